"""AudioLoader on worker processes and with features per batch: same batches, resume, lifecycle, misuse."""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

import audioloader as al
from audioloader.workers.forks import process_identity
from tests.helpers import IPC_ROWS as ROWS
from tests.helpers import assert_resumes_exactly, assert_same_batches, loader_for, make_shards, roundtrip, take


@pytest.fixture(scope="module")
def parquet(shard_folder) -> Path:
    return shard_folder(ROWS, "parquet", batch_rows=4, seconds=0.4)


def flip(wave: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A module-level augment (importable in worker processes), seeded by the key's rng."""
    return wave[::-1] * np.float32(rng.uniform(0.5, 1.0))


class Broke(Exception):
    def __init__(self, message: str, *, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def broken(wave, rng):
    raise Broke("augment failed", detail="kept")


def children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


# ---------------------------------------------------------------------------------------- same batches


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("shuffle_before_decode", [True, False])
def test_processes_give_the_batches_threads_give(ipc_shards, train, shuffle_before_decode):
    kwargs = {"train": train, "shuffle": al.Shuffle(before_decode=shuffle_before_decode), "augment": flip}
    with loader_for(ipc_shards, workers=al.Workers(kind="thread", num_workers=2), **kwargs) as threads:
        expected = take(threads, 6) if train else list(threads)
    for workers in (1, 3):
        with loader_for(ipc_shards, workers=al.Workers(kind="process", num_workers=workers), **kwargs) as processes:
            assert_same_batches(take(processes, 6) if train else list(processes), expected)


def test_processes_on_parquet_receive_the_audio_through_shared_memory(parquet):
    with loader_for(parquet, train=False, workers=al.Workers(kind="thread")) as threads:
        expected = list(threads)
    with loader_for(parquet, train=False, workers=al.Workers(kind="process")) as processes:
        assert processes.decoder._decoder.fetch is None  # not memory-mapped: the audio itself travels
        assert_same_batches(list(processes), expected)


@pytest.mark.parametrize(("saved", "resumed"), [("process", "thread"), ("thread", "process"),
                                                ("process", "process")])
def test_resume_is_exact_across_worker_types(ipc_shards, saved, resumed):
    for shuffle_before_decode in (True, False):
        build = functools.partial(loader_for, ipc_shards, workers=al.Workers(kind=saved, num_workers=2),
                                  shuffle=al.Shuffle(before_decode=shuffle_before_decode))
        assert_resumes_exactly(build, 7, [3], continued=True, workers=al.Workers(kind=resumed, num_workers=3))


def test_worker_processes_report_stage_times(ipc_shards):
    with loader_for(ipc_shards, train=False, workers=al.Workers(kind="process")) as loader:
        list(loader)
        seconds = loader.stats()["seconds"]
    assert seconds["decode"] > 0 and seconds["mel"] > 0


def test_user_exception_from_a_process_keeps_type_attributes_and_worker_traceback(ipc_shards):
    with loader_for(ipc_shards, augment=broken, workers=al.Workers(kind="process")) as loader, \
            pytest.raises(Broke) as info:
        take(loader, 1)
    assert info.value.detail == "kept"
    assert "broken" in [entry.name for entry in info.traceback]  # the worker's frames, rebuilt here


def test_lambda_augment_with_processes_is_refused_with_the_fix(ipc_shards):
    with pytest.raises(TypeError, match="top level of a module"):
        loader_for(ipc_shards, augment=lambda wave, rng: wave, workers=al.Workers(kind="process"))


def test_auto_uses_threads_on_small_machines_and_for_unpicklable_augments(ipc_shards, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert loader_for(ipc_shards).worker_type == "thread"
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert loader_for(ipc_shards).worker_type == "process"
    assert loader_for(ipc_shards, workers=al.Workers(num_workers=0)).worker_type == "thread"
    with pytest.warns(UserWarning, match="decoding runs in threads"):
        assert loader_for(ipc_shards, augment=lambda wave, rng: wave).worker_type == "thread"


# ---------------------------------------------------------------------------------------- features per batch


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("train", [True, False])
def test_batched_features_match_per_sample_features(ipc_shards, train):
    with loader_for(ipc_shards, train=train, drop_last=False) as per_sample:
        expected = take(per_sample, 4) if train else list(per_sample)
    with loader_for(ipc_shards, train=train, device="cpu") as batched:
        got = take(batched, 4) if train else list(batched)
    assert len(got) == len(expected)
    for x, y in zip(got, expected, strict=True):
        assert x.keys() == y.keys()
        assert x["spectrogram"].shape == y["spectrogram"].shape
        assert rel_l2(x["spectrogram"], y["spectrogram"]) < 1e-4
        for name in x:
            if name != "spectrogram":
                assert torch.equal(x[name], y[name]) if isinstance(x[name], torch.Tensor) else x[name] == y[name]


def test_batched_features_give_the_same_checkpoints(ipc_shards):
    states = []
    for device in (None, "cpu"):
        with loader_for(ipc_shards, device=device, workers=al.Workers(kind="process")) as loader:
            it = iter(loader)
            [next(it) for _ in range(3)]
            states.append(loader.state_dict())
    assert states[0] == states[1]
    with loader_for(ipc_shards) as per_sample, loader_for(ipc_shards, device="cpu") as batched:
        per_sample.load_state_dict(roundtrip(states[1]))  # a state saved on one path resumes on the other
        batched.load_state_dict(roundtrip(states[0]))
        for x, y in zip(take(per_sample, 2), take(batched, 2), strict=True):
            assert torch.equal(x["index"], y["index"]) and rel_l2(y["spectrogram"], x["spectrogram"]) < 1e-4


def test_eval_padding_entries_have_zero_features_on_both_paths(tmp_path):
    make_shards(tmp_path, [20], "ipc_file", seconds=0.4)  # 5 splits of 4: ranks read 12 and 8 rows
    for device in (None, "cpu"):
        with loader_for(tmp_path, train=False, device=device, storage=al.Storage(world_size=2, rank=1)) as loader:
            batches = list(loader)
        padded = [b for b in batches if not b["valid"].all()]
        assert padded and all(float(b["spectrogram"][~b["valid"]].abs().sum()) == 0 for b in padded)


def test_cuda_device_without_cuda_is_refused(ipc_shards):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA is not available"):
        loader_for(ipc_shards, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_features_match_the_cpu_path(ipc_shards):
    with loader_for(ipc_shards) as cpu, loader_for(ipc_shards, device="cuda") as gpu:
        for x, y in zip(take(cpu, 4), take(gpu, 4), strict=True):
            assert y["spectrogram"].device.type == "cuda" and y["label"].device.type == "cuda"
            assert rel_l2(y["spectrogram"].cpu(), x["spectrogram"]) < 1e-4
            assert torch.equal(y["index"].cpu(), x["index"])


# ---------------------------------------------------------------------------------------- lifecycle


def test_processes_stop_with_the_loader(ipc_shards):
    before = children()
    for i in range(4):
        loader = loader_for(ipc_shards, train=bool(i % 2), workers=al.Workers(kind="process"))
        if i % 2:
            it = iter(loader)
            next(it)
            del it
        else:
            list(loader)
        del loader
    assert children() == before


@pytest.mark.skipif(os.name != "posix", reason="SIGINT delivery to a child process")
@pytest.mark.parametrize("phase", ["steady", "buffer fill"])
def test_ctrl_c_with_worker_processes(ipc_shards, phase):
    """Ctrl-C, sent to the process group as a terminal sends it: the interrupt reaches the program promptly and
    once (none is lost in a worker's start), no worker prints a traceback, and no worker outlives the program.
    Where it lands inside the loader's ``next()`` (waiting for a batch, filling the buffer, starting the
    workers), every worker has stopped before the program sees it; where it lands in the program's own loop,
    the workers stop with the loader (at exit here)."""
    # "buffer fill": a large min fill, so Ctrl-C lands while the shuffle buffer fills.
    sizes = "buffer_size=20, min_size=10" if phase == "steady" else "buffer_size=40, min_size=40, before_decode=False"
    script = textwrap.dedent(f"""
        import multiprocessing, sys, time, traceback
        from pathlib import Path
        import audioloader as al
        from tests.helpers import loader_for
        loader = loader_for({str(ipc_shards)!r}, workers=al.Workers(kind="process"), shuffle=al.Shuffle({sizes}))
        package = str(Path(al.__file__).parent)
        try:
            it = iter(loader)
            print("running", flush=True)
            for batch in it:
                pass
        except KeyboardInterrupt as interrupt:
            inside = any(f.filename.startswith(package) for f in traceback.extract_tb(interrupt.__traceback__))
            alive = [str(p.pid) for p in multiprocessing.active_children()]
            print("interrupted", time.monotonic(), "inside" if inside else "outside", *alive, flush=True)
            sys.exit(3)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parent.parent,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline().strip() == "running"
        time.sleep(0.3)
        sent = time.monotonic()
        os.killpg(child.pid, signal.SIGINT)  # as a terminal does: to the whole process group
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    line = out.split()
    assert line and line[0] == "interrupted", out + err
    assert float(line[1]) - sent < 5, out + err  # generous (shared machine); the point is no hang
    alive = [int(pid) for pid in line[3:]]
    if line[2] == "inside":
        assert alive == [], "worker processes still alive after an interrupt inside the loader's next()"
    assert not [pid for pid in alive if process_identity(pid) is not None], "worker processes outlived the program"
    assert child.returncode == 3, out + err
    assert "Traceback" not in err, err  # workers ignore SIGINT: no traceback per worker


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="fork's hooks")
def test_ctrl_c_in_a_workers_fork_hook_is_not_lost(ipc_shards):
    """An interrupt raised inside a fork's at-fork hook is printed as "Exception ignored" and dropped by Python:
    it used to be lost there (an infinite loader ran on). It is held over the start and raised after it, and
    the loader stops every worker, the one being started too."""
    script = textwrap.dedent(f"""
        import multiprocessing, os, signal
        import audioloader as al
        from tests.helpers import loader_for
        forks = []
        def interrupt_once():  # Ctrl-C landing in the hooks the parent runs after its first worker's fork
            if not forks:
                forks.append(1)
                os.kill(os.getpid(), signal.SIGINT)
        os.register_at_fork(after_in_parent=interrupt_once)
        loader = loader_for({str(ipc_shards)!r}, workers=al.Workers(kind="process", start_method="fork"))
        try:
            next(iter(loader))
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted", len(multiprocessing.active_children()))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["interrupted", "0"], done.stdout + done.stderr


# ---------------------------------------------------------------------------------------- pickling, misuse


def test_pickled_loader_goes_on_where_it_was(ipc_shards):
    with loader_for(ipc_shards, augment=flip) as loader:
        fresh = pickle.loads(pickle.dumps(loader))
        assert_same_batches(take(fresh, 2), take(loader_for(ipc_shards, augment=flip), 2))
        it = iter(loader)
        [next(it) for _ in range(2)]
        copy = pickle.loads(pickle.dumps(loader))
        expected = [next(it) for _ in range(3)]
        it.close()
    with copy:
        assert_same_batches(take(copy, 3), expected)


def test_pickling_a_loader_with_a_lambda_says_what_to_do(ipc_shards):
    loader = loader_for(ipc_shards, augment=lambda wave, rng: wave, workers=al.Workers(kind="thread"))
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps(loader)


def test_a_second_iterator_supersedes_the_first(ipc_shards):
    loader = loader_for(ipc_shards)
    first = iter(loader)
    next(first)
    second = iter(loader)  # as with a DataLoader: fine, and the newest one owns the stream
    assert len([next(second)]) == 1
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    second.close()
    with pytest.raises(StopIteration):
        next(second)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    take(loader, 1)
    loader.shutdown()


def test_two_threads_cannot_share_one_stream(ipc_shards):
    loader = loader_for(ipc_shards)
    errors, a_started, b_iterating = [], threading.Event(), threading.Event()

    def first():
        it = iter(loader)
        next(it)
        a_started.set()
        b_iterating.wait()
        try:
            next(it)  # B's iterator took the stream over: A never gets a batch of it
        except RuntimeError as error:
            errors.append(error)

    a = threading.Thread(target=first, daemon=True)
    a.start()
    a_started.wait()
    it = iter(loader)
    b_iterating.set()
    a.join()
    assert len(take_from(it, 2)) == 2
    assert errors and "superseded" in str(errors[0])
    loader.shutdown()


def take_from(it, n):
    return [next(it) for _ in range(n)]


def test_wrapping_in_a_torch_dataloader_says_what_to_do(ipc_shards):
    with loader_for(ipc_shards, train=False) as loader, \
            pytest.raises(TypeError, match="iterate it directly") as info:
        next(iter(torch.utils.data.DataLoader(loader, batch_size=None, num_workers=2)))
    # The error's frames hold the DataLoader's iterator in a reference cycle: left to the garbage collector (in a
    # later test), its worker processes are shut down after their queues were freed and it waits 5 s for each.
    traceback.clear_frames(info.tb)  # freed now: its workers stop at once
    with loader_for(ipc_shards, train=True) as loader, \
            pytest.raises(TypeError, match="iterate the AudioLoader directly"):
        next(iter(torch.utils.data.DataLoader(loader, batch_size=None)))


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_a_forked_child_gets_an_error_not_a_hang(ipc_shards, worker_type):
    loader = loader_for(ipc_shards, workers=al.Workers(kind=worker_type))
    it = iter(loader)
    next(it)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            next(it)
            os.write(write, b"no error")
        except RuntimeError as error:
            os.write(write, str(error).encode()[:300])
        os._exit(0)
    os.waitpid(pid, 0)
    assert "build the loader in the process that iterates it" in os.read(read, 400).decode()
    next(it)  # the parent goes on
    it.close()
    loader.shutdown()


def test_no_beta_warning_reaches_users(ipc_shards):
    # In a fresh interpreter with every warning shown: torch's once-per-process sparse CSR
    # warning used to escape from a decode thread.
    script = textwrap.dedent(f"""
        import audioloader as al
        from tests.helpers import loader_for, take
        with loader_for({str(ipc_shards)!r}, workers=al.Workers(kind="thread")) as loader:
            take(loader, 2)
        print("done")
    """)
    done = subprocess.run([sys.executable, "-W", "always", "-c", script], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "done", done.stderr
    assert "beta" not in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------- memory


def mapped_shard_kb(pid: int) -> int:
    """Resident KiB of process ``pid``'s memory maps of ``.arrow`` files."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:  # a mapping's header line
                inside = fields[-1].endswith(".arrow")
            elif inside and line.startswith("Rss:"):
                total += int(fields[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_decode_workers_keep_only_the_rows_at_hand_mapped(tmp_path):
    # A worker reads its rows by key from the memory-mapped shards; every page it touched stayed mapped, so each
    # worker's memory grew with the rows it had decoded (half the dataset each after a pass).
    make_shards(tmp_path, [24, 24], batch_rows=4, seconds=8.0)  # 16 kHz WAV: 256 KB a row, 12 MB in all
    with al.AudioLoader(tmp_path, batch_size=8, features=al.WaveformConfig(sample_rate=8000), train=False,
                        length=al.LengthPolicy(clip_seconds=0.5),
                        workers=al.Workers(num_workers=2, kind="process")) as loader:
        batches = iter(loader)
        for _ in range(5):  # 40 rows: ~5 MB read by each worker
            next(batches)
        workers = [p.pid for p in multiprocessing.active_children() if p.name.startswith("audioloader-decode")]
        assert len(workers) == 2
        held = [mapped_shard_kb(pid) for pid in workers]
    assert all(kb < 2600 for kb in held), held  # at most about a chunk's rows (8 x 256 KB)
