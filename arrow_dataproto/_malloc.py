"""glibc's heap in a process that receives without copying.

glibc's ``malloc`` serves a request above its *mmap threshold* (128 KiB at start) with a
mapping of its own, and when such a block is freed it raises the threshold to that
block's size (at most 32 MiB on 64-bit) and its *trim threshold* (how much free memory
the heap may keep at its top) to twice that: mallopt(3), ``M_MMAP_THRESHOLD``. A process
that copies what it receives (plain pickle, verl's numpy mode, ``copy=True``) frees
large blocks every step, so its thresholds soon sit at 32 and 64 MiB and its heap keeps
the memory of one step's temporaries for the next. A process that receives views frees
no such block: its thresholds stay where its own temporaries put them, glibc gives the
heap's top back to the system after each step, and the next step's temporaries fault in
fresh pages. In verl's worker group on CPU (``benchmarks/bench_verl_held.py``) that was
2,000-3,800 page faults a step in each worker's compute, which took 21 ms of CPU instead of 12.

:func:`raise_thresholds` frees one block of the largest size that moves the thresholds,
once per process: the process then keeps its memory as one that once copied a large
batch does, retaining up to 64 MiB of freed heap for reuse. The block is mapped and
unmapped, not written. Where the user has set a threshold (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_``, their
``GLIBC_TUNABLES`` or ``mallopt``), glibc keeps the thresholds fixed and this changes
nothing; off glibc, or on a 32-bit one, it does nothing either.
"""

from __future__ import annotations

import ctypes
import mmap

__all__ = ["raise_thresholds"]

_LARGEST = 32 * 2**20
"""glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit: a freed mapped block up to this size raises the thresholds."""

_done = False


def _glibc() -> ctypes.CDLL | None:
    """This process's C library, if it is glibc on a 64-bit machine."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(None)  # Windows: TypeError
        libc.gnu_get_libc_version  # only glibc has it
    except (OSError, AttributeError, TypeError):
        return None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.restype = None
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def raise_thresholds() -> bool:
    """Move glibc's mmap and trim thresholds to 32 and 64 MiB as a freed 32 MiB block does,
    the first time it is called in this process; ``True`` where it freed that block."""
    global _done
    if _done:
        return False
    _done = True
    libc = _glibc()
    if libc is None:
        return False
    # The mapped block's size is the request plus a header, rounded up to pages: keep it at most _LARGEST.
    block = libc.malloc(_LARGEST - 2 * mmap.PAGESIZE)
    libc.free(block)
    return block is not None
