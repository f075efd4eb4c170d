"""The worker side of `audioloader.workers.pool.ProcessPool`: the loop a worker process runs, and how an
exception raised there travels back to the consumer with its type, attributes and traceback.

`worker_main` reads chunks from its socket, maps the job over them (`run_chunk`, which
the thread pool and the inline pool use too) and answers through the chunk's slot
(`audioloader.workers.wire`). An exception from the job becomes that item's `Failure`;
across the process boundary it travels as a `_RemoteFailure` (pickled exception plus
tblib's plain-data traceback) and is rebuilt in the consumer (`_RemoteFailure.to_failure`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

import tblib

from ..samples import Failure
from . import cuda, forks, memory, wire

#: Seconds between a worker's checks that its consumer process is still alive.
PARENT_CHECK_SECONDS = 1.0


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as text (its ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _rebuild_exception(cls: type, args: tuple, state: dict[str, Any]) -> BaseException:
    """An exception of type ``cls`` with ``args`` and attributes ``state``, without calling its ``__init__``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


def _exception_payload(error: BaseException) -> bytes | None:
    """``error`` pickled so that it unpickles with its type and attributes, or None.

    The default pickling of an exception calls ``type(*args)`` on the way back,
    which fails for the many exceptions whose ``__init__`` takes other arguments
    (keywords, say); then the type, args and attributes are sent instead.
    """
    for candidate in (error, _Rebuild(error)):
        try:
            payload = pickle.dumps(candidate)
            pickle.loads(payload)
            return payload
        except Exception:
            continue
    return None


class _Rebuild:
    def __init__(self, error: BaseException) -> None:
        self.parts = (type(error), error.args, dict(vars(error)))

    def __reduce__(self):
        return _rebuild_exception, self.parts


class _RemoteFailure:
    """An exception from a worker process, made picklable: the exception and its traceback.

    The traceback travels as tblib's plain-data form and is rebuilt on the
    consumer's side, so the exception is raised there with the worker's frames
    (file, line, function) followed by the consumer's, as a thread would give it.
    """

    def __init__(self, error: BaseException) -> None:
        self.text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        self.summary = f"{type(error).__module__}.{type(error).__qualname__}: {error}"
        self.payload = _exception_payload(error)
        try:
            self.frames: dict[str, Any] | None = tblib.Traceback(error.__traceback__).as_dict()
        except Exception:  # a traceback tblib cannot represent: the text below still goes
            self.frames = None

    def to_failure(self) -> Failure:
        error: BaseException
        if self.payload is not None:
            error = pickle.loads(self.payload)
        else:
            error = RuntimeError(f"{self.summary} (in a worker process; the exception could not be pickled)")
        rebuilt = None
        if self.frames is not None:
            with contextlib.suppress(Exception):
                rebuilt = tblib.Traceback.from_dict(self.frames).as_traceback()
        if rebuilt is not None:
            error = error.with_traceback(rebuilt)
        else:
            error.__cause__ = RemoteTraceback(f'\n"""\n{self.text}"""')
        return Failure(error)


def run_chunk(job: Callable[[Any], Any], items: list[Any], cancelled: Callable[[], bool]) -> list[Any]:
    """``job`` over ``items`` in order (an exception becomes a `Failure` result); stops early when ``cancelled()``."""
    results = []
    for item in items:
        if cancelled():
            break
        try:
            results.append(job(item))
        except Exception as error:  # carried as an item, raised in the consumer's thread
            results.append(Failure(error))
    return results


def _exit_with_consumer(consumer: int) -> None:
    """Exit this worker once the consumer process (the one that uses its results) is gone.

    A worker normally exits when its socket closes, but one stuck in native
    code (a decoder that never returns) never reads the socket and would outlive
    a killed training job. Its parent is no guide: a fork server's children keep
    the fork server alive. The check runs in a thread of its own; torch and the
    decoders release the GIL while they work, so it runs even then.
    """
    identity = forks.process_identity(consumer)

    def watch() -> None:
        while forks.process_identity(consumer) == identity:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="audioloader-consumer-watch", daemon=True).start()


def worker_main(conn: Any, job_bytes: bytes, depth: int, consumer: int, what: str = "worker", ring_bytes: int = 0,
                row_bytes: int = 0) -> None:
    """A worker process: read chunks from ``conn``, answer with results, until told to stop, the socket
    closes, or the ``consumer`` process exits. ``what`` names it in errors (e.g. "decode worker").
    ``ring_bytes``: the consumer's shared batch arenas follow the slots on ``conn``; a chunk's result
    buffers of ``row_bytes`` bytes are written straight into the rows the chunk names there."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the consumer; it stops us
    _exit_with_consumer(consumer)
    cuda.refuse_cuda_here(what)  # before the job is unpickled: that runs user code too
    import torch

    torch.set_num_threads(1)
    memory.keep_heap_pages()  # this process holds no results: the next sample's temporaries reuse the last one's pages
    control = wire.SharedSlot(reduction.recv_handle(conn), 8)
    slots = [wire.SharedSlot(reduction.recv_handle(conn), 0) for _ in range(depth)]
    ring = wire.SharedSlot(reduction.recv_handle(conn), ring_bytes) if ring_bytes else None
    try:
        job = pickle.loads(job_bytes)
    except Exception as error:
        conn.send_bytes(pickle.dumps(("failed", f"{type(error).__name__}: {error}. Functions passed to the loader "
                                      "must be importable in a fresh process (defined at the top level of a "
                                      "module, not in a notebook or a script's __main__ without the "
                                      "`if __name__ == '__main__':` guard); or use threads: "
                                      "workers=al.Workers(kind='thread')")))
        return
    conn.send_bytes(pickle.dumps(("ready",)))
    stats = getattr(job, "stats", None)
    prepare = getattr(job, "prepare", None)
    generation_view = control.view(0, 8).cast("q")
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the consumer went away
        if message[0] == "stop":
            return
        _, seq, generation, slot_index, data, table, size, places = message
        slot = slots[slot_index]

        def cancelled(generation: int = generation) -> bool:
            return generation_view[0] != generation

        items = wire.loads(data, table, slot, size, copy=False)
        try:
            if prepare is not None and not cancelled():
                items = prepare(items)
            results = run_chunk(job, items, cancelled)
        except Exception as error:  # prepare failed (e.g. a shard changed): every item of the chunk fails with it
            results = [Failure(error)] * len(items)
        del items  # views of the slot, about to be overwritten
        if cancelled():
            reply: tuple = ("cancelled", seq)
        else:
            results = [_RemoteFailure(r.error) if isinstance(r, Failure) else r for r in results]
            delta = stats.drain() if stats is not None and hasattr(stats, "drain") else None
            data, table, size = wire.dumps(results, slot, places, ring, row_bytes)
            reply = ("done", seq, slot_index, data, table, size, delta)
        try:
            conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            return
