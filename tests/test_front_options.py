"""The front's grouped, keyword-only options and 0.2's flat keywords (accepted for one release, with a warning)."""

from __future__ import annotations

import inspect
import pickle
import warnings

import pyarrow.compute as pc
import pytest

import audioloader as al
from audioloader.errors import DeprecatedKeywordWarning
from tests.helpers import SMALL, assert_same_batches, take


def grouped(source, **kwargs):
    options = {"batch_size": 8, "features": SMALL, "seed": 1, "storage": al.Storage(split_rows=4),
               "workers": al.Workers(num_workers=2, kind="thread"), "shuffle": al.Shuffle(buffer_size=12, min_size=6)}
    options.update(kwargs)
    return al.AudioLoader(source, **options)


def test_every_option_after_source_is_keyword_only_and_at_most_16():
    parameters = [p for name, p in inspect.signature(al.AudioLoader).parameters.items() if name != "moved"]
    assert len(parameters) <= 16
    assert parameters[0].name == "source"
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[1:])
    with pytest.raises(TypeError):
        al.AudioLoader("shards/", 64)  # the batch size is keyword-only now


COMMON = {"batch_size": 8, "features": SMALL, "seed": 1}
GROUPS = {"storage": al.Storage(split_rows=4), "workers": al.Workers(num_workers=2, kind="thread"),
          "shuffle": al.Shuffle(buffer_size=12, min_size=6)}
FLAT = {"split_rows": 4, "num_workers": 2, "worker_type": "thread", "shuffle_buffer_size": 12, "shuffle_min_size": 6}


def test_the_suite_fails_on_a_deprecated_keyword_although_its_warning_points_at_the_caller(ipc_shards):
    # pyproject's filterwarnings turn audioloader's deprecation warnings into errors by their class: the warning's
    # stack level points at this line (a test module), which a filter on the module "audioloader" would miss.
    with pytest.raises(DeprecatedKeywordWarning, match=r"AudioLoader\(num_workers=\.\.\.\) is deprecated") as info:
        al.AudioLoader(ipc_shards, num_workers=0)
    assert isinstance(info.value, FutureWarning)
    with pytest.warns(FutureWarning, match="num_workers"):  # recorded, not raised, under pytest.warns
        al.AudioLoader(ipc_shards, num_workers=0).shutdown()


@pytest.mark.parametrize("rank", [None, 1])
def test_flat_keywords_of_0_2_warn_and_give_the_same_batches(ipc_shards, rank):
    distributed = {} if rank is None else {"rank": rank, "world_size": 2}
    with pytest.warns(FutureWarning, match=r"deprecated .* pass (workers|shuffle|storage)=al\."):
        old = al.AudioLoader(ipc_shards, **COMMON, **FLAT, **distributed)
    storage = al.Storage(split_rows=4, **distributed)
    new = al.AudioLoader(ipc_shards, **COMMON, **{**GROUPS, "storage": storage})
    assert_same_batches(take(old, 3), take(new, 3))
    assert old.state_dict()["fingerprint"] == new.state_dict()["fingerprint"]
    assert (old.num_workers, old.worker_type, old.shuffle_buffer_size, old.rank) == (2, "thread", 12, rank or 0)


def test_flat_label_column_and_filter_fold_into_the_source(ipc_shards):
    with pytest.warns(FutureWarning, match=r"source=al\.Source\(label_column=None\)|pass source=al\.Source"):
        old = grouped(ipc_shards, train=False, label_column=None, filter=pc.field("label") >= 1)
    new = grouped(al.Source(ipc_shards, label_column=None, filter=pc.field("label") >= 1), train=False)
    a, b = list(old), list(new)
    assert "label" not in a[0]
    assert_same_batches(a, b)
    assert old.state_dict()["fingerprint"] == new.state_dict()["fingerprint"]


def test_a_flat_keyword_that_contradicts_its_group_names_both(ipc_shards):
    with pytest.raises(ValueError, match="num_workers=2 conflicts with Workers"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        al.AudioLoader(ipc_shards, num_workers=2, workers=al.Workers(num_workers=3))


def test_an_unknown_keyword_is_a_type_error(ipc_shards):
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_worker'"):
        al.AudioLoader(ipc_shards, num_worker=2)


def test_on_error_takes_a_string_or_a_budget(ipc_shards):
    assert grouped(ipc_shards, on_error="raise").settings.on_error == al.OnError(action="raise")
    budget = al.OnError(max_fraction=0.5, min_rows=10)
    assert grouped(ipc_shards, on_error=budget).settings.on_error == budget
    with pytest.raises(ValueError, match="on_error='ignore': must be one of"):
        grouped(ipc_shards, on_error="ignore")
    with pytest.raises(ValueError, match=r"OnError.max_fraction=2: must be a fraction in \[0, 1\]"):
        al.OnError(max_fraction=2)


def test_groups_are_checked_by_type(ipc_shards):
    with pytest.raises(TypeError, match=r"storage must be an audioloader\.Storage"):
        grouped(ipc_shards, storage={"split_rows": 4})
    with pytest.raises(ValueError, match=r"Storage.split_rows=0: must be an integer >= 1"):
        al.Storage(split_rows=0)


def test_pickled_loader_rebuilds_from_the_grouped_arguments_without_warnings(ipc_shards):
    loader = grouped(ipc_shards)
    first = take(loader, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        again = pickle.loads(pickle.dumps(loader))
    assert_same_batches(take(again, 1), take(grouped(ipc_shards), 3)[2:])
    assert len(first) == 2
