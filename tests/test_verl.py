"""verl drop-in (arrow_dataproto.integrations.verl).

The patching, the Arrow pickles and the decoders of an unpatched verl's states
are tested on ``StandIn``, a class with verl's three fields and verl-like
pickling; tests marked ``verl`` repeat the essentials on the real
``verl.protocol.DataProto`` and skip where verl cannot be imported.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pytest
import tensordict
import torch
from packaging.version import Version
from tensordict import TensorDict
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

from arrow_dataproto import DecodeError, from_ipc, receive_options, to_ipc
from arrow_dataproto.integrations import verl as adp_verl

MODULE = b"arrow_dataproto.integrations.verl"

# tensordict < 0.13 drops a jagged tensor's ragged_idx in consolidate + torch.save (tensordict #1676):
# verl's default state cannot carry the mRoPE column exactly there, whoever decodes it.
RAGGED_IDX_SURVIVES_TORCH_SAVE = Version(tensordict.__version__).release >= (0, 13)


# ---------------------------------------------------------------- verl's pickled states, written from the format


def legacy_default_state(dp) -> tuple:
    """verl's default state: the consolidated batch as ``torch.save`` bytes."""
    batch = dp.batch
    if batch is not None and len(batch.keys()):
        batch = batch.contiguous().consolidate()
    buffer = io.BytesIO()
    torch.save(batch, buffer)
    return buffer.getvalue(), dp.non_tensor_batch, dp.meta_info


def _triple(t: torch.Tensor) -> tuple:
    return str(t.dtype).removeprefix("torch."), t.shape, t.contiguous().reshape(-1).view(torch.uint8).numpy()


def legacy_numpy_state(dp) -> tuple:
    """verl's numpy-mode state: per key ``(dtype, shape, uint8 bytes)``, or ``(layout, [one per row])``."""
    if dp.batch is None:
        return None, dp.non_tensor_batch, dp.meta_info
    items = {
        key: (str(t.layout).removeprefix("torch."), [_triple(r) for r in t.unbind()]) if t.is_nested else _triple(t)
        for key, t in dp.batch.items()
    }
    device = None if dp.batch.device is None else str(dp.batch.device)
    return (tuple(dp.batch.batch_size), device, items), dp.non_tensor_batch, dp.meta_info


@dataclass
class StandIn:
    """verl's DataProto in miniature: three fields, a checking constructor, verl-like pickling."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)
    legacy_mode = "default"  # class attribute (not a field): which state __getstate__ writes
    constructed = 0  # how many times the constructor ran
    states_written = 0  # how many times __getstate__ ran

    def __post_init__(self):
        type(self).constructed += 1
        if self.batch is not None and self.batch.batch_dims != 1:
            raise ValueError("only one batch dimension")
        if any(len(v) != len(self) for v in self.non_tensor_batch.values()):
            raise ValueError("rows differ")

    def __len__(self):
        return 0 if self.batch is None else self.batch.batch_size[0]

    def __getstate__(self):
        type(self).states_written += 1
        return legacy_numpy_state(self) if self.legacy_mode == "numpy" else legacy_default_state(self)

    def __setstate__(self, state):  # reads the default state only
        encoded, self.non_tensor_batch, self.meta_info = state
        self.batch = torch.load(io.BytesIO(encoded), weights_only=False)


def parts(drop: tuple[str, ...] = ()) -> tuple:
    """The sample batch's three fields, without the batch keys in ``drop``."""
    dp = sample_dataproto()
    batch = dp.batch.exclude(*drop) if drop else dp.batch
    return batch, dp.non_tensor_batch, dp.meta_info


NOT_IN_NUMPY_MODE = ("extra",)  # verl's numpy mode writes top-level tensors only, not nested TensorDicts
NOT_IN_DEFAULT_MODE = () if RAGGED_IDX_SURVIVES_TORCH_SAVE else ("position_ids_mrope",)


@pytest.fixture
def standin(monkeypatch):
    """StandIn, unpatched; unpatched again (and in default legacy mode) after the test."""
    monkeypatch.setattr(StandIn, "legacy_mode", "default")
    yield StandIn
    adp_verl.uninstall(StandIn)


def buffer_ranges(buffers) -> list[tuple[int, int]]:
    ranges = []
    for b in buffers:
        view = pa.py_buffer(b)
        ranges.append((view.address, view.address + view.size))
    return ranges


# ---------------------------------------------------------------- Arrow pickles of a patched class


def test_protocol5_round_trip_sends_tensor_bytes_out_of_band(standin):
    original = standin(*parts())
    adp_verl.install(standin)
    buffers = []
    data = pickle.dumps(original, protocol=5, buffer_callback=buffers.append)
    ids = original.batch["input_ids"].numpy().tobytes()
    assert MODULE in data and ids not in data
    assert any(ids in bytes(b.raw()) for b in buffers)
    restored = pickle.loads(data, buffers=buffers)
    assert type(restored) is standin
    assert_dataproto_equal(restored, original)


@pytest.mark.parametrize("protocol", range(5))
def test_lower_protocols_round_trip(standin, protocol):
    original = standin(*parts())
    adp_verl.install(standin)
    data = pickle.dumps(original, protocol=protocol)
    restored = pickle.loads(data)
    assert type(restored) is standin
    assert_dataproto_equal(restored, original)


def test_receive_options_apply_and_constructor_is_not_rerun(standin):
    original = standin(*parts())
    adp_verl.install(standin)
    buffers = []
    data = pickle.dumps(original, protocol=5, buffer_callback=buffers.append)
    ranges = buffer_ranges(buffers)

    def inside(t: torch.Tensor) -> bool:
        return any(lo <= t.data_ptr() < hi for lo, hi in ranges)

    constructed = standin.constructed
    copied = pickle.loads(data, buffers=buffers)
    with receive_options(copy=False):
        viewing = pickle.loads(data, buffers=buffers)
    assert standin.constructed == constructed
    assert not inside(copied.batch["input_ids"]) and inside(viewing.batch["input_ids"])
    assert_dataproto_equal(viewing, original)


def test_install_is_idempotent_and_uninstall_restores(standin):
    before = dict(standin.__dict__)
    assert adp_verl.install(standin) is standin and adp_verl.install(standin) is standin
    assert adp_verl.is_installed(standin)
    adp_verl.uninstall(standin)
    assert not adp_verl.is_installed(standin)
    assert dict(standin.__dict__) == before
    original = standin(*parts(NOT_IN_DEFAULT_MODE))
    data = pickle.dumps(original, protocol=5)
    assert MODULE not in data
    assert_dataproto_equal(pickle.loads(data), original)


class SubStandIn(StandIn):
    pass


def test_subclasses_pickle_as_themselves(standin):
    adp_verl.install(standin)
    original = SubStandIn(*parts())
    restored = pickle.loads(pickle.dumps(original, protocol=5))
    assert type(restored) is SubStandIn
    assert_dataproto_equal(restored, original)


@pytest.mark.parametrize("receive_copy", [True, False])
def test_copies_are_independent_of_receive_options(standin, receive_copy):
    original = standin(*parts())
    adp_verl.install(standin)
    with receive_options(copy=receive_copy):
        shallow, deep = copy.copy(original), copy.deepcopy(original)
    for duplicate in (shallow, deep):
        assert type(duplicate) is standin
        assert_dataproto_equal(duplicate, original)
        assert duplicate.batch["input_ids"].data_ptr() != original.batch["input_ids"].data_ptr()
    assert shallow.non_tensor_batch is original.non_tensor_batch and shallow.meta_info is original.meta_info
    assert deep.non_tensor_batch["reward_model"][0] is not original.non_tensor_batch["reward_model"][0]
    assert deep.meta_info["global_token_num"] is not original.meta_info["global_token_num"]


# ---------------------------------------------------------------- states pickled by an unpatched class


@pytest.mark.parametrize(
    "mode, drop",
    [("default", NOT_IN_DEFAULT_MODE), ("numpy", NOT_IN_NUMPY_MODE)],
)
def test_unpatched_payloads_load_after_install(standin, mode, drop):
    standin.legacy_mode = mode
    original = standin(*parts(drop))
    assert original.batch["responses_jagged"].is_nested  # jagged rows are part of the payload
    payloads = [pickle.dumps(original, protocol=p) for p in (2, 5)]
    assert all(MODULE not in p for p in payloads)
    adp_verl.install(standin)
    for payload in payloads:
        restored = pickle.loads(payload)
        assert type(restored) is standin
        assert_dataproto_equal(restored, original)


def test_numpy_mode_strided_nested_and_no_batch(standin):
    strided = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 1)], layout=torch.strided)
    batch = TensorDict({"s": strided, "b": torch.tensor([True, False])}, batch_size=[2])
    with_batch = standin(batch, {"k": np.array(["x", "y"], dtype=object)}, {"step": 1})
    without_batch = standin(None, {}, {"step": 2})
    # (verl's default mode cannot send strided nested tensors: tensordict refuses to consolidate them)
    cases = [(with_batch, legacy_numpy_state), (without_batch, legacy_numpy_state), (without_batch, legacy_default_state)]
    adp_verl.install(standin)
    for original, encode in cases:
        restored = standin.__new__(standin)
        restored.__setstate__(encode(original))
        assert_dataproto_equal(restored, original)


def test_numpy_mode_tensors_own_their_memory_even_without_copy(standin):
    original = standin(TensorDict({"x": torch.arange(6.0).view(3, 2)}, batch_size=[3]))
    state = legacy_numpy_state(original)
    adp_verl.install(standin)
    with receive_options(copy=False):
        restored = standin.__new__(standin)
        restored.__setstate__(state)
    source = state[0][2]["x"][2]
    assert restored.batch["x"].data_ptr() != source.ctypes.data
    restored.batch["x"].add_(1)
    assert torch.equal(original.batch["x"], torch.arange(6.0).view(3, 2))


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _dense(dtype="int64", shape=(2, 3), nbytes=48):
    return (dtype, torch.Size(shape), np.zeros(nbytes, dtype=np.uint8))


def _numpy_state(items, batch_size=(2,), device=None, non_tensor=None, meta_info=None):
    non_tensor = {"uid": np.array(["a", "b"], dtype=object)} if non_tensor is None else non_tensor
    return (batch_size, device, items), non_tensor, {} if meta_info is None else meta_info


MALFORMED = {
    "not a tuple": [b"", {}, {}],
    "two fields": (b"", {}),
    "batch of another type": (3, {}, {}),
    "not torch.save bytes": (b"junk", {}, {}),
    "truncated torch.save": (_saved(TensorDict({"x": torch.zeros(2)}, batch_size=[2]))[:50], {}, {}),
    "torch.save of a tensor": (_saved(torch.zeros(2)), {}, {}),
    "numpy batch of 2 fields": ((2, None), {}, {}),
    "batch_size not ints": _numpy_state({"x": _dense()}, batch_size=("2",)),
    "device not a str": _numpy_state({"x": _dense()}, device=0),
    "items not a dict": _numpy_state([_dense()]),
    "entry of 4 fields": _numpy_state({"x": (*_dense(), 0)}),
    "unknown dtype": _numpy_state({"x": _dense(dtype="float99")}),
    "dtype naming a torch function": _numpy_state({"x": _dense(dtype="save")}),
    "too few bytes": _numpy_state({"x": _dense(nbytes=47)}),
    "bytes not uint8": _numpy_state({"x": ("int64", torch.Size([2, 3]), np.zeros(6, dtype=np.int64))}),
    "negative shape": _numpy_state({"x": _dense(shape=(2, -3))}),
    "rows disagree with batch_size": _numpy_state({"x": _dense(shape=(3, 2))}),
    "unknown layout": _numpy_state({"x": ("sparse", [_dense(shape=(2,), nbytes=16)] * 2)}),
    "nested rows not a list": _numpy_state({"x": ("jagged", _dense())}),
    "nested row not a triple": _numpy_state({"x": ("jagged", [("int64",)] * 2)}),
    "two batch dims": _numpy_state({"x": _dense()}, batch_size=(2, 3)),
    "non_tensor_batch not a dict": _numpy_state({"x": _dense()}, non_tensor=[]),
    "non_tensor value not an array": _numpy_state({"x": _dense()}, non_tensor={"uid": ["a", "b"]}),
    "non_tensor rows differ": _numpy_state({"x": _dense()}, non_tensor={"uid": np.array(["a"], dtype=object)}),
    "meta_info not a dict": _numpy_state({"x": _dense()}, meta_info=[]),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_unpatched_states_raise_decode_error(standin, name):
    adp_verl.install(standin)
    with pytest.raises(DecodeError):
        standin.__new__(standin).__setstate__(MALFORMED[name])


# ---------------------------------------------------------------- selection, verl missing


def test_without_verl_install_raises_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "verl.protocol", None)  # makes `import verl.protocol` fail
    with pytest.raises(ImportError, match="needs verl") as info:
        adp_verl.install()
    assert isinstance(info.value, adp_verl.VerlNotFoundError)
    monkeypatch.setenv(adp_verl.ENV_VAR, "arrow")
    with pytest.raises(adp_verl.VerlNotFoundError):
        adp_verl.install_from_env()


@pytest.mark.parametrize("value", [None, "numpy", "Arrow", ""])
def test_install_from_env_ignores_other_values(monkeypatch, value):
    monkeypatch.setitem(sys.modules, "verl.protocol", None)  # any attempt to patch verl would raise
    if value is None:
        monkeypatch.delenv(adp_verl.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(adp_verl.ENV_VAR, value)
    assert adp_verl.install_from_env() is False


# ---------------------------------------------------------------- through Ray


@pytest.fixture(scope="module")
def echo_actor(ray_session):
    @ray_session.remote(num_cpus=0)
    class Echo:
        """An actor in an unpatched worker: receives, and answers with what it saw."""

        def inspect(self, dp):
            return type(dp).__qualname__, to_ipc(dp)

        def echo(self, dp):
            return dp

    # the worker imports this module to find StandIn
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    actor = Echo.options(runtime_env={"env_vars": {"PYTHONPATH": path}}).remote()
    yield actor
    ray_session.kill(actor)


def test_ray_put_get_and_actor_argument(standin, ray_session, echo_actor):
    original = standin(*parts(NOT_IN_DEFAULT_MODE))
    adp_verl.install(standin)
    written = standin.states_written
    restored = ray_session.get(ray_session.put(original))
    assert standin.states_written == written  # Ray pickled it through Arrow, not verl's state
    assert type(restored) is standin
    assert_dataproto_equal(restored, original)
    name, ipc = ray_session.get(echo_actor.inspect.remote(original))
    assert name == "StandIn"
    assert_dataproto_equal(from_ipc(ipc, allow_pickle=True), original)
    # the unpatched worker answers with the legacy state, which the patched driver loads
    echoed = ray_session.get(echo_actor.echo.remote(original))
    assert type(echoed) is standin
    assert_dataproto_equal(echoed, original)


# ---------------------------------------------------------------- the real verl.protocol.DataProto


@pytest.fixture
def verl_dataproto():
    module = pytest.importorskip("verl.protocol", reason="verl is not installed (pip install --no-deps verl)")
    cls = module.DataProto
    assert not adp_verl.is_installed(cls)
    yield cls
    adp_verl.uninstall(cls)


@pytest.mark.verl
def test_verl_pickle_round_trip(verl_dataproto):
    original = verl_dataproto(*parts())
    assert adp_verl.install() is verl_dataproto
    buffers = []
    data = pickle.dumps(original, protocol=5, buffer_callback=buffers.append)
    assert MODULE in data and buffers
    for restored in (pickle.loads(data, buffers=buffers), pickle.loads(pickle.dumps(original, protocol=2))):
        assert type(restored) is verl_dataproto
        restored.check_consistency()
        assert_dataproto_equal(restored, original)


@pytest.mark.verl
@pytest.mark.parametrize("mode, drop", [("default", NOT_IN_DEFAULT_MODE), ("numpy", NOT_IN_NUMPY_MODE)])
def test_verl_unpatched_payloads_load_after_install(verl_dataproto, monkeypatch, mode, drop):
    original = verl_dataproto(*parts(drop))
    monkeypatch.setenv(adp_verl.ENV_VAR, mode)
    payload = pickle.dumps(original, protocol=5)
    assert MODULE not in payload
    monkeypatch.delenv(adp_verl.ENV_VAR)  # the receiver needs no setting
    adp_verl.install()
    restored = pickle.loads(payload)
    assert type(restored) is verl_dataproto
    assert_dataproto_equal(restored, original)


@pytest.mark.verl
def test_verl_uninstall_restores_its_pickling(verl_dataproto, monkeypatch):
    before = dict(verl_dataproto.__dict__)
    monkeypatch.setenv(adp_verl.ENV_VAR, "arrow")
    assert adp_verl.install_from_env() is True and adp_verl.is_installed()
    adp_verl.uninstall()
    assert dict(verl_dataproto.__dict__) == before
    original = verl_dataproto(*parts(NOT_IN_DEFAULT_MODE))
    data = pickle.dumps(original, protocol=5)
    assert MODULE not in data
    assert_dataproto_equal(pickle.loads(data), original)


@pytest.mark.verl
def test_verl_through_ray(verl_dataproto, ray_session, echo_actor):
    original = verl_dataproto(*parts(NOT_IN_DEFAULT_MODE))
    adp_verl.install()
    restored = ray_session.get(ray_session.put(original))
    assert type(restored) is verl_dataproto
    assert_dataproto_equal(restored, original)
    name, ipc = ray_session.get(echo_actor.inspect.remote(original))
    assert name == "DataProto"
    assert_dataproto_equal(from_ipc(ipc, allow_pickle=True), original)
    assert_dataproto_equal(ray_session.get(echo_actor.echo.remote(original)), original)


SETUP_HOOK_SCRIPT = textwrap.dedent(
    """
    import ray, torch
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from arrow_dataproto.integrations import verl as adp_verl

    ray.init(address="local", num_cpus=1, object_store_memory=100 * 2**20, include_dashboard=False, runtime_env={
        "env_vars": {"VERL_DATAPROTO_SERIALIZATION_METHOD": "arrow"},
        "worker_process_setup_hook": "arrow_dataproto.integrations.verl.install_from_env",
    })
    assert adp_verl.install_from_env()

    @ray.remote
    class Worker:
        def double(self, dp):
            dp.batch["x"] = dp.batch["x"] * 2
            return adp_verl.is_installed(), dp

        def threads(self):
            import os
            return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")

    @ray.remote
    class Plain:  # never sees a DataProto: the hook must have imported nothing heavy
        def modules(self):
            import sys
            return [m for m in ("torch", "pyarrow", "tensordict", "verl.protocol") if m in sys.modules]

    assert ray.get(Plain.remote().modules.remote()) == []
    dp = DataProto(TensorDict({"x": torch.arange(6).view(3, 2)}, batch_size=[3]))
    worker = Worker.remote()
    patched, result = ray.get(worker.double.remote(dp))
    assert patched and type(result) is DataProto, (patched, type(result))
    assert torch.equal(result.batch["x"], torch.arange(6).view(3, 2) * 2)
    threads, omp = ray.get(worker.threads.remote())  # torch imported after Ray set the worker's thread count
    assert omp is not None and threads == int(omp), (threads, omp)
    print("hook ok")
    """
)


@pytest.mark.verl
def test_verl_env_var_selects_arrow_in_ray_workers(verl_dataproto, tmp_path):
    """Its own Ray (a setup hook is per job): workers patched by the hook, driver by install_from_env."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env[adp_verl.ENV_VAR] = "arrow"  # the driver's own setting; runtime_env carries it to every worker
    result = subprocess.run(
        [sys.executable, "-c", SETUP_HOOK_SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "hook ok" in result.stdout, result.stderr[-3000:]


# ---------------------------------------------------------------- damaged pickles of verl's class (load_from_disk)


class _Reduced:
    """Pickles as ``fn(*args)`` (then ``BUILD state`` if given): writes a chosen pickle without hand-made opcodes."""

    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


_core = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
DAMAGED = {  # each crashes numpy's own unpickling or raises an exception outside DataProtoError
    "scalar of object dtype (a pointer read from bytes)": _Reduced(_core.scalar, (np.dtype(object), b"\x01" * 8)),
    "dtype state with the object flag on int64": _Reduced(
        np.dtype, ("i8", False, True), (3, "<", None, None, None, -1, -1, 63)
    ),
    "dtype state with another item size": _Reduced(np.dtype, ("U1", False, True), (3, "<", None, None, None, 4096, 4, 8)),
    "array bytes shorter than its shape": _Reduced(
        _core._reconstruct, (np.ndarray, (0,), b"b"), (1, (10,), np.dtype("i8"), False, b"\0" * 8)
    ),
    "object array with fewer items than its shape": _Reduced(
        _core._reconstruct, (np.ndarray, (0,), b"b"), (1, (3,), np.dtype(object), False, [1])
    ),
    "array of a huge shape": _Reduced(
        _core._reconstruct, (np.ndarray, (0,), b"b"), (1, (2**40, 2**40), np.dtype("i8"), False, b"")
    ),
    "array of an ndarray subclass": _Reduced(_core._reconstruct, (np.matrix, (0,), b"b"), (1, (1, 1), np.dtype("i8"), False, b"\0" * 8)),
    "KeyError from a named function": _Reduced(__import__("operator").getitem, ({}, "missing")),
    "OverflowError from a named function": _Reduced(__import__("math").factorial, (10**400,)),
    "AssertionError from a named function": _Reduced(__import__("unittest").TestCase("run").assertTrue, (False,)),
    "nesting deeper than the limit": None,  # built below
}


def _damaged_file(tmp_path, name) -> "os.PathLike":
    value = DAMAGED[name]
    if value is None:
        value = _Reduced(_core._reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), np.dtype(object), False, [[]]))
        for _ in range(300):
            value = [value]
    state = (None, {"uid": np.array(["a"], dtype=object)}, {"damaged": value})
    path = tmp_path / "verl.pkl"
    path.write_bytes(b"\x80\x04c__main__\nNotVerl\n" if False else _verl_pickle(state))
    return path


def _verl_pickle(state) -> bytes:
    """A pickle of verl's DataProto with ``state`` (what ``copyreg.__newobj__`` + BUILD write), built without verl."""
    body = pickle.dumps(state, protocol=2)[2:-1]  # no PROTO, no STOP: the state's opcodes alone
    return b"\x80\x02cverl.protocol\nDataProto\n)\x81" + body + b"b."


@pytest.mark.parametrize("name", DAMAGED)
def test_damaged_verl_pickles_raise_decode_error_and_never_crash(tmp_path, name):
    from arrow_dataproto import DataProto

    with pytest.raises(DecodeError):
        DataProto.load_from_disk(_damaged_file(tmp_path, name), allow_pickle=True)


def test_a_verl_pickle_with_a_huge_memo_index_loads_without_allocating_for_it(tmp_path):
    """A PUT may name any index; CPython's C unpickler sizes its memo list by it (gigabytes for one
    damaged byte, seconds spent zeroing them). The library unpickles verl's pickles in Python."""
    from arrow_dataproto import DataProto

    state = (None, {"uid": np.array(["a", "b"], dtype=object)}, {"step": 3})
    data = _verl_pickle(state)
    index = data.index(b"q\x00")  # the first BINPUT, never read back by a GET in this pickle
    assert b"h\x00" not in data
    path = tmp_path / "verl.pkl"
    path.write_bytes(data[:index] + b"r\xff\xff\xff\x3f" + data[index + 2 :])  # LONG_BINPUT 2**30 - 1
    loaded = DataProto.load_from_disk(path, allow_pickle=True)
    assert loaded.non_tensor_batch["uid"].tolist() == ["a", "b"] and loaded.meta_info == {"step": 3}


def test_verl_pickles_of_numpy_values_load_as_numpy_wrote_them(tmp_path):
    from arrow_dataproto import DataProto

    values = {
        "object": np.array(["a", {"k": np.int64(3)}, [np.arange(2.0)]], dtype=object),
        "float32": np.arange(3, dtype=np.float32), "fortran": np.asfortranarray(np.arange(6).reshape(3, 2)),
        "unicode": np.array(["xy", "z", ""]), "datetime": np.array(["2026-12-03"] * 3, dtype="datetime64[D]"),
    }
    meta = {"scalar": np.float16(1.5), "array": np.arange(4, dtype=np.uint8), "dtype": np.dtype("<i2"), "set": {1}}
    for protocol in (2, 4, 5):
        body = pickle.dumps((None, values, meta), protocol=protocol)
        path = tmp_path / "ok.pkl"
        path.write_bytes(_verl_pickle((None, values, meta)) if protocol == 2 else _verl_pickle_any(body))
        loaded = DataProto.load_from_disk(path, allow_pickle=True)
        for key, array in values.items():
            got = loaded.non_tensor_batch[key]
            assert got.dtype == array.dtype and got.shape == array.shape and got.flags.f_contiguous == array.flags.f_contiguous
            assert repr(got.tolist()) == repr(array.tolist()), key
        assert loaded.meta_info["scalar"] == meta["scalar"] and type(loaded.meta_info["scalar"]) is np.float16
        assert loaded.meta_info["array"].tolist() == [0, 1, 2, 3] and loaded.meta_info["dtype"] == meta["dtype"]
        assert loaded.meta_info["set"] == {1}


def _verl_pickle_any(state_pickle: bytes) -> bytes:
    """The state pickled at any protocol, loaded inside a verl-shaped pickle (protocol 2 framing around it)."""
    return _verl_pickle(pickle.loads(state_pickle))


@pytest.mark.verl
def test_main_ppo_hydra_overrides_reach_ray_init(verl_dataproto, monkeypatch):
    """The two overrides of the README make verl's own launcher start Ray with our hook and variable."""
    hydra = pytest.importorskip("hydra", reason="hydra-core is not installed")
    main_ppo = pytest.importorskip("verl.trainer.main_ppo", reason="verl.trainer.main_ppo does not import here")
    overrides = [
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=arrow_dataproto.integrations.verl.install_from_env",
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_DATAPROTO_SERIALIZATION_METHOD=arrow",
    ]
    with hydra.initialize_config_dir(config_dir=os.path.join(os.path.dirname(main_ppo.__file__), "config"), version_base=None):
        config = hydra.compose("ppo_trainer", overrides=overrides)
    seen: dict = {}

    class Stop(Exception):
        pass

    def init(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(main_ppo.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(main_ppo.ray, "init", init)
    with pytest.raises(Stop):
        main_ppo.run_ppo(config, task_runner_class=None)
    runtime_env = seen["runtime_env"]
    assert runtime_env["worker_process_setup_hook"] == "arrow_dataproto.integrations.verl.install_from_env"
    assert runtime_env["env_vars"][adp_verl.ENV_VAR] == "arrow"
    assert runtime_env["env_vars"]["TOKENIZERS_PARALLELISM"] == "true"  # verl's own defaults are kept


@pytest.mark.verl
@pytest.mark.parametrize("mode", [None, "numpy"])
def test_to_verl_from_verl_share_tensors_and_verl_readable_files(verl_dataproto, tmp_path, monkeypatch, mode):
    from arrow_dataproto import DataProto

    ours = DataProto(TensorDict({"x": torch.arange(6).view(3, 2)}, batch_size=[3]), {"uid": np.array(["a", "b", "c"], dtype=object)}, {"k": 1})
    theirs = adp_verl.to_verl(ours)
    assert type(theirs) is verl_dataproto and theirs.batch is ours.batch
    back = adp_verl.from_verl(theirs)
    assert type(back) is DataProto and back.batch is ours.batch and back.meta_info == {"k": 1}
    if mode:
        monkeypatch.setenv(adp_verl.ENV_VAR, mode)
    adp_verl.install()
    try:
        adp_verl.save_verl_readable(theirs, tmp_path / "v.pkl")
    finally:
        adp_verl.uninstall()
    assert MODULE not in (tmp_path / "v.pkl").read_bytes()  # names no arrow_dataproto: verl reads it alone
    loaded = verl_dataproto.load_from_disk(str(tmp_path / "v.pkl"))  # unpatched verl
    assert torch.equal(loaded.batch["x"], ours.batch["x"]) and list(loaded.non_tensor_batch["uid"]) == ["a", "b", "c"]


@pytest.mark.verl
def test_worker_group_benchmark_at_tiny_size(verl_dataproto, tmp_path):
    """benchmarks/bench_verl_e2e.py --quick: verl's RayWorkerGroup in every mode, each result checked exactly
    inside the script (its own Ray: the setup hook is per job). The timing is not judged."""
    pytest.importorskip("verl.single_controller.ray", reason="verl.single_controller does not import here")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    out = tmp_path / "verl_e2e.md"
    result = subprocess.run(
        [sys.executable, os.path.join(root, "benchmarks", "bench_verl_e2e.py"), "--quick", "--out", str(out)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    traceback = result.stderr.rfind("Traceback")  # Ray's workers log on after it
    assert result.returncode == 0, result.stderr[traceback : traceback + 3000] if traceback >= 0 else result.stderr[-3000:]
    report = out.read_text()
    for mode in ("verl_default", "verl_numpy", "install", "floor"):
        assert f"| {mode} |" in report



# ---------------------------------------------------------------- hostile content (issue 48)


def _unusual_views(cls):
    """A DataProto of ``cls`` holding a conjugate view, a negative view, a conjugate jagged tensor
    and two jagged columns on one offsets tensor that is a slice of a longer one (rows 1..2 of a
    jagged batch, taken without copying)."""
    values = torch.arange(10.0)
    sliced = torch.tensor([0, 1, 3, 6, 10])[1:4]
    batch = TensorDict(
        {
            "conj": torch.complex(torch.arange(2.0), torch.ones(2)).conj(),
            "neg": torch._neg_view(torch.arange(2.0)),
            "jconj": torch.nested.nested_tensor_from_jagged(torch.complex(values, -values).conj(), torch.tensor([0, 2, 5])),
            "a": torch.nested.nested_tensor_from_jagged(values, sliced),
            "b": torch.nested.nested_tensor_from_jagged(values * 2, sliced),
        },
        batch_size=[2],
    )
    return cls(batch, {"uid": np.array(["x", "y"], dtype=object)}, {})


def _rows(t: torch.Tensor) -> list[torch.Tensor]:
    if t.is_nested:
        offsets, values = t.offsets(), t.values()
        return [values[int(offsets[i]) : int(offsets[i + 1])].resolve_conj().resolve_neg() for i in range(len(offsets) - 1)]
    return list(t.resolve_conj().resolve_neg().unbind())


def _assert_unusual_views_exact(original, back) -> None:
    for key in original.batch.keys():
        got, want = _rows(back.batch[key]), _rows(original.batch[key])
        assert len(got) == len(want) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(got, want)), key
    product = back.batch["a"] * back.batch["b"]  # still one ragged structure
    assert [r.tolist() for r in product.unbind()] == [[2.0, 8.0], [18.0, 32.0, 50.0]]


@pytest.mark.parametrize("protocol", [2, 5])
def test_conjugate_negative_and_sliced_shared_jagged_views_pickle_exactly(standin, protocol):
    """Issue 48, 3 and 4: under install() a conjugate or negative view raised torch's RuntimeError
    from pickle.dumps ("view is not supported for conjugate view tensors"), and two jagged columns
    on one sliced offsets tensor came back with offsets of their own (``a * b`` raised)."""
    from arrow_dataproto import DataProto

    adp_verl.install(standin)
    for cls in (standin, DataProto):
        original = _unusual_views(cls)
        _assert_unusual_views_exact(original, pickle.loads(pickle.dumps(original, protocol=protocol)))


@pytest.mark.verl
def test_conjugate_negative_and_sliced_shared_jagged_views_pickle_exactly_in_verl(verl_dataproto):
    adp_verl.install()
    original = _unusual_views(verl_dataproto)
    _assert_unusual_views_exact(original, pickle.loads(pickle.dumps(original, protocol=5)))
