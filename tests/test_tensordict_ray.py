"""TensorDict through Ray with arrow_dataproto.integrations.tensordict, and DataProto /
TensorDict through Ray Direct Transport (gloo on the CPU)."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from arrow_dataproto import DataProto
from arrow_dataproto.integrations import tensordict as adp_td
from arrow_dataproto.testing import assert_dataproto_equal, assert_td_equal

ray = pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module

# What ray.init(runtime_env={"worker_process_setup_hook": "...install"}) gives every worker (Ray
# processes that key only at the job level): the same hook, for these actors only.
HOOK = ray._private.runtime_env.setup_hook.export_setup_func_module({}, "arrow_dataproto.integrations.tensordict.install")


def every_leaf(rows: int = 4, width: int = 8) -> TensorDict:
    """Dense (bf16, fp8, bool, int), jagged and strided nested tensors, a nested TensorDict
    with its own batch size, NonTensorData and NonTensorStack leaves, at several levels."""
    g = torch.Generator().manual_seed(0)
    return TensorDict(
        {
            "ids": torch.arange(rows * width).reshape(rows, width),
            "logp": torch.randn(rows, width, generator=g).bfloat16(),
            "name": NonTensorData("rollout", batch_size=[rows]),
            "fp8": torch.randn(rows, 3, generator=g).to(torch.float8_e4m3fn),
            "mask": torch.arange(rows * width).reshape(rows, width) % 3 == 0,
            "jagged": torch.nested.nested_tensor([torch.arange(i + 1) for i in range(rows)], layout=torch.jagged),
            "strided": torch.nested.nested_tensor([torch.full((i % 2 + 1, 2), float(i)) for i in range(rows)]),
            "uid": NonTensorStack(*[NonTensorData(f"u{i}") for i in range(rows)]),
            "sub": TensorDict(
                {"score": torch.linspace(0, 1, rows * 2).reshape(rows, 2), "tag": NonTensorData({"k": 1}, batch_size=[rows, 2])},
                batch_size=[rows, 2],
            ),
        },
        batch_size=[rows],
    )


def big(rows: int = 64) -> TensorDict:
    """Over 100 KiB: in Ray's shared memory, not inlined."""
    return TensorDict({"x": torch.arange(rows * 4096, dtype=torch.float32).reshape(rows, 4096)}, batch_size=[rows])


def assert_same(a: TensorDict, b: TensorDict) -> None:
    """Bit-equal tensors, key order, batch sizes (assert_td_equal), and the non-tensor leaves' values."""
    tensors = [k for k, v in a.items(True, True) if isinstance(v, torch.Tensor)]
    assert list(a.keys(True)) == list(b.keys(True))
    assert_td_equal(a.select(*tensors), b.select(*tensors))
    for key in a.keys(True, True):
        if key not in tensors:
            assert type(a.get(key)) is type(b.get(key)), key
            assert a.get(key).tolist() == b.get(key).tolist(), key


def in_band(value) -> tuple[int, int]:
    """``(in-band bytes, out-of-band bytes)`` of Ray's pickling of ``value`` (protocol 5)."""
    buffers: list = []
    data = ray.cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return len(data), sum(memoryview(b).nbytes for b in buffers)


@pytest.fixture
def installed():
    adp_td.install()
    yield
    adp_td.uninstall()


@ray.remote(runtime_env=HOOK, enable_tensor_transport=True)
class Worker:
    """A Ray worker with the setup hook; also in the gloo group of Ray Direct Transport."""

    def installed(self):
        return adp_td.is_installed()

    def echo(self, td):
        return td

    def add_one_then_sum(self, td):
        td["x"].add_(1)
        return float(td["x"].sum())

    def total(self, td):
        return float(td["x"].sum())

    @ray.method(tensor_transport="gloo")
    def make(self, kind: str):
        return made(kind)

    def same(self, received, kind: str):
        """The class of what arrived, after checking that it equals what :meth:`make` built."""
        expected = made(kind)
        if kind == "dataproto":
            assert_dataproto_equal(received, expected)
        else:
            assert_same(expected, received)
        return type(received).__name__

    def in_band_of(self, kind: str):
        """Bytes Ray's direct-transport serialization of ``made(kind)`` leaves for the object store,
        and bytes of the tensors it hands to gloo."""
        context = ray._private.worker.global_worker.get_serialization_context()
        serialized, tensors = context.serialize_rdt_objects(made(kind), "GLOO")
        return serialized.total_bytes, sum(t.numel() * t.element_size() for t in tensors)


def made(kind: str):
    """What :meth:`Worker.make` returns: a DataProto of every tensor kind, :func:`every_leaf`, or :func:`big`."""
    if kind == "dataproto":
        td = every_leaf().exclude("name", "uid", ("sub", "tag"))
        return DataProto(td, {"uid": np.array(["a", "b", "c", "d"], dtype=object)}, {"step": 3})
    return every_leaf() if kind == "tensordict" else big()


@ray.remote
class Plain:
    """A Ray worker without the setup hook."""

    def installed(self):
        return adp_td.is_installed()

    def same(self, td):
        assert_same(every_leaf(), td)
        return type(td).__name__


@pytest.fixture(scope="module")
def workers(ray_session):
    actors = [Worker.remote(), Worker.remote()]
    ray.get([a.installed.remote() for a in actors])
    yield actors
    for a in actors:
        ray.kill(a)


# ---------------------------------------------------------------- ray.put, arguments, returns


def test_put_get_is_exact_for_every_leaf_kind(ray_session, installed):
    td = every_leaf()
    assert_same(td, ray.get(ray.put(td)))


def test_tensor_bytes_travel_out_of_band(installed):
    td = big()
    inside, outside = in_band(td)
    assert outside == td["x"].numel() * 4
    assert inside < 4096
    adp_td.uninstall()
    assert in_band(td)[0] > td["x"].numel() * 4  # tensordict's own pickling: the bytes in band


def test_actor_arguments_and_returns_go_through_the_hook(workers, installed):
    td = every_leaf()
    assert ray.get(workers[0].installed.remote())
    assert_same(td, ray.get(workers[0].echo.remote(td)))


def test_writes_stay_private(workers, installed):
    td = big()
    expected = float(td["x"].sum())
    ref = ray.put(td)
    writer, reader = workers
    assert ray.get(writer.add_one_then_sum.remote(ref)) == expected + td["x"].numel()
    assert ray.get(reader.total.remote(ref)) == expected
    mine = ray.get(ref)
    mine["x"].add_(1)
    assert float(ray.get(ref)["x"].sum()) == expected
    assert float(td["x"].sum()) == expected


def test_a_receiver_without_install_reads_it(ray_session, installed):
    plain = Plain.remote()
    try:
        assert not ray.get(plain.installed.remote())
        assert ray.get(plain.same.remote(every_leaf())) == "TensorDict"
    finally:
        ray.kill(plain)


def through_codec() -> bool:
    """Whether Ray's pickling of a TensorDict here carries its bytes out of band (our serializer)."""
    return in_band(big())[0] < 4096


def test_install_is_idempotent_and_undoable(ray_session):
    assert not through_codec()
    adp_td.install()
    adp_td.install()
    try:
        assert adp_td.is_installed() and through_codec()
        ref = ray.put(big())
    finally:
        adp_td.uninstall()
    adp_td.uninstall()
    assert not adp_td.is_installed() and not through_codec()
    assert_same(big(), ray.get(ref))  # sent while installed: still read afterwards
    assert_same(big(), ray.get(ray.put(big())))  # tensordict's own pickling again


def test_what_the_codec_cannot_encode_falls_back_to_tensordict_pickling(ray_session, installed):
    td = TensorDict({"scalar": torch.tensor(3.0), "v": torch.arange(3)}, batch_size=[])
    state = adp_td.serialize(td)
    assert state[0] == "tensordict.pickle"
    assert_same(td, ray.get(ray.put(td)))


def test_a_nested_lazy_stack_keeps_its_keys_and_stacking_through_ray(ray_session, installed):
    """Issue 48: stacked TensorDicts with different keys (or shapes) inside a TensorDict went through
    Ray as a plain TensorDict of the shared keys (or raised torch's RuntimeError from ray.put)."""
    from tensordict import LazyStackedTensorDict

    steps = LazyStackedTensorDict(
        TensorDict({"obs": torch.ones(3), "bonus": torch.arange(2), "v": torch.ones(1)}, []),
        TensorDict({"obs": torch.zeros(3), "v": torch.ones(4)}, []),
        stack_dim=0,
    )
    back = ray.get(ray.put(TensorDict({"steps": steps, "t": torch.arange(2)}, batch_size=[2])))
    got = back["steps"]
    assert type(got) is LazyStackedTensorDict and got.stack_dim == 0
    assert [sorted(td.keys()) for td in got.tensordicts] == [["bonus", "obs", "v"], ["obs", "v"]]
    assert torch.equal(got.tensordicts[0]["bonus"], torch.arange(2)) and got.tensordicts[1]["v"].shape == (4,)


def test_a_malformed_state_is_a_decode_error():
    from arrow_dataproto import DecodeError

    with pytest.raises(DecodeError, match="not a TensorDict state"):
        adp_td.rebuild(("something else",))


def test_the_setup_hook_imports_neither_torch_nor_tensordict():
    code = (
        "import sys\n"
        "from arrow_dataproto.integrations import tensordict as m\n"
        "m.install()\n"
        "assert 'torch' not in sys.modules and 'tensordict' not in sys.modules and 'ray' not in sys.modules\n"
        "import torch, ray.cloudpickle\n"
        "from tensordict import TensorDict\n"
        "td = TensorDict({'x': torch.zeros(64, 4096)}, batch_size=[64])\n"
        "assert len(ray.cloudpickle.dumps(td, protocol=5, buffer_callback=list().append)) < 4096\n"
        "m.uninstall()\n"
        "assert len(ray.cloudpickle.dumps(td, protocol=5, buffer_callback=list().append)) > 2**20\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_pickle_and_torch_save_keep_tensordict_behaviour(installed):
    td = big(2)
    assert pickle.loads(pickle.dumps(td))["x"].equal(td["x"])  # pickle's dispatch is not Ray's


# ---------------------------------------------------------------- Ray Direct Transport (gloo)


@pytest.fixture(scope="module")
def gloo_group(workers):
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    group = create_collective_group(workers, backend="torch_gloo")
    yield workers
    destroy_collective_group(group)


@pytest.mark.parametrize("kind", ["dataproto", "tensordict"])
def test_direct_transport_is_exact(gloo_group, kind):
    sender, receiver = gloo_group
    assert ray.get(receiver.same.remote(sender.make.remote(kind), kind)) in ("DataProto", "TensorDict")


@pytest.mark.parametrize("kind", ["dataproto", "tensordict", "big"])
def test_direct_transport_keeps_the_tensor_bytes_out_of_the_object_store(gloo_group, kind):
    inside, through_gloo = ray.get(gloo_group[0].in_band_of.remote(kind))
    assert through_gloo > 0
    assert inside < 16 * 1024
    if kind == "big":
        assert through_gloo == 64 * 4096 * 4
