"""The TransferQueue backend ``arrow_dataproto`` (arrow_dataproto.integrations.transfer_queue).

``tq.init`` takes 6-27 s here, so the module starts one TransferQueue on the session Ray and
every test uses its own partition. The killed-directory test runs last and ends that instance.
The two-node test runs in a child process (tests/two_nodes.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

tq = pytest.importorskip("transfer_queue", reason="transferqueue is not installed (arrow-dataproto[transfer-queue])")
from omegaconf import OmegaConf  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402

import ray  # noqa: E402

from arrow_dataproto.integrations import transfer_queue as backend  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module

HOOK = {"worker_process_setup_hook": "arrow_dataproto.integrations.register_transfer_queue"}
CONFIG = {"backend": {"storage_backend": "arrow_dataproto", "arrow_dataproto": {}}}


@pytest.fixture(scope="module")
def tq_on_ray(ray_session):
    tq.init(OmegaConf.create(CONFIG))
    conf = ray_session.get(ray_session.get_actor("TransferQueueController", namespace="transfer_queue").get_config.remote())
    directory = ray_session.get_actor(conf.backend.arrow_dataproto.directory, namespace="transfer_queue")
    yield directory
    tq.close()


def held(directory) -> int:
    import ray

    return ray.get(directory.held.remote())


def batch(rows: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + rows)
    return TensorDict(
        {
            "tokens": (ids[:, None] * 10 + torch.arange(6)).to(torch.int64),
            "logp": (ids[:, None] * 0.37 - torch.arange(6)).to(torch.bfloat16),
            "flags": ids[:, None] % 2 == 0,
            "response": torch.nested.nested_tensor(
                [torch.arange(int(i) % 4 + 1, dtype=torch.int32) for i in ids], layout=torch.jagged
            ),
            "uid": NonTensorStack.from_list([f"u{int(i)}" for i in ids]),
        },
        batch_size=[rows],
    )


def assert_same(got: TensorDict, want: TensorDict) -> None:
    assert list(got.keys()) == list(want.keys())
    for k in want.keys():
        a, b = got.get(k), want.get(k)
        if isinstance(b, NonTensorStack):
            assert isinstance(a, NonTensorStack) and a.tolist() == b.tolist(), k
        elif b.is_nested:
            assert a.is_nested and a.layout == b.layout, k
            assert [x.tolist() for x in a.unbind()] == [x.tolist() for x in b.unbind()], k
        else:
            assert a.dtype == b.dtype and a.shape == b.shape and not a.is_nested, k
            assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                               b.view(torch.uint8) if b.dtype == torch.bfloat16 else b), k


def keys(rows: int, start: int = 0) -> list[str]:
    return [f"k{i}" for i in range(start, start + rows)]


# ---------------------------------------------------------------- the directory's bookkeeping (no Ray)


@pytest.fixture
def directory(monkeypatch) -> backend.Directory:
    """A directory in this process (its constructor's process-wide receive options not applied here)."""
    monkeypatch.setattr(backend, "set_receive_options", lambda **options: None)
    return backend.Directory()


def _where(directory: backend.Directory, field: str, indexes: list[int]) -> list[tuple[str, int]]:
    """``(object ref, row)`` of each index of ``field``, as ``locate`` reports them."""
    refs, where = directory.locate("p", [field], indexes)
    objs, rows = where[field]
    return [(refs[o], int(r)) for o, r in zip(objs, rows)]


def test_directory_streaming_puts_later_fields_and_overwrites(directory):
    d = directory
    d.register("p", "a", ["A"], [0, 1, 2, 3], ["x", "y"])
    d.register("p", "b", ["B"], [4, 5], ["x", "y"])
    d.register("p", "c", ["C"], [0, 1, 2, 3, 4, 5], ["z"])  # a later field of every row
    assert _where(d, "x", [5, 0, 4, 3]) == [("B", 1), ("A", 0), ("B", 0), ("A", 3)]
    assert _where(d, "z", [5, 0]) == [("C", 5), ("C", 0)]
    refs, where = d.locate("p", ["x", "y", "z"], [1, 4])
    assert refs == ["A", "B", "C"] and where["x"][0].tolist() == where["y"][0].tolist() == [0, 1]
    assert where["z"][0].tolist() == [2, 2] and where["z"][1].tolist() == [1, 4]
    refs, where = d.locate("p", ["x", "y"], [])  # no rows: empty positions for every field
    assert refs == [] and all(len(objs) == len(rows) == 0 for objs, rows in where.values())
    d.register("p", "d", ["D"], [4, 5], ["x", "y"])  # every cell of b replaced: b is freed
    assert d.held() == 3 and _where(d, "y", [4, 5]) == [("D", 0), ("D", 1)]
    d.register("p", "e", ["E"], [0], ["x"])  # one cell of a replaced: a keeps its other 7
    assert d.held() == 4 and _where(d, "x", [0, 1]) == [("E", 0), ("A", 1)]
    assert d.objects["a"][1] == 7


def test_directory_release_frees_an_object_with_its_last_cell(directory):
    d = directory
    d.register("p", "a", ["A"], [0, 1, 2], ["x", "y"])
    d.register("p", "b", ["B"], [3], ["x"])
    d.register("q", "c", ["C"], [0], ["x"])  # another partition, same index
    d.release("p", [0, 3])
    assert sorted(d.objects) == ["a", "c"] and d.objects["a"][1] == 4
    with pytest.raises(KeyError, match="field 'x' has no stored row 0"):
        d.locate("p", ["x"], [0])
    d.release("p", [1, 2, 7])  # 7 was never stored
    assert sorted(d.objects) == ["c"] and not any(p == "p" for p, _ in d.cells)
    refs, where = d.locate("q", ["x"], [0])
    assert refs == ["C"] and where["x"][1].tolist() == [0]


def test_runs_of_one_jagged_tensor_each_get_their_own_offsets():
    """_rows' memo (one per get) computes a slice's or a gather's offsets per rows selected:
    two runs of one jagged tensor must not share the first run's offsets."""
    from arrow_dataproto import _rows

    t = torch.nested.nested_tensor([torch.tensor([10]), torch.tensor([20, 21, 22, 23]), torch.tensor([30, 31, 32, 33]),
                                    torch.tensor([40])], layout=torch.jagged)
    shared: dict = {}
    first, second = _rows.slice_rows(t, 0, 2, shared), _rows.slice_rows(t, 2, 4, shared)
    assert [r.tolist() for r in first.unbind()] == [[10], [20, 21, 22, 23]]
    assert [r.tolist() for r in second.unbind()] == [[30, 31, 32, 33], [40]]
    again = _rows.slice_rows(t, 2, 4, shared)  # the same rows: the same offsets tensor
    assert again.offsets() is second.offsets()
    a, b = _rows.take(t, torch.tensor([3, 0]), shared), _rows.take(t, torch.tensor([1, 2]), shared)
    assert [r.tolist() for r in a.unbind()] == [[40], [10]]
    assert [r.tolist() for r in b.unbind()] == [[20, 21, 22, 23], [30, 31, 32, 33]]


def test_put_get_clear_round_trip(tq_on_ray):
    before = held(tq_on_ray)
    data = batch(8)
    tq.kv_batch_put(keys=keys(8), partition_id="round", fields=data)
    assert held(tq_on_ray) == before + 1  # one object for the whole put
    assert_same(tq.kv_batch_get(keys=keys(8), partition_id="round"), data)
    # fields in the order asked; a run of rows; rows in another order
    got = tq.kv_batch_get(keys=keys(3, 2), partition_id="round", select_fields=["uid", "tokens"])
    assert list(got.keys()) == ["uid", "tokens"]
    assert_same(got, TensorDict(
        {"uid": NonTensorStack.from_list(["u2", "u3", "u4"]), "tokens": data["tokens"][2:5]}, batch_size=[3]))
    order = [5, 0, 7]
    got = tq.kv_batch_get(keys=[f"k{i}" for i in order], partition_id="round")
    assert_same(got, TensorDict({
        "tokens": data["tokens"][order], "logp": data["logp"][order], "flags": data["flags"][order],
        "response": torch.nested.nested_tensor([data["response"][i] for i in order], layout=torch.jagged),
        "uid": NonTensorStack.from_list([f"u{i}" for i in order])}, batch_size=[3]))
    tq.kv_clear(keys=keys(8), partition_id="round")
    assert held(tq_on_ray) == before
    with pytest.raises(ValueError):
        tq.kv_batch_get(keys=keys(8), partition_id="round")


def test_streaming_puts_and_a_later_field(tq_on_ray):
    before = held(tq_on_ray)
    data = batch(9)
    for start in range(0, 9, 3):  # a few rows at a time
        tq.kv_batch_put(keys=keys(3, start), partition_id="stream", fields=batch(3, start))
    assert_same(tq.kv_batch_get(keys=keys(9), partition_id="stream"), data)
    extra = TensorDict({"score": torch.arange(9.0)[:, None]}, batch_size=[9])
    tq.kv_batch_put(keys=keys(9), partition_id="stream", fields=extra)
    got = tq.kv_batch_get(keys=keys(9), partition_id="stream")
    assert list(got.keys()) == [*data.keys(), "score"]
    assert torch.equal(got["score"], extra["score"])
    tq.kv_clear(keys=keys(9), partition_id="stream")
    assert held(tq_on_ray) == before


def test_partitions_are_separate(tq_on_ray):
    tq.kv_batch_put(keys=keys(4), partition_id="p1", fields=batch(4))
    tq.kv_batch_put(keys=keys(4), partition_id="p2", fields=batch(4, 100))
    assert_same(tq.kv_batch_get(keys=keys(4), partition_id="p1"), batch(4))
    assert_same(tq.kv_batch_get(keys=keys(4), partition_id="p2"), batch(4, 100))
    tq.kv_clear(keys=keys(4), partition_id="p1")
    assert_same(tq.kv_batch_get(keys=keys(4), partition_id="p2"), batch(4, 100))
    tq.kv_clear(keys=keys(4), partition_id="p2")


def test_dense_rows_are_views_of_the_object_store(tq_on_ray):
    rows = 4096  # 192 KiB per field: in shared memory, not inlined
    data = TensorDict({"x": torch.arange(rows * 6, dtype=torch.int64).reshape(rows, 6)}, batch_size=[rows])
    tq.kv_batch_put(keys=keys(rows), partition_id="views", fields=data)
    whole = tq.kv_batch_get(keys=keys(rows), partition_id="views")["x"]
    run = tq.kv_batch_get(keys=keys(100, 50), partition_id="views")["x"]
    # a run of one put's rows views the whole column's buffer (no copy of its own)
    assert torch.equal(run, data["x"][50:150]) and torch.equal(whole, data["x"])
    assert run.untyped_storage().nbytes() >= whole.nbytes > run.nbytes
    assert run.storage_offset() == 50 * 6
    tq.kv_clear(keys=keys(rows), partition_id="views")


def _reader_class():
    import ray

    @ray.remote(num_cpus=0)
    class Reader:  # shipped by value: each method imports the backend, which registers it in that worker
        def read_and_write(self, names, partition):
            import transfer_queue as tq

            import arrow_dataproto.integrations.transfer_queue  # noqa: F401 -- registers the backend

            tq.init()
            got = tq.kv_batch_get(keys=names, partition_id=partition)
            before = int(got["tokens"].sum())
            got["tokens"].add_(1)  # a private write
            return before

        def put(self, names, partition, start):
            import transfer_queue as tq

            import arrow_dataproto.integrations.transfer_queue  # noqa: F401 -- registers the backend

            tq.init()
            tq.kv_batch_put(keys=names, partition_id=partition, fields=batch(len(names), start))
            return True

    return Reader


def test_fan_out_and_writes_stay_private(tq_on_ray):
    import ray

    rows = 2048
    data = batch(rows)
    tq.kv_batch_put(keys=keys(rows), partition_id="fan", fields=data)
    readers = [_reader_class().remote() for _ in range(3)]
    sums = ray.get([r.read_and_write.remote(keys(rows), "fan") for r in readers])
    assert sums == [int(data["tokens"].sum())] * 3  # nobody saw another's write
    assert_same(tq.kv_batch_get(keys=keys(rows), partition_id="fan"), data)
    tq.kv_clear(keys=keys(rows), partition_id="fan")
    for r in readers:
        ray.kill(r)


def test_data_outlives_the_putter(tq_on_ray):
    import ray

    putter = _reader_class().remote()
    assert ray.get(putter.put.remote(keys(512), "orphan", 7))
    ray.kill(putter)
    time.sleep(1)
    assert_same(tq.kv_batch_get(keys=keys(512), partition_id="orphan"), batch(512, 7))
    tq.kv_clear(keys=keys(512), partition_id="orphan")


def test_a_put_is_the_writers_object_until_a_reader_needs_the_directorys_own(tq_on_ray):
    import ray

    before = held(tq_on_ray)
    data = batch(2048)
    tq.kv_batch_put(keys=keys(2048), partition_id="owned", fields=data)
    assert held(tq_on_ray) == before + 1  # one object per put
    mine = ray.put(0).owner_address()
    refs, _ = ray.get(tq_on_ray.locate.remote("owned", ["tokens"], [0]))
    assert refs[0].owner_address() == mine  # the writer's object: no second copy
    refs, _ = ray.get(tq_on_ray.locate.remote("owned", ["tokens", "uid"], [0, 1], True))
    assert len(refs) == 1 and refs[0].owner_address() != mine  # asked for: the directory's own copy
    refs, _ = ray.get(tq_on_ray.locate.remote("owned", ["tokens"], [5]))
    assert refs[0].owner_address() != mine and held(tq_on_ray) == before + 1  # it replaced the writer's
    assert_same(tq.kv_batch_get(keys=keys(2048), partition_id="owned"), data)
    tq.kv_clear(keys=keys(2048), partition_id="owned")
    assert held(tq_on_ray) == before


def test_a_writer_gone_before_any_read(tq_on_ray):
    """The writer exits right after its put: the bytes the directory mapped stay pinned (new
    objects do not take their place), and the rows read back exactly. (A reader on another
    node, which must fetch the writer's object, is the two-node test's.)"""
    import ray

    rows = 8192  # about 700 KB: in the shared-memory store (smaller objects are inlined)
    putter = _reader_class().remote()
    assert ray.get(putter.put.remote(keys(rows), "early", 3))
    ray.kill(putter)
    time.sleep(1)
    fillers = [ray.put(np.full(2**20, 255, dtype=np.uint8)) for _ in range(4)]  # where a freed object would be
    assert_same(tq.kv_batch_get(keys=keys(rows), partition_id="early"), batch(rows, 3))
    refs, _ = ray.get(tq_on_ray.locate.remote("early", ["tokens"], [0], True))  # copied from the pinned bytes
    assert torch.equal(ray.get(refs[0]).batch["tokens"], batch(rows, 3)["tokens"])
    del fillers
    tq.kv_clear(keys=keys(rows), partition_id="early")


def _three_puts() -> dict[str, TensorDict]:
    """Three puts of two, three and one rows: jagged (two fields sharing offsets), dense, non-tensor."""
    out = {}
    for name, rows, start in (("a", 2, 0), ("b", 3, 10), ("c", 1, 20)):
        ids = range(start, start + rows)
        lengths = [(i * 7) % 5 + 1 for i in ids]
        response = torch.nested.nested_tensor([torch.arange(n) + 100 * i for n, i in zip(lengths, ids)], layout=torch.jagged)
        out[name] = TensorDict({
            "response": response,
            "mask": torch.nested.nested_tensor_from_jagged(response.values() % 2 == 0, response.offsets()),
            "score": torch.tensor([[i * 0.5, -i] for i in ids], dtype=torch.float32),
            "uid": NonTensorStack.from_list([f"{name}{i}" for i in ids]),
        }, batch_size=[rows])
    return out


def _row(data: TensorDict, i: int) -> dict:
    return {
        "response": data["response"].unbind()[i].tolist(), "mask": data["mask"].unbind()[i].tolist(),
        "score": data["score"][i].tolist(), "uid": data.get("uid").tolist()[i],
    }


def test_every_order_of_rows_over_three_puts_is_exact(tq_on_ray):
    """A get of any permutation of the six keys (runs of one put split by others' rows, reversed,
    interleaved) gives each row exactly as it was put: a jagged field's offsets come from each run."""
    import itertools

    puts = _three_puts()
    rows = {}
    for name, data in puts.items():
        names = [f"{name}{i}" for i in range(data.batch_size[0])]
        tq.kv_batch_put(keys=names, partition_id="perm", fields=data)
        rows.update({k: _row(data, i) for i, k in enumerate(names)})
    every = list(rows)
    for order in itertools.permutations(every):
        got = tq.kv_batch_get(keys=list(order), partition_id="perm")
        assert list(got.keys()) == ["response", "mask", "score", "uid"]
        assert got["response"].is_nested and got["score"].dtype == torch.float32 and not got["score"].is_nested
        assert [_row(got, i) for i in range(len(order))] == [rows[k] for k in order], order
    for k in every:  # and every subset of two, in both orders
        for j in every:
            if j != k:
                got = tq.kv_batch_get(keys=[k, j], partition_id="perm")
                assert [_row(got, 0), _row(got, 1)] == [rows[k], rows[j]]
    tq.kv_clear(keys=every, partition_id="perm")


def test_the_issues_interleaved_jagged_runs(tq_on_ray):
    a = TensorDict({"r": torch.nested.nested_tensor(
        [torch.tensor([10]), torch.tensor([20, 21, 22, 23]), torch.tensor([30, 31, 32, 33]), torch.tensor([40])],
        layout=torch.jagged)}, batch_size=[4])
    b = TensorDict({"r": torch.nested.nested_tensor([torch.tensor([99, 98])], layout=torch.jagged)}, batch_size=[1])
    tq.kv_batch_put(keys=["a0", "a1", "a2", "a3"], partition_id="runs", fields=a)
    tq.kv_batch_put(keys=["b0"], partition_id="runs", fields=b)
    got = tq.kv_batch_get(keys=["a0", "a1", "b0", "a2", "a3"], partition_id="runs")["r"]
    assert [t.tolist() for t in got.unbind()] == [[10], [20, 21, 22, 23], [99, 98], [30, 31, 32, 33], [40]]
    got = tq.kv_batch_get(keys=["a3", "b0", "a0", "a2"], partition_id="runs")["r"]
    assert [t.tolist() for t in got.unbind()] == [[40], [99, 98], [10], [30, 31, 32, 33]]
    tq.kv_clear(keys=["a0", "a1", "a2", "a3", "b0"], partition_id="runs")


def _bits(t: torch.Tensor) -> list:
    return t.view(torch.uint8).tolist() if t.dtype.itemsize == 1 or t.is_floating_point() else t.tolist()


@pytest.mark.parametrize(
    ("first", "second", "common"),
    [
        (torch.bfloat16, torch.float16, torch.float32),
        (torch.int32, torch.int64, torch.int64),
        (torch.int32, torch.float32, torch.float64),
        (torch.uint8, torch.int8, torch.int16),
        (torch.float8_e4m3fn, torch.float16, torch.float16),
        (torch.bool, torch.int16, torch.int16),
        (torch.float32, torch.complex64, torch.complex64),
        (torch.int64, torch.float32, None),  # no dtype holds both exactly: the library's error
        (torch.float64, torch.bfloat16, torch.float64),
    ],
)
def test_puts_of_other_dtypes_come_back_exact_or_raise(tq_on_ray, first, second, common):
    part = f"dtypes-{first}-{second}".replace("torch.", "")
    values = [0.5, 1.5, 2.5, 1.0009765625] if first.is_floating_point or second.is_floating_point else [0, 1, 2, 3]
    if torch.bool in (first, second):
        values = [0, 1, 1, 0]
    a = torch.tensor(values[:2]).to(first)[:, None]
    b = torch.tensor(values[2:]).to(second)[:, None]
    tq.kv_batch_put(keys=["x0", "x1"], partition_id=part, fields=TensorDict({"v": a}, batch_size=[2]))
    tq.kv_batch_put(keys=["x2", "x3"], partition_id=part, fields=TensorDict({"v": b}, batch_size=[2]))
    for order in (["x0", "x1", "x2", "x3"], ["x3", "x0", "x2", "x1"]):
        if common is None:
            with pytest.raises(backend.TransferQueueStorageError, match=r"field 'v' was put with dtypes") as e:
                tq.kv_batch_get(keys=order, partition_id=part)
            assert re.search(r"torch.int64: global indexes \[\d+, \d+\]", str(e.value))
            assert re.search(r"torch.float32: global indexes \[\d+, \d+\]", str(e.value))
            continue
        got = tq.kv_batch_get(keys=order, partition_id=part)["v"]
        assert got.dtype == common and not got.is_nested and got.shape == (4, 1)
        want = {"x0": a[0], "x1": a[1], "x2": b[0], "x3": b[1]}
        for row, k in zip(got, order):  # each row the value put, bit for bit once cast back
            if not common.is_complex:
                assert _bits(row.to(want[k].dtype)) == _bits(want[k]), k
            assert torch.equal(row, want[k].to(common)), k
    for k in ("x0", "x1", "x2", "x3"):  # each put alone: its own dtype
        assert tq.kv_batch_get(keys=[k], partition_id=part)["v"].dtype == (first if k < "x2" else second)
    tq.kv_clear(keys=["x0", "x1", "x2", "x3"], partition_id=part)


def test_an_overwrite_with_another_dtype(tq_on_ray):
    tq.kv_batch_put(keys=keys(4), partition_id="over", fields=TensorDict(
        {"v": torch.tensor([1.0009765625, 2.0, 3.0, 4.0], dtype=torch.float16)}, batch_size=[4]))
    tq.kv_batch_put(keys=keys(2, 1), partition_id="over", fields=TensorDict(
        {"v": torch.tensor([0.5, 7.0], dtype=torch.bfloat16)}, batch_size=[2]))
    got = tq.kv_batch_get(keys=keys(4), partition_id="over")["v"]
    assert got.dtype == torch.float32 and got.tolist() == [1.0009765625, 0.5, 7.0, 4.0]
    tq.kv_clear(keys=keys(4), partition_id="over")


@pytest.mark.parametrize("tensor_first", [True, False])
def test_a_field_tensor_in_one_put_and_non_tensor_in_another(tq_on_ray, tensor_first):
    part = f"kinds-{tensor_first}"
    tensor = TensorDict({"v": torch.tensor([[1, 2], [3, 4]])}, batch_size=[2])
    objects = TensorDict({"v": NonTensorStack.from_list(["x", {"y": 1}])}, batch_size=[2])
    first, second = (tensor, objects) if tensor_first else (objects, tensor)
    tq.kv_batch_put(keys=["k0", "k1"], partition_id=part, fields=first)
    tq.kv_batch_put(keys=["k2", "k3"], partition_id=part, fields=second)
    got = tq.kv_batch_get(keys=["k3", "k0", "k2", "k1"], partition_id=part).get("v")
    assert isinstance(got, NonTensorStack)
    want = {"k0": first.get("v"), "k1": first.get("v"), "k2": second.get("v"), "k3": second.get("v")}
    for value, k, i in zip(got.tolist(), ["k3", "k0", "k2", "k1"], [1, 0, 0, 1]):
        expected = want[k][i] if isinstance(want[k], torch.Tensor) else want[k].tolist()[i]
        if isinstance(expected, torch.Tensor):
            assert isinstance(value, torch.Tensor) and value.dtype == expected.dtype and torch.equal(value, expected)
        else:
            assert value == expected
    tq.kv_clear(keys=["k0", "k1", "k2", "k3"], partition_id=part)


def test_gets_across_partitions_of_other_dtypes(tq_on_ray):
    """Rows of two partitions in one get (a BatchMeta of both): joined under the same rules."""
    tq.kv_batch_put(keys=["m0", "m1"], partition_id="mixA", fields=TensorDict(
        {"v": torch.tensor([1, 2], dtype=torch.int32)}, batch_size=[2]))
    tq.kv_batch_put(keys=["m0"], partition_id="mixB", fields=TensorDict(
        {"v": torch.tensor([0.25], dtype=torch.float32)}, batch_size=[1]))
    from transfer_queue.metadata import BatchMeta

    client = tq.get_client()
    a = client.kv_retrieve_meta(keys=["m1", "m0"], partition_id="mixA", create=False)
    b = client.kv_retrieve_meta(keys=["m0"], partition_id="mixB", create=False)
    got = client.get_data(BatchMeta.concat([a, b], validate=False))["v"]
    assert got.dtype == torch.float64 and got.tolist() == [2.0, 1.0, 0.25]
    got = client.get_data(BatchMeta.concat([b, a], validate=False))["v"]
    assert got.dtype == torch.float64 and got.tolist() == [0.25, 2.0, 1.0]
    tq.kv_clear(keys=["m0", "m1"], partition_id="mixA")
    tq.kv_clear(keys=["m0"], partition_id="mixB")


def test_a_refused_put_leaves_no_trace(tq_on_ray):
    before = held(tq_on_ray)
    tq.kv_batch_put(keys=keys(3), partition_id="refused", fields=batch(3))
    for _ in range(3):  # a retry loop
        with pytest.raises(backend.TransferQueueStorageError, match="more than once .duplicated keys.: nothing was stored"):
            tq.kv_batch_put(keys=["k1", "k1"], partition_id="refused", fields=batch(2, 50))
    assert held(tq_on_ray) == before + 1
    assert_same(tq.kv_batch_get(keys=keys(3), partition_id="refused"), batch(3))  # nothing overwritten
    tq.kv_clear(keys=["k0", "k2"], partition_id="refused")
    assert held(tq_on_ray) == before + 1  # k1 is still stored
    assert_same(tq.kv_batch_get(keys=["k1"], partition_id="refused"), batch(1, 1))
    tq.kv_clear(keys=["k1"], partition_id="refused")
    assert held(tq_on_ray) == before


def test_no_object_held_once_every_key_is_cleared(tq_on_ray):
    """Overwrites of some rows and some fields, a later field, refused puts: clearing every key frees every object."""
    before = held(tq_on_ray)
    tq.kv_batch_put(keys=keys(6), partition_id="count", fields=batch(6))
    tq.kv_batch_put(keys=keys(2, 2), partition_id="count", fields=batch(2, 40))  # overwrites rows 2, 3
    tq.kv_batch_put(keys=keys(6), partition_id="count", fields=TensorDict({"extra": torch.ones(6)}, batch_size=[6]))
    tq.kv_batch_put(keys=keys(1, 5), partition_id="count", fields=TensorDict({"extra": torch.zeros(1)}, batch_size=[1]))
    with pytest.raises((ValueError, backend.TransferQueueStorageError)):
        tq.kv_batch_put(keys=["k3", "k3"], partition_id="count", fields=batch(2))
    assert held(tq_on_ray) == before + 4
    tq.kv_clear(keys=keys(2, 2), partition_id="count")  # the second put's rows: it is freed
    assert held(tq_on_ray) == before + 3
    tq.kv_clear(keys=["k0", "k1", "k4"], partition_id="count")
    assert held(tq_on_ray) == before + 2  # row 5: in the first and the fourth (its "extra" replaced the third's)
    got = tq.kv_batch_get(keys=["k5"], partition_id="count")
    assert got["extra"].tolist() == [0.0] and got.get("uid").tolist() == ["u5"]
    tq.kv_clear(keys=["k5"], partition_id="count")
    assert held(tq_on_ray) == before


def _checkpointed_puts() -> None:
    """Puts in two partitions: an overwrite of some rows' fields, a later field, cleared rows."""
    tq.kv_batch_put(keys=keys(6), partition_id="ck1", fields=batch(6))
    tq.kv_batch_put(keys=keys(2, 1), partition_id="ck1", fields=TensorDict(
        {"logp": torch.full((2, 6), 0.5, dtype=torch.bfloat16), "uid": NonTensorStack.from_list(["x1", "x2"])},
        batch_size=[2]))
    tq.kv_batch_put(keys=keys(4, 100), partition_id="ck2", fields=batch(4, 100))
    tq.kv_batch_put(keys=keys(4, 100), partition_id="ck2", fields=TensorDict({"score": torch.arange(4.0)}, batch_size=[4]))
    tq.kv_batch_put(keys=keys(3, 200), partition_id="ck2", fields=batch(3, 200))
    tq.kv_clear(keys=["k4"], partition_id="ck1")  # a cleared row in the middle of a put
    tq.kv_clear(keys=keys(3, 200), partition_id="ck2")  # a whole put cleared


def _checkpointed_rows() -> dict[str, tuple[list[str], TensorDict]]:
    """What :func:`_checkpointed_puts` leaves stored."""
    rows, six = [0, 1, 2, 3, 5], batch(6)
    ck1 = TensorDict({
        "tokens": six["tokens"][rows], "logp": six["logp"][rows], "flags": six["flags"][rows],
        "response": torch.nested.nested_tensor([six["response"].unbind()[i] for i in rows], layout=torch.jagged),
        "uid": NonTensorStack.from_list(["u0", "x1", "x2", "u3", "u5"]),
    }, batch_size=[5])
    ck1["logp"][1:3] = 0.5
    ck2 = batch(4, 100)
    ck2["score"] = torch.arange(4.0)
    return {"ck1": (["k0", "k1", "k2", "k3", "k5"], ck1), "ck2": (keys(4, 100), ck2)}


def _assert_checkpointed_rows() -> None:
    for partition, (names, want) in _checkpointed_rows().items():
        assert_same(tq.kv_batch_get(keys=names, partition_id=partition, select_fields=list(want.keys())), want)
    with pytest.raises(ValueError):  # cleared before the save: gone
        tq.kv_batch_get(keys=["k4"], partition_id="ck1")


def test_checkpoint_round_trip_files_and_errors(tq_on_ray, tmp_path):
    import pandas as pd

    from arrow_dataproto.files import open_file

    _checkpointed_puts()
    tq.save_checkpoint(tmp_path / "ckpt")
    folder = tmp_path / "ckpt" / "arrow_dataproto"
    manifest = __import__("json").loads((folder / "manifest.json").read_text())
    assert len(manifest["files"]) == 4  # the cleared put wrote nothing
    first = folder / manifest["files"][0]["file"]
    with open_file(first, verify=True) as reader:  # our files, checksummed, readable as any batch file
        assert len(reader.read_batch(0)) == 5
    assert len(pd.read_feather(first)) == 5
    tq.kv_clear(keys=["k0", "k1", "k2", "k3", "k5"], partition_id="ck1")
    tq.kv_batch_put(keys=keys(2), partition_id="ck1", fields=batch(2, 900))  # rows the load replaces
    tq.load_checkpoint(tmp_path / "ckpt")
    _assert_checkpointed_rows()
    assert held(tq_on_ray) == 4

    # a damaged file: the library's error naming it, nothing loaded (the rows stay as they were)
    data = bytearray(first.read_bytes())
    at = bytes(data).index(torch.arange(30, 36).numpy().tobytes())  # row k3's tokens
    data[at + 9] ^= 0x01
    first.write_bytes(bytes(data))
    tq.kv_clear(keys=["k0"], partition_id="ck1")
    with pytest.raises(backend.TransferQueueStorageError, match=r"00000\.arrow cannot be loaded") as e:
        tq.load_checkpoint(tmp_path / "ckpt")
    assert "nothing was loaded" in str(e.value)
    assert_same(tq.kv_batch_get(keys=["k5"], partition_id="ck1", select_fields=["tokens"]),
                TensorDict({"tokens": batch(6)["tokens"][5:]}, batch_size=[1]))
    (folder / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(backend.TransferQueueStorageError, match="manifest.json is not this backend's manifest"):
        tq.load_checkpoint(tmp_path / "ckpt")
    (folder / "manifest.json").unlink()
    with pytest.raises(backend.TransferQueueStorageError, match="manifest.json not found"):
        tq.load_checkpoint(tmp_path / "ckpt")
    tq.kv_clear(keys=["k1", "k2", "k3", "k5"], partition_id="ck1")
    tq.kv_clear(keys=keys(4, 100), partition_id="ck2")
    assert held(tq_on_ray) == 0


def test_checkpoint_outlives_the_killed_process(tq_on_ray, tmp_path):
    """The process that called tq.init() (in a Ray of its own) is SIGKILLed right after
    save_checkpoint; this process, in another Ray session, loads the checkpoint and gets every
    row exact."""
    import os
    import signal

    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")])}
    saver = subprocess.Popen([sys.executable, __file__, "save", str(tmp_path / "ckpt")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = ""
        deadline = time.monotonic() + 240
        while "saved" not in line and time.monotonic() < deadline and saver.poll() is None:
            line = saver.stdout.readline()
        assert "saved" in line, saver.stderr.read()[-3000:] if saver.poll() is not None else "no save in 240 s"
        os.kill(saver.pid, signal.SIGKILL)
        saver.wait(30)
    finally:
        try:
            os.killpg(saver.pid, signal.SIGKILL)  # the Ray it started
        except ProcessLookupError:
            pass
    tq.load_checkpoint(tmp_path / "ckpt")
    _assert_checkpointed_rows()
    tq.kv_clear(keys=["k0", "k1", "k2", "k3", "k5"], partition_id="ck1")
    tq.kv_clear(keys=keys(4, 100), partition_id="ck2")
    assert held(tq_on_ray) == 0


def _child_ray() -> None:
    ray.init(address="local", num_cpus=8, object_store_memory=512 * 1024**2, include_dashboard=False,
             runtime_env=HOOK, configure_logging=False)


def save_then_wait(path: str) -> None:
    _child_ray()
    tq.init(OmegaConf.create(CONFIG))
    _checkpointed_puts()
    tq.save_checkpoint(path)
    print("saved", flush=True)
    time.sleep(600)  # killed here


def test_setup_hook_is_cheap_and_registers():
    code = (
        "import sys; import arrow_dataproto.integrations as i; i.register_transfer_queue(); "
        "assert 'torch' not in sys.modules and 'transfer_queue' not in sys.modules; "
        "import transfer_queue; from transfer_queue.storage.managers.base import StorageManagerFactory as F; "
        "assert 'arrow_dataproto' in F._registry; print('registered')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "registered" in out.stdout, out.stderr[-3000:]


def test_reader_on_a_second_node():
    from two_nodes import run_as_child

    run_as_child(__file__, "second node read")


def test_killed_directory_is_a_clear_error(tq_on_ray):
    """Runs last: it ends the module's TransferQueue instance."""
    import ray

    tq.kv_batch_put(keys=keys(512), partition_id="dead", fields=batch(512))
    ray.kill(tq_on_ray)
    time.sleep(1)
    start = time.monotonic()
    with pytest.raises(backend.TransferQueueStorageError, match="directory actor"):
        tq.kv_batch_get(keys=keys(512), partition_id="dead")
    with pytest.raises(backend.TransferQueueStorageError):
        tq.kv_batch_put(keys=keys(4, 900), partition_id="dead", fields=batch(4))
    assert time.monotonic() - start < 60


def main() -> None:
    """The child of test_reader_on_a_second_node: driver puts on the head, an actor on the second node reads."""
    import ray
    from two_nodes import two_nodes

    with two_nodes(runtime_env=HOOK, resources={"second": 1}):  # the documented line
        tq.init(OmegaConf.create(CONFIG))
        data = batch(2048)
        tq.kv_batch_put(keys=keys(2048), partition_id="far", fields=data)

        @ray.remote(num_cpus=0, resources={"second": 1})
        def read(names):
            import transfer_queue as tq

            import arrow_dataproto.integrations.transfer_queue  # noqa: F401 -- registers the backend

            tq.init()
            got = tq.kv_batch_get(keys=names, partition_id="far")
            return ray.get_runtime_context().get_node_id(), got["tokens"].clone(), got["uid"].tolist()

        node, tokens, uid = ray.get(read.remote(keys(2048)))
        assert node != ray.get_runtime_context().get_node_id()
        assert torch.equal(tokens, data["tokens"]) and uid == data["uid"].tolist()

        # A writer on the head node exits after its put: the reader on the second node cannot
        # fetch the writer's object (its owner is gone) and is answered with the directory's
        # own copy, put then from the bytes it pinned.
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        head = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        putter = _reader_class().options(scheduling_strategy=head).remote()
        assert ray.get(putter.put.remote(keys(8192, 10_000), "far", 5))
        ray.kill(putter)
        time.sleep(3)  # the owner's death known across the cluster
        node, tokens, uid = ray.get(read.remote(keys(8192, 10_000)))
        assert node != ray.get_runtime_context().get_node_id()
        assert torch.equal(tokens, batch(8192, 5)["tokens"]) and uid == batch(8192, 5)["uid"].tolist()
        tq.close()
    print("second node read")


if __name__ == "__main__":
    if sys.argv[1:2] == ["save"]:
        save_then_wait(sys.argv[2])
    else:
        main()
