"""The Arrow codec: to_arrow/from_arrow and to_ipc/from_ipc.

Round trips are bit-exact (NaN payloads included) and keep dtype, shape, layout,
ragged dimension, device and key order. Property-based cases cover every dtype in
the storage table, ranks 1-4 with zero-size dimensions, batch sizes of rank 2,
nested TensorDicts, jagged tensors (ragged_idx 1-3), strided nested tensors and
non-tensor values; named cases cover what the format promises (zero-copy, exported
bytes, schema metadata, devices, errors). The strategies here are shared with
``test_pickling.py``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto.dtypes import STORAGE
from utils import assert_dataproto_equal, assert_tensor_equal, sample_dataproto

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

DTYPES = sorted(STORAGE, key=str)
PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


# ---------------------------------------------------------------- strategies (shared with test_pickling.py)


def random_bits(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    """A contiguous tensor of ``shape`` with random bytes (every NaN payload is possible); bool holds 0/1."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8))
    if dtype == torch.bool:
        raw &= 1  # any other byte is not a valid torch bool
    return raw.view(dtype).view(*shape)


def _strided_nested_ok(dtype: torch.dtype) -> bool:
    try:
        torch.nested.nested_tensor([torch.zeros(1, dtype=torch.uint8).view(dtype)] * 2)
    except RuntimeError:
        return False
    return True


STRIDED_DTYPES = [d for d in DTYPES if _strided_nested_ok(d)]  # torch cannot build the others
seeds = st.integers(0, 2**32 - 1)


@st.composite
def dense_tensors(draw, batch_size: list[int]) -> torch.Tensor:
    """A dense tensor ``[*batch_size, ...]`` of rank <= 4, contiguous or a non-contiguous view."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = [*batch_size, *draw(st.lists(st.integers(0, 3), max_size=4 - len(batch_size)))]
    seed = draw(seeds)
    kind = draw(st.sampled_from(["contiguous", "permuted", "row_step", "expanded"]))
    if kind == "permuted":  # every stride reversed
        return random_bits(dtype, shape[::-1], seed).permute(*reversed(range(len(shape))))
    if kind == "row_step":  # every other row of a bigger tensor
        return random_bits(dtype, [2 * shape[0], *shape[1:]], seed)[::2]
    if kind == "expanded":  # one row repeated with stride 0
        return random_bits(dtype, [1, *shape[1:]], seed).expand(*shape)
    return random_bits(dtype, shape, seed)


@st.composite
def jagged_tensors(draw, rows: int) -> torch.Tensor:
    """A jagged nested tensor with ``rows`` rows, ragged dimension 1, 2 or 3, any dtype."""
    dtype = draw(st.sampled_from(DTYPES))
    ragged_idx = draw(st.integers(1, 3))
    other = draw(st.lists(st.integers(0, 3), min_size=ragged_idx - 1, max_size=3))
    lengths = draw(st.lists(st.integers(0, 4), min_size=rows, max_size=rows))
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
    values = random_bits(dtype, [int(offsets[-1]), *other], draw(seeds)).movedim(0, ragged_idx - 1)
    if draw(st.booleans()):
        values = values.contiguous()
    return torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=ragged_idx)


@st.composite
def strided_nested_tensors(draw, rows: int) -> torch.Tensor:
    """A strided-layout nested tensor: ``rows`` rows of one rank (1-3) but any shape."""
    dtype = draw(st.sampled_from(STRIDED_DTYPES))
    ndim = draw(st.integers(1, 3))
    shapes = draw(st.lists(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim), min_size=rows, max_size=rows))
    return torch.nested.nested_tensor([random_bits(dtype, s, draw(seeds)) for s in shapes], dtype=dtype)


@st.composite
def tensordicts(draw, batch_size: list[int], depth: int = 0) -> TensorDict:
    """A TensorDict of dense, nested (when the batch has one dimension) and sub-TensorDict leaves."""
    keys = draw(st.lists(st.text("abcdefgh_", min_size=1, max_size=3), max_size=4, unique=True))
    kinds = ["dense"] + (["jagged", "strided"] if len(batch_size) == 1 else []) + (["td"] if depth < 2 else [])
    content = {}
    for key in keys:  # the drawn order, not sorted: key order must survive
        kind = draw(st.sampled_from(kinds))
        if kind == "dense":
            content[key] = draw(dense_tensors(batch_size))
        elif kind == "jagged":
            content[key] = draw(jagged_tensors(batch_size[0]))
        elif kind == "strided":
            content[key] = draw(strided_nested_tensors(batch_size[0]))
        else:
            sub_size = batch_size + draw(st.lists(st.integers(0, 2), max_size=1 if len(batch_size) < 2 else 0))
            content[key] = draw(tensordicts(sub_size, depth + 1))
    return TensorDict(content, batch_size=batch_size, device=draw(st.sampled_from([None, "cpu"])))


def _object_column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=5)
)
_row_values = st.sampled_from(
    [
        st.text(max_size=6),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(),
        st.booleans(),
        st.one_of(st.none(), st.text(max_size=3)),
        st.lists(st.integers(-100, 100), max_size=3),
        st.fixed_dictionaries({"k": st.text(max_size=3), "v": st.floats(allow_nan=False)}),
    ]
)


@st.composite
def non_tensor_columns(draw, rows: int) -> dict[str, np.ndarray]:
    """Object columns (one Python type per column) and numeric numpy columns of any row shape."""
    columns = {}
    for i in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            values = draw(st.lists(draw(_row_values), min_size=rows, max_size=rows))
            columns[f"O{i}"] = _object_column(values)
        else:
            dtype = draw(st.sampled_from(["int8", "int64", "uint16", "float32", "float64", "bool"]))
            shape = [rows, *draw(st.lists(st.integers(0, 3), max_size=2))]
            high = 2 if dtype == "bool" else 256  # random bits; numpy bools hold 0 or 1
            raw = np.random.default_rng(draw(seeds)).integers(0, high, math.prod(shape) * np.dtype(dtype).itemsize)
            columns[f"N{i}"] = raw.astype(np.uint8).view(dtype).reshape(shape)
    return columns


meta_infos = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        _json_scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=6,
    ),
    max_size=4,
)


@st.composite
def dataprotos(draw) -> adp.DataProto:
    """A DataProto with or without a batch (rank 1 or 2), non-tensor columns and JSON meta_info."""
    rows = draw(st.integers(0, 5))
    batch = None
    if draw(st.integers(0, 4)):  # mostly with a batch
        batch_size = [rows, *draw(st.lists(st.integers(0, 3), max_size=1))]
        batch = draw(tensordicts(batch_size))
    return adp.DataProto(batch, draw(non_tensor_columns(rows)), draw(meta_infos))


# ---------------------------------------------------------------- helpers


def ipc_round_trip(dp, compression=None, **kwargs):
    return adp.from_ipc(adp.to_ipc(dp, compression=compression), **kwargs)


def arrow_round_trip(dp, **kwargs):
    return adp.from_arrow(adp.to_arrow(dp), **kwargs)


def data_buffer(array: pa.Array) -> pa.Buffer:
    """The buffer holding the values of a (possibly nested) Arrow column."""
    while True:
        if isinstance(array.type, pa.BaseExtensionType):
            array = array.storage
        elif array.type.num_fields:
            array = array.values
        else:
            return array.buffers()[1]


def leaves(dp) -> dict:
    return dict(dp.batch.items(include_nested=True, leaves_only=True))


def with_schema_metadata(record_batch: pa.RecordBatch, key: str, value: str | None) -> pa.RecordBatch:
    """``record_batch`` with schema metadata ``key`` set to ``value`` (removed if None)."""
    metadata = dict(record_batch.schema.metadata)
    metadata.pop(key.encode(), None)
    if value is not None:
        metadata[key.encode()] = value.encode()
    return record_batch.replace_schema_metadata(metadata)


def with_field_metadata(record_batch: pa.RecordBatch, key: str, value: str) -> pa.RecordBatch:
    """``record_batch`` with field metadata ``key`` set to ``value`` on every field."""
    update = {key.encode(): value.encode()}
    fields = [f.with_metadata({**(f.metadata or {}), **update}) for f in record_batch.schema]
    schema = pa.schema(fields, metadata=record_batch.schema.metadata)
    return pa.RecordBatch.from_arrays(record_batch.columns, schema=schema)


def ipc_of(record_batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, record_batch.schema) as writer:
        writer.write_batch(record_batch)
    return sink.getvalue()


def dp_of(**tensors) -> adp.DataProto:
    rows = next(iter(tensors.values())).size(0)
    return adp.DataProto(TensorDict(tensors, batch_size=[rows]))


def absent_device() -> str:
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda:0"


# ---------------------------------------------------------------- property-based round trips


@PROPERTY_SETTINGS
@given(dataprotos())
def test_round_trip_arrow_and_ipc(dp):
    assert_dataproto_equal(dp, arrow_round_trip(dp, allow_pickle=True))
    for compression in adp.codec.COMPRESSIONS:
        assert_dataproto_equal(dp, ipc_round_trip(dp, compression, allow_pickle=True))


@PROPERTY_SETTINGS
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 4), min_size=1, max_size=4), seeds)
def test_every_dtype_and_shape_is_bit_exact(dtype, shape, seed):
    t = random_bits(dtype, shape, seed)
    dp = dp_of(x=t)
    for out in (arrow_round_trip(dp), ipc_round_trip(dp, "zstd"), adp.from_arrow(adp.to_arrow(dp), copy=True)):
        assert_tensor_equal(t, out.batch["x"], "x")


@PROPERTY_SETTINGS
@given(st.data())
def test_a_slice_of_a_batch_round_trips(data):
    dp = data.draw(dataprotos())
    start = data.draw(st.integers(0, len(dp)))
    stop = data.draw(st.integers(start, len(dp)))
    piece = dp[start:stop]
    assert_dataproto_equal(piece, ipc_round_trip(piece, allow_pickle=True))


# ---------------------------------------------------------------- named cases


def test_sample_batch_round_trips_every_way():
    dp = sample_dataproto()
    assert_dataproto_equal(dp, arrow_round_trip(dp))
    for compression in adp.codec.COMPRESSIONS:
        assert_dataproto_equal(dp, ipc_round_trip(dp, compression))


def test_single_tensor():
    t = torch.arange(12, dtype=torch.int32)
    out = ipc_round_trip(dp_of(x=t))
    assert_tensor_equal(t, out.batch["x"])
    assert out.batch.batch_size == (12,)
    assert out.non_tensor_batch == {} and out.meta_info == {}


def test_batch_size_of_rank_two():
    td = TensorDict(
        {
            "a": torch.randn(5, 3, 2),
            "b": torch.arange(15).view(5, 3),
            "sub": TensorDict({"c": torch.ones(5, 3, 4)}, [5, 3]),
        },
        batch_size=[5, 3],
    )
    dp = adp.DataProto(td, {"s": np.array(list("abcde"), dtype=object)})
    out = ipc_round_trip(dp)
    assert out.batch.batch_size == (5, 3) and out.batch["sub"].batch_size == (5, 3)
    assert_dataproto_equal(dp, out)
    assert json.loads(adp.to_arrow(dp).schema.metadata[b"adp.batch_size"]) == [5, 3]


@pytest.mark.parametrize("ragged_idx", [1, 2, 3])
def test_jagged_column_is_a_large_list_over_the_values(ragged_idx):
    lengths = [2, 0, 5, 1]
    other = [2, 3]
    rows = []
    for n in lengths:
        shape = list(other)
        shape.insert(ragged_idx - 1, n)
        rows.append(torch.randn(shape).bfloat16())
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    assert nt._ragged_idx == ragged_idx
    record_batch = adp.to_arrow(dp_of(nt=nt))
    column, field = record_batch.column(0), record_batch.schema.field(0)
    assert pa.types.is_large_list(column.type)
    assert column.offsets.to_pylist() == [0, *itertools.accumulate(lengths)]
    assert field.metadata[b"adp.kind"] == b"jagged" and field.metadata[b"adp.ragged_idx"] == str(ragged_idx).encode()
    expected_shape = list(other)
    expected_shape.insert(ragged_idx - 1, None)
    assert json.loads(field.metadata[b"adp.shape"]) == expected_shape
    out = adp.from_arrow(record_batch).batch["nt"]
    assert_tensor_equal(nt, out)
    for row, expected in zip(out.unbind(), rows):
        assert torch.equal(row.view(torch.uint16), expected.view(torch.uint16))


def test_jagged_values_are_exported_without_copy():
    nt = torch.nested.nested_tensor([torch.randn(n, 4) for n in [3, 1, 2]], layout=torch.jagged)
    column = adp.to_arrow(dp_of(nt=nt)).column(0)
    assert data_buffer(column).address == nt.values().data_ptr()
    assert column.buffers()[1].address == nt.offsets().data_ptr()


def test_mrope_position_ids_ragged_idx_two():
    lengths = [4, 1, 3]
    nt = torch.nested.nested_tensor([torch.arange(3 * n).view(3, n) for n in lengths], layout=torch.jagged)
    assert nt._ragged_idx == 2
    for out in (arrow_round_trip(dp_of(position_ids=nt)), ipc_round_trip(dp_of(position_ids=nt), "lz4")):
        got = out.batch["position_ids"]
        assert got._ragged_idx == 2 and [r.shape for r in got.unbind()] == [(3, n) for n in lengths]
        assert_tensor_equal(nt, got)


def test_jagged_tensor_transposed_to_ragged_idx_two():
    base = torch.nested.nested_tensor([torch.randn(n, 3) for n in [2, 4, 1]], layout=torch.jagged)
    nt = base.transpose(1, 2)  # [B, 3, j]: non-contiguous values
    assert nt._ragged_idx == 2
    assert_tensor_equal(nt, ipc_round_trip(dp_of(nt=nt)).batch["nt"])


def test_jagged_with_holes_is_compacted():
    values = torch.arange(40, dtype=torch.float32).view(4, 10)
    starts, lengths = torch.tensor([0, 3, 1, 5]), torch.tensor([2, 4, 0, 5])
    nt = torch.nested.narrow(values, 1, starts, lengths, layout=torch.jagged)
    assert nt.lengths() is not None
    out = ipc_round_trip(dp_of(nt=nt)).batch["nt"]
    assert_tensor_equal(nt, out)
    for i, row in enumerate(out.unbind()):
        assert torch.equal(row, values[i, starts[i] : starts[i] + lengths[i]])


def test_jagged_offsets_not_starting_at_zero_export_only_their_values():
    values = torch.arange(20, dtype=torch.int64).view(10, 2)
    nt = torch.nested.nested_tensor_from_jagged(values, torch.tensor([2, 5, 9]))
    column = adp.to_arrow(dp_of(nt=nt)).column(0)
    assert column.offsets.to_pylist() == [0, 3, 7] and len(column.values) == 7
    out = ipc_round_trip(dp_of(nt=nt)).batch["nt"]
    assert [r.tolist() for r in out.unbind()] == [values[2:5].tolist(), values[5:9].tolist()]


def test_jagged_slice_of_a_batch():
    dp = sample_dataproto(rows=8)
    piece = dp[2:5]
    assert int(piece.batch["responses_jagged"].offsets()[0]) == 0
    column = adp.to_arrow(piece).column("responses_jagged")
    assert len(column.values) == int(piece.batch["responses_jagged"].offsets()[-1])
    assert_dataproto_equal(piece, ipc_round_trip(piece))


def test_strided_nested_keeps_per_row_shapes():
    rows = [torch.randn(2, 3), torch.randn(4, 1), torch.randn(0, 5), torch.randn(1, 1)]
    nt = torch.nested.nested_tensor(rows)
    record_batch = adp.to_arrow(dp_of(nt=nt))
    column = record_batch.column(0)
    assert pa.types.is_struct(column.type)
    assert column.field("shape").to_pylist() == [[2, 3], [4, 1], [0, 5], [1, 1]]
    assert record_batch.schema.field(0).metadata[b"adp.kind"] == b"strided"
    out = ipc_round_trip(dp_of(nt=nt)).batch["nt"]
    assert_tensor_equal(nt, out)
    assert out.layout == torch.strided and out.is_nested


def test_strided_nested_non_contiguous():
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]).transpose(1, 2)
    assert not nt.is_contiguous()
    assert_tensor_equal(nt, ipc_round_trip(dp_of(nt=nt)).batch["nt"])


def test_strided_nested_with_rows_of_no_dimension_is_refused():
    nt = torch.nested.nested_tensor([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(adp.EncodeError, match="'nt'"):
        adp.to_arrow(dp_of(nt=nt))


def test_empty_pieces_of_nested_columns():
    """More chunks than rows: the empty pieces hold 0-row jagged and strided tensors."""
    dp = sample_dataproto(rows=3)
    dp.batch["strided"] = torch.nested.nested_tensor([torch.randn(2, 1), torch.randn(1, 3), torch.randn(2, 2)])
    pieces = dp.array_split(5)
    assert [len(p) for p in pieces] == [1, 1, 1, 0, 0]
    for piece in pieces:
        assert_dataproto_equal(piece, ipc_round_trip(piece))
        assert_dataproto_equal(piece, arrow_round_trip(piece))


def test_mixed_dtypes_with_bf16_and_fp8():
    float8 = [d for d in DTYPES if str(d).startswith("torch.float8")]
    assert float8, "this torch has no float8 dtype"
    columns = {
        f"c_{str(d)[6:]}": random_bits(d, [4, 3], i)
        for i, d in enumerate([torch.bfloat16, torch.float32, torch.int64, torch.bool, *float8])
    }
    dp = dp_of(**columns)
    record_batch = adp.to_arrow(dp)
    for field in record_batch.schema:
        dtype = STORAGE[getattr(torch, field.metadata[b"adp.dtype"].decode())]
        assert field.type.value_type == dtype.arrow_type
    assert record_batch.schema.field("c_bfloat16").type.value_type == pa.uint16()
    assert record_batch.schema.field("c_float8_e4m3fn").type.value_type == pa.uint8()
    assert_dataproto_equal(dp, ipc_round_trip(dp))


def test_bool_is_bool8_one_byte_per_value():
    t = torch.tensor([True, False, True, True, False])
    record_batch = adp.to_arrow(dp_of(b=t))
    assert record_batch.schema.field("b").type == pa.bool8()
    assert data_buffer(record_batch.column(0)).size == 5
    assert_tensor_equal(t, adp.from_arrow(record_batch).batch["b"])


def test_complex_is_stored_as_real_pairs():
    t = torch.randn(3, 2, dtype=torch.complex64)
    record_batch = adp.to_arrow(dp_of(z=t))
    assert record_batch.schema.field("z").type == pa.fixed_shape_tensor(pa.float32(), [2, 2])
    assert_tensor_equal(t, adp.from_arrow(record_batch).batch["z"])
    conj = t.conj()  # a lazy conjugate bit must be resolved, not lost
    assert_tensor_equal(conj.resolve_conj(), ipc_round_trip(dp_of(z=conj)).batch["z"])


def test_zero_size_dimensions():
    dp = dp_of(a=torch.empty(4, 0), b=torch.empty(4, 0, 3, dtype=torch.bfloat16), c=torch.randn(4, 2, 0, 1))
    assert_dataproto_equal(dp, ipc_round_trip(dp))
    empty = dp_of(a=torch.empty(0, 3), b=torch.empty(0, dtype=torch.bool))
    assert_dataproto_equal(empty, ipc_round_trip(empty))


def test_empty_tensordict_keeps_its_rows():
    for rows in (0, 7):
        dp = adp.DataProto(TensorDict({}, batch_size=[rows]), meta_info={"k": 1})
        record_batch = adp.to_arrow(dp)
        assert record_batch.num_rows == rows and record_batch.num_columns == 0
        out = ipc_round_trip(dp)
        assert len(out) == rows and out.batch.batch_size == (rows,) and list(out.batch.keys()) == []
        assert_dataproto_equal(dp, out)


def test_no_batch():
    dp = adp.DataProto(None, {"uid": np.array(["a", "b", "c"], dtype=object)}, {"step": 3})
    out = ipc_round_trip(dp)
    assert out.batch is None and len(out) == 3
    assert_dataproto_equal(dp, out)
    nothing = ipc_round_trip(adp.DataProto())
    assert nothing.batch is None and len(nothing) == 0 and nothing.non_tensor_batch == {} and nothing.meta_info == {}


def test_nested_tensordicts_keep_key_order_batch_size_and_device():
    inner = TensorDict({"z": torch.randn(3, 4, 2), "a": torch.arange(12).view(3, 4)}, batch_size=[3, 4])
    middle = TensorDict({"y": torch.ones(3, 4, 1), "inner": inner}, batch_size=[3, 4])
    td = TensorDict({"m": middle, "b": torch.zeros(3), "a": torch.ones(3)}, batch_size=[3], device="cpu")
    dp = adp.DataProto(td)
    out = ipc_round_trip(dp)
    assert list(out.batch.keys(include_nested=True)) == list(td.keys(include_nested=True))
    assert out.batch["m"].batch_size == (3, 4) and out.batch["m", "inner"].batch_size == (3, 4)
    assert adp.to_arrow(dp).schema.names == ["m.y", "m.inner.z", "m.inner.a", "b", "a"]
    assert_dataproto_equal(dp, out)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(6, 3).T,  # transposed
        lambda: torch.arange(40)[::3],  # strided slice of rows
        lambda: torch.randn(6, 8)[:, 1::2],  # strided slice of columns
        lambda: torch.randn(1, 5).expand(6, 5),  # expanded (stride 0)
        lambda: torch.randn(10, 4, 2)[2:8].permute(0, 2, 1),  # offset + permuted
    ],
    ids=["transposed", "row_step", "column_step", "expanded", "offset_permuted"],
)
def test_non_contiguous_input_exports_only_its_own_bytes(make):
    t = make()
    assert not t.is_contiguous() or t.storage_offset()
    column = adp.to_arrow(dp_of(t=t)).column(0)
    assert data_buffer(column).size == t.numel() * t.element_size()
    assert_tensor_equal(t, ipc_round_trip(dp_of(t=t)).batch["t"])


def test_chunk_of_a_batch_exports_a_quarter_of_the_bytes():
    dp = sample_dataproto(rows=400, prompt=64, response=64)
    whole = adp.to_ipc(dp).size
    quarter = adp.to_ipc(dp.chunk(4)[0]).size
    assert 0.2 * whole < quarter < 0.3 * whole
    assert_dataproto_equal(dp.chunk(4)[0], ipc_round_trip(dp.chunk(4)[0]))


def test_bare_tensordict():
    td = sample_dataproto().batch
    for out in (arrow_round_trip(td), ipc_round_trip(td)):
        assert isinstance(out, adp.DataProto)
        assert out.non_tensor_batch == {} and out.meta_info == {}
        assert_dataproto_equal(adp.DataProto(td), out)


class DuckProto:
    """Not a DataProto, but has its three fields."""

    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


def test_duck_typed_container():
    dp = sample_dataproto()
    duck = DuckProto(dp.batch, dp.non_tensor_batch, dp.meta_info)
    assert_dataproto_equal(duck, ipc_round_trip(duck))
    assert_dataproto_equal(adp.DataProto(), ipc_round_trip(DuckProto(None, None, None)))


@pytest.mark.verl
def test_verl_dataproto():
    protocol = pytest.importorskip("verl.protocol", reason="verl is not installed (pip install --no-deps verl)")
    dp = sample_dataproto()
    plain = dp.select(batch_keys=["input_ids", "attention_mask", "old_log_probs", "ref_log_prob", "extra"])
    theirs = protocol.DataProto(batch=plain.batch, non_tensor_batch=plain.non_tensor_batch, meta_info=plain.meta_info)
    assert_dataproto_equal(theirs, ipc_round_trip(theirs))


@pytest.mark.parametrize("value", [5, None, "text", {"batch": 1}, np.zeros(3)])
def test_non_dataproto_input_is_refused(value):
    with pytest.raises(adp.EncodeError):
        adp.to_arrow(value)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8), "dtype"),
        (lambda: torch.eye(3).to_sparse(), "layout"),
        (lambda: torch.empty(3, device="meta"), "meta"),
    ],
    ids=["quantized", "sparse", "meta"],
)
def test_unsupported_tensor_is_refused_naming_the_column(make, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized tensors are deprecated
        tensor = make()
    with pytest.raises(adp.EncodeError, match=match) as info:
        adp.to_arrow(TensorDict({"bad": tensor}, batch_size=[3]))
    assert "'bad'" in str(info.value)


def test_non_tensor_data_inside_the_tensordict_is_refused():
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    td["note"] = "not a tensor"
    with pytest.raises(adp.EncodeError, match="note"):
        adp.to_arrow(td)


def test_key_in_both_batch_and_non_tensor_is_refused():
    dp = adp.DataProto(TensorDict({"k": torch.zeros(2)}, [2]), {"k": np.zeros(2)})
    with pytest.raises(adp.EncodeError, match="duplicate"):
        adp.to_arrow(dp)


def test_compression_must_be_known():
    with pytest.raises(adp.EncodeError, match="compression"):
        adp.to_ipc(sample_dataproto(), compression="gzip")


# ---------------------------------------------------------------- zero copy


def test_to_arrow_shares_the_memory_of_contiguous_tensors():
    dp = sample_dataproto()
    record_batch = adp.to_arrow(dp)
    shared = {"input_ids", "attention_mask", "old_log_probs", "ref_log_prob", "extra.values"}
    for name in shared:
        key = tuple(name.split("."))
        tensor = dp.batch[key if len(key) > 1 else key[0]]
        assert data_buffer(record_batch.column(name)).address == tensor.data_ptr(), name
    dp.batch["input_ids"][0, 0] = -1  # writes show through the views
    assert record_batch.column("input_ids").to_numpy_ndarray()[0, 0] == -1


def test_from_ipc_views_the_buffer():
    dp = sample_dataproto()
    buffer = adp.to_ipc(dp)
    start, end = buffer.address, buffer.address + buffer.size
    out = adp.from_ipc(buffer)
    for name, tensor in leaves(out).items():
        pointers = (
            [tensor.values().data_ptr(), tensor.offsets().data_ptr()] if tensor.is_nested else [tensor.data_ptr()]
        )
        assert all(start <= p < end for p in pointers), name
    copied = adp.from_ipc(buffer, copy=True)
    for name, tensor in leaves(copied).items():
        pointer = tensor.values().data_ptr() if tensor.is_nested else tensor.data_ptr()
        assert not start <= pointer < end, name
    assert_dataproto_equal(out, copied)


@pytest.mark.parametrize(
    "wrap", [bytes, memoryview, bytearray, pa.py_buffer], ids=["bytes", "memoryview", "bytearray", "pa.Buffer"]
)
def test_from_ipc_accepts_bytes_like(wrap):
    dp = sample_dataproto()
    assert_dataproto_equal(dp, adp.from_ipc(wrap(adp.to_ipc(dp).to_pybytes())))


def test_misaligned_buffers_decode_safely():
    """IPC aligns buffers to 8 bytes, a caller's memory to anything: torch crashes on misaligned complex128."""
    dp = dp_of(**{f"c{i}": random_bits(d, [3, 1], i) for i, d in enumerate(DTYPES)})
    dp.batch["jagged"] = torch.nested.nested_tensor(
        [torch.ones(n, dtype=torch.complex128) for n in (1, 2, 0)], layout=torch.jagged
    )
    payload = adp.to_ipc(dp).to_pybytes()
    for shift in range(16):
        memory = bytearray(shift) + bytearray(payload)
        out = adp.from_ipc(memoryview(memory)[shift:])
        for name, tensor in leaves(out).items():
            values = tensor.values() if tensor.is_nested else tensor
            assert values.data_ptr() % tensor.dtype.itemsize == 0, (shift, name)
        assert_dataproto_equal(dp, out)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_stream_is_smaller_and_decodes_to_new_memory(compression):
    dp = dp_of(zeros=torch.zeros(256, 256), ids=torch.arange(256))
    plain, packed = adp.to_ipc(dp), adp.to_ipc(dp, compression=compression)
    assert packed.size < plain.size / 10
    out = adp.from_ipc(packed)
    assert not packed.address <= out.batch["zeros"].data_ptr() < packed.address + packed.size
    assert_dataproto_equal(dp, out)


# ---------------------------------------------------------------- schema metadata and versions


def test_schema_metadata_names_format_version_and_columns():
    dp = sample_dataproto()
    record_batch = adp.to_arrow(dp)
    metadata = record_batch.schema.metadata
    assert metadata[b"adp.format"] == b"arrow-dataproto"
    assert metadata[b"adp.version"] == ("%d.%d" % adp.FORMAT_VERSION).encode()
    assert json.loads(metadata[b"adp.batch_size"]) == [len(dp)]
    assert json.loads(metadata[b"adp.device"]) is None
    for name, tensor in leaves(dp).items():
        field = record_batch.schema.field(".".join(name) if isinstance(name, tuple) else name)
        assert field.metadata[b"adp.dtype"] == str(tensor.dtype).removeprefix("torch.").encode()
        assert field.metadata[b"adp.device"] == b"cpu"
        kind = field.metadata[b"adp.kind"].decode()
        assert kind == ("jagged" if tensor.is_nested else "tensor")
        shape = json.loads(field.metadata[b"adp.shape"])
        if kind == "tensor":
            assert shape == list(tensor.shape[1:])
        else:
            assert shape.count(None) == 1 and int(field.metadata[b"adp.ragged_idx"]) == tensor._ragged_idx


def test_unknown_major_version_is_refused():
    record_batch = adp.to_arrow(sample_dataproto())
    newer = with_schema_metadata(record_batch, "adp.version", f"{adp.FORMAT_VERSION[0] + 1}.0")
    with pytest.raises(adp.FormatVersionError, match="version"):
        adp.from_arrow(newer)
    with pytest.raises(adp.FormatVersionError):
        adp.from_ipc(ipc_of(newer))
    assert issubclass(adp.FormatVersionError, adp.DecodeError)


def test_minor_version_bump_is_accepted():
    dp = sample_dataproto()
    bumped = with_schema_metadata(
        adp.to_arrow(dp), "adp.version", f"{adp.FORMAT_VERSION[0]}.{adp.FORMAT_VERSION[1] + 7}"
    )
    assert_dataproto_equal(dp, adp.from_ipc(ipc_of(bumped)))


@pytest.mark.parametrize(
    "key, value",
    [
        *[(key, None) for key in ("adp.format", "adp.version", "adp.batch_size", "adp.device", "adp.tree")],
        *[(key, "{garbled") for key in ("adp.batch_size", "adp.device", "adp.tree")],
        ("adp.format", "parquet"),
        ("adp.version", ""),
        ("adp.version", "one.zero"),
        ("adp.version", "1"),
        ("adp.batch_size", '"6"'),
        ("adp.batch_size", "[]"),
        ("adp.batch_size", "[-6]"),
        ("adp.batch_size", "[7]"),
        ("adp.batch_size", "[6, 2]"),
        ("adp.device", "3"),
        ("adp.tree", '{"a": 1}'),
        ("adp.tree", '[["extra", 3]]'),
        ("adp.tree", '["input_ids"]'),
        ("adp.tree", json.dumps(["x"] * 50)),
        ("adp.meta_info", None),
        ("adp.meta_info", "{garbled"),
        ("adp.meta_info", "[1]"),
        ("adp.meta_info.encoding", "yaml"),
    ],
)
def test_missing_or_garbled_schema_metadata_is_a_decode_error(key, value):
    record_batch = with_schema_metadata(adp.to_arrow(sample_dataproto()), key, value)
    with pytest.raises(adp.DecodeError):
        adp.from_arrow(record_batch)


def test_schema_without_metadata_is_a_decode_error():
    record_batch = adp.to_arrow(sample_dataproto()).replace_schema_metadata(None)
    with pytest.raises(adp.DecodeError, match="arrow-dataproto"):
        adp.from_arrow(record_batch)
    with pytest.raises(adp.DecodeError):
        adp.from_arrow(pa.record_batch({"a": [1, 2]}))
    with pytest.raises(adp.DecodeError):
        adp.from_arrow(pa.table({"a": [1, 2]}))


@pytest.mark.parametrize(
    "key, value",
    [
        ("adp.dtype", "no_such_dtype"),
        ("adp.dtype", "complex128"),
        ("adp.dtype", "bool"),
        ("adp.shape", "not json"),
        ("adp.shape", "[-1]"),
        ("adp.shape", "[99]"),
        ("adp.shape", "[null]"),
        ("adp.kind", "mystery"),
        ("adp.kind", "strided"),
        ("adp.kind", "jagged"),
    ],
)
def test_inconsistent_column_metadata_is_a_decode_error(key, value):
    record_batch = adp.to_arrow(dp_of(x=torch.randn(4, 3)))
    with pytest.raises(adp.DecodeError, match="'x'"):
        adp.from_arrow(with_field_metadata(record_batch, key, value))


def test_corrupt_ipc_bytes_raise_only_library_errors():
    """Random byte flips either decode (the flip hit tensor data) or raise a DataProtoError, never anything else."""
    payload = adp.to_ipc(sample_dataproto()).to_pybytes()
    rng = random.Random(0)
    for cut in (0, 7, 100, len(payload) // 2, len(payload) - 9):
        with pytest.raises(adp.DecodeError):
            adp.from_ipc(payload[:cut])
    for _ in range(300):
        corrupt = bytearray(payload)
        for _ in range(3):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                adp.from_ipc(bytes(corrupt))
        except adp.DataProtoError:
            pass


# ---------------------------------------------------------------- devices


def test_device_is_recorded():
    td = TensorDict({"x": torch.zeros(2), "sub": TensorDict({"y": torch.ones(2)}, [2])}, batch_size=[2], device="cpu")
    record_batch = adp.to_arrow(td)
    assert json.loads(record_batch.schema.metadata[b"adp.device"]) == "cpu"
    assert all(f.metadata[b"adp.device"] == b"cpu" for f in record_batch.schema)
    out = adp.from_arrow(record_batch)
    assert out.batch.device == torch.device("cpu") and out.batch["sub"].device == torch.device("cpu")


@pytest.mark.parametrize("via", ["arrow", "ipc"])
def test_recorded_device_missing_here_lands_on_cpu_with_one_warning(via):
    td = TensorDict(
        {"x": torch.arange(3), "j": torch.nested.nested_tensor([torch.ones(2)] * 3, layout=torch.jagged)},
        [3],
        device="cpu",
    )
    device = absent_device()
    record_batch = with_field_metadata(adp.to_arrow(td), "adp.device", device)
    record_batch = with_schema_metadata(record_batch, "adp.device", json.dumps(device))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = adp.from_arrow(record_batch) if via == "arrow" else adp.from_ipc(ipc_of(record_batch))
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and device in str(runtime[0].message)
    assert out.batch.device == torch.device("cpu")
    assert all(t.device.type == "cpu" for t in leaves(out).values())
    assert_dataproto_equal(adp.DataProto(td), out)


def test_device_argument_overrides_the_recorded_device():
    record_batch = with_field_metadata(
        adp.to_arrow(TensorDict({"x": torch.arange(3)}, [3], device="cpu")), "adp.device", absent_device()
    )
    record_batch = with_schema_metadata(record_batch, "adp.device", json.dumps(absent_device()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = adp.from_arrow(record_batch, device="cpu")
        undeclared = adp.from_arrow(adp.to_arrow(TensorDict({"x": torch.arange(3)}, [3])), device=torch.device("cpu"))
    assert out.batch.device == torch.device("cpu") and out.batch["x"].device.type == "cpu"
    assert undeclared.batch.device == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_is_restored_and_overridable():
    td = sample_dataproto().batch.to("cuda")
    record_batch = adp.to_arrow(adp.DataProto(td))
    assert json.loads(record_batch.schema.metadata[b"adp.device"]) == "cuda:0"
    out = adp.from_ipc(adp.to_ipc(adp.DataProto(td)))
    assert out.batch.device == torch.device("cuda:0")
    assert all(t.device == torch.device("cuda:0") for t in leaves(out).values())
    assert_dataproto_equal(adp.DataProto(td), out)
    on_cpu = adp.from_arrow(record_batch, device="cpu")
    assert all(t.device.type == "cpu" for t in leaves(on_cpu).values())
    assert_dataproto_equal(adp.DataProto(td.cpu()), on_cpu)
