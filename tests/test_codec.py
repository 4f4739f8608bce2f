"""The Arrow codec: to_arrow/from_arrow and to_ipc/from_ipc.

Round trips are bit-exact (NaN payloads included) and keep dtype, shape, layout,
ragged dimension, device and key order. Property-based cases cover every dtype in
the storage table, ranks 1-4 with zero-size dimensions, batch sizes of rank 2,
nested TensorDicts, jagged tensors (ragged_idx 1-3), strided nested tensors and
non-tensor values (strategies: :mod:`arrow_dataproto.testing.strategies`); named cases
cover what the format promises (zero-copy, exported bytes, schema metadata, devices, errors).
"""

from __future__ import annotations

import itertools
import json
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
from arrow_dataproto._dtypes import STORAGE
from arrow_dataproto.testing import assert_dataproto_equal, assert_tensor_equal, sample_dataproto
from arrow_dataproto.testing.strategies import DTYPES, dataprotos, random_bits, seeds

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


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
    for compression in adp._codec.COMPRESSIONS:
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
    for compression in adp._codec.COMPRESSIONS:
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


def test_a_batch_size_other_than_the_rows_present_follows_the_rows():
    # Issue 10: a filtered or sliced table keeps the schema metadata of the whole one.
    record_batch = with_schema_metadata(adp.to_arrow(sample_dataproto()), "adp.batch_size", "[7]")
    out = adp.from_arrow(record_batch)
    assert out.batch.batch_size == torch.Size([record_batch.num_rows])
    assert_dataproto_equal(out, sample_dataproto())


def test_a_schema_without_metadata_is_read_by_the_rule_for_other_tools():
    # Issue 10: tables of other tools come back (tests/test_foreign.py has the rule row by row).
    stripped = adp.to_arrow(sample_dataproto()).replace_schema_metadata(None)
    out = adp.from_arrow(stripped)  # the field metadata still gives dtypes, shapes and layouts
    assert out.meta_info == {} and out.batch["ref_log_prob"].dtype == torch.bfloat16
    assert "extra.values" in out.batch.keys()  # the tree was in the schema metadata: flat keys
    assert adp.from_arrow(pa.record_batch({"a": [1, 2]})).batch["a"].tolist() == [1, 2]
    assert adp.from_arrow(pa.table({"a": [1, 2]})).batch["a"].tolist() == [1, 2]


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


# ---------------------------------------------------------------- a subset of columns


def test_columns_decode_a_subset_zero_copy():
    dp = sample_dataproto()
    record_batch = adp.to_arrow(dp)
    part = adp.from_arrow(record_batch, columns=["input_ids", "extra", "uid"])  # "extra": a nested TensorDict
    assert_dataproto_equal(dp.select(["input_ids", "extra"], ["uid"]), part)
    assert part.batch["input_ids"].data_ptr() == dp.batch["input_ids"].data_ptr()  # a view, as without columns=
    only_meta = adp.from_ipc(adp.to_ipc(dp), columns=["uid"])
    assert only_meta.batch.batch_size == dp.batch.batch_size and list(only_meta.batch.keys()) == []
    assert only_meta.meta_info == dp.meta_info
    with pytest.raises(adp.ColumnNotFoundError, match="nope"):
        adp.from_arrow(record_batch, columns=["input_ids", "nope"])


def test_decoding_a_jagged_column_logs_no_torch_fx_notice(tmp_path):
    """torch logs an ``is_fx_tracing`` notice (once per process) when a jagged tensor is built;
    decoding one must not show it (decoded in a fresh process, where it would be the first)."""
    nt = torch.nested.nested_tensor_from_jagged(torch.arange(5), torch.tensor([0, 2, 5]))
    (tmp_path / "b.arrows").write_bytes(adp.to_ipc(TensorDict({"x": nt}, batch_size=[2])).to_pybytes())
    code = (
        "import sys, arrow_dataproto as adp\n"
        "dp = adp.from_ipc(open(sys.argv[1], 'rb').read())\n"
        "assert dp.batch['x'].unbind()[1].tolist() == [2, 3, 4]\n"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "b.arrows")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "is_fx_tracing" not in done.stderr + done.stdout


def test_jagged_tensors_in_autograd_are_built_and_taken_apart_through_autograd():
    """Outside autograd the codec builds jagged tensors without torch's dispatcher; a tensor
    that requires grad still goes through it, so row operations keep the graph."""
    from arrow_dataproto import _jagged

    values = torch.arange(6.0, requires_grad=True)
    nt = _jagged.build(values, torch.tensor([0, 2, 6]), 1)
    assert nt.requires_grad and nt.grad_fn is not None
    taken, _ = _jagged.parts(nt)
    taken.sum().backward()
    assert values.grad is not None and values.grad.tolist() == [1.0] * 6

    leaf = _jagged.build(torch.arange(6.0), torch.tensor([0, 2, 6]), 1).requires_grad_()
    taken, _ = _jagged.parts(leaf)
    assert taken.requires_grad  # an autograd view of the leaf's values, not the bare values tensor
    plain = _jagged.build(torch.arange(6.0), torch.tensor([0, 2, 6]), 1)
    assert not plain.requires_grad and _jagged.parts(plain)[0] is plain._values


@pytest.mark.parametrize("ragged_idx", [1, 2, 3])
def test_jagged_tensors_built_without_the_dispatcher_match_torchs_own(ragged_idx):
    from arrow_dataproto import _jagged

    shape = [2, 3]
    shape.insert(ragged_idx - 1, 7)
    values = torch.arange(42.0).view(*shape)
    offsets = torch.tensor([0, 3, 3, 7])
    ours = _jagged.build(values.movedim(ragged_idx - 1, 0), offsets, ragged_idx)
    theirs = torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=ragged_idx)
    assert ours.shape == theirs.shape and ours.layout == torch.jagged
    assert all(torch.equal(a, b) for a, b in zip(ours.unbind(), theirs.unbind()))
    assert torch.equal((ours * 2 + theirs).values(), values * 3)  # one ragged size: they combine
    assert torch.equal(_jagged.parts(ours)[0], _jagged.parts(theirs)[0])


def test_field_metadata_is_parsed_once_per_distinct_columns(monkeypatch):
    """A training loop decodes the same columns every step: each tensor column's metadata
    is parsed once for them, whatever the batch's meta_info and row count; other columns,
    or the same columns with other field metadata, are parsed afresh (and checked)."""
    from arrow_dataproto import _format

    parsed = []
    original = _format.TensorSpec.parse.__func__
    monkeypatch.setattr(_format.TensorSpec, "parse", classmethod(lambda cls, n, m: parsed.append(n) or original(cls, n, m)))
    monkeypatch.setattr(_format, "_columns_seen", [])

    def batch(rows, step, dtype=torch.float32):
        td = TensorDict({"a": torch.zeros(rows, 3, dtype=dtype), "b": torch.arange(rows)}, batch_size=[rows])
        return adp.DataProto(batch=td, meta_info={"step": step})

    for step, rows in enumerate([4, 4, 9]):
        got = adp.from_ipc(adp.to_ipc(batch(rows, step)))
        assert got.meta_info == {"step": step} and got.batch["a"].shape == (rows, 3)
    assert parsed == ["a", "b"]
    got = adp.from_ipc(adp.to_ipc(batch(4, 3, torch.float64)))  # other field metadata for "a"
    assert got.batch["a"].dtype == torch.float64 and parsed == ["a", "b", "a", "b"]

    record_batch = adp.to_arrow(batch(4, 4))
    field = record_batch.schema.field("a")
    damaged = field.with_metadata({**field.metadata, b"adp.shape": b"[4]"})  # the rows hold 3 values
    bad = pa.RecordBatch.from_arrays(
        record_batch.columns, schema=record_batch.schema.set(0, damaged)
    )
    with pytest.raises(adp.DecodeError, match="'a'"):
        adp.from_arrow(bad)
    assert adp.from_arrow(record_batch).meta_info == {"step": 4}  # the good columns still decode
