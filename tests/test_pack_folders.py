"""What a pack folder tells a loader and ``audioloader index``: unfinished parts refused by name, several packs in
one folder refused rather than merged, files written with the shards' permissions, a flat folder of unlabelled
audio packed without labels, and refusals and summaries that lead with the real cause (issue 39)."""

from __future__ import annotations

import json
import os
import stat

import pyarrow as pa
import pytest

import audioloader as al
from audioloader.tools.pack import pack_dataset
from tests.helpers import class_tree, encode, make_shards, tone, truncated_flac


def _modes(folder):
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_pack_writes_manifest_and_journal_with_the_shards_permissions(tmp_path, mask):
    """A manifest written 0600 (mkstemp) locks the group out on a shared file system; every file pack or index
    writes gets the umask's permissions, as the shards do."""
    from audioloader.tools.cli import main

    src = class_tree(tmp_path / "src")
    old = os.umask(mask)
    try:
        pack_dataset(src, tmp_path / "out", progress=False)
        assert main(["index", str(tmp_path / "out")]) == 0  # written again by index: the same
    finally:
        os.umask(old)
    modes = _modes(tmp_path / "out")
    assert {"_audioloader_manifest.arrow", "_audioloader_pack.json", "labels.json", "shard-00000.arrow"} <= set(modes)
    assert set(modes.values()) == {0o666 & ~mask}, modes


def _two_parts(tmp_path, parts=("0/2",)):
    src = class_tree(tmp_path / "src")
    for part in parts:
        pack_dataset(src, tmp_path / "out", part=part, rows_per_batch=2, progress=False)
    return src, tmp_path / "out"


def test_an_unfinished_partitioned_pack_is_refused_naming_the_missing_part(tmp_path):
    """Half the parts used to load as if whole (len 38 for 300 of 600 rows, no warning)."""
    _, out = _two_parts(tmp_path)
    with pytest.raises(al.PackFolderError, match=r"1 of the 2 parts .* not finished: --part 1/2\b"):
        al.AudioLoader(str(out), train=False, batch_size=4)
    with pytest.raises(al.PackFolderError, match=r"--part 1/2\b"):
        al.ShardDataset(str(out))
    # The opt-in: the finished part's shards, named.
    loader = al.AudioLoader(str(out / "shard-p0000of0002-*"), train=False, batch_size=4, workers=al.Workers(0))
    assert sum(len(b["index"]) for b in loader) == 6  # part 0: the first 7 of the 15 files, one not audio
    loader.shutdown()


def test_index_names_the_unfinished_parts_and_indexes_when_all_are_done(tmp_path, capsys):
    from audioloader.tools.cli import main

    src, out = _two_parts(tmp_path)
    assert main(["index", str(out)]) == 1
    assert "not finished: --part 1/2." in capsys.readouterr().err
    pack_dataset(src, out, part="1/2", rows_per_batch=2, progress=False)
    loader = al.AudioLoader(str(out), train=False, batch_size=4, workers=al.Workers(0))
    assert sorted(int(i) for b in loader for i in b["index"]) == list(range(3 * 5 - 1))  # every row once
    loader.shutdown()


def test_a_pack_started_over_an_indexed_one_is_refused_until_it_finishes(tmp_path):
    """--overwrite removes the old manifest (it listed the shards it removes), so the unfinished pack is seen."""
    src = class_tree(tmp_path / "src")
    pack_dataset(src, tmp_path / "out", progress=False)
    pack_dataset(src, tmp_path / "out", part="0/2", overwrite=True, progress=False)
    with pytest.raises(al.PackFolderError, match=r"not finished: --part 1/2\b"):
        al.ShardDataset(str(tmp_path / "out"))


def test_an_unfinished_whole_pack_is_refused(tmp_path):
    src = class_tree(tmp_path / "src")
    pack_dataset(src, tmp_path / "out", progress=False)
    journal = tmp_path / "out" / "_audioloader_pack.json"
    doc = json.loads(journal.read_text())
    journal.write_text(json.dumps({**doc, "done": False}))  # as a pack killed before its last shard leaves it
    (tmp_path / "out" / "_audioloader_manifest.arrow").unlink()
    with pytest.raises(al.PackFolderError, match=r"not finished .*run the same `audioloader pack"):
        al.AudioLoader(str(tmp_path / "out"), train=False)


def test_several_packs_in_sub_folders_are_refused_not_merged(tmp_path):
    src = class_tree(tmp_path / "src")
    for name in ("a", "b"):
        pack_dataset(src, tmp_path / "packs" / name, progress=False)
    with pytest.raises(al.PackFolderError, match=r"holds 2 packs,.*'a', 'b'.*a list of the folders"):
        al.AudioLoader(str(tmp_path / "packs"), train=False)
    both = al.ShardDataset([str(tmp_path / "packs" / "a"), str(tmp_path / "packs" / "b")])  # explicit: allowed
    assert both.num_rows == 2 * 14


def test_an_unfinished_pack_in_a_bucket_is_refused(s3, tmp_path):
    src = class_tree(tmp_path / "src")
    s3.filesystem().create_dir("folders")
    pack_dataset(src, s3.url("folders/parts"), part="1/2", rows_per_batch=2, progress=False)
    with pytest.raises(al.PackFolderError, match=r"not finished: --part 0/2\b"):
        al.ShardDataset(s3.url("folders/parts"))


# -- what pack says --------------------------------------------------------------------------------------------


def test_pack_interrupted_while_writing_its_journal_leaves_no_temporary_and_says_how_to_continue(
        tmp_path, monkeypatch, capsys):
    from audioloader.tools.cli import main

    src = class_tree(tmp_path / "src")
    out = tmp_path / "out"
    replace = os.replace

    def interrupted(a, b):  # Ctrl-C lands while the journal is being put in place
        if str(b).endswith("_audioloader_pack.json"):
            raise KeyboardInterrupt
        return replace(a, b)

    monkeypatch.setattr(os, "replace", interrupted)
    assert main(["pack", str(src), str(out), "-q"]) == 130
    assert "interrupted; the finished shards are kept: run the same command again to continue" in \
        capsys.readouterr().err
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(os, "replace", replace)
    (out / "._audioloader_pack.json.0123456789ab.tmp").write_text("{")  # as a SIGKILL at that moment leaves it
    assert main(["pack", str(src), str(out), "-q"]) == 0
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_finished_pack_run_again_says_it_was_already_complete(tmp_path):
    src = class_tree(tmp_path / "src")
    first = pack_dataset(src, tmp_path / "out", progress=False)
    assert not first.complete and "already complete" not in first.text()
    again = pack_dataset(src, tmp_path / "out", progress=False)
    assert again.complete and again.rows == first.rows
    assert "already complete: an earlier run finished this pack, nothing was done" in again.text()
    assert "continued:" not in again.text()


def test_a_refused_pack_leaves_no_empty_out_folder(tmp_path):
    src = tmp_path / "src"
    (src / "dog").mkdir(parents=True)
    (src / "dog" / "a.wav").write_bytes(b"not audio")
    with pytest.raises(ValueError, match="every row was skipped"):
        pack_dataset(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "mine").mkdir()  # a folder the user made is left alone
    with pytest.raises(ValueError, match="every row was skipped"):
        pack_dataset(src, tmp_path / "mine", progress=False)
    assert (tmp_path / "mine").is_dir()


def test_index_says_how_many_files_and_rows_it_indexed(tmp_path, capsys):
    from audioloader.tools.cli import main

    make_shards(tmp_path / "data", [5, 7])
    assert main(["index", str(tmp_path / "data")]) == 0
    assert capsys.readouterr().out.strip() == (f"{tmp_path / 'data' / '_audioloader_manifest.arrow'}: "
                                               "2 shard file(s), 12 rows")


def test_pack_checks_headers_only_says_so_and_verify_decodes_every_row(tmp_path):
    """docs/cli.md said rows that cannot be decoded are left out; a truncated FLAC (a good header) was stored."""
    src = class_tree(tmp_path / "src")
    (src / "dog" / "99.flac").write_bytes(truncated_flac())
    plain = pack_dataset(src, tmp_path / "plain", progress=False)
    assert "99.flac" in [r["path"].split("/")[-1] for r in _rows(tmp_path / "plain")]
    assert "checked: each file's header only" in plain.text() and "--verify" in plain.text()
    verified = pack_dataset(src, tmp_path / "verified", verify=True, progress=False)
    assert verified.rows == plain.rows - 1 and verified.skipped["undecodable"] == 2
    assert any("99.flac" in e and "truncated" in e for e in verified.examples["undecodable"])
    assert "checked:" not in verified.text()
    with pytest.raises(ValueError, match="made with verify=True, this run has verify=None"):  # other checks: refused
        pack_dataset(src, tmp_path / "verified", progress=False)


def _rows(folder):
    return pa.concat_tables(pa.ipc.open_file(str(p)).read_all() for p in sorted(folder.glob("shard-*"))).to_pylist()


def test_pack_a_flat_folder_of_unlabelled_audio(tmp_path):
    """A self-supervised or TTS corpus: audio files, no classes. Detected, or asked for with --input-format files."""
    src = tmp_path / "corpus"
    (src / "more").mkdir(parents=True)
    clips = {"a.wav": 0.2, "b.flac": 0.3, "more/c.wav": 0.25}
    for rel, seconds in clips.items():
        (src / rel).write_bytes(encode(tone(seconds, 16000), 16000, "FLAC" if rel.endswith("flac") else "WAV"))
    with pytest.raises(ValueError, match="--input-format files"):  # beside a sub-folder: classes? say how
        pack_dataset(src, tmp_path / "refused", progress=False)
    summary = pack_dataset(src, tmp_path / "out", input_format="files", progress=False)
    assert summary.input_format == "files" and summary.label_names is None
    assert summary.columns == ["audio", "path", "duration"]
    assert [r["path"] for r in _rows(tmp_path / "out")] == sorted(clips)
    assert not (tmp_path / "out" / "labels.json").exists()
    (src / "more" / "c.wav").rename(src / "c.wav")
    (src / "more").rmdir()
    flat = pack_dataset(src, tmp_path / "flat", progress=False)  # detected: audio files and no sub-folder
    assert flat.input_format == "files" and flat.rows == 3
    loader = al.AudioLoader(al.Source(str(tmp_path / "flat"), label_column=None), train=False, batch_size=3,
                            workers=al.Workers(0), features=al.WaveformConfig(sample_rate=16000),
                            length=al.LengthPolicy(clip_seconds=0.2))
    assert "label" not in next(iter(loader))
    loader.shutdown()
