"""The dtype table: every torch dtype maps to an Arrow type of the same width, and back, bit for bit."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto._dtypes import STORAGE, dtype_from_name, dtype_name, storage_of
from arrow_dataproto.testing import assert_tensor_equal

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

# What each dtype's values look like to any Arrow reader, written out independently of the table.
EXPECTED_VALUE_TYPE = {
    "bool": pa.bool8(),
    "uint8": pa.uint8(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bfloat16": pa.uint16(),
    "complex32": pa.float16(),
    "complex64": pa.float32(),
    "complex128": pa.float64(),
    "float8_e4m3fn": pa.uint8(),
    "float8_e4m3fnuz": pa.uint8(),
    "float8_e5m2": pa.uint8(),
    "float8_e5m2fnuz": pa.uint8(),
    "float8_e8m0fnu": pa.uint8(),
    "float4_e2m1fn_x2": pa.uint8(),
    "bits8": pa.uint8(),
    "bits16": pa.uint16(),
}
# torch dtypes with no Arrow storage: quantized (they carry scale/zero point), the
# sub-byte placeholders (no copy kernel) and the packed-bit containers other than bits8.
UNSUPPORTED = {"qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2"} | {
    f"{s}int{n}" for s in ("", "u") for n in range(1, 8)
}
ALL_TORCH_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
DTYPES = sorted(STORAGE, key=str)


def _ids(dtypes):
    return [dtype_name(d) for d in dtypes]


# Wider dtypes: infinities, signalling and quiet NaNs with payloads, -0.0, denormals (as 64- then 32-bit words).
SPECIAL_WORDS = np.concatenate(
    [
        np.array(
            [
                0,
                1,
                0x7FF0000000000000,
                0x7FF0000000000001,
                0x7FF8000000000000,
                0x7FF8DEADBEEF0000,
                0xFFF8000000000001,
                0x8000000000000000,
                0x000FFFFFFFFFFFFF,
                0xFFFFFFFFFFFFFFFF,
            ],
            dtype=np.uint64,
        ).view(np.uint8),
        np.array(
            [0, 1, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FC0BEEF, 0xFFC00001, 0x80000000, 0xFFFFFFFF],
            dtype=np.uint32,
        ).view(np.uint8),
    ]
)


def every_bit_pattern(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 1- or 2-byte dtype; for wider ones, special values and NaN payloads."""
    if dtype == torch.bool:
        raw = torch.tensor([0, 1, 1, 0, 0, 1], dtype=torch.uint8)  # torch bool holds only 0 and 1
    elif dtype.itemsize == 1:
        raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    elif dtype.itemsize == 2:
        raw = torch.arange(65536, dtype=torch.int32).to(torch.uint16).view(torch.uint8)
    else:
        raw = torch.from_numpy(SPECIAL_WORDS[: len(SPECIAL_WORDS) // dtype.itemsize * dtype.itemsize].copy())
    return raw.view(dtype)


def _round_trips(t: torch.Tensor):
    dp = adp.DataProto(TensorDict({"x": t}, batch_size=[t.shape[0]]))
    buffers: list = []
    pickled = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    yield "arrow", adp.from_arrow(adp.to_arrow(dp))
    yield "ipc", adp.from_ipc(adp.to_ipc(dp))
    yield "zstd", adp.from_ipc(adp.to_ipc(dp, compression="zstd"))
    yield "copy", adp.from_ipc(adp.to_ipc(dp), copy=True)
    yield "pickle5", pickle.loads(pickled, buffers=buffers)
    with adp.receive_options(copy=False):
        yield "pickle5 view", pickle.loads(pickled, buffers=buffers)
    yield "pickle2", pickle.loads(pickle.dumps(dp, protocol=2))


def test_every_torch_dtype_is_stored_or_explicitly_unsupported():
    names = {dtype_name(d) for d in ALL_TORCH_DTYPES}
    stored = {dtype_name(d) for d in STORAGE}
    assert names - stored <= UNSUPPORTED, sorted(names - stored - UNSUPPORTED)
    assert stored == set(EXPECTED_VALUE_TYPE) & names


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
def test_storage_has_the_same_width(dtype):
    storage = STORAGE[dtype]
    assert storage.arrow_type == EXPECTED_VALUE_TYPE[dtype_name(dtype)]
    value_type = (
        storage.arrow_type.storage_type if isinstance(storage.arrow_type, pa.BaseExtensionType) else storage.arrow_type
    )
    assert value_type.bit_width * storage.pair == dtype.itemsize * 8
    assert storage.torch_view.itemsize * storage.pair == dtype.itemsize
    assert storage.pair == (2 if dtype.is_complex else 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
def test_names_round_trip(dtype):
    assert dtype_from_name(dtype_name(dtype), "c") is dtype
    assert storage_of(dtype, "c") is STORAGE[dtype]


@pytest.mark.parametrize("name", ["no_such_dtype", "qint8", "torch.float32", ""])
def test_unknown_dtype_name_is_a_decode_error(name):
    with pytest.raises(adp.DecodeError, match="'col'"):
        dtype_from_name(name, "col")


@pytest.mark.parametrize("name", sorted(UNSUPPORTED & {dtype_name(d) for d in ALL_TORCH_DTYPES}))
def test_unsupported_dtype_is_refused_naming_the_column(name):
    dtype = getattr(torch, name)
    with pytest.raises(adp.EncodeError, match="'col'"):
        storage_of(dtype, "col")
    if name in ("qint8", "quint8", "qint32"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # quantized tensors are deprecated
            tensor = torch.quantize_per_tensor(torch.randn(3), 0.1, 0, dtype)
    elif name.startswith("q"):
        return  # packed quantized dtypes: no simple constructor
    else:
        tensor = torch.empty(3, dtype=dtype)
    with pytest.raises(adp.EncodeError, match="'x'"):
        adp.to_arrow(TensorDict({"x": tensor}, batch_size=[3]))


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
def test_column_types_and_metadata(dtype):
    flat = torch.zeros(6 * dtype.itemsize, dtype=torch.uint8).view(dtype)
    shaped = torch.zeros(24 * dtype.itemsize, dtype=torch.uint8).view(dtype).view(6, 2, 2)
    value_type = EXPECTED_VALUE_TYPE[dtype_name(dtype)]
    for t, row_shape in ((flat, []), (shaped, list(shaped.shape[1:]))):
        record_batch = adp.to_arrow(TensorDict({"x": t}, batch_size=[t.shape[0]]))
        field = record_batch.schema.field("x")
        arrow_shape = row_shape + ([2] if dtype.is_complex else [])
        expected = pa.fixed_shape_tensor(value_type, arrow_shape) if arrow_shape else value_type
        assert field.type == expected
        assert field.metadata[b"adp.dtype"] == dtype_name(dtype).encode()
        assert field.metadata[b"adp.kind"] == b"tensor"


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
def test_every_bit_pattern_survives_every_transport(dtype):
    t = every_bit_pattern(dtype)
    for rank_shape in ((-1,), (-1, 2) if t.numel() % 2 == 0 else (-1, 1)):
        tensor = t.reshape(rank_shape)
        for how, out in _round_trips(tensor):
            assert_tensor_equal(tensor, out.batch["x"], f"{dtype} {how}")


@pytest.mark.parametrize(
    "dtype", [d for d in DTYPES if not d.is_complex and STORAGE[d].torch_view == d and d != torch.bool], ids=str
)
def test_native_dtypes_read_as_numbers_by_other_arrow_readers(dtype):
    t = every_bit_pattern(dtype)[:64]
    column = adp.to_arrow(TensorDict({"x": t}, batch_size=[len(t)])).column(0)
    assert np.array_equal(column.to_numpy().view(np.uint8), t.view(torch.uint8).numpy())


def test_bool_reads_as_bool_and_complex_as_real_pairs():
    flags = torch.tensor([True, False, False, True])
    column = adp.to_arrow(TensorDict({"b": flags}, batch_size=[4])).column(0)
    assert column.to_numpy(zero_copy_only=False).tolist() == flags.tolist()
    z = torch.randn(4, 3, dtype=torch.complex128)
    column = adp.to_arrow(TensorDict({"z": z}, batch_size=[4])).column(0)
    assert np.array_equal(column.to_numpy_ndarray(), torch.view_as_real(z).numpy())


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids(DTYPES))
def test_dtype_whose_storage_disagrees_with_the_column_is_a_decode_error(dtype):
    other = torch.int32 if STORAGE[dtype].arrow_type != pa.int32() else torch.int64
    record_batch = adp.to_arrow(TensorDict({"x": torch.zeros(3, dtype=other)}, batch_size=[3]))
    field = record_batch.schema.field(0)
    tampered = field.with_metadata({**field.metadata, b"adp.dtype": dtype_name(dtype).encode()})
    schema = pa.schema([tampered], metadata=record_batch.schema.metadata)
    with pytest.raises(adp.DecodeError, match="'x'"):
        adp.from_arrow(pa.RecordBatch.from_arrays(record_batch.columns, schema=schema))
