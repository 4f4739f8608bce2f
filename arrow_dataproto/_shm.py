"""Copy-on-write views of buffers that live in shared memory (Ray's object store).

A Ray worker sees the object store as one shared mapping of a deleted tmpfs
file (objects larger than the store: of another deleted file). Viewing an
object there is zero-copy but not private: an in-place write reaches every
reader. :func:`private_views` maps the pages under a set of buffers a second
time with ``MAP_PRIVATE``: reads come from the same physical pages (no copy),
and a write copies only the page it touches, in this process alone.

How the file is reached: this process holds no descriptor on it, the raylet
does. ``/proc/<raylet>/fd/<n>`` opens with ptrace-read access (the same user);
the raylet is this worker's parent, or, for a driver, found by name in
``/proc``. A file that still has a name is opened by it. Every candidate is
checked against the device and inode of the mapping before it is used.

Lifetime: a private mapping shows the file's *current* contents in every page
it has not written, so it must not outlive the object. Each view keeps the
original buffers (and so the Ray object, pinned) alive; the mapping is
unmapped, and the object released, when the last view dies.

Where a buffer cannot be mapped so (not Linux, no ``/proc``, a buffer in
ordinary memory as Ray's inlined small objects are, no reachable descriptor,
``mmap`` refused), it is copied instead: :func:`private_views` never returns a
shared view. A reason that holds for the whole process is logged once and
kept for :func:`unavailable_reason`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import queue
import sys
import threading
from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

__all__ = ["private_views", "unavailable_reason"]

log = logging.getLogger("arrow_dataproto")

PROC = "/proc"  # tests point this elsewhere to play a machine without /proc
_PAGE = mmap.PAGESIZE
_DELETED = " (deleted)"

_process_reason: str | None = None  # why copy-on-write cannot work in this process, once known


def unavailable_reason() -> str | None:
    """Why shared-memory buffers are copied rather than mapped copy-on-write in
    this process (``None``: no such reason is known; per-buffer fallbacks, such
    as Ray's inlined small objects, are not reasons of the process)."""
    if not sys.platform.startswith("linux"):
        return f"copy-on-write mapping needs Linux /proc (this is {sys.platform})"
    return _process_reason


def _give_up(reason: str) -> None:
    """Record (and log, once per process) a reason that holds for the whole process."""
    global _process_reason
    if _process_reason is None:
        _process_reason = reason
        log.warning("arrow-dataproto: received tensors are copied, not mapped copy-on-write: %s", reason)


# ---------------------------------------------------------------- the mappings of this process


@dataclass(frozen=True)
class _Region:
    """One shared file mapping of this process, as ``/proc/self/maps`` lists it."""

    start: int
    end: int
    offset: int  # file offset of ``start``
    dev: int
    ino: int
    path: str


def _shared_regions(addresses: Sequence[int]) -> dict[int, _Region]:
    """For each address, the shared file mapping of this process that holds it (others are absent)."""
    found: dict[int, _Region] = {}
    pending = sorted(set(addresses))
    with open(f"{PROC}/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[1][3] != "s":  # anonymous or private: not a store
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = [a for a in pending if start <= a < end]
            if not inside:
                continue
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            region = _Region(start, end, int(fields[2], 16), os.makedev(major, minor), int(fields[4]), fields[5].rstrip("\n"))
            for a in inside:
                found[a] = region
            pending = [a for a in pending if a not in found]
            if not pending:
                break
    return found


# ---------------------------------------------------------------- a descriptor on the file


_holders: dict[tuple[int, int], str] = {}  # (dev, ino) -> a /proc path that opened that file last time


def _open_matching(path: str, dev: int, ino: int) -> int | None:
    """``path`` opened read-only if it is the file ``(dev, ino)``, else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) == (dev, ino):
        return fd
    os.close(fd)
    return None


def _raylets() -> list[int]:
    pids = []
    for entry in os.listdir(PROC):
        if entry.isdigit():
            try:
                with open(f"{PROC}/{entry}/comm") as comm:
                    if comm.read().strip() == "raylet":
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _open_region_file(region: _Region) -> int:
    """A read-only descriptor on the file behind ``region``; :class:`OSError` saying why not."""
    key = (region.dev, region.ino)
    known = _holders.get(key)
    if known is not None:
        fd = _open_matching(known, *key)
        if fd is not None:
            return fd
    if not region.path.endswith(_DELETED):
        fd = _open_matching(region.path, *key)
        if fd is not None:
            return fd
    denied = []
    for pid in dict.fromkeys([os.getppid(), *_raylets()]):  # the parent first: a worker's raylet
        try:
            descriptors = os.listdir(f"{PROC}/{pid}/fd")
        except OSError as e:
            denied.append(f"pid {pid}: {e.strerror}")
            continue
        for n in descriptors:
            path = f"{PROC}/{pid}/fd/{n}"
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == key:
                fd = _open_matching(path, *key)
                if fd is not None:
                    _holders[key] = path
                    return fd
    detail = f" ({'; '.join(denied)})" if denied else ""
    raise OSError(f"no process here holds an openable descriptor on {region.path}{detail}")


# ---------------------------------------------------------------- private mappings


def _libc() -> ctypes.CDLL | None:
    """libc with the prototypes used below; ``None`` off Linux, where nothing is mapped."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.restype = ctypes.c_int
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


_LIBC = _libc()
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_POPULATE_READ = 22  # Linux 5.14+: fill the page tables with the file's pages, copying nothing


class _Releaser:
    """Unmaps collected mappings on a background thread, then lets go of their sources.

    Tearing down the page tables of a large mapping takes milliseconds per GiB;
    doing it here keeps it off the path of the code that dropped the last tensor.
    The order is what makes it safe: the mapping goes first, the buffers that pin
    the Ray object after it. Started on first use, and again in a forked child.
    """

    def __init__(self) -> None:
        self.pid: int | None = None  # the process whose thread serves ``queue``
        self.queue: queue.SimpleQueue = queue.SimpleQueue()

    def release(self, address: int, length: int, sources: list) -> None:
        if self.pid != os.getpid():
            work: queue.SimpleQueue = queue.SimpleQueue()
            try:
                threading.Thread(target=self._run, args=(work,), name="adp-unmap", daemon=True).start()
            except RuntimeError:  # the interpreter is shutting down: no new threads
                assert _LIBC is not None  # a mapping exists, so libc was loaded
                _LIBC.munmap(address, length)
                return
            self.pid, self.queue = os.getpid(), work
        self.queue.put((address, length, sources))

    @staticmethod
    def _run(work: queue.SimpleQueue) -> None:
        assert _LIBC is not None  # only started for a mapping, so libc was loaded
        munmap = _LIBC.munmap
        while True:
            address, length, sources = work.get()
            munmap(address, length)
            del sources


_releaser = _Releaser()


class _PrivateMapping:
    """Owns one ``MAP_PRIVATE`` mapping and the buffers it mirrors; released when collected.

    Mapped with ``libc.mmap`` rather than :class:`mmap.mmap`, which would keep a
    duplicate descriptor open per mapping. The page tables are filled up front
    with ``MADV_POPULATE_READ`` (one call, instead of a fault per page on first
    read; ``MAP_POPULATE`` would copy every page of a writable private mapping);
    older kernels refuse it, and pages are then mapped as they are read.
    """

    __slots__ = ("address", "length", "sources")

    def __init__(self, fd: int, file_offset: int, length: int, sources: list[pa.Buffer]):
        if _LIBC is None:
            raise OSError(f"copy-on-write mapping needs Linux (this is {sys.platform})")
        address = _LIBC.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, file_offset)
        if address in (None, _MAP_FAILED):
            errno = ctypes.get_errno()
            raise OSError(errno, f"mmap of {length} bytes: {os.strerror(errno)}")
        self.address, self.length = address, length
        _LIBC.madvise(address, length, _MADV_POPULATE_READ)
        self.sources = sources  # keeps the object (pinned by these buffers) alive as long as the mapping

    def __del__(self, release=_releaser.release) -> None:  # bound early: usable during interpreter exit
        release(self.address, self.length, self.sources)


def _map_group(region: _Region, buffers: list[pa.Buffer]) -> list[pa.Buffer]:
    """Private views of ``buffers`` (all inside ``region``) over one new mapping of their pages."""
    first = min(b.address for b in buffers)
    last = max(b.address + b.size for b in buffers)
    file_start = region.offset + (first - region.start)
    aligned = file_start - file_start % _PAGE
    skip = file_start - aligned
    length = -(-(skip + last - first) // _PAGE) * _PAGE
    fd = _open_region_file(region)
    try:
        mapping = _PrivateMapping(fd, aligned, length, buffers)
    finally:
        os.close(fd)
    whole = pa.foreign_buffer(mapping.address, length, base=mapping)
    return [whole.slice(skip + b.address - first, b.size) for b in buffers]


def private_views(buffers: Sequence[pa.Buffer]) -> list[pa.Buffer]:
    """``buffers`` again, each either a copy-on-write view (when it lies in a shared
    file mapping, such as Ray's object store) or a private copy: never a view that
    a write could carry to another process, nor one that another process's write
    could change.

    Zero-copy for mapped buffers: one ``mmap`` per shared region the buffers lie
    in (an object is one region), whatever their number. Empty buffers are
    returned as they are.
    """
    out: list[pa.Buffer | None] = [b if b.size == 0 else None for b in buffers]
    wanted = [i for i, b in enumerate(buffers) if b.size]
    if wanted and unavailable_reason() is None:
        try:
            regions = _shared_regions([buffers[i].address for i in wanted])
        except OSError as e:
            _give_up(f"{PROC}/self/maps is not readable ({e.strerror or e})")
            regions = {}
        groups: dict[_Region, list[int]] = {}
        for i in wanted:
            region = regions.get(buffers[i].address)
            if region is not None and buffers[i].address + buffers[i].size <= region.end:
                groups.setdefault(region, []).append(i)
        for region, members in groups.items():
            try:
                views = _map_group(region, [buffers[i] for i in members])
            except OSError as e:
                _give_up(str(e))
                break
            for i, view in zip(members, views):
                out[i] = view
    return [b if b is not None else _copy(buffers[i]) for i, b in enumerate(out)]


def _copy(buffer: pa.Buffer) -> pa.Buffer:
    """A private, 64-byte aligned copy of ``buffer``."""
    copy = pa.allocate_buffer(buffer.size)
    pa.FixedSizeBufferWriter(copy).write(buffer)
    return copy
