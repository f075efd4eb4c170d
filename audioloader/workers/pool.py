"""Worker pools for `audioloader.nodes.ParallelMap`: threads, or processes fed through shared memory.

Both run *chunks* (lists of items) through a job, one chunk per task, and hand
results back strictly in submission order: a process pool gives chunk ``seq``
to the active worker with the fewest chunks in flight (`ProcessPool.set_active`),
every worker works through its chunks first in, first out, and the consumer
reads each chunk from the worker it went to, in submission order: it never
reorders, and which worker ran a chunk changes nothing.

A job is a callable ``job(item) -> result`` with two optional hooks:
``job.encode(item)`` runs in the consumer before an item is sent to a process
(e.g. a row that the worker can read itself becomes its key) and
``job.prepare(items)`` runs in the worker before the items are mapped (e.g.
those keys are read back in one random-access call). An exception from
``job(item)`` becomes that item's result, a `Failure` carrying it; the chunk
goes on with the next item.

Processes: each worker owns ``depth`` `SharedSlot` s, one per chunk it may
have in flight; a chunk's inputs and then its results travel through its slot
(see `audioloader.workers.wire`; a stream's features go straight into the batch's rows in
shared memory instead, `audioloader.workers.recycle.BatchArenas`), the socket carries only small pickles. Workers
ignore SIGINT (Ctrl-C is the consumer's to handle), run torch with one
intra-op thread, exit when their socket closes (so they never outlive the
consumer), and are watched: a worker that dies (killed by the OOM killer, a
crash in a decoder) is reported with its exit status instead of a hang. What runs inside
a worker process is in `audioloader.workers.process_worker`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import pickle
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from multiprocessing import reduction
from typing import Any

from ..errors import CudaInWorkerError, WorkerError  # noqa: F401 - importable from here as before
from . import cuda, forks, wire
from .process_worker import _RemoteFailure, run_chunk, worker_main
from .recycle import BatchArenas, Recycler
from .threads import join_or_report

#: Seconds between liveness checks while waiting for a worker.
POLL_SECONDS = 0.1

#: Bytes of result buffers a `ProcessPool` reuses (`audioloader.workers.recycle`): enough for the results in
#: flight and a batch being collated (64 log-mels of 256 KiB are 16 MiB).
RESULT_RECYCLE_BYTES = 64 << 20

#: Seconds a stopping worker process gets before it is terminated, then killed.
STOP_GRACE_SECONDS = 0.5

#: The process start method used when none is given and `choose_start_method`
#: cannot fork: a fork server (safe in a process with threads, fast after its
#: first start) where the platform has one.
DEFAULT_START_METHOD = "forkserver" if sys.platform != "win32" else "spawn"


def choose_start_method() -> str:
    """The start method `ProcessPool` uses when none is given (see `start_method_and_reason`)."""
    return start_method_and_reason(None)[0]


def start_method_and_reason(asked: str | None) -> tuple[str, str]:
    """``(start method, why)`` for worker processes: ``asked`` unless it is ``"fork"`` in a process that uses CUDA.

    None picks ``"fork"`` on Linux while this is the process's only Python thread
    and CUDA is not in use here, else `DEFAULT_START_METHOD`. A fork is instant and
    shares the parent's imports, where a fork server first spends ~1.3 s importing
    torch (once per process) and holds ~400 MB. It is safe when no other Python
    thread can hold a lock at the moment of the fork (native pools, torch's and
    Arrow's, are what DataLoader forks with on Linux too; workers run torch on one
    thread). With other Python threads running (another loader's, your own), the
    fork server. With CUDA initialised (a model moved to the GPU first: the usual
    order) a forked child can abort on its first CUDA call, even one made by its
    garbage collector (see `audioloader.workers.cuda`): never a fork then, not even
    when asked for.
    """
    cuda_reason = cuda.fork_unsafe_reason() if asked in (None, "fork") else None
    if asked == "fork" and cuda_reason is not None:
        return DEFAULT_START_METHOD, f"Workers(start_method='fork') was asked for, but {cuda_reason}"
    if asked is not None:
        return asked, "Workers(start_method=...)"
    if not sys.platform.startswith("linux"):
        return DEFAULT_START_METHOD, f"fork is used on Linux only ({sys.platform})"
    if cuda_reason is not None:
        return DEFAULT_START_METHOD, cuda_reason
    if threading.active_count() > 1:
        threads = threading.active_count()
        return DEFAULT_START_METHOD, f"{threads} Python threads are running (a fork could copy a held lock)"
    return "fork", "the only Python thread and no CUDA in this process"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """Decode threads when their number is left to the library: 2 per core, at most 8 (the GIL stops more)."""
    return min(8, 2 * available_cores())


def free_mkl_buffers() -> bool:
    """Free MKL's cached memory (its "fast memory manager") in this process; False where torch has no MKL.

    Called right before worker processes are forked. MKL keeps per-thread
    buffer accounting that a forked child inherits in an inconsistent state when
    MKL was used in another thread before the fork (e.g. an earlier loader's
    decode thread): the child's first FFT (``torch.stft`` -> ``DftiCreateDescriptor``)
    then spins forever in ``mm_account_ptr_by_tid``. Measured: 4 of 12 fresh
    processes that decoded in a thread and then forked workers hung; 0 of 15
    after freeing the buffers before the fork. torch's x86 wheels link MKL
    statically and export this service function; elsewhere there is nothing to free.
    """
    function = _mkl_free_buffers_function()
    if function is None:
        return False
    function()
    return True


@functools.cache
def _mkl_free_buffers_function() -> Any:
    import torch

    if not torch.backends.mkl.is_available():
        return None
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        return getattr(ctypes.CDLL(library), "mkl_serv_free_buffers", None)
    except OSError:  # not Linux, or another layout: no statically linked MKL to look into
        return None


#: What the fork server imports once, by name, so that each worker it starts finds them loaded and starts in
#: milliseconds (a worker started from a fresh interpreter spends ~1.5 s importing torch): the libraries a decode
#: job uses, the worker's loop, and the decode job's module (it imports the readers, dsp and nodes it runs).
#: Names, not imports: the fork server loads them in its own process, so this layer imports nothing above it.
_PRELOAD = ["numpy", "pyarrow", "soundfile", "soxr", "torch",
            "audioloader.workers.process_worker", "audioloader.nodes.decode_spectrogram"]


class PoolClosed(Exception):
    """The pool was shut down while a result was awaited (the consumer is being stopped)."""


# ---------------------------------------------------------------------------------------- threads


class ThreadPool:
    """``num_workers`` threads running chunks (one chunk per task), results in submission order."""

    def __init__(self, job: Callable[[Any], Any], num_workers: int, *,
                 initializer: Callable[[], None] | None = None, name: str = "audioloader-worker") -> None:
        self.job = job
        self.num_workers = num_workers
        self._initializer = initializer
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._futures: dict[int, Future] = {}
        self._generation = 0

    def start(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.num_workers, thread_name_prefix=self._name,
                                                initializer=self._initializer)

    def submit(self, seq: int, items: list[Any], into: Any = None) -> None:
        executor = self._executor
        if executor is None:
            raise PoolClosed
        generation = self._generation
        try:
            self._futures[seq] = executor.submit(run_chunk, self.job, items, lambda: self._generation != generation)
        except RuntimeError:  # "cannot schedule new futures after shutdown": shut down from another thread
            raise PoolClosed from None

    def result(self, seq: int, into: Any = None) -> tuple[list[Any], dict[str, Any] | None]:
        future = self._futures.pop(seq, None)
        if future is None:
            raise PoolClosed
        try:
            return future.result(), None
        except CancelledError:
            raise PoolClosed from None

    def cancel(self) -> None:
        """Abandon every submitted chunk (running ones stop after their current item)."""
        self._generation += 1
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()

    def shutdown(self) -> None:
        executor, self._executor = self._executor, None
        self.cancel()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
            # shutdown(wait=True) would join without a word; a worker that does not stop is reported.
            for thread in list(getattr(executor, "_threads", ())):
                join_or_report(thread)


# ---------------------------------------------------------------------------------------- processes


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is unresponsive"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel's out-of-memory killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


class _Worker:
    """The consumer's side of one worker process."""

    def __init__(self, process: Any, conn: Any, slots: list[wire.SharedSlot], control: wire.SharedSlot) -> None:
        self.process = process
        self.conn = conn
        self.slots = slots
        self.control = control


class ProcessPool:
    """``num_workers`` processes running chunks, inputs and results through shared memory.

    Args:
        job: picklable callable (see the module docstring); pickled once, here,
            so an unpicklable job fails at once with a clear message.
        num_workers: processes.
        depth: chunks each worker may have in flight (its slots).
        slot_bytes: initial size of each slot (slots grow to fit).
        start_method: ``"forkserver"``, ``"spawn"`` or ``"fork"`` (None: `choose_start_method` when the
            workers start).
        what: how errors name the workers (e.g. "decode worker").
        arenas: `BatchArenas` whose rows the workers write the results of chunks submitted with them straight
            into (through shared memory), where the consumer would otherwise copy them there.
    """

    def __init__(self, job: Callable[[Any], Any], num_workers: int, *, depth: int = 2,
                 slot_bytes: int = 4 << 20, start_method: str | None = None, what: str = "worker",
                 arenas: BatchArenas | None = None) -> None:
        self.job = job
        self.num_workers = num_workers
        self.depth = depth
        self.slot_bytes = slot_bytes
        self.start_method = start_method
        self.what = what
        self._job_bytes = _pickle_job(job, what)
        self._encode = getattr(job, "encode", None)
        self._results_memory = Recycler(RESULT_RECYCLE_BYTES)  # results are copied out of the slots into these
        self._arenas = arenas if arenas is not None and arenas.row_bytes >= wire.INLINE_BYTES else None
        self._ring: wire.SharedSlot | None = None  # the arenas' shared memory, made at each start
        self._reserved: set[int] = set()  # chunks submitted with rows of the arenas reserved
        self._workers: list[_Worker] = []
        self._generation = 0
        self._in_flight: dict[int, tuple[int, int]] = {}  # chunk seq -> (worker, slot) it went to
        self._free_slots: list[list[int]] = []  # per worker, the slots it holds no chunk in
        self.active = num_workers  # the workers that get new chunks (the first `active`; see `set_active`)
        self._waited = 0.0  # seconds `result` waited for answers, since `take_waited`
        self._closed = threading.Event()
        self._io_lock = threading.Lock()
        # start() and shutdown() exclude each other: a loader stopped (Ctrl-C in the main thread) while a
        # background thread is starting the workers waits for that start to give up, so that no worker
        # outlives the shutdown() call.
        self._lifecycle = threading.RLock()
        self._pid = os.getpid()
        self.method_used: str | None = None  # set by start(), with the reason for it
        self.start_reason = ""

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers and wait until each is ready; a `shutdown` from another thread meanwhile makes
        this stop the ones started and raise `PoolClosed`."""
        with self._lifecycle:
            if self._workers:
                return
            self._closed.clear()
            self._start_workers()

    def _start_workers(self) -> None:
        import multiprocessing

        method, self.start_reason = start_method_and_reason(self.start_method)
        if self.start_method is not None and method != self.start_method:
            warnings.warn(f"audioloader: {self.what} processes start with {method!r}: {self.start_reason}",
                          RuntimeWarning, stacklevel=4)
        self.method_used = method
        context = multiprocessing.get_context(method)
        if self._arenas is not None and self._ring is None:
            self._ring = wire.SharedSlot.create(self._arenas.ring_bytes)
            self._arenas.use_ring(self._ring.view(0, self._ring.size))
        if method == "forkserver":
            context.set_forkserver_preload(_PRELOAD)
        if method == "fork":
            free_mkl_buffers()  # see there: a child could otherwise hang in its first FFT
        try:
            for index in range(self.num_workers):
                if self._closed.is_set():
                    raise PoolClosed
                self._workers.append(self._launch(context, index))
            self._free_slots = [list(range(self.depth)) for _ in self._workers]
            for index, worker in enumerate(self._workers):
                reply = self._receive(worker, f"starting {self.what} {index}")
                if reply[0] != "ready":
                    raise WorkerError(f"{self.what} {index} could not start: {reply[1]}")
        except BaseException:
            self._stop_workers()
            raise

    def _launch(self, context: Any, index: int) -> _Worker:
        ours, theirs = context.Pipe(duplex=True)
        process = context.Process(target=worker_main,
                                  args=(theirs, self._job_bytes, self.depth, os.getpid(), self.what,
                                        self._ring.size if self._ring is not None else 0,
                                        self._arenas.row_bytes if self._arenas is not None else 0),
                                  name=f"audioloader-{self.what.replace(' ', '-')}-{index}", daemon=True)
        try:
            with _main_module_hidden(context.get_start_method() != "fork" and b"__main__" not in self._job_bytes), \
                    forks.interrupt_held() as interrupted:
                process.start()
        except RuntimeError as error:
            raise WorkerError(_start_failed_message(self.what, error)) from error
        try:
            if interrupted:  # Ctrl-C during the start, held back until the process could be stopped (below)
                raise KeyboardInterrupt
            theirs.close()
            forks.forget_in_forked_children(process)  # a child forked from us must not stop it at its exit
            control = wire.SharedSlot.create(8)
            _set_generation(control, self._generation)
            slots = [wire.SharedSlot.create(self.slot_bytes) for _ in range(self.depth)]
            for slot in [control, *slots, *([self._ring] if self._ring is not None else [])]:
                reduction.send_handle(ours, slot.fd, process.pid)
        except BaseException:  # Ctrl-C between the start and the return: this process is in no list yet
            process.kill()
            process.join()
            ours.close()
            raise
        return _Worker(process, ours, slots, control)

    def shutdown(self) -> None:
        """Stop every worker: ask, wait `STOP_GRACE_SECONDS`, then terminate; idempotent. Returns once no
        worker of this pool runs, also when another thread was starting them (that start raises `PoolClosed`)."""
        self._closed.set()  # first: a start under way in another thread gives up instead of waiting for workers
        with self._lifecycle:
            self._stop_workers()

    def _stop_workers(self) -> None:
        self._closed.set()
        workers, self._workers = self._workers, []
        if os.getpid() != self._pid:
            return  # a forked copy of the consumer: the workers are not its children
        for worker in workers:
            _set_generation(worker.control, -1)  # stop the current chunk early
        for worker in workers:
            self._send_stop(worker)
        for worker in workers:
            worker.process.join(STOP_GRACE_SECONDS)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(STOP_GRACE_SECONDS)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        with self._io_lock:  # a consumer thread polling a socket finishes that poll first
            for worker in workers:
                worker.conn.close()
                for slot in [worker.control, *worker.slots]:
                    slot.close()
        if self._ring is not None:  # its file goes; batches still held keep their mapping, the next start a new one
            self._ring.close()
            self._ring = None
        self._in_flight.clear()
        self._reserved.clear()

    # -- work ---------------------------------------------------------------------------------

    def set_active(self, count: int) -> None:
        """Hand new chunks to the first ``count`` workers only (1 to ``num_workers``); the others finish the chunks
        they hold and then wait, started, until they are active again."""
        if not 1 <= count <= self.num_workers:
            raise ValueError(f"count={count}: must be between 1 and num_workers={self.num_workers}")
        self.active = count

    def take_waited(self) -> float:
        """Seconds `result` waited for a worker's answer since the last call (what `Autotuner` is told)."""
        waited, self._waited = self._waited, 0.0
        return waited

    def _pick(self) -> int:
        """The active worker with the fewest chunks in flight (the first of them on a tie), with a free slot.

        Which worker runs a chunk never changes its results: a worker answers its chunks first in, first out,
        and `result` reads chunks in the order they were submitted, from the worker each went to.
        """
        free = self._free_slots
        best = max(range(self.active), key=lambda index: len(free[index]))
        if not free[best]:  # more than active x depth chunks in flight (none of ParallelMap's): any started worker
            best = max(range(self.num_workers), key=lambda index: len(free[index]))
            if not free[best]:
                raise RuntimeError(f"every {self.what} holds {self.depth} chunks (a bug; please report it)")
        return best

    def submit(self, seq: int, items: list[Any], into: Any = None) -> None:
        """Send chunk ``seq``; ``into``: the pool's `BatchArenas` when the chunk's results are to become the rows
        due in them (see `result`)."""
        workers = self._workers
        if not workers or self._closed.is_set():
            raise PoolClosed
        index = self._pick()
        worker, slot = workers[index], self._free_slots[index][0]
        if self._encode is not None:
            items = [self._encode(item) for item in items]
        data, table, size = wire.dumps(items, worker.slots[slot])
        places = None
        if into is not None and into is self._arenas:
            places = into.reserve(seq, len(items))
            self._reserved.add(seq)
        self._send(worker, ("chunk", seq, self._generation, slot, data, table, size, places))
        self._free_slots[index].pop(0)
        self._in_flight[seq] = (index, slot)

    def result(self, seq: int, into: Any = None) -> tuple[list[Any], dict[str, Any] | None]:
        """Chunk ``seq``'s results (copied out of its slot into arrays from ``into.empty(nbytes)``, by default
        reused ones) and the worker's stats delta."""
        workers = self._workers
        if not workers:
            raise PoolClosed
        index, slot = self._in_flight[seq]
        started = time.perf_counter()
        reply = self._receive(workers[index], f"waiting for {self.what} {index}")
        self._waited += time.perf_counter() - started
        del self._in_flight[seq]
        self._free_slots[index].append(slot)
        worker = workers[index]
        kind, got = reply[0], reply[1]
        if got != seq:
            raise WorkerError(f"{self.what} answered chunk {got} where chunk {seq} was due (a bug; please report it)")
        if kind == "cancelled":
            return [], None
        _, _, slot, data, table, size, stats = reply
        results = wire.loads(data, table, worker.slots[slot], size, copy=True,
                             into=self._results_memory if into is None else into, ring=self._ring)
        if seq in self._reserved:
            self._reserved.discard(seq)
            into.settle(seq)
        return [r.to_failure() if isinstance(r, _RemoteFailure) else r for r in results], stats

    def cancel(self) -> None:
        """Abandon every chunk in flight: workers stop them early and their answers are read and dropped.

        A pool with a dead worker (killed, crashed: the error its consumer saw) is shut down instead, so that
        the `start` that follows a reset starts every worker afresh rather than meeting the dead one again.
        """
        if any(worker.process.exitcode is not None for worker in self._workers):
            self.shutdown()
            return
        self._generation += 1
        for worker in self._workers:
            _set_generation(worker.control, self._generation)
        for seq in sorted(self._in_flight):
            index, slot = self._in_flight[seq]
            self._receive(self._workers[index], f"cancelling {self.what} work")
            self._free_slots[index].append(slot)
        self._in_flight.clear()
        self._reserved.clear()  # the rows they were to take are free again (the arenas restart with the stream)

    # -- the socket ---------------------------------------------------------------------------

    def _send(self, worker: _Worker, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            # One writer at a time: a message over 16 KiB (a chunk of remote rows carries their bytes) is
            # written in several pieces, and another thread's message between two of them corrupts the stream.
            with self._io_lock:
                if self._closed.is_set():
                    raise PoolClosed
                worker.conn.send_bytes(data)
        except OSError as error:
            if self._closed.is_set():
                raise PoolClosed from None
            raise WorkerError(f"{self.what} {worker.process.name} {_describe_exit(worker.process.exitcode)}") \
                from error

    def _send_stop(self, worker: _Worker) -> None:
        """Ask a worker to exit, under the lock of `_send` (a stop written into the middle of a chunk message
        that another thread is writing was read by the worker as a broken pickle: ``UnpicklingError``).

        The lock is waited for `STOP_GRACE_SECONDS` at most: a sender blocked on a worker that no longer reads
        (stuck in native code, its socket full) keeps it, and that worker is terminated without a stop.
        """
        if not self._io_lock.acquire(timeout=STOP_GRACE_SECONDS):
            return
        try:
            worker.conn.send_bytes(pickle.dumps(("stop",)))
        except OSError:
            pass  # the worker is gone already
        finally:
            self._io_lock.release()

    def _receive(self, worker: _Worker, doing: str) -> tuple:
        """The worker's next message; raises `PoolClosed` on shutdown, `WorkerError` if it died."""
        while True:
            with self._io_lock:
                if self._closed.is_set():
                    raise PoolClosed
                try:
                    if worker.conn.poll(POLL_SECONDS):
                        return pickle.loads(worker.conn.recv_bytes())
                except (EOFError, OSError):
                    if self._closed.is_set():
                        raise PoolClosed from None
                    worker.process.join(STOP_GRACE_SECONDS)
                if worker.process.exitcode is not None:
                    raise WorkerError(f"{doing}: the process (pid {worker.process.pid}) "
                                      f"{_describe_exit(worker.process.exitcode)}")


@contextlib.contextmanager
def _main_module_hidden(hide: bool):
    """Start processes that do not import the script being run (``__main__``), when ``hide``.

    multiprocessing's spawn and fork-server children import the parent's main
    module first, so that functions defined there can be unpickled; a script
    without the ``if __name__ == "__main__":`` guard would then run again in
    every worker. Our workers need ``__main__`` only when the job refers to
    something defined there (a pickle names its module), so otherwise the main
    module's ``__spec__``/``__file__``, which multiprocessing reads in
    ``Process.start()`` to decide that import, are out of sight for that call:
    scripts without the guard and notebooks work as they do with a fork.
    """
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = {name: main.__dict__[name] for name in ("__spec__", "__file__") if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _set_generation(control: wire.SharedSlot, generation: int) -> None:
    with contextlib.suppress(ValueError, TypeError):
        control.view(0, 8).cast("q")[0] = generation


def _pickle_job(job: Any, what: str) -> bytes:
    try:
        return pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise TypeError(
            f"the {what} job cannot be sent to worker processes: {error}. Functions you pass (augment=...) must "
            "be importable: define them at the top level of a module (not inside a function, not a lambda), or "
            "use threads (workers=al.Workers(kind='thread'))") from error


def _start_failed_message(what: str, error: BaseException) -> str:
    return (f"cannot start {what} processes: {error}. When a script starts worker processes, its own code must "
            "be guarded with `if __name__ == '__main__':` (worker processes import the script); or use threads "
            "(workers=al.Workers(kind='thread'))")
