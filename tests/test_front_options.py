"""The front's grouped, keyword-only options; 0.2's flat keywords, removed in 0.4, are refused naming their group."""

from __future__ import annotations

import inspect
import pickle
import warnings

import pytest

import audioloader as al
from tests.helpers import SMALL, assert_same_batches, take


def grouped(source, **kwargs):
    options = {"batch_size": 8, "features": SMALL, "seed": 1, "storage": al.Storage(split_rows=4),
               "workers": al.Workers(num_workers=2, kind="thread"), "shuffle": al.Shuffle(buffer_size=12, min_size=6)}
    options.update(kwargs)
    return al.AudioLoader(source, **options)


def test_every_option_after_source_is_keyword_only_and_at_most_16():
    parameters = [p for name, p in inspect.signature(al.AudioLoader).parameters.items() if name != "removed"]
    assert len(parameters) <= 16
    assert parameters[0].name == "source"
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[1:])
    with pytest.raises(TypeError):
        al.AudioLoader("shards/", 64)  # the batch size is keyword-only now


#: Every flat keyword of 0.2 and the group (argument and class) its error names, removed in 0.4.
REMOVED = {"num_workers": "workers=al.Workers(num_workers=", "worker_type": "workers=al.Workers(kind=",
           "start_method": "workers=al.Workers(start_method=",
           "prefetch_batches": "workers=al.Workers(prefetch_batches=",
           "pin_memory": "workers=al.Workers(pin_memory=", "shuffle_buffer_size": "shuffle=al.Shuffle(buffer_size=",
           "shuffle_min_size": "shuffle=al.Shuffle(min_size=",
           "shuffle_before_decode": "shuffle=al.Shuffle(before_decode=",
           "rank": "storage=al.Storage(rank=", "world_size": "storage=al.Storage(world_size=",
           "split_rows": "storage=al.Storage(split_rows=", "filesystem": "storage=al.Storage(filesystem=",
           "retry": "storage=al.Storage(retry=", "max_error_fraction": "on_error=al.OnError(max_fraction=",
           "audio_column": "al.Source(shards, audio_column=", "label_column": "al.Source(shards, label_column=",
           "filter": "al.Source(shards, filter="}


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_each_flat_keyword_of_0_2_is_refused_naming_the_group_that_holds_it(ipc_shards, name):
    with pytest.raises(TypeError) as info:
        al.AudioLoader(ipc_shards, **{name: 1})
    message = str(info.value)
    assert message.startswith(f"AudioLoader({name}=...) was removed in 0.4") and REMOVED[name] in message


def test_a_flat_keyword_is_refused_before_any_file_is_opened(tmp_path):
    with pytest.raises(TypeError, match=r"num_workers=\.\.\.\) was removed in 0\.4: pass workers=al\.Workers"):
        al.AudioLoader(tmp_path / "no such folder", num_workers=2)


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
