"""Copy-on-write views of buffers in Ray's object store, and copies of everything else.

Where copy-on-write applies: only to buffers that lie in a shared file mapping
whose file a **raylet** holds open, i.e. Ray's object store (its tmpfs file,
and its fallback allocations for objects larger than the store). Objects there
are sealed: nobody writes them while they are pinned, and the store never
truncates its file. Every other buffer is copied: ordinary memory (Ray's
inlined small objects, plain ``pickle.loads``) and every other kind of shared
memory (``multiprocessing.shared_memory``, a ``MAP_SHARED`` file, torch's shared
memory), which its owner may write (a private mapping shows the file's changes
on the pages it has not copied) or truncate (a mapping of a truncated file
raises ``SIGBUS``). :func:`private_views` never returns a shared view.

How: a Ray worker sees the store as one shared mapping of a deleted file that
the raylet holds open; ``/proc/<raylet>/fd/<n>`` opens with ptrace-read access
(the same user; the raylet is a worker's parent, or, for a driver, found by
name in ``/proc``), checked against the mapping's device and inode, found once
per file and process. The first object received in a store mapping maps that
whole mapping a second time with ``MAP_PRIVATE`` (its *twin*, kept for the
process's life); each object is a lease on its bytes there. Reads come from the
store's own pages (no copy). Nothing is mapped up front: a page's table entry is
filled when the page is first read, as for any view of the store (a receiver
pays only for the pages it reads), and it stays, serving every later object in
the same memory: receiving costs what a zero-copy view costs. A write copies
only the page it touches, in this process alone.

Lifetime: an unwritten page of the twin shows the file's *current* contents, so
a lease must not outlive its object: each view keeps the original buffers (and
so the Ray object, pinned) alive. When the last view dies, a background thread
finds the lease's written (private) pages in ``/proc/self/pagemap``, drops them
(``MADV_DONTNEED``: they read the store's bytes again) and maps the store's pages
there again (``MADV_POPULATE_READ``, so that the next object in that memory is read
without a fault per page), then lets the object go.
Two leases never hold the same bytes (an object received twice while its first
views live gets a mapping of its own), and a page shared with a live
neighbouring lease is dropped only by the last of them; a twin whose store
mapping is gone from this process is unmapped at the next receive.

After ``os.fork()`` the child's inherited views are no longer pinned by
anything (the pin is the parent's Ray client's): the child copies the pages of
every live lease at once (they become its own, stable memory; the parent is
untouched). Forking a process that holds many received tensors costs that copy
in each child; drop them, or receive with ``copy=True``, before forking.

Where a store buffer cannot be mapped so (not Linux, no ``/proc``, the
raylet's descriptors unreadable, ``mmap`` refused), it is copied; a reason that
holds for the whole process is logged once and kept for
:func:`unavailable_reason`.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import itertools
import logging
import mmap
import os
import queue
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

__all__ = ["private_views", "unavailable_reason"]

log = logging.getLogger("arrow_dataproto")

PROC = "/proc"  # tests point this elsewhere to play a machine without /proc
_PAGE = mmap.PAGESIZE
_DELETED = " (deleted)"

_process_reason: str | None = None  # why copy-on-write cannot work in this process, once known


def unavailable_reason() -> str | None:
    """Why Ray store buffers are copied rather than mapped copy-on-write in this
    process (``None``: no such reason is known; per-buffer fallbacks, such as
    Ray's inlined small objects or other shared memory, are not reasons of the process)."""
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


_SMALL = 64 << 20
"""Buffers of at most this many bytes in all that lie in mappings which were neither shared
nor file-backed at the last read of ``/proc/self/maps`` are copied without reading it again:
the read costs 2-8 ms in a process with torch or verl loaded (500-1800 mappings), as much as
copying 16-64 MiB, and it would be paid on every receive in ordinary memory (Ray's inlined
objects, plain ``pickle.loads`` of bytes from a pipe or socket). A mapping replaced since by a
store mapping (one of Ray's fallback allocations, made only when the store is full) is then
copied, never viewed (safe); larger buffers always read the maps."""
_plain: tuple[list[int], list[int]] = ([], [])  # starts and ends of the other mappings at the last read


def _in_plain_memory(addresses: Sequence[int]) -> bool:
    """Whether every address lay in a private or anonymous mapping at the last read of the maps."""
    starts, ends = _plain
    for a in addresses:
        i = bisect.bisect_right(starts, a) - 1
        if i < 0 or a >= ends[i]:
            return False
    return True


def _shared_regions(addresses: Sequence[int]) -> tuple[dict[int, _Region], set[_Region]]:
    """For each address, the shared file mapping of this process that holds it
    (others are absent); and every shared file mapping of this process. Notes the
    other mappings for :func:`_in_plain_memory`."""
    global _plain
    found: dict[int, _Region] = {}
    every: set[_Region] = set()
    starts: list[int] = []
    ends: list[int] = []
    pending = sorted(set(addresses))
    with open(f"{PROC}/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if len(fields) < 6 or fields[1][3] != "s" or fields[4] == "0":  # anonymous or private: not a store
                starts.append(start)
                ends.append(end)
                continue
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            region = _Region(start, end, int(fields[2], 16), os.makedev(major, minor), int(fields[4]), fields[5].rstrip("\n"))
            every.add(region)
            for a in pending:
                if start <= a < end:
                    found[a] = region
            if found:
                pending = [a for a in pending if a not in found]
    _plain = (starts, ends)
    return found, every


# ---------------------------------------------------------------- the raylet's descriptor on the file


class _NotTheStore(Exception):
    """The file is not held open by any raylet here: not known to be immutable, so copied."""


_holders: dict[tuple[int, int], str] = {}  # (dev, ino) -> the raylet's /proc path that opened that file last time


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


def _is_raylet(pid: int) -> bool:
    try:
        with open(f"{PROC}/{pid}/comm") as comm:
            return comm.read().strip() == "raylet"
    except OSError:
        return False


def _raylets() -> list[int]:
    return [int(entry) for entry in os.listdir(PROC) if entry.isdigit() and _is_raylet(int(entry))]


def _open_store_file(region: _Region) -> int:
    """A read-only descriptor on the file behind ``region``, through a raylet that holds it.

    :class:`_NotTheStore` if no raylet here holds it; :class:`OSError` if one
    may, but its descriptors cannot be read (a reason of the process).
    """
    key = (region.dev, region.ino)
    known = _holders.get(key)
    if known is not None:
        fd = _open_matching(known, *key)
        if fd is not None:
            return fd
    denied = []
    parent = os.getppid()
    for pid in dict.fromkeys([parent] * _is_raylet(parent) + _raylets()):  # the parent first: a worker's raylet
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
                denied.append(f"pid {pid}: {path} does not open")
    if denied and "plasma" in region.path:
        raise OSError(f"no process here holds an openable descriptor on {region.path} ({'; '.join(denied)})")
    raise _NotTheStore(region.path)


# ---------------------------------------------------------------- libc


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
_MAP_NORESERVE = 0x4000  # no commit charge for the twin: it copies only the pages written
_MADV_DONTNEED = 4
_MADV_POPULATE_READ = 22  # Linux 5.14+ (older kernels refuse it: pages are then mapped as read)


def _map_private(fd: int, offset: int, length: int) -> int:
    """The address of a new ``MAP_PRIVATE`` read-write mapping of ``fd``; :class:`OSError` if refused.

    ``libc.mmap`` rather than :class:`mmap.mmap`, which would keep a duplicate
    descriptor open per mapping.
    """
    if _LIBC is None:
        raise OSError(f"copy-on-write mapping needs Linux (this is {sys.platform})")
    flags = mmap.MAP_PRIVATE | _MAP_NORESERVE
    address = _LIBC.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, offset)
    if address in (None, _MAP_FAILED):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mmap of {length} bytes: {os.strerror(errno)}")
    return address


def _private_pages(address: int, pages: int) -> list[tuple[int, int]]:
    """``(first page, count)`` runs of the pages from ``address`` that this process
    has written (anonymous, or swapped out), from ``/proc/self/pagemap``; :class:`OSError` if unreadable."""
    with open(f"{PROC}/self/pagemap", "rb", buffering=0) as pagemap:
        raw = os.pread(pagemap.fileno(), pages * 8, address // _PAGE * 8)
    entries = np.frombuffer(raw, dtype=np.uint64)
    if len(entries) != pages:
        raise OSError(f"/proc/self/pagemap gave {len(entries)} of {pages} entries")
    present, swapped, file_page = ((entries >> np.uint64(bit)) & np.uint64(1) for bit in (63, 62, 61))
    written = np.flatnonzero((present & ~file_page | swapped).astype(bool))
    if not written.size:
        return []
    breaks = np.flatnonzero(np.diff(written) != 1)
    starts = np.concatenate((written[:1], written[breaks + 1]))
    ends = np.concatenate((written[breaks], written[-1:])) + 1
    return [(int(s), int(e - s)) for s, e in zip(starts, ends)]


def _drop_written(address: int, pages: int) -> None:
    """Drop the private pages among ``pages`` pages from ``address`` (all of them if pagemap
    is unreadable), then map the file's pages there again (on this background thread), so
    that the next object received in that memory reads without a fault per page, as if it
    had never been written."""
    assert _LIBC is not None
    try:
        runs = _private_pages(address, pages)
    except OSError:
        runs = [(0, pages)]
    for first, count in runs:
        _LIBC.madvise(address + first * _PAGE, count * _PAGE, _MADV_DONTNEED)
        _LIBC.madvise(address + first * _PAGE, count * _PAGE, _MADV_POPULATE_READ)


# ---------------------------------------------------------------- releasing on a background thread


class _Releaser:
    """Runs releases (unmapping, dropping written pages, then letting go of the
    buffers that pin the Ray object) on a background thread, off the path of the
    code that dropped the last tensor. Started on first use, and again in a forked child."""

    def __init__(self) -> None:
        self.pid: int | None = None  # the process whose thread serves ``queue``
        self.queue: queue.SimpleQueue = queue.SimpleQueue()

    def release(self, work: Callable[..., None], *args) -> None:
        if self.pid != os.getpid():
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            try:
                threading.Thread(target=self._run, args=(jobs,), name="adp-unmap", daemon=True).start()
            except RuntimeError:  # the interpreter is shutting down: no new threads
                work(*args)
                return
            self.pid, self.queue = os.getpid(), jobs
        self.queue.put((work, args))

    @staticmethod
    def _run(jobs: queue.SimpleQueue) -> None:
        while True:
            work, args = jobs.get()
            work(*args)
            del work, args


_releaser = _Releaser()


# ---------------------------------------------------------------- twins and leases


_lock = threading.Lock()  # guards every twin's ``leases``, and ``_twins``
_serials = itertools.count()


class _Twin:
    """A ``MAP_PRIVATE`` mapping of one whole shared store mapping of this process.

    ``leases``: serial -> ``(lo, hi)``, the byte offsets of each live object's
    buffers in it; no two overlap, and a private (written) page of the twin
    always lies under a live lease.
    """

    __slots__ = ("region", "address", "leases")

    def __init__(self, region: _Region, fd: int):
        self.region = region
        self.address = _map_private(fd, region.offset, region.end - region.start)
        self.leases: dict[int, tuple[int, int]] = {}

    def admit(self, lo: int, hi: int) -> int | None:
        """Register bytes ``[lo, hi)`` as a new lease (under ``_lock``); ``None`` if they
        overlap a live lease's bytes, or share a written page with one."""
        first, last = lo // _PAGE, -(-hi // _PAGE)
        shared: set[int] = set()
        for a, b in self.leases.values():
            if a < hi and lo < b:  # the same object, received again while its views live
                return None
            shared.update(p for p in (first, last - 1) if a // _PAGE <= p < -(-b // _PAGE))
        try:
            if any(_private_pages(self.address + p * _PAGE, 1) for p in shared):
                return None
        except OSError:
            return None
        serial = next(_serials)
        self.leases[serial] = (lo, hi)
        return serial

    def end(self, serial: int, sources: list) -> None:
        """The lease's views are gone: drop its written pages, then let its object go."""
        lo, hi = self.leases[serial]
        first, last = lo // _PAGE, -(-hi // _PAGE)
        if last - first > 2:  # interior pages: no other lease can share them
            _drop_written(self.address + (first + 1) * _PAGE, last - first - 2)
        with _lock:  # the edge pages, which a neighbour admitted meanwhile may share
            others = [span for s, span in self.leases.items() if s != serial]
            held = {p for p in (first, last - 1) for a, b in others if a // _PAGE <= p < -(-b // _PAGE)}
            for p in {first, last - 1} - held:
                _drop_written(self.address + p * _PAGE, 1)
            del self.leases[serial]  # last: a written page lies under a live lease at every moment
        del sources

    def unmap(self) -> None:
        assert _LIBC is not None
        _LIBC.munmap(self.address, self.region.end - self.region.start)


class _Lease:
    """The base of one object's views in a twin; pins ``sources`` (the Ray buffers) while alive."""

    __slots__ = ("twin", "serial", "sources")

    def __init__(self, twin: _Twin, serial: int, sources: list[pa.Buffer]):
        self.twin, self.serial, self.sources = twin, serial, sources

    def __del__(self, release=_releaser.release) -> None:  # bound early: usable during interpreter exit
        release(self.twin.end, self.serial, self.sources)


_twins: dict[_Region, _Twin] = {}


def _twin_of(region: _Region, every: set[_Region]) -> _Twin:
    """The twin of ``region``, mapped on first use; twins of mappings gone from this
    process (a fallback allocation released) are unmapped if no lease is left on them."""
    with _lock:
        for gone in [r for r, t in _twins.items() if r not in every and not t.leases]:
            _twins.pop(gone).unmap()
        twin = _twins.get(region)
    if twin is not None:
        return twin
    fd = _open_store_file(region)
    try:
        fresh = _Twin(region, fd)
    finally:
        os.close(fd)
    with _lock:
        twin = _twins.setdefault(region, fresh)
    if twin is not fresh:  # another thread mapped it meanwhile
        fresh.unmap()
    return twin


class _PrivateMapping:
    """One object's own ``MAP_PRIVATE`` mapping (for an object whose bytes a live
    lease of the twin holds already) and the buffers it mirrors; unmapped when collected."""

    __slots__ = ("address", "length", "sources", "__weakref__")

    def __init__(self, fd: int, file_offset: int, length: int, sources: list[pa.Buffer]):
        self.address, self.length = _map_private(fd, file_offset, length), length
        self.sources = sources  # keeps the object (pinned by these buffers) alive as long as the mapping
        _own_mappings.add(self)

    def __del__(self, release=_releaser.release) -> None:
        release(_unmap, self.address, self.length, self.sources)


_own_mappings: weakref.WeakSet = weakref.WeakSet()


def _unmap(address: int, length: int, sources: list) -> None:
    assert _LIBC is not None
    _LIBC.munmap(address, length)
    del sources


def _map_group(region: _Region, buffers: list[pa.Buffer], every: set[_Region]) -> list[pa.Buffer]:
    """Private views of ``buffers`` (all inside ``region``): a lease on the region's
    twin, else a mapping of their own pages."""
    first = min(b.address for b in buffers)
    last = max(b.address + b.size for b in buffers)
    twin = _twin_of(region, every)
    with _lock:
        serial = twin.admit(first - region.start, last - region.start)
    if serial is not None:
        whole = pa.foreign_buffer(twin.address + (first - region.start), last - first, base=_Lease(twin, serial, buffers))
    else:
        file_start = region.offset + (first - region.start)
        aligned = file_start - file_start % _PAGE
        skip = file_start - aligned
        length = -(-(skip + last - first) // _PAGE) * _PAGE
        fd = _open_store_file(region)
        try:
            mapping = _PrivateMapping(fd, aligned, length, buffers)
        finally:
            os.close(fd)
        whole = pa.foreign_buffer(mapping.address + skip, last - first, base=mapping)
    return [whole.slice(b.address - first, b.size) for b in buffers]


def _still_mapped(region: _Region) -> bool:
    """Whether this process still maps ``region``'s file over ``region`` (one ``stat``)."""
    try:
        st = os.stat(f"{PROC}/self/map_files/{region.start:x}-{region.end:x}")
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (region.dev, region.ino)


def _known_regions(addresses: Sequence[int]) -> tuple[dict[int, _Region], set[_Region]] | None:
    """:func:`_shared_regions` without reading ``/proc/self/maps``, when every address
    lies in a store mapping that has a twin and is still mapped (``None`` otherwise)."""
    with _lock:
        regions = list(_twins)
    found: dict[int, _Region] = {}
    for a in addresses:
        region = next((r for r in regions if r.start <= a < r.end), None)
        if region is None:
            return None
        found[a] = region
    every = {r for r in regions if _still_mapped(r)}
    return (found, every) if set(found.values()) <= every else None


def private_views(buffers: Sequence[pa.Buffer]) -> list[pa.Buffer]:
    """``buffers`` again, each either a copy-on-write view (when it lies in Ray's
    object store) or a private copy: never a view that a write could carry to
    another process, nor one that another process's write could change.

    Zero-copy for store buffers: one lease on the store's twin per object
    (mapped once per process), whatever the number of buffers. Empty buffers
    are returned as they are. Up to :data:`_SMALL` bytes of buffers in memory known
    to be ordinary are copied without reading ``/proc/self/maps`` again.
    """
    out: list[pa.Buffer | None] = [b if b.size == 0 else None for b in buffers]
    wanted = [i for i, b in enumerate(buffers) if b.size]
    addresses = [buffers[i].address for i in wanted]
    small = sum(buffers[i].size for i in wanted) <= _SMALL and _in_plain_memory(addresses)
    if wanted and unavailable_reason() is None and not small:
        known = _known_regions(addresses)
        if known is not None:
            regions, every = known
        else:
            try:
                regions, every = _shared_regions(addresses)
            except OSError as e:
                _give_up(f"{PROC}/self/maps is not readable ({e.strerror or e})")
                regions, every = {}, set()
        groups: dict[_Region, list[int]] = {}
        for i in wanted:
            region = regions.get(buffers[i].address)
            if region is not None and buffers[i].address + buffers[i].size <= region.end:
                groups.setdefault(region, []).append(i)
        for region, members in groups.items():
            try:
                views = _map_group(region, [buffers[i] for i in members], every)
            except _NotTheStore:
                continue  # other shared memory: copied
            except OSError as e:
                _give_up(str(e))
                break
            for i, view in zip(members, views):
                out[i] = view
    return [b if b is not None else _copy(buffers[i]) for i, b in enumerate(out)]


def private_views_by_id(objects: Sequence[Any]) -> dict[int, pa.Buffer]:
    """``id(object) -> private view or copy`` (:func:`private_views`) of each object that
    exports a contiguous buffer, as unpickled out of band: a decoder swaps its state's buffer
    objects for these. ``TypeError``, ``ValueError`` or ``BufferError`` from
    :func:`pyarrow.py_buffer` for an object that exports none, or a strided one."""
    return {id(o): view for o, view in zip(objects, private_views([pa.py_buffer(o) for o in objects]))}


def _copy(buffer: pa.Buffer) -> pa.Buffer:
    """A private, 64-byte aligned copy of ``buffer``."""
    copy = pa.allocate_buffer(buffer.size)
    pa.FixedSizeBufferWriter(copy).write(buffer)
    return copy


# ---------------------------------------------------------------- fork


def _own_every_leased_page() -> None:
    """In a forked child: copy the pages of every live view, so that they no longer
    depend on a Ray pin that only the parent holds (one thread runs here)."""
    global _lock
    _lock = threading.Lock()
    spans = [(t.address + lo, hi - lo) for t in _twins.values() for lo, hi in t.leases.values()]
    spans += [(m.address, m.length) for m in list(_own_mappings)]
    for address, length in spans:
        aligned = address - address % _PAGE
        pages = (ctypes.c_ubyte * (address + length - aligned)).from_address(aligned)
        for offset in range(0, len(pages), _PAGE):
            pages[offset] = pages[offset]  # a write fault: the page becomes this process's copy


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: _lock.acquire(), after_in_parent=lambda: _lock.release(), after_in_child=_own_every_leased_page)
