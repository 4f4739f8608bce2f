"""Small verl DataProtos under ``install()`` pickle as their tensors' bytes (arrow_dataproto._compact).

What is tested on a stand-in with verl's three fields: which objects take the compact state
and which the Arrow one, exact round trips of every dtype and jagged layout, the receive
options, and malformed states refused with :class:`DecodeError`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import DecodeError, EncodeError, FormatVersionError, receive_options
from arrow_dataproto import _compact
from arrow_dataproto._compat import ragged_idx
from arrow_dataproto.integrations import verl as adp_verl
from arrow_dataproto.testing import assert_dataproto_equal
from test_cow import LINUX, is_private_view_of_the_store, mapping_of

ROWS = 4
DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128,
]


@dataclass
class Small:
    """verl's DataProto in miniature: the three fields, patched by the fixture."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@pytest.fixture(autouse=True)
def patched():
    adp_verl.install(Small)
    yield
    adp_verl.uninstall(Small)


def _bits(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Random bytes viewed as ``dtype`` (NaN payloads, subnormals and all)."""
    count = int(np.prod(shape)) * dtype.itemsize
    raw = torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(count))
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).view(shape)


def _jagged(lengths: list[int], tail: tuple[int, ...] = (), ragged: int = 1) -> torch.Tensor:
    rows = [torch.arange(n * int(np.prod(tail)), dtype=torch.float32).view(n, *tail) for n in lengths]
    if ragged != 1:
        rows = [r.movedim(0, ragged - 1) for r in rows]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def _small(**tensors) -> Small:
    uid = np.array([f"u{i}" for i in range(ROWS)], dtype=object)
    extra = np.array([{"i": i, "t": (i,)} for i in range(ROWS)], dtype=object)
    return Small(
        TensorDict(tensors, batch_size=[ROWS]),
        {"uid": uid, "extra": extra, "score": np.arange(ROWS, dtype=np.float32)},
        {"global_steps": 3, "metrics": {"loss": float("nan")}},
    )


def _round_trip(obj, *, buffers: bool = True):
    if not buffers:
        return pickle.loads(pickle.dumps(obj, protocol=5))
    out: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=out.append)
    return pickle.loads(data, buffers=out)


def _reducer(obj) -> object:
    return obj.__reduce_ex__(5)[0]


# ---------------------------------------------------------------- which state


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("buffers", [True, False], ids=["out-of-band", "in-band"])
def test_every_dtype_round_trips_bit_exact(dtype, buffers):
    obj = _small(flat=_bits(dtype, (ROWS,)), rows=_bits(dtype, (ROWS, 3, 2)))
    assert _reducer(obj) is adp_verl.rebuild_compact
    restored = _round_trip(obj, buffers=buffers)
    assert type(restored) is Small
    assert_dataproto_equal(restored, obj)


@pytest.mark.parametrize("ragged", [1, 2, 3])
def test_jagged_tensors_keep_their_ragged_dimension(ragged):
    obj = _small(j=_jagged([2, 0, 5, 1], (3, 2), ragged))
    assert _reducer(obj) is adp_verl.rebuild_compact
    restored = _round_trip(obj)
    assert ragged_idx(restored.batch["j"]) == ragged
    assert_dataproto_equal(restored, obj)


def test_a_slice_of_a_jagged_tensor_sends_its_own_rows():
    whole = _jagged([3, 1, 4, 1, 5, 9])
    part = torch.nested.nested_tensor_from_jagged(whole.values(), whole.offsets()[2:5])  # rows 2-3: values 4..9
    obj = Small(TensorDict({"j": part}, batch_size=[2]))
    (_, state) = obj.__reduce_ex__(5)[1]
    assert state[3][0][3].raw().nbytes == (4 + 1) * 4  # the values of rows 2 and 3 alone
    rows = _round_trip(obj).batch["j"].unbind()
    assert [r.tolist() for r in rows] == [r.tolist() for r in whole.unbind()[2:4]]


def test_jagged_columns_sharing_offsets_still_share_them():
    a = _jagged([2, 3, 1, 4])
    b = torch.nested.nested_tensor_from_jagged(a.values() * 2, a.offsets())
    restored = _round_trip(_small(a=a, b=b))
    assert restored.batch["b"].offsets() is restored.batch["a"].offsets()
    assert torch.equal((restored.batch["a"] * restored.batch["b"]).values(), (a * b).values())


@pytest.mark.parametrize(
    "obj",
    [
        Small(None, {"uid": np.array(["a", "b"], dtype=object)}, {"k": 1}),
        Small(TensorDict({}, batch_size=[3])),
        Small(TensorDict({"x": torch.arange(6).view(2, 3)}, batch_size=[2, 3])),
        Small(TensorDict({"x": torch.arange(3)}, batch_size=[3], device="cpu")),
        Small(TensorDict({"x": torch.arange(12).view(3, 4)[:, ::2]}, batch_size=[3])),  # strides made contiguous
        Small(),
    ],
    ids=["no batch", "no columns", "two batch dims", "a device", "non-contiguous", "empty"],
)
def test_other_plain_objects_round_trip(obj):
    assert _reducer(obj) is adp_verl.rebuild_compact
    assert_dataproto_equal(_round_trip(obj), obj)


@pytest.mark.parametrize(
    "obj",
    [
        Small(TensorDict({"t": TensorDict({"x": torch.arange(2)}, [2])}, batch_size=[2])),
        Small(TensorDict({"x": torch.ones(2, requires_grad=True)}, batch_size=[2])),
        Small(TensorDict({"x": torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 2)])}, batch_size=[2])),
        Small(TensorDict({"x": torch.arange(2)}, [2]), {"x": np.arange(2)}),
    ],
    ids=["nested TensorDict", "requires grad", "strided nested", "a name in both"],
)
def test_anything_else_pickles_through_arrow(obj):
    assert _compact.state(obj) is None
    try:
        assert _reducer(obj) is adp_verl.rebuild
        restored = _round_trip(obj)
    except EncodeError:  # what the Arrow encoder refuses, it still refuses
        return
    assert_dataproto_equal(restored, obj)


def _large() -> Small:
    """Just over :data:`_compact.COPY_UP_TO` bytes of tensors, a jagged column among them."""
    cols = _compact.COPY_UP_TO // 8 // ROWS + 1
    return _small(x=torch.arange(ROWS * cols, dtype=torch.float64).view(ROWS, cols), j=_jagged([1, 2, 0, 3]))


@pytest.mark.parametrize(
    "obj",
    [_large, lambda: Small(None, {"big": np.arange(_compact.COPY_UP_TO // 8 + 1, dtype=np.float64)})],
    ids=["large tensors", "large numpy column"],
)
def test_large_plain_objects_are_compact_too(obj):
    """Size does not send plain content through Arrow (earlier versions did so past 1, then 8 MiB)."""
    obj = obj()
    assert _reducer(obj) is adp_verl.rebuild_compact
    assert_dataproto_equal(_round_trip(obj), obj)


def test_protocols_below_5_pickle_through_arrow():
    obj = _small(x=torch.arange(ROWS))
    assert obj.__reduce_ex__(4)[0] is adp_verl.rebuild  # a PickleBuffer needs protocol 5
    assert_dataproto_equal(pickle.loads(pickle.dumps(obj, protocol=4)), obj)


def test_what_arrow_refuses_is_still_refused():
    obj = Small(TensorDict({"x": torch.arange(2)}, [2]), {"y": np.arange(3)})  # rows disagree
    assert _compact.state(obj) is None
    with pytest.raises(EncodeError):
        pickle.dumps(obj, protocol=5)


# ---------------------------------------------------------------- receive options


def _inside(t: torch.Tensor, buffers: list) -> bool:
    ranges = [(v.address, v.address + v.size) for v in map(pa.py_buffer, buffers)]
    return any(lo <= t.data_ptr() < hi for lo, hi in ranges)


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("copy", [True, "on_write", False])
def test_copies_unless_copy_false(copy, size):
    """Buffers in ordinary memory (plain pickle): copies, unless ``copy=False``, at either size
    (above ``COPY_UP_TO``, copy-on-write receive copies what is not in Ray's store)."""
    if size == "small":
        obj = _small(x=torch.arange(ROWS * 3, dtype=torch.int64).view(ROWS, 3), j=_jagged([1, 2, 0, 3]))
    else:
        obj = _large()
    buffers: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    with receive_options(copy=copy):
        restored = pickle.loads(data, buffers=buffers)
    assert_dataproto_equal(restored, obj)
    viewed = _inside(restored.batch["x"], buffers), _inside(restored.batch["j"].values(), buffers)
    assert viewed == ((True, True) if copy is False else (False, False))
    score = restored.non_tensor_batch["score"]
    assert score.flags.writeable == (copy is not False) or not _inside(torch.from_numpy(np.array(score)), buffers)
    if copy is not False:
        restored.batch["x"] += 1  # writes reach nobody else
        assert_dataproto_equal(pickle.loads(data, buffers=buffers), obj)


def test_device_option_places_the_batch():
    obj = _small(x=torch.arange(ROWS))
    with receive_options(device="cpu"):
        restored = _round_trip(obj)
    assert restored.batch.device == torch.device("cpu")
    assert restored.batch["x"].device == torch.device("cpu")


@LINUX
def test_through_ray_large_objects_are_copy_on_write_views_of_the_store(ray_session):
    """Above ``COPY_UP_TO`` the default receive views Ray's store privately: no copy, a write
    stays in the tensor written, and every later receive still sees the object's bytes."""
    obj = _large()
    ref = ray_session.put(obj)
    first, second = ray_session.get(ref), ray_session.get(ref)
    assert_dataproto_equal(first, obj)
    for t in (first.batch["x"], first.batch["j"].values(), second.batch["x"]):
        assert is_private_view_of_the_store(t)
    first.batch["x"] += 1
    first.batch["j"].values().mul_(-1)
    assert_dataproto_equal(second, obj)
    assert_dataproto_equal(ray_session.get(ref), obj)
    with receive_options(copy=True):
        assert not is_private_view_of_the_store(ray_session.get(ref).batch["x"])


@LINUX
def test_through_ray_objects_up_to_copy_up_to_are_copied(ray_session):
    """In Ray's store (over Ray's ~100 KiB inline limit) but at most ``COPY_UP_TO``: copied."""
    obj = _small(x=torch.arange(ROWS * 2**15, dtype=torch.float64).view(ROWS, -1))  # 1 MiB
    ref = ray_session.put(obj)
    got = ray_session.get(ref)
    assert_dataproto_equal(got, obj)
    found = mapping_of(got.batch["x"].data_ptr())
    assert found is None or not found[2]  # anonymous memory: the copy, not a mapping of the store's file
    got.batch["x"] += 1
    assert_dataproto_equal(ray_session.get(ref), obj)


# ---------------------------------------------------------------- malformed states


def _original() -> Small:
    j = _jagged([1, 2, 0, 3])
    k = torch.nested.nested_tensor_from_jagged(j.values() + 1, j.offsets())  # shares j's offsets
    return _small(x=torch.arange(ROWS * 2).view(ROWS, 2), j=j, k=k)


def _state():
    (_, state) = _original().__reduce_ex__(5)[1]
    return [list(state), [list(c) for c in state[3]]]


def _with(change) -> tuple:
    state, columns = _state()
    columns = [[c if not isinstance(c, pickle.PickleBuffer) else bytes(c.raw()) for c in col] for col in columns]
    change(state, columns)
    state[3] = [tuple(c) for c in columns]
    return tuple(state)


def _set(where, value):
    def change(state, columns):
        if where[0] == "state":
            state[where[1]] = value
        else:
            columns[where[1]][where[2]] = value
    return change


CORRUPT = {
    "a later version": _set(("state", 0), 2),
    "batch size not a tuple": _set(("state", 1), [ROWS]),
    "negative batch size": _set(("state", 1), (-1,)),
    "batch size disagrees": _set(("state", 1), (ROWS + 1,)),
    "a device": _set(("state", 2), "cuda:0"),
    "non_tensor not a dict": _set(("state", 4), [1]),
    "unknown dtype": _set(("col", 0, 1), "float128"),
    "dtype not text": _set(("col", 0, 1), torch.int64),
    "shape too small for the bytes": _set(("col", 0, 2), (ROWS, 1)),
    "shape not a tuple": _set(("col", 0, 2), [ROWS, 2]),
    "negative shape": _set(("col", 0, 2), (-ROWS, -2)),
    "huge shape": _set(("col", 0, 2), (2**40, 2**40)),
    "truncated bytes": _set(("col", 0, 3), b"\0" * 7),
    "not a buffer": _set(("col", 0, 3), 12),
    "a strided buffer": _set(("col", 0, 3), memoryview(np.zeros(4 * ROWS, dtype=np.int64))[::2]),
    "offsets decrease": _set(("col", 1, 4), np.array([0, 2, 1, 1, 6], dtype=np.int64).tobytes()),
    "offsets miss the end": _set(("col", 1, 4), np.array([0, 1, 3, 3, 5], dtype=np.int64).tobytes()),
    "offsets start late": _set(("col", 1, 4), np.array([1, 1, 3, 3, 6], dtype=np.int64).tobytes()),
    "too few offsets": _set(("col", 1, 4), np.array([0, 6], dtype=np.int64).tobytes()),
    "shares a later column's offsets": _set(("col", 1, 4), 2),
    "shares a dense column's offsets": _set(("col", 2, 4), 0),
    "ragged dimension 0": _set(("col", 1, 5), 0),
    "ragged dimension past the values": _set(("col", 1, 5), 2),
    "repeated names": _set(("col", 1, 0), "x"),
    "a column of five": lambda s, c: c[0].pop(),
}


@pytest.mark.parametrize("version", [2, 0, True, "1"])
def test_another_version_is_a_format_version_error(version):
    with pytest.raises(FormatVersionError):
        adp_verl.rebuild_compact(Small, _with(_set(("state", 0), version)))


@pytest.mark.parametrize("mapped", [False, True], ids=["copied", "through private_views"])
@pytest.mark.parametrize("name", CORRUPT)
def test_malformed_states_raise_decode_error(name, mapped, monkeypatch):
    """Either way a receive takes: copied, or (``COPY_UP_TO`` at 0) through ``_shm.private_views`` first."""
    if mapped:
        monkeypatch.setattr(_compact, "COPY_UP_TO", 0)
    state = _with(CORRUPT[name])
    with pytest.raises(DecodeError):
        adp_verl.rebuild_compact(Small, state)


def test_the_untouched_state_decodes():
    state = _with(lambda s, c: None)
    assert type(state[3][2][4]) is int  # k shares j's offsets
    assert_dataproto_equal(adp_verl.rebuild_compact(Small, state), _original())


@pytest.mark.parametrize("state", [None, (), (1, 2, 3), "state", (1,) * 6])
def test_states_of_the_wrong_shape_raise_decode_error(state):
    with pytest.raises(DecodeError):
        adp_verl.rebuild_compact(Small, state)


# ---------------------------------------------------------------- verl's own class


@pytest.mark.verl
def test_verl_small_batches_pickle_compact_and_load_from_disk(tmp_path):
    module = pytest.importorskip("verl.protocol", reason="verl is not installed (pip install --no-deps verl)")
    cls = module.DataProto
    adp_verl.install(cls)
    try:
        original = cls(TensorDict({"x": torch.arange(6).view(3, 2), "j": _jagged([1, 0, 2])}, batch_size=[3]),
                       {"uid": np.array(["a", "b", "c"], dtype=object)}, {"step": 1})
        assert _reducer(original) is adp_verl.rebuild_compact
        restored = _round_trip(original)
        assert type(restored) is cls
        restored.check_consistency()
        assert_dataproto_equal(restored, original)
        path = tmp_path / "small.pkl"  # verl's save_to_disk pickles with the default protocol: 5 from Python 3.14
        path.write_bytes(pickle.dumps(original, protocol=5))
        assert_dataproto_equal(adp.DataProto.load_from_disk(path, allow_pickle=True), original)
    finally:
        adp_verl.uninstall(cls)


@pytest.mark.verl
@pytest.mark.parametrize("compact", [True, False], ids=["compact", "arrow-only"])
def test_the_codec_benchmarks_verl_paths_pickle_as_they_say(compact):
    """``benchmarks/bench_codec.py`` times verl's class under install() both ways: check that
    each way is the one it names, and exact."""
    module = pytest.importorskip("verl.protocol", reason="verl is not installed (pip install --no-deps verl)")
    from benchmarks.harness import VerlInstalled  # the repository root is on pythonpath
    from arrow_dataproto.testing.samples import ppo_batch

    path = VerlInstalled(compact=compact)  # installs on verl's class
    try:
        td, non_tensor, meta = ppo_batch(rows=8, prompt=4, response=4)
        payload = path.encode(td, non_tensor, meta)
        assert payload.__reduce_ex__(5)[0] is (adp_verl.rebuild_compact if compact else adp_verl.rebuild)
        restored = pickle.loads(pickle.dumps(payload, protocol=5))
        assert type(restored) is module.DataProto
        assert_dataproto_equal(adp.DataProto(*path.decode(restored)), adp.DataProto(td, non_tensor, meta))
    finally:
        adp_verl.uninstall(module.DataProto)
