"""Copy-on-write receive (the default): tensors received through Ray's shared memory
are private mappings of the object store's pages. Reads are zero-copy, a write
stays in the writing process, held tensors keep the object alive and unchanged,
and every case where mapping is impossible falls back to a copy, with its reason.

Scenarios that need their own Ray instance (an object larger than the store, an
unprivileged user) run this file as a script in a child process.
"""

from __future__ import annotations

import copy
import gc
import logging
import mmap
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import DataProto, _shm, receive_mode, receive_options, transport

HERE = os.path.dirname(os.path.abspath(__file__))
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="copy-on-write mapping is Linux-only")
MiB = 1024**2


def mapping_of(address: int) -> tuple[str, int, int, str] | None:
    """``(perms, device, inode, path)`` of the mapping of this process that holds ``address``."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                path = fields[5].strip() if len(fields) > 5 else ""
                return fields[1], os.makedev(major, minor), int(fields[4]), path
    return None


def is_private_view_of_the_store(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in a private mapping of a file that this process also maps shared (the store)."""
    found = mapping_of(t.data_ptr())
    if found is None or found[0][3] != "p" or not found[2]:
        return False
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if fields[1][3] == "s" and int(fields[4]) == found[2]:
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                if os.makedev(major, minor) == found[1]:
                    return True
    return False


def batch(rows: int = 64, cols: int = 4096, seed: int = 0) -> DataProto:
    """About 2 MiB of int64 plus a jagged column: stored in shared memory, not inlined."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (rows, cols), generator=g)
    lengths = torch.randint(1, 100, (rows,), generator=g)
    jagged = torch.nested.nested_tensor([torch.full((int(n),), float(i)) for i, n in enumerate(lengths)], layout=torch.jagged)
    return DataProto(TensorDict({"input_ids": ids, "logp": jagged}, batch_size=[rows]))


def mapped_fraction(t: torch.Tensor) -> float:
    """The fraction of ``t``'s pages that have a page-table entry in this process (``/proc/self/pagemap``, bit 63)."""
    first = t.data_ptr() // mmap.PAGESIZE
    last = -(-(t.data_ptr() + t.numel() * t.element_size()) // mmap.PAGESIZE)
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        raw = os.pread(pagemap.fileno(), (last - first) * 8, first * 8)
    entries = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw), 8)]
    return sum(e >> 63 for e in entries) / (last - first)


def write_everything(dp: DataProto) -> None:
    dp.batch["input_ids"].add_(1)
    dp.batch["logp"].values().add_(1)


# ---------------------------------------------------------------- through Ray


if __name__ != "__main__":
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module

    class _Reader:
        def mode(self):
            return tuple(receive_mode())

        def private_view(self, dp):
            return is_private_view_of_the_store(dp.batch["input_ids"]) and is_private_view_of_the_store(
                dp.batch["logp"].values()
            )

        def write_and_read_back(self, dp):
            before = dp.batch["input_ids"].clone()
            write_everything(dp)
            return torch.equal(dp.batch["input_ids"], before + 1)

        def checksum(self, dp):
            return int(dp.batch["input_ids"].sum()), float(dp.batch["logp"].values().sum())

        def warm_up(self):
            transport.warm_up()
            return len(_shm._twins)

        def modules(self, *received):
            return sorted(sys.modules)

        def mapped_as_read(self, dp):
            ids = dp.batch["input_ids"]
            received = mapped_fraction(ids)
            int(ids[0].sum())  # the first row: 8 of its 512 pages
            one_row = mapped_fraction(ids)
            int(ids.sum())
            return received, one_row, mapped_fraction(ids)

    Reader = ray.remote(num_cpus=0)(_Reader)

    @pytest.fixture(scope="module")
    def readers(ray_session):
        group = [Reader.remote() for _ in range(2)]
        yield group
        for actor in group:
            ray.kill(actor)


def checksum(dp: DataProto) -> tuple[int, float]:
    return int(dp.batch["input_ids"].sum()), float(dp.batch["logp"].values().sum())


@LINUX
def test_the_default_is_copy_on_write_everywhere(readers):
    assert adp.get_receive_options().copy == "on_write"
    assert receive_mode().mode == "on_write"
    assert ray.get(readers[0].mode.remote())[0] == "on_write"
    ref = ray.put(batch())
    assert is_private_view_of_the_store(ray.get(ref).batch["input_ids"])  # driver: ray.get
    assert ray.get(readers[0].private_view.remote(ref))  # actor: argument resolved by Ray
    echoed = ray.get(ray.remote(num_cpus=0)(lambda d: d).remote(ref))  # task argument, then return value
    assert is_private_view_of_the_store(echoed.batch["input_ids"])
    with receive_options(copy=True):
        assert not is_private_view_of_the_store(ray.get(ref).batch["input_ids"])


@LINUX
def test_warm_up_maps_the_store_once(readers):
    assert ray.get(readers[0].warm_up.remote()) == 1  # the store's twin is mapped before the first batch
    assert ray.get(readers[0].private_view.remote(ray.put(batch())))
    assert ray.get(readers[0].warm_up.remote()) == 1


def test_warm_up_imports_nothing_a_receiver_does_not(ray_session):
    """warm_up() primes receiving: a fresh actor that receives a batch with every kind of
    column imports at least what warm_up() does (pyarrow would import pandas for an
    object column encoded in warm_up, which decoding never needs)."""
    dp = batch()
    dp.non_tensor_batch["uid"] = np.array([f"uid-{i}" for i in range(len(dp))], dtype=object)
    receiver, warmed = Reader.remote(), Reader.remote()
    try:
        received = set(ray.get(receiver.modules.remote(ray.put(dp))))
        ray.get(warmed.warm_up.remote())
        warmed_up = set(ray.get(warmed.modules.remote()))
    finally:
        ray.kill(receiver)
        ray.kill(warmed)
    assert "arrow_dataproto._objects" in received and "pandas" not in received
    assert sorted(warmed_up - received) == []


@pytest.mark.parametrize("ray_state", ["not imported", "not installed"])
def test_warm_up_without_ray_round_trips_through_pickle(ray_state):
    """Outside Ray (not imported, or not even installed) warm_up() pickles its batch,
    as its docstring says, and imports no Ray."""
    block = "import sys; sys.modules['ray'] = None\n" if ray_state == "not installed" else ""
    code = block + (
        "import sys\n"
        "from arrow_dataproto import transport\n"
        "transport.warm_up()\n"
        "assert sys.modules.get('ray') is None, 'warm_up imported Ray'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@LINUX
def test_a_receiver_maps_only_the_pages_it_reads(ray_session):
    """Receiving fills no page tables up front (a fresh process pays for the pages it
    reads, as with any view of the store); reading fills them."""
    fresh = Reader.remote()  # a new process: none of the store is mapped in it yet
    try:
        received, one_row, everything = ray.get(fresh.mapped_as_read.remote(ray.put(batch())))
    finally:
        ray.kill(fresh)
    assert received < 0.25  # at most the neighbours of buffers the decoder reads (fault-around)
    assert one_row < 0.25
    assert everything == 1.0


@LINUX
def test_a_write_in_one_receiver_reaches_no_other_reader(readers):
    dp = batch()
    expected = checksum(dp)
    ref = ray.put(dp)
    writer, reader = readers
    assert ray.get(writer.write_and_read_back.remote(ref))  # the writer sees its own write
    assert ray.get(reader.checksum.remote(ref)) == expected  # another actor does not
    mine = ray.get(ref)
    write_everything(mine)
    assert checksum(mine) != expected
    assert checksum(ray.get(ref)) == expected  # nor does the driver, nor the object
    assert checksum(transport.get(ref, copy=False)) == expected
    assert checksum(dp) == expected


@LINUX
def test_held_tensors_survive_the_ref_and_the_store_reusing_memory(ray_session):
    dp = batch(seed=1)
    expected = copy.deepcopy(dp)
    held = ray.get(ray.put(dp))  # the ref is dropped at once
    write_everything(held)
    write_everything(expected)  # some pages private, others still the store's
    held.batch["input_ids"][1:].sub_(1)
    expected.batch["input_ids"][1:].sub_(1)
    gc.collect()
    for i in range(30):  # same-sized objects: the allocator would reuse freed space at once
        other = batch(seed=100 + i)
        other.batch["input_ids"].fill_(-i)
        ray.get(ray.put(other))
    assert torch.equal(held.batch["input_ids"], expected.batch["input_ids"])
    assert torch.equal(held.batch["logp"].values(), expected.batch["logp"].values())


def store_objects() -> int:
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    return int(text.split("Plasma memory usage")[1].split("MiB,")[1].split("objects")[0])


def wait_for_objects(count: int, wait_s: float = 30) -> int:
    deadline = time.monotonic() + wait_s
    while (now := store_objects()) != count and time.monotonic() < deadline:
        time.sleep(0.2)
    return now


@LINUX
def test_the_last_tensor_releases_the_object(ray_session):
    baseline = wait_for_objects(0)
    ref = ray.put(batch())
    received = ray.get(ref)
    logp = received.batch["logp"]
    del ref
    gc.collect()
    assert wait_for_objects(baseline + 1, wait_s=2) == baseline + 1  # pinned by the tensors
    del received
    gc.collect()
    assert wait_for_objects(baseline + 1, wait_s=2) == baseline + 1  # one tensor still holds it
    del logp
    gc.collect()
    assert wait_for_objects(baseline) == baseline


@LINUX
def test_after_fork_a_child_keeps_what_it_received(ray_session):
    """A driver forks while holding received tensors, then drops them; the store reuses
    the memory. The child's tensors must still hold what was received (the child copied
    their pages at the fork), and neither process's writes reach the other or the object."""
    dp = batch(seed=2)
    expected = checksum(dp)
    ref = ray.put(dp)
    held = ray.get(ref)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no Ray, no torch thread pool; only memory reads and writes
        try:
            os.read(ready_r, 1)  # the parent has dropped its tensors and refilled the store
            ids = held.batch["input_ids"].numpy()
            ok = int(ids.sum()) == expected[0] and float(held.batch["logp"].values().numpy().sum()) == expected[1]
            ids += 1  # private to the child
            os._exit(0 if ok else 1)
        finally:
            os._exit(2)
    os.close(ready_r)
    del held
    gc.collect()
    for i in range(10):  # same-sized objects over the freed memory
        other = batch(seed=200 + i)
        other.batch["input_ids"].fill_(-i)
        ray.get(ray.put(other))
    os.write(ready_w, b"x")
    os.close(ready_w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert checksum(ray.get(ref)) == expected


@LINUX
def test_torch_multiprocessing_sharing_leaves_the_store(ray_session):
    """Sending a tensor through ``torch.multiprocessing`` first moves it into torch's own
    shared memory (``share_memory_``): from then on sender and receiver share that copy,
    as torch documents, and no write reaches the Ray object; its lease is let go."""
    dp = batch(seed=3)
    expected = checksum(dp)
    ref = ray.put(dp)
    got = ray.get(ref)
    ids = got.batch["input_ids"]
    assert is_private_view_of_the_store(ids)
    ids.share_memory_()
    assert ids.is_shared() and not is_private_view_of_the_store(ids)
    ids.add_(1)
    assert checksum(ray.get(ref)) == expected


def test_small_objects_are_copied(ray_session):
    """Ray inlines objects under ~100 KiB: no file behind them, so they are copied, not viewed."""
    dp = batch(rows=4, cols=16)
    ref = ray.put(dp)
    got = ray.get(ref)
    found = mapping_of(got.batch["input_ids"].data_ptr())
    assert found is None or found[0][3] == "p"
    write_everything(got)
    assert checksum(ray.get(ref)) == checksum(dp)
    assert receive_mode().mode == "on_write"  # a per-object fallback, not the process's


def test_a_device_target_is_a_copy_without_mapping(ray_session, monkeypatch):
    mapped = []
    monkeypatch.setattr(_shm, "_map_group", lambda *a: mapped.append(a))
    if torch.cuda.is_available():
        with receive_options(device="cuda:0"):
            assert receive_mode() == ("copy", "tensors are decoded onto cuda:0: the transfer is the copy")
    got = ray.get(ray.put(transport.receive_as(batch(), device="meta")))  # the one other device here
    assert got.batch["input_ids"].device.type == "meta"
    assert mapped == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_process_lacks_is_refused_where_it_is_given(ray_session):
    for give in (
        lambda: receive_options(device="cuda").__enter__(),
        lambda: adp.set_receive_options(device="cuda:0"),
        lambda: transport.get(ray.put(batch()), device="cuda"),
        lambda: adp.ReceiveOptions(device="no-such-device"),
    ):
        with pytest.raises(adp.OptionError, match="device"):
            give()
    assert adp.get_receive_options().device is None
    # a sender without the device may still ask for it: the receiver decides, with the library's error
    ref = ray.put(transport.receive_as(batch(), device="cuda"))
    with pytest.raises(adp.OptionError, match="no cuda device"):
        transport.get(ref)


def test_argument_errors_are_the_librarys_and_value_errors():
    for give in (
        lambda: adp.set_receive_options(copy="yes"),
        lambda: receive_options(copy="sometimes").__enter__(),
        lambda: transport.scatter([], "f", batch(rows=2, cols=2)),
        lambda: transport.broadcast([], "f", batch(rows=2, cols=2)),
    ):
        with pytest.raises(adp.OptionError) as caught:
            give()
        assert isinstance(caught.value, adp.DataProtoError) and isinstance(caught.value, ValueError)
    assert adp.get_receive_options().copy == "on_write"


def test_asked_modes_are_reported():
    with receive_options(copy=True):
        assert receive_mode().mode == "copy"
    with receive_options(copy=False):
        assert receive_mode().mode == "view"
    with pytest.raises(ValueError, match="copy must be"):
        adp.ReceiveOptions(copy="sometimes")


# ---------------------------------------------------------------- the mapping itself, without Ray


@pytest.fixture
def shared_file():
    """A buffer in a shared mapping of a named tmpfs file, and the file's name."""
    fd, name = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.write(fd, bytes(range(256)) * (3 * mmap.PAGESIZE // 256 + 1))
        shared = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED)
        yield name, pa.py_buffer(shared).slice(100, 2 * mmap.PAGESIZE)
    finally:
        os.close(fd)
        if os.path.exists(name):
            os.unlink(name)


@pytest.fixture
def fresh_process_state(monkeypatch):
    monkeypatch.setattr(_shm, "_process_reason", None)
    monkeypatch.setattr(_shm, "_holders", {})
    monkeypatch.setattr(_shm, "_twins", {})
    monkeypatch.setattr(_shm, "_plain", ([], []))


def assert_copied(buffer: pa.Buffer) -> None:
    (out,) = _shm.private_views([buffer])
    assert out.to_pybytes() == buffer.to_pybytes()
    found = mapping_of(out.address)
    assert found is None or found[0][3] == "p"
    assert out.address % 64 == 0


@LINUX
def test_no_proc_falls_back_to_a_copy_and_says_so_once(shared_file, fresh_process_state, monkeypatch, caplog):
    _, buffer = shared_file
    monkeypatch.setattr(_shm, "PROC", "/nonexistent-proc")
    with caplog.at_level(logging.WARNING, logger="arrow_dataproto"):
        assert_copied(buffer)
        assert_copied(buffer)
    assert "/nonexistent-proc/self/maps is not readable" in _shm.unavailable_reason()
    assert len([r for r in caplog.records if "copy-on-write" in r.getMessage()]) == 1
    mode = receive_mode()
    assert mode.mode == "copy" and "/nonexistent-proc" in mode.reason


@LINUX
def test_a_raylet_whose_descriptors_cannot_be_read_falls_back_to_a_copy(fresh_process_state, monkeypatch):
    """A store file (a deleted ``plasma`` file) that no reachable raylet descriptor opens: a reason of the process."""
    fd, name = tempfile.mkstemp(prefix="plasma", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.unlink(name)
    os.ftruncate(fd, 2 * mmap.PAGESIZE)
    shared = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED)
    os.close(fd)
    monkeypatch.setattr(_shm, "_raylets", lambda: [1 << 30])  # a raylet whose /proc/<pid>/fd does not list
    assert_copied(pa.py_buffer(shared).slice(10, 100))
    assert "no process here holds an openable descriptor" in _shm.unavailable_reason()
    assert receive_mode().mode == "copy"


def test_another_os_falls_back_to_a_copy(shared_file, fresh_process_state, monkeypatch):
    _, buffer = shared_file
    monkeypatch.setattr(sys, "platform", "darwin")
    assert_copied(buffer)
    assert receive_mode() == ("copy", "copy-on-write is unavailable here: copy-on-write mapping needs Linux /proc (this is darwin)")


def test_ordinary_memory_is_copied(fresh_process_state):
    buffer = pa.py_buffer(bytearray(b"x" * 10_000))
    assert_copied(buffer)
    assert _shm.unavailable_reason() is None  # not a reason of the process


@LINUX
def test_small_buffers_in_ordinary_memory_are_copied_without_reading_the_maps_again(fresh_process_state, monkeypatch):
    """Ray's inlined objects: once /proc/self/maps has shown their memory ordinary, small buffers
    there are copied outright (reading the maps of a process with torch loaded takes milliseconds
    per object); more than _SMALL bytes read the maps again."""
    small, large = pa.py_buffer(bytearray(b"x" * 10_000)), pa.py_buffer(bytearray(_shm._SMALL + 1))
    assert_copied(small)  # the maps read once
    monkeypatch.setattr(_shm, "PROC", "/nonexistent-proc")  # any further read fails, and says so
    assert_copied(small)
    assert _shm.unavailable_reason() is None  # not read
    assert_copied(large)
    assert _shm.unavailable_reason() is not None  # read (and failed): large buffers always look


# ---------------------------------------------------------------- other shared memory: copied, never mapped


def _owner(kind: str, tmp_path) -> tuple[torch.Tensor, object]:
    """An int64 tensor of 3 pages in writable shared memory of ``kind``, and a way to truncate its file (or ``None``)."""
    n = 3 * mmap.PAGESIZE // 8
    if kind == "multiprocessing":
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=n * 8)
        tensor = torch.frombuffer(segment.buf, dtype=torch.int64)
        tensor.owner = segment  # type: ignore[attr-defined]  # kept alive (and unlinked) with the tensor
        segment.unlink()
        return tensor, lambda: os.ftruncate(segment._fd, 0)
    if kind == "map_shared_file":
        path = tmp_path / "shared.bin"
        path.write_bytes(bytes(n * 8))
        with open(path, "r+b") as f:
            shared = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED)
        return torch.frombuffer(shared, dtype=torch.int64), lambda: os.truncate(path, 0)
    assert kind == "torch"
    return torch.zeros(n, dtype=torch.int64).share_memory_(), None


def _in_a_shared_file_mapping(address: int) -> bool:
    found = mapping_of(address)
    return found is not None and found[0][3] == "s" and bool(found[2])


@LINUX
@pytest.mark.parametrize("kind", ["multiprocessing", "map_shared_file", "torch"])
def test_other_shared_memory_is_copied(kind, tmp_path, fresh_process_state):
    """Only Ray's sealed store is immutable: a DataProto unpickled (default options) from
    buffers in writable shared memory owns copies, blind to its owner's writes and truncation."""
    owned, truncate = _owner(kind, tmp_path)
    owned.copy_(torch.arange(len(owned)))
    buffers: list = []
    state = pickle.dumps(DataProto(TensorDict({"x": owned}, batch_size=[len(owned)])), protocol=5, buffer_callback=buffers.append)
    assert any(_in_a_shared_file_mapping(pa.py_buffer(b).address) for b in buffers)  # sent from the shared memory itself
    got = pickle.loads(state, buffers=buffers).batch["x"]
    assert not _in_a_shared_file_mapping(got.data_ptr()) and mapping_of(got.data_ptr())[2] == 0  # ordinary memory
    owned.add_(100)  # the owner writes after the receipt
    assert torch.equal(got, torch.arange(len(owned)))
    got.add_(1)  # and the receiver's writes stay its own
    assert torch.equal(owned, torch.arange(len(owned)) + 100)
    if truncate is not None:
        truncate()  # a view of the file would now raise SIGBUS
        assert int(got.sum()) == int(torch.arange(len(got)).sum()) + len(got)
    assert _shm.unavailable_reason() is None and _shm._twins == {}


# ---------------------------------------------------------------- the store's twin, without Ray


@pytest.fixture
def fake_store(monkeypatch, fresh_process_state):
    """A deleted tmpfs ``plasma`` file mapped shared, of which this process plays the raylet."""
    fd, name = tempfile.mkstemp(prefix="plasma", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.unlink(name)
    os.ftruncate(fd, 16 * mmap.PAGESIZE)
    shared = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED)
    shared[:] = bytes(range(256)) * (len(shared) // 256)
    monkeypatch.setattr(_shm, "_raylets", lambda: [os.getpid()])
    try:
        yield shared
    finally:
        for twin in _shm._twins.values():
            wait_until(lambda: not twin.leases)
        os.close(fd)


def wait_until(condition, wait_s: float = 10) -> None:
    deadline = time.monotonic() + wait_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def received(shared: mmap.mmap, offset: int, size: int) -> torch.Tensor:
    """A copy-on-write view of ``shared[offset:offset + size]`` as a uint8 tensor, as the codec views it."""
    (view,) = _shm.private_views([pa.py_buffer(shared).slice(offset, size)])
    return torch.from_dlpack(pa.Array.from_buffers(pa.uint8(), view.size, [None, view]))


def wait_released() -> None:
    """Wait until every lease on the twins is gone (the caller dropped its views)."""
    gc.collect()
    wait_until(lambda: all(not twin.leases for twin in _shm._twins.values()))


def wait_released_but(live: int) -> None:
    gc.collect()
    wait_until(lambda: sum(len(twin.leases) for twin in _shm._twins.values()) == live)


@LINUX
def test_store_objects_share_one_twin_mapped_once(fake_store):
    page = mmap.PAGESIZE
    a, b = received(fake_store, 100, page), received(fake_store, 5 * page + 8, 2 * page)
    (twin,) = _shm._twins.values()
    assert mapping_of(a.data_ptr())[:3] == mapping_of(b.data_ptr())[:3]  # one private mapping of the file
    assert mapping_of(a.data_ptr())[0] == "rw-p" and a.data_ptr() == twin.address + 100
    assert bytes(a.numpy()) == fake_store[100 : 100 + page] and bytes(b.numpy()) == fake_store[5 * page + 8 : 7 * page + 8]
    original = fake_store[:]
    a.add_(1)
    b.add_(1)
    assert fake_store[:] == original  # writes stay private
    assert len(twin.leases) == 2


@LINUX
def test_a_dead_lease_drops_its_written_pages(fake_store):
    page = mmap.PAGESIZE
    t = received(fake_store, 0, 3 * page)
    address = t.data_ptr()
    t.fill_(7)  # every page of the object private
    del t
    wait_released()
    fake_store[: 3 * page] = bytes([9]) * (3 * page)  # the store reuses the memory for another object
    again = received(fake_store, 0, 3 * page)
    assert again.data_ptr() == address  # the same twin, its page tables reused
    assert bytes(again.numpy()) == bytes([9]) * (3 * page)  # the new object, not the old writes


@LINUX
def test_pages_a_dead_lease_wrote_are_mapped_again_to_the_store(fake_store):
    """The release drops the written pages and maps the file's pages there again (in the
    background): the next object received in that memory finds them mapped, and reads the
    store's bytes, not the old writes."""
    page = mmap.PAGESIZE
    t = received(fake_store, 0, 4 * page)
    (twin,) = _shm._twins.values()
    view = torch.from_dlpack(pa.Array.from_buffers(pa.uint8(), 4 * page, [None, pa.foreign_buffer(twin.address, 4 * page)]))
    t.fill_(7)
    del t
    wait_released()
    assert not _shm._private_pages(twin.address, 4)  # nothing of the writes is left
    assert mapped_fraction(view) == 1.0  # mapped again, to the file's pages
    assert bytes(view.numpy()) == fake_store[: 4 * page]


@LINUX
def test_the_same_bytes_twice_are_mapped_apart(fake_store):
    page = mmap.PAGESIZE
    first = received(fake_store, 64, 2 * page)
    first.fill_(1)
    second = received(fake_store, 64, 2 * page)  # received again while the first views live
    assert second.data_ptr() != first.data_ptr()
    assert bytes(second.numpy()) == fake_store[64 : 64 + 2 * page]
    second.fill_(2)
    assert bool((first == 1).all())
    del second
    wait_released_but(1)
    assert bool((first == 1).all())


@LINUX
def test_a_page_written_by_a_neighbour_is_not_shared(fake_store):
    """Objects are 64-byte aligned, so neighbours share pages: a page one object wrote
    (copied when the next object's bytes were not yet there) must not serve the next one."""
    a = received(fake_store, 0, 100)
    a.fill_(1)  # the page is now private, with the file's bytes of that moment beyond 100
    fake_store[128:228] = bytes([5]) * 100  # the store then writes a neighbour into the same page
    b = received(fake_store, 128, 100)
    assert bytes(b.numpy()) == bytes([5]) * 100
    del a
    wait_released()  # b has a mapping of its own
    assert bytes(b.numpy()) == bytes([5]) * 100
    c = received(fake_store, 3 * mmap.PAGESIZE, 100)  # an unwritten neighbour page: served by the twin
    d = received(fake_store, 3 * mmap.PAGESIZE + 128, 100)
    assert d.data_ptr() - c.data_ptr() == 128
    d.fill_(3)
    assert bytes(c.numpy()) == fake_store[3 * mmap.PAGESIZE : 3 * mmap.PAGESIZE + 100]


@LINUX
def test_a_forked_child_owns_its_views(fake_store):
    """After fork the parent's Ray pin no longer protects the child's views: the child
    copies their pages, so that the store's later reuse of the memory cannot change them."""
    t = received(fake_store, 100, 2 * mmap.PAGESIZE)
    t[:10].fill_(42)  # a written page and unwritten ones
    expected = bytes(t.numpy())
    pid = os.fork()
    if pid == 0:  # the child: the store (here: the shared mapping) is rewritten under it
        fake_store[:] = bytes(len(fake_store))
        os._exit(0 if bytes(t.numpy()) == expected else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fake_store[:] = bytes(range(256)) * (len(fake_store) // 256)


# ---------------------------------------------------------------- in a child process with its own Ray


def child_environment() -> dict[str, str]:
    """This environment, with the checkout and this interpreter's packages importable from any interpreter."""
    paths = [os.path.dirname(HERE), sysconfig.get_paths()["purelib"], os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    env.pop("RAY_ADDRESS", None)
    return env


def run_child(scenario: str, user: tuple[int, int] | None = None, python: str = sys.executable, timeout: float = 300) -> str:
    env = child_environment()
    command = [python, os.path.abspath(__file__), scenario]
    temp = tempfile.mkdtemp(prefix="adp-cow-")
    env["HOME"] = env["TMPDIR"] = temp
    if user is not None:
        os.chmod(temp, 0o777)
        command = [*_drop_to(user), *command]
    try:
        child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert child.returncode == 0, f"stdout:\n{child.stdout[-4000:]}\nstderr:\n{child.stderr[-8000:]}"
    return child.stdout


@LINUX
def test_objects_beyond_the_store(ray_session):
    """Ray's fallback allocation (an object larger than the store: a deleted file on disk,
    also held by the raylet) and objects spilled to disk, then restored."""
    out = run_child("beyond-the-store")
    assert "fallback allocation: private view, exact, writes private" in out
    assert "spilled and restored: private view, exact, writes private" in out


def _drop_to(user: tuple[int, int]) -> list[str]:
    """A command prefix running as ``(uid, gid)`` with no capabilities (util-linux ``setpriv``)."""
    uid, gid = user
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all"]


def _interpreter_for(user: tuple[int, int]) -> str:
    """An interpreter that ``user`` can run, and start again from a child (as Ray does).

    A venv's ``python`` links to its base interpreter, which may sit in a folder
    only root can enter (``/root/.pyenv``): then the system interpreter of the
    same version runs this interpreter's packages.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    relaunch = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import ray, arrow_dataproto'], check=True)"
    errors = []
    for python in dict.fromkeys([sys.executable, f"/usr/bin/python{version}"]):
        probe = subprocess.run([*_drop_to(user), python, "-c", relaunch], env=child_environment(), capture_output=True, text=True, cwd="/")
        if probe.returncode == 0:
            return python
        errors.append(f"{python}: {probe.stderr.strip().splitlines()[-1:] }")
    raise AssertionError(f"no Python {version} interpreter that an unprivileged user can run: {errors}")


@LINUX
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to drop privileges (CI has both)")
def test_an_unprivileged_user_gets_copy_on_write(ray_session):
    import pwd

    nobody = pwd.getpwnam("nobody")
    user = (nobody.pw_uid, nobody.pw_gid)
    python = _interpreter_for(user)
    out = run_child("unprivileged", user=user, python=python)
    assert "unprivileged: on_write in the driver and an actor, writes private" in out


def _start_ray(store: int) -> None:
    import ray

    ray.init(
        address="local",
        num_cpus=1,
        object_store_memory=store,
        include_dashboard=False,
        configure_logging=False,
        _temp_dir=os.path.join(os.environ["TMPDIR"], "ray"),
    )


def _check_private_view(ref, expected) -> None:
    import ray

    got = ray.get(ref)
    found = mapping_of(got.batch["input_ids"].data_ptr())
    assert found is not None and found[0] == "rw-p" and found[2], found  # a private mapping of a file
    assert checksum(got) == expected
    got.batch["input_ids"][::7].add_(3)
    assert checksum(ray.get(ref)) == expected
    assert receive_mode().mode == "on_write"


def child_beyond_the_store() -> None:
    import ray

    _start_ray(80 * MiB)
    dp = batch(rows=160, cols=128 * 1024)  # 160 MiB: a fallback allocation
    ref = ray.put(dp)
    _check_private_view(ref, checksum(dp))
    print("fallback allocation: private view, exact, writes private")
    del ref, dp

    batches = [batch(rows=30, cols=128 * 1024, seed=s) for s in range(4)]  # 30 MiB each: the first ones spill
    refs = [ray.put(b) for b in batches]
    from ray._private.internal_api import memory_summary

    summary = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    assert "Spilled" in summary, summary  # the first objects went to disk; getting one restores it
    _check_private_view(refs[0], checksum(batches[0]))
    print("spilled and restored: private view, exact, writes private")
    ray.shutdown()


def child_unprivileged() -> None:
    import ray

    assert os.geteuid() != 0
    _start_ray(100 * MiB)
    reader = ray.remote(num_cpus=0)(_ChildReader).remote()
    dp = batch()
    expected = checksum(dp)
    ref = ray.put(dp)
    got = ray.get(ref)
    assert is_private_view_of_the_store(got.batch["input_ids"]), mapping_of(got.batch["input_ids"].data_ptr())
    write_everything(got)
    assert ray.get(reader.write.remote(ref)) == ("on_write", True)
    assert checksum(ray.get(ref)) == expected
    assert receive_mode().mode == "on_write"
    print("unprivileged: on_write in the driver and an actor, writes private")
    ray.shutdown()


class _ChildReader:
    def write(self, dp):
        private = is_private_view_of_the_store(dp.batch["input_ids"])
        write_everything(dp)
        return receive_mode().mode, private


if __name__ == "__main__":
    {"beyond-the-store": child_beyond_the_store, "unprivileged": child_unprivileged}[sys.argv[1]]()
