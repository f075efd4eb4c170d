"""CUDA and worker processes: a process that uses CUDA is never forked, and no worker process uses CUDA.

A child forked from a process that has initialised CUDA inherits the parent's
CUDA objects (tensors, pinned buffers, the caching allocators) but not a usable
CUDA context: the first CUDA call in it fails, and when that call is made from
C++ where no exception may leave (a tensor freed by the child's garbage
collector, say) the child aborts with SIGABRT (``terminate called after throwing
an instance of 'c10::AcceleratorError' ... CUDA error: initialization error``).
Users move their model to the GPU before they build their loaders, so this is the
normal order, not a corner case. Two rules keep it away:

- `fork_unsafe_reason` says why this process must not be forked for workers (CUDA
  initialised, or the CUDA driver loaded); `audioloader.workers.pool` then starts
  them from a fork server (or spawns them) instead.
- `refuse_cuda_here` runs first in every worker process: CUDA initialisation there
  raises `CudaInWorkerError` (a ``WorkerError``) that says device work belongs in
  the main process (``AudioLoader(device="cuda")``), and the process sees no CUDA
  device (``CUDA_VISIBLE_DEVICES=""``), so code that picks its device with
  ``torch.cuda.is_available()`` runs on the CPU and native paths that bypass
  Python (``pin_memory()``) fail with an error instead of making a context.

Nothing here initialises CUDA or imports torch: the checks read what is loaded.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import CudaInWorkerError

#: What a worker process raises when it would initialise CUDA.
CUDA_IN_WORKER_MESSAGE = (
    "audioloader: code running in a {what} process tried to initialise CUDA. Worker processes never use "
    "CUDA (each would hold its own context; a forked one crashes): device work belongs in the main process. "
    "Pass device='cuda' to AudioLoader to compute the features (and SpecAugment, Mixup) per batch on the GPU, "
    "move batches to the GPU in your training loop, and keep augment= functions on CPU tensors or NumPy "
    "(or use Workers(kind='thread'), whose threads share the main process's CUDA)")

#: Marks a process as an audioloader worker (set by `refuse_cuda_here`; inherited by what the worker starts).
IN_WORKER_ENV = "AUDIOLOADER_WORKER"


def fork_unsafe_reason() -> str | None:
    """Why worker processes must not be forked from this process because of CUDA, or None when they may be.

    Reads ``torch.cuda.is_initialized()`` (without importing torch: a process that
    has not imported it has not initialised CUDA through it) and whether the CUDA
    driver (``libcuda``) is mapped into this process: a CUDA stream, pinned memory,
    ``torch.cuda.is_available()`` or another library (CuPy, JAX) load it without
    setting torch's flag, and a forked child cannot use it either.
    """
    cuda = sys.modules.get("torch.cuda")
    is_initialized = getattr(cuda, "is_initialized", None)
    if is_initialized is not None and is_initialized():
        return "CUDA is initialised in this process (torch.cuda.is_initialized())"
    if _cuda_driver_loaded():
        return ("the CUDA driver is loaded in this process (libcuda: torch.cuda.is_available(), a CUDA stream, "
                "pinned memory or another library used CUDA)")
    return None


def _cuda_driver_loaded() -> bool:
    """Whether ``libcuda.so`` is mapped into this process (Linux; False where /proc cannot tell)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return any(b"/libcuda.so" in line for line in maps)
    except OSError:
        return False


class _Refusal:
    """Stands in for ``torch.cuda._lazy_init`` in a worker: raises `CudaInWorkerError` instead of initialising."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise CudaInWorkerError(CUDA_IN_WORKER_MESSAGE.format(what=self.what))


def refuse_cuda_here(what: str = "worker") -> None:
    """In a worker process, before any user code runs: CUDA initialisation raises `CudaInWorkerError`.

    torch initialises CUDA lazily through ``torch.cuda._lazy_init`` (from Python
    and from C++: ``tensor.cuda()``, ``torch.zeros(..., device="cuda")``,
    ``torch.cuda.current_device()``...); it is replaced, in ``torch.cuda`` and in
    its submodules that imported it by name. Hiding the devices catches what
    bypasses it. ``what`` names the worker in the message (e.g. "decode worker").
    """
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ[IN_WORKER_ENV] = "1"
    import torch.cuda

    original = torch.cuda._lazy_init
    if isinstance(original, _Refusal):
        return
    refusal = _Refusal(what)
    for name, module in list(sys.modules.items()):
        if (name == "torch.cuda" or name.startswith("torch.cuda.")) and getattr(module, "_lazy_init", None) is original:
            module._lazy_init = refusal
