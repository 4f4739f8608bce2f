"""How each torch dtype is stored in Arrow.

One table, read both ways. A dtype Arrow has natively (integers, float16/32/64)
is stored as itself; ``bool`` uses the canonical ``arrow.bool8`` extension (one
byte per value, no bit packing). Dtypes Arrow lacks keep their bits in a storage
type of the same width (bfloat16 in ``uint16``, every float8 in ``uint8``) and
the real torch dtype is recorded in the column's metadata. Complex numbers are
stored as (real, imag) pairs of their float type, as an extra trailing
dimension of 2 (``torch.view_as_real`` order), so other Arrow readers see numbers.

The same table says how numpy (pandas) shows each dtype: as itself when numpy
has it, else widened to a dtype that holds every value exactly (bfloat16 and
every float8 as float32, complex32 as complex64), or as its raw bits
(``bits8``/``bits16``/``float4_e2m1fn_x2`` as uint8/uint16).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import torch

from .errors import DecodeError, EncodeError, UnknownContentError


@dataclass(frozen=True)
class Storage:
    """Arrow storage of one torch dtype.

    ``arrow_type`` is the Arrow value type of the column; ``torch_view`` is the
    torch dtype of that storage (what DLPack hands back), viewed as the real
    dtype on decode; ``pair`` is 2 for complex dtypes (an extra trailing
    dimension of real/imag), else 1. ``shown`` is the dtype numpy shows it as
    (``None``: itself), ``widened`` whether that takes a value conversion
    (otherwise the bits are viewed as they are).
    """

    arrow_type: pa.DataType
    torch_view: torch.dtype
    pair: int = 1
    shown: torch.dtype | None = None
    widened: bool = False


def _table() -> dict[torch.dtype, Storage]:
    native = {
        "bool": Storage(pa.bool8(), torch.int8),
        "uint8": Storage(pa.uint8(), torch.uint8),
        "int8": Storage(pa.int8(), torch.int8),
        "int16": Storage(pa.int16(), torch.int16),
        "int32": Storage(pa.int32(), torch.int32),
        "int64": Storage(pa.int64(), torch.int64),
        "uint16": Storage(pa.uint16(), torch.uint16),
        "uint32": Storage(pa.uint32(), torch.uint32),
        "uint64": Storage(pa.uint64(), torch.uint64),
        "float16": Storage(pa.float16(), torch.float16),
        "float32": Storage(pa.float32(), torch.float32),
        "float64": Storage(pa.float64(), torch.float64),
        "bfloat16": Storage(pa.uint16(), torch.uint16, 1, torch.float32, True),
        "complex32": Storage(pa.float16(), torch.float16, 2, torch.complex64, True),
        "complex64": Storage(pa.float32(), torch.float32, 2),
        "complex128": Storage(pa.float64(), torch.float64, 2),
        "float8_e4m3fn": Storage(pa.uint8(), torch.uint8, 1, torch.float32, True),
        "float8_e4m3fnuz": Storage(pa.uint8(), torch.uint8, 1, torch.float32, True),
        "float8_e5m2": Storage(pa.uint8(), torch.uint8, 1, torch.float32, True),
        "float8_e5m2fnuz": Storage(pa.uint8(), torch.uint8, 1, torch.float32, True),
        "float8_e8m0fnu": Storage(pa.uint8(), torch.uint8, 1, torch.float32, True),
        "float4_e2m1fn_x2": Storage(pa.uint8(), torch.uint8, 1, torch.uint8),
        "bits8": Storage(pa.uint8(), torch.uint8, 1, torch.uint8),
        "bits16": Storage(pa.uint16(), torch.uint16, 1, torch.uint16),
    }
    # Older torch releases lack some of these names; the table holds what this one has.
    return {getattr(torch, name): s for name, s in native.items() if hasattr(torch, name)}


STORAGE: dict[torch.dtype, Storage] = _table()


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the name recorded in metadata."""
    return str(dtype).removeprefix("torch.")


_BY_NAME: dict[str, torch.dtype] = {dtype_name(d): d for d in STORAGE}


def storage_of(dtype: torch.dtype, column: str) -> Storage:
    """The Arrow storage of ``dtype``; :class:`EncodeError` for dtypes with none (quantized...)."""
    try:
        return STORAGE[dtype]
    except KeyError:
        raise EncodeError(f"column {column!r}: torch dtype {dtype} has no Arrow storage") from None


def dtype_from_name(name: str, column: str) -> torch.dtype:
    """The torch dtype recorded as ``name``; :class:`DecodeError` if this torch has no such dtype."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownContentError(f"column {column!r}: unknown or unsupported torch dtype {name!r}") from None


def shown_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype whose numpy dtype shows ``dtype`` (itself when numpy has it)."""
    return STORAGE[dtype].shown or dtype


NUMPY_NATIVE: frozenset[torch.dtype] = frozenset(d for d, s in STORAGE.items() if s.shown is None)
"""The torch dtypes numpy has (``torch.from_numpy`` gives them back)."""
