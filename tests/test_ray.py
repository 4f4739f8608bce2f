"""DataProto through Ray: ray.put/get, actor arguments and returns, scatter/gather,
the copy policy (write safety by default, real zero-copy on request), receive
devices, and errors (undecodable payloads, dying actors)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import sys
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict
from utils import assert_dataproto_equal, assert_tensor_equal, sample_dataproto

from arrow_dataproto import DataProto, DecodeError, MissingDependencyError, receive_options, set_receive_options, to_arrow, transport
from arrow_dataproto.pickling import batch_state, rebuild_dataproto

ray = pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module

SHARED_MEMORY_CHECK = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/maps to find the object store's mapping"
)


# ---------------------------------------------------------------- batches and helpers


def every_kind(rows: int = 6, width: int = 5) -> DataProto:
    """:func:`sample_dataproto` plus the column kinds it lacks: a strided nested tensor,
    a numeric numpy column and a column that needs pickling (tuples)."""
    dp = sample_dataproto(rows=rows, prompt=width, response=width + 2)
    dp.batch["strided"] = torch.nested.nested_tensor([torch.full((i % 3 + 1, 2), float(i)) for i in range(rows)])
    dp.non_tensor_batch["score"] = np.linspace(0, 1, rows, dtype=np.float32)
    pairs = np.empty(rows, dtype=object)
    pairs[:] = [(i, str(i)) for i in range(rows)]
    dp.non_tensor_batch["pairs"] = pairs
    return dp


def big() -> DataProto:
    """Every kind, over 1 MiB: stored in Ray's shared memory, not inlined in messages."""
    return every_kind(rows=64, width=1024)


def add_one(dp: DataProto) -> None:
    """Change every tensor of ``dp`` in place, and its numeric column if writable."""
    for t in dp.batch.values(include_nested=True, leaves_only=True):
        if t.dtype == torch.bool:
            t.logical_not_()
        elif t.is_nested and t.layout == torch.jagged:
            t.values().add_(1)
        elif t.is_nested:
            for row in t.unbind():
                row.add_(1)
        else:
            t.add_(1)
    score = dp.non_tensor_batch["score"]
    if score.flags.writeable:  # numpy enforces the read-only views of zero-copy mode
        score += 1


def in_shared_memory(address: int) -> bool:
    """Whether ``address`` lies in a shared mapping of this process (Ray's object store is one)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                return "s" in perms
    return False


def dense_pointer_shared(dp: DataProto) -> bool:
    """Whether the first dense tensor of ``dp`` views shared memory."""
    return in_shared_memory(dp.batch["input_ids"].data_ptr())


def replace_field_metadata(record_batch: pa.RecordBatch, column: str, **changes: str) -> pa.RecordBatch:
    fields = []
    for f in record_batch.schema:
        if f.name == column:
            f = f.with_metadata({**f.metadata, **{k.encode(): v.encode() for k, v in changes.items()}})
        fields.append(f)
    return pa.RecordBatch.from_arrays(record_batch.columns, schema=pa.schema(fields, metadata=record_batch.schema.metadata))


def recorded_on(dp: DataProto, device: str) -> pa.RecordBatch:
    """``dp`` encoded as if a sender had it on ``device``."""
    record_batch = to_arrow(dp)
    for name in [k if isinstance(k, str) else ".".join(k) for k in dp.batch.keys(include_nested=True, leaves_only=True)]:
        record_batch = replace_field_metadata(record_batch, name, **{"adp.device": device})
    metadata = {**record_batch.schema.metadata, b"adp.device": json.dumps(device).encode()}
    return record_batch.replace_schema_metadata(metadata)


class Payload:
    """Unpickles as a DataProto decoded from a hand-made RecordBatch, as if another sender had made it."""

    def __init__(self, record_batch: pa.RecordBatch):
        self.record_batch = record_batch

    def __reduce_ex__(self, protocol):
        return rebuild_dataproto, batch_state(self.record_batch)


def corrupt(dp: DataProto) -> Payload:
    """``dp`` with the metadata of column ``old_log_probs`` claiming a shape its buffer cannot hold."""
    return Payload(replace_field_metadata(to_arrow(dp), "old_log_probs", **{"adp.shape": "[99]"}))


class _Worker:
    def echo(self, dp):
        return dp

    def echo_in_a_tuple(self, dp):
        return dp, len(dp)

    def add_one(self, dp):
        add_one(dp)
        return float(dp.batch["old_log_probs"][0, 0])

    def shared(self, dp):
        return dense_pointer_shared(dp)

    def fetch_shared(self, refs, copy):
        return dense_pointer_shared(transport.get(refs[0], copy=copy))

    @transport.receiving(copy=False)
    def fetch_shared_decorated(self, refs):
        return dense_pointer_shared(ray.get(refs[0]))

    def annotate(self, dp):
        dp.batch["row_sum"] = dp.batch["input_ids"].sum(dim=1)
        dp.non_tensor_batch["pid"] = np.full(len(dp), os.getpid())
        return dp

    def fetch_with_warnings(self, refs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dp = transport.get(refs[0])
        devices = {t.device.type for t in dp.batch.values(include_nested=True, leaves_only=True)}
        return [w.category.__name__ for w in caught], sorted(devices)

    def corrupt_result(self, dp):
        return corrupt(dp)

    def die(self, dp):
        os._exit(1)


class _ZeroCopyWorker(_Worker):
    """A worker that sets its process-wide receive options in ``__init__``."""

    def __init__(self):
        set_receive_options(copy=False)


Worker = ray.remote(num_cpus=0)(_Worker)
ZeroCopyWorker = ray.remote(num_cpus=0)(_ZeroCopyWorker)


@pytest.fixture(scope="module")
def workers(ray_session):
    group = [Worker.remote() for _ in range(3)]
    yield group
    for actor in group:
        ray.kill(actor)


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("make", [every_kind, big], ids=["inlined", "shared-memory"])
@pytest.mark.parametrize("copy_mode", [True, False], ids=["copy", "zero-copy"])
def test_put_get_round_trip(ray_session, make, copy_mode):
    dp = make()
    ref = ray.put(dp)
    assert_dataproto_equal(transport.get(ref, copy=copy_mode), dp)
    with receive_options(copy=copy_mode):
        assert_dataproto_equal(ray.get(ref), dp)


def test_actor_argument_and_return(workers):
    dp = big()
    assert_dataproto_equal(ray.get(workers[0].echo.remote(dp)), dp)
    assert_dataproto_equal(ray.get(workers[0].echo.remote(ray.put(dp))), dp)
    assert_dataproto_equal(ray.get(workers[0].echo.remote(transport.receive_as(dp, copy=False))), dp)


def test_task_argument_and_return(ray_session):
    dp = every_kind()
    echo = ray.remote(num_cpus=0)(lambda d: d)
    assert_dataproto_equal(ray.get(echo.remote(dp)), dp)


def test_receive_as_unpickles_as_a_dataproto(ray_session):
    dp = every_kind()
    back = ray.get(ray.put(transport.receive_as(dp, copy=True)))
    assert type(back) is DataProto
    assert_dataproto_equal(back, dp)


def test_a_sent_chunk_carries_only_its_rows():
    dp = DataProto(TensorDict({"x": torch.arange(30 * 1000).view(30, 1000)}, batch_size=[30]))
    for piece in dp.chunk(3):
        buffers = []
        pickle_bytes = pickle.dumps(piece, protocol=5, buffer_callback=buffers.append)
        assert sum(b.raw().nbytes for b in buffers) == 10 * 1000 * 8
        assert len(pickle_bytes) < 10_000


# ---------------------------------------------------------------- scatter / gather


def test_scatter_gather_chunks_calls_and_concatenates(workers):
    dp = every_kind(rows=10)
    out = transport.scatter_gather(workers, "annotate", dp)
    assert_dataproto_equal(out.select(batch_keys=list(dp.batch.keys()), non_tensor_batch_keys=list(dp.non_tensor_batch)), dp)
    assert torch.equal(out.batch["row_sum"], dp.batch["input_ids"].sum(dim=1))
    pids = out.non_tensor_batch["pid"]
    assert [len(set(pids[a:b])) for a, b in ((0, 4), (4, 7), (7, 10))] == [1, 1, 1]
    assert len(set(pids)) == 3


def test_scatter_gather_more_actors_than_rows(workers):
    dp = every_kind(rows=2)
    out = transport.scatter_gather(workers, "echo", dp)
    assert_dataproto_equal(out, dp)


@SHARED_MEMORY_CHECK
def test_scatter_gather_returns_a_list_for_other_results(workers):
    parcel = transport.receive_as(big(), copy=False)
    assert transport.scatter_gather(workers, "shared", parcel) == [True, True, True]


@SHARED_MEMORY_CHECK
def test_gather_returns_copies_inside_other_results(workers):
    pairs = transport.gather(transport.scatter(workers, "echo_in_a_tuple", big()))
    assert [dense_pointer_shared(dp) for dp, _ in pairs] == [False, False, False]


@SHARED_MEMORY_CHECK
def test_gather_result_owns_its_memory(workers):
    dp = big()
    out = transport.gather(transport.scatter(workers, "echo", dp))
    assert_dataproto_equal(out, dp)
    assert not dense_pointer_shared(out)
    assert out.non_tensor_batch["score"].flags.writeable


@SHARED_MEMORY_CHECK
def test_broadcast_sends_one_object_to_every_actor(workers):
    dp = big()
    refs = transport.broadcast(workers, "echo", dp)
    for out in transport.get(refs):
        assert_dataproto_equal(out, dp)
    shared = transport.get(transport.broadcast(workers, "shared", transport.receive_as(dp, copy=False)))
    assert shared == [True, True, True]


def test_scatter_needs_an_actor_and_enough_pieces(workers):
    with pytest.raises(ValueError, match="at least one actor"):
        transport.scatter([], "echo", every_kind())
    with pytest.raises(ValueError, match="at least one actor"):
        transport.broadcast([], "echo", every_kind())
    with pytest.raises(ValueError, match="one per actor"):
        transport.scatter(workers, "echo", TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]))  # chunk: 2 pieces


# ---------------------------------------------------------------- copy policy


def test_default_copy_keeps_writes_private(workers):
    dp = big()
    expected = copy.deepcopy(dp)
    ref = ray.put(dp)
    writer, reader = workers[:2]
    assert ray.get(writer.add_one.remote(ref)) == float(expected.batch["old_log_probs"][0, 0] + 1)
    assert_dataproto_equal(ray.get(reader.echo.remote(ref)), expected)
    mine = ray.get(ref)
    add_one(mine)
    assert_dataproto_equal(transport.get(ref, copy=False), expected)
    assert_dataproto_equal(dp, expected)


def test_zero_copy_mode_views_the_object_store_hazard_included(workers):
    """What the read-only contract of ``copy=False`` is about: one receiver's write reaches every reader."""
    dp = big()
    expected = copy.deepcopy(dp)
    ref = ray.put(transport.receive_as(dp, copy=False))
    ray.get(workers[0].add_one.remote(ref))
    changed = transport.get(ref, copy=True)
    assert torch.equal(changed.batch["input_ids"], expected.batch["input_ids"] + 1)
    assert_dataproto_equal(dp, expected)  # the sender's own tensors are not the object


@SHARED_MEMORY_CHECK
def test_zero_copy_get_points_into_the_object_store(ray_session):
    ref = ray.put(big())
    first, second = transport.get(ref, copy=False), transport.get(ref, copy=False)
    assert dense_pointer_shared(first)
    assert first.batch["input_ids"].data_ptr() == second.batch["input_ids"].data_ptr()
    copied = transport.get(ref)
    assert not dense_pointer_shared(copied)
    assert copied.batch["input_ids"].data_ptr() != first.batch["input_ids"].data_ptr()


def memory_of(t: torch.Tensor) -> list[int]:
    """Data pointers of a tensor's memory: its own, or a nested tensor's values and offsets."""
    if t.is_nested and t.layout == torch.jagged:
        return [t.values().data_ptr(), t.offsets().data_ptr()]
    if t.is_nested:
        return [t.values().data_ptr()]
    return [t.data_ptr()]


@SHARED_MEMORY_CHECK
def test_copy_mode_keeps_no_view_of_the_object_store(ray_session):
    """Nothing the default decode returns views the object (which stays pinned while viewed)."""
    dp = big()
    copied = transport.get(ray.put(dp))
    for key, t in copied.batch.items(include_nested=True, leaves_only=True):
        assert not any(in_shared_memory(p) for p in memory_of(t)), key
    viewed = transport.get(ray.put(dp), copy=False)
    for key, t in viewed.batch.items(include_nested=True, leaves_only=True):
        assert all(in_shared_memory(p) for p in memory_of(t)), key


@SHARED_MEMORY_CHECK
def test_actor_side_choices_of_the_copy_policy(workers):
    dp = big()
    ref = ray.put(dp)
    worker = workers[0]
    assert ray.get(worker.shared.remote(ref)) is False  # the default
    assert ray.get(worker.shared.remote(transport.receive_as(dp, copy=False))) is True  # chosen by the sender
    assert ray.get(worker.fetch_shared.remote([ref], False)) is True  # per call, in the actor
    assert ray.get(worker.fetch_shared.remote([ref], True)) is False
    assert ray.get(worker.fetch_shared_decorated.remote([ref])) is True  # per method
    assert ray.get(worker.shared.remote(ref)) is False  # and nothing leaked into the process default


@SHARED_MEMORY_CHECK
@pytest.mark.parametrize(
    "start",
    [
        lambda: ZeroCopyWorker.remote(),
        lambda: Worker.options(runtime_env={"env_vars": {"ARROW_DATAPROTO_COPY": "0"}}).remote(),
    ],
    ids=["set_receive_options", "environment"],
)
def test_process_wide_zero_copy_in_an_actor(ray_session, start):
    actor = start()
    try:
        ref = ray.put(big())
        assert ray.get(actor.shared.remote(ref)) is True
        assert ray.get(actor.shared.remote(transport.receive_as(big(), copy=True))) is False
    finally:
        ray.kill(actor)


# ---------------------------------------------------------------- devices


def _missing_cuda() -> str:
    return f"cuda:{torch.cuda.device_count()}"  # an ordinal past the last GPU: absent on every machine


def test_recorded_device_missing_here_falls_back_to_cpu(workers):
    dp = every_kind()
    ref = ray.put(Payload(recorded_on(dp, _missing_cuda())))
    with pytest.warns(RuntimeWarning, match="not available here"):
        out = transport.get(ref)
    for key, t in out.batch.items(include_nested=True, leaves_only=True):
        assert t.device.type == "cpu"
        assert_tensor_equal(t, dp.batch[key], str(key))
    categories, devices = ray.get(workers[0].fetch_with_warnings.remote([ref]))
    assert categories == ["RuntimeWarning"] and devices == ["cpu"]


def test_receive_device_overrides_the_recorded_one(ray_session):
    dp = every_kind()
    ref = ray.put(Payload(recorded_on(dp, _missing_cuda())))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = transport.get(ref, device="cpu")
    assert {t.device.type for t in out.batch.values(include_nested=True, leaves_only=True)} == {"cpu"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_receive_onto_the_gpu(ray_session):
    dp = every_kind()
    out = transport.get(ray.put(dp), device="cuda")
    for key, t in out.batch.items(include_nested=True, leaves_only=True):
        assert t.device.type == "cuda"
        assert_tensor_equal(t.cpu(), dp.batch[key], str(key))
    on_gpu = copy.deepcopy(dp).to("cuda")
    back = ray.get(ray.put(on_gpu))  # the recorded device is used when present
    assert {t.device.type for t in back.batch.values(include_nested=True, leaves_only=True)} == {"cuda"}


# ---------------------------------------------------------------- errors


def test_undecodable_argument_raises_the_library_error_through_ray(workers):
    dp = big()
    with pytest.raises(DecodeError, match="column 'old_log_probs'"):
        transport.get(workers[0].echo.remote(corrupt(dp)))
    with pytest.raises(ray.exceptions.RayError, match="column 'old_log_probs'"):
        ray.get(workers[0].echo.remote(corrupt(dp)))


def test_undecodable_result_raises_the_library_error(workers):
    with pytest.raises(DecodeError, match="column 'old_log_probs'"):
        transport.gather([workers[0].corrupt_result.remote(big())])
    with pytest.raises(DecodeError, match="column 'old_log_probs'"):
        transport.get(ray.put(corrupt(every_kind())))


def test_actor_dying_mid_call_leaves_the_data_intact(workers):
    dp = big()
    expected = copy.deepcopy(dp)
    doomed = Worker.remote()
    with pytest.raises(ray.exceptions.RayActorError):
        transport.scatter_gather([doomed], "die", dp)
    assert_dataproto_equal(dp, expected)
    assert_dataproto_equal(transport.scatter_gather(workers, "echo", dp), expected)


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r'needs ray, .*pip install -c constraints.txt -e "\.\[ray\]"'):
        transport.get([])
