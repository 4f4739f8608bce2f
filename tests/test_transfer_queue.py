"""The TransferQueue backend ``arrow_dataproto`` (arrow_dataproto.integrations.transfer_queue).

``tq.init`` takes 6-27 s here, so the module starts one TransferQueue on the session Ray and
every test uses its own partition. The killed-directory test runs last and ends that instance.
The two-node test runs in a child process (tests/two_nodes.py).
"""

from __future__ import annotations

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
    main()
