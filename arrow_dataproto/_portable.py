"""The portable view: a RecordBatch of plain Arrow types that every tool reads as values, and back.

:func:`to_portable` turns a RecordBatch made by :func:`~arrow_dataproto.to_arrow` into one
that pandas, polars, DuckDB and HF ``datasets`` read as values, with no extension type
left to unwrap; :func:`from_portable` is its exact inverse, and ``_codec.decode`` calls it
first, so every reader of this library takes either form and gives the DataProto back bit
for bit. What changes (``docs/format.md``, "The portable view"):

============================================  =============================================
stored                                         portable
============================================  =============================================
bfloat16 / float16 / every float8 (bits)       float32: the same value; a NaN keeps its sign
                                               and payload bits, so no two patterns meet
complex32 (float16 pairs)                      float32 pairs
bool (``arrow.bool8``, or int8 in a            Arrow ``bool``
non-tensor ``fixed_shape_tensor``)
``fixed_shape_tensor`` ``[d1..dn]``            ``fixed_size_list`` nested n deep (row-major)
jagged element ``fixed_size_list[d1*..*dn]``   ``fixed_size_list`` nested n deep
``large_list`` (jagged, strided ``data``)      ``list`` when its offsets fit int32
datetime64 / timedelta64 in s, ms, us, ns      ``timestamp`` / ``duration`` (NaT: null)
JSON (``arrow.json``)                          its string storage
============================================  =============================================

Everything else stays as stored: ints, float32/64, strings, object columns (structs, lists),
pickled bytes, ``bits8``/``bits16``/``float4_e2m1fn_x2`` (packed bits, no float meaning), and
datetimes of other units (int64). Field metadata (``adp.kind``, ``adp.dtype``, shapes) is
kept as it is, so it still names the original dtype and shape; the schema gains
``adp.portable``.

Costs: widened values, bools, NaT nulls and int32 offsets are new buffers (one pass each);
everything else, the nesting of fixed-size lists included, views the same buffers.
:func:`from_portable` copies the same columns back (narrowing checks every value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ._dtypes import STORAGE, dtype_name
from ._format import FORMAT, KIND, PORTABLE, TENSOR_KINDS, ArraySpec, TensorSpec, text_metadata
from ._validate import no_nulls
from .errors import DecodeError, EncodeError, column_error

_PORTABLE_KEY = PORTABLE.encode()
_FORMAT_KEY = FORMAT.encode()
_INT32_MAX = 2**31 - 1
_NAT = np.iinfo(np.int64).min
_TIME_UNITS = ("s", "ms", "us", "ns")  # those of Arrow's timestamp and duration types


# ---------------------------------------------------------------- tables: float widening, time units


@dataclass(frozen=True)
class _Format:
    """Bits of a float dtype narrower than float32: mantissa width and whether it has a sign bit."""

    mantissa: int
    signed: bool = True


_FLOATS = {
    "bfloat16": _Format(7),
    "float16": _Format(10),
    "float8_e4m3fn": _Format(3),
    "float8_e4m3fnuz": _Format(3),
    "float8_e5m2": _Format(2),
    "float8_e5m2fnuz": _Format(2),
    "float8_e8m0fnu": _Format(0, signed=False),
}
"""The dtypes widened to float32, by torch name (complex32 widens its float16 halves)."""


@dataclass(frozen=True)
class _WideningTable:
    """The float32 bits of every bit pattern of one dtype, and the way back."""

    dtype: torch.dtype
    bits: torch.dtype  # the unsigned torch dtype of the same width
    widened: np.ndarray  # uint32[2**bits]: the float32 bits of each pattern
    keys: np.ndarray  # sorted: the widened bits that only one pattern has
    patterns: np.ndarray  # uint8/uint16: the pattern of each key

    def narrow(self, bits: np.ndarray, rounded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pattern of each of the float32 ``bits`` (uint32), and the indices of the bits
        that are no single pattern's widening.

        ``rounded`` (torch's rounding of the values to the dtype) already holds the pattern of
        every number; where its widening is not ``bits`` (a NaN payload; a value the dtype
        lacks), the pattern that alone widens to ``bits`` replaces it in a copy, and
        where there is none ``rounded`` is kept and the index returned.
        """
        missed = np.flatnonzero(self.widened[rounded] != bits)
        if len(missed):
            at = np.minimum(np.searchsorted(self.keys, bits[missed]), len(self.keys) - 1)
            found = self.keys[at] == bits[missed]
            rounded = rounded.copy()
            rounded[missed[found]] = self.patterns[at[found]]
            missed = missed[~found]
        return rounded, missed


@lru_cache(maxsize=None)
def widening_table(name: str, *, nan_payloads: bool = True) -> _WideningTable:
    """The float32 bits of every bit pattern of the torch dtype ``name`` (one of ``_FLOATS``),
    and the way back (:meth:`~_WideningTable.narrow`).

    A number widens to the float32 of the same value (torch's conversion, exact for these
    dtypes). A NaN widens one of two ways:

    - ``nan_payloads=True`` (the portable view): to the float32 NaN of the same sign whose
      mantissa starts with the pattern's mantissa bits (the quiet NaN when those are all
      zero, as in the single NaN of the ``fnuz`` and ``e8m0`` formats). No two patterns
      widen to the same bits: the portable view is a stored form, every pattern comes back.
    - ``nan_payloads=False`` (pandas): as torch's own conversion (``t.float()``), which quiets
      NaNs: float16's 2,046 NaN patterns meet in 1,024 float32 NaNs, float8_e5m2's 6 in 4.
      A frame shows the values ``t.float()`` holds, the ones a user computes with; a float32
      NaN that several patterns share leads back to none of them (it narrows to torch's NaN).
    """
    fmt, dtype = _FLOATS[name], getattr(torch, name)
    bits = dtype.itemsize * 8
    unsigned = np.uint8 if bits == 8 else np.uint16
    patterns = np.arange(2**bits, dtype=np.uint32)
    values = torch.from_numpy(patterns.astype(unsigned)).view(dtype).float()
    widened = values.view(torch.int32).numpy().view(np.uint32).copy()
    if nan_payloads:
        nan = values.isnan().numpy()
        sign = ((patterns >> (bits - 1)) & 1) << 31 if fmt.signed else np.zeros_like(patterns)
        mantissa = patterns & ((1 << fmt.mantissa) - 1)
        payload = np.where(mantissa != 0, mantissa << (23 - fmt.mantissa), 1 << 22).astype(np.uint32)
        widened[nan] = (sign | 0x7F800000 | payload)[nan]
    keys, first, count = np.unique(widened, return_index=True, return_counts=True)
    once = count == 1
    return _WideningTable(dtype, torch.uint8 if bits == 8 else torch.uint16, widened, keys[once], first[once].astype(unsigned))


def time_unit(dtype: np.dtype) -> str | None:
    """The unit of a datetime64/timedelta64 dtype when Arrow's ``timestamp``/``duration``
    types have it, and so pandas and polars (``s``, ``ms``, ``us``, ``ns``, a step of 1);
    None for the other units (days, picoseconds..., ``m8[10ms]``) and other dtypes."""
    if dtype.kind not in "Mm":
        return None
    unit, step = np.datetime_data(dtype)
    return unit if unit in _TIME_UNITS and step == 1 else None


def _numpy(values: pa.Array) -> np.ndarray:
    """A read-only numpy view of a primitive array's values (honours slicing); nulls refused."""
    if isinstance(values, pa.ExtensionArray):
        values = values.storage
    return values.to_numpy(zero_copy_only=True)


def _primitive(arrow_type: pa.DataType, values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


# ---------------------------------------------------------------- leaf values


@dataclass(frozen=True)
class _Leaf:
    """How the values of a column change: ``stored`` and ``portable`` Arrow value types,
    ``widen`` (stored values -> portable) and ``narrow`` (the inverse); both take the column
    name for errors. ``nulls``: whether the portable values may hold nulls."""

    stored: pa.DataType
    portable: pa.DataType
    widen: Callable[[pa.Array, str], pa.Array]
    narrow: Callable[[pa.Array, str], pa.Array]
    nulls: bool = False


def _same(arrow_type: pa.DataType) -> _Leaf:
    def keep(values: pa.Array, name: str) -> pa.Array:
        return values

    return _Leaf(arrow_type, arrow_type, keep, keep)


def _float_leaf(name: str, stored: pa.DataType) -> _Leaf:
    table = widening_table(name)

    def widen(values: pa.Array, column: str) -> pa.Array:
        raw = _numpy(values)
        return _primitive(pa.float32(), table.widened[raw.view(table.patterns.dtype)])

    def narrow(values: pa.Array, column: str) -> pa.Array:
        bits = _numpy(values).view(np.uint32)
        try:  # torch's rounding finds the pattern of every number; the table makes it exact
            rounded = torch.from_dlpack(values).to(table.dtype).view(table.bits).numpy()
        except (RuntimeError, TypeError):  # a conversion this torch lacks
            rounded = np.zeros(len(bits), dtype=table.patterns.dtype)
        patterns, missed = table.narrow(bits, rounded)
        if len(missed):
            first = bits[missed[:1]]
            raise column_error(
                DecodeError, column,
                f"{len(missed)} of its float32 values are not {name} values (the first: {first.view(np.float32)[0]!s}, "
                f"bits 0x{int(first[0]):08x}); a portable column gives back only the values it was widened from",
            )
        return _primitive(stored, patterns)

    return _Leaf(stored, pa.float32(), widen, narrow)


def _bool_leaf(stored: pa.DataType) -> _Leaf:
    """bool8 (or int8) bytes <-> Arrow's bit-packed bool."""

    def widen(values: pa.Array, column: str) -> pa.Array:
        raw = _numpy(values).view(np.uint8)
        if len(raw) and int(raw.max()) > 1:
            raise column_error(EncodeError, column, "bool bytes other than 0 and 1 have no portable form")
        return pa.array(raw.view(np.bool_), type=pa.bool_())

    def narrow(values: pa.Array, column: str) -> pa.Array:
        ints = pc.cast(values, pa.int8())
        return pa.ExtensionArray.from_storage(stored, ints) if isinstance(stored, pa.BaseExtensionType) else ints

    return _Leaf(stored, pa.bool_(), widen, narrow)


def _time_leaf(portable: pa.DataType) -> _Leaf:
    """int64 datetime64/timedelta64 <-> timestamp/duration of the same unit; NaT <-> null."""

    def widen(values: pa.Array, column: str) -> pa.Array:
        times = values.view(portable)
        nat = pc.equal(values, pa.scalar(_NAT, pa.int64()))
        return pc.if_else(nat, pa.scalar(None, portable), times) if pc.any(nat).as_py() else times

    def narrow(values: pa.Array, column: str) -> pa.Array:
        ints = values.view(pa.int64())
        return pc.fill_null(ints, pa.scalar(_NAT, pa.int64())) if values.null_count else ints

    return _Leaf(pa.int64(), portable, widen, narrow, nulls=True)


def _json_leaf(storage: pa.DataType) -> _Leaf:
    """The ``arrow.json`` extension <-> its string storage (a ``None`` row stays a null)."""
    stored = pa.json_(storage)

    def widen(values: pa.Array, column: str) -> pa.Array:
        return values.storage

    def narrow(values: pa.Array, column: str) -> pa.Array:
        return pa.ExtensionArray.from_storage(stored, values)

    return _Leaf(stored, storage, widen, narrow, nulls=True)


def _is_json(arrow_type: pa.DataType) -> bool:
    return isinstance(arrow_type, pa.BaseExtensionType) and arrow_type.extension_name == "arrow.json"


def _innermost(arrow_type: pa.DataType) -> pa.DataType:
    """The value type under every (fixed-size) list and fixed_shape_tensor of ``arrow_type``."""
    while True:
        if isinstance(arrow_type, pa.FixedShapeTensorType):
            arrow_type = arrow_type.value_type
        elif pa.types.is_fixed_size_list(arrow_type) or pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
            arrow_type = arrow_type.value_type
        else:
            return arrow_type


# ---------------------------------------------------------------- column layouts


@dataclass(frozen=True)
class _Layout:
    """One column: ``form`` is ``flat`` (a value, or a ``fixed_shape_tensor`` of ``dims``, per
    row), ``list`` (a jagged ``large_list`` of elements of ``dims``) or ``strided``
    (``struct<data: large_list, shape>``, ``ndim`` wide); ``leaf`` says how values change."""

    form: str
    dims: tuple[int, ...]
    leaf: _Leaf
    ndim: int = 0

    def stored_type(self) -> pa.DataType:
        leaf = self.leaf.stored
        if self.form == "flat":
            return pa.fixed_shape_tensor(leaf, list(self.dims)) if self.dims else leaf
        data = pa.large_list(pa.list_(leaf, math.prod(self.dims)) if self.dims else leaf)
        return data if self.form == "list" else _strided_type(data, self.ndim)

    def portable_types(self) -> list[pa.DataType]:
        element = _nested_type(self.leaf.portable, self.dims)
        if self.form == "flat":
            return [element]
        lists = [pa.list_(element), pa.large_list(element)]
        return lists if self.form == "list" else [_strided_type(data, self.ndim) for data in lists]


def _strided_type(data: pa.DataType, ndim: int) -> pa.DataType:
    return pa.struct([pa.field("data", data), pa.field("shape", pa.list_(pa.int64(), ndim))])


def _nested_type(value_type: pa.DataType, dims: tuple[int, ...]) -> pa.DataType:
    for d in reversed(dims):
        value_type = pa.list_(value_type, d)
    return value_type


def _tensor_layout(name: str, metadata: dict[str, str]) -> _Layout:
    spec = TensorSpec.parse(name, metadata)
    storage = STORAGE[spec.dtype]
    dtype = dtype_name(spec.dtype)
    pair = (2,) if storage.pair == 2 else ()
    if spec.dtype == torch.bool:
        leaf = _bool_leaf(storage.arrow_type)
    elif dtype in _FLOATS or dtype == "complex32":
        leaf = _float_leaf("float16" if dtype == "complex32" else dtype, storage.arrow_type)
    else:
        leaf = _same(storage.arrow_type)
    if spec.kind == "tensor":
        return _Layout("flat", tuple(int(n or 0) for n in spec.shape) + pair, leaf)
    if spec.kind == "jagged":
        return _Layout("list", tuple(int(n) for n in spec.shape if n is not None) + pair, leaf)
    return _Layout("strided", pair, leaf, len(spec.shape))


def _numeric_leaf(dtype: np.dtype, row_shape: tuple[int, ...]) -> _Leaf:
    if dtype.kind == "b":
        return _bool_leaf(pa.int8() if row_shape else pa.bool8())
    if dtype.kind == "f" and dtype.itemsize == 2:
        return _float_leaf("float16", pa.float16())
    if dtype.kind in "Mm":
        unit = time_unit(dtype)
        if unit is None:
            return _same(pa.int64())
        return _time_leaf(pa.timestamp(unit) if dtype.kind == "M" else pa.duration(unit))
    if dtype.kind == "c":
        return _same(pa.from_numpy_dtype(np.dtype(f"f{dtype.itemsize // 2}")))
    return _same(pa.from_numpy_dtype(dtype.newbyteorder("=")))


def _array_layout(name: str, metadata: dict[str, str], actual: pa.DataType) -> _Layout | None:
    kind = metadata.get(KIND)
    if kind == "json":
        inner = actual.storage_type if _is_json(actual) else actual
        return _Layout("flat", (), _json_leaf(inner))
    if kind not in ("numeric", "string"):
        return None  # object and pickled columns are plain Arrow already
    spec = ArraySpec.parse(metadata)
    if kind == "string":
        return _Layout("flat", spec.row_shape, _same(_innermost(actual))) if spec.row_shape else None
    pair = (2,) if spec.dtype.kind == "c" else ()
    return _Layout("flat", spec.row_shape + pair, _numeric_leaf(spec.dtype, spec.row_shape))


MAX_NESTING = 32
"""Columns of more dimensions per element stay as stored: Arrow's IPC readers refuse types
nested more than 64 deep."""


def _layout(field: pa.Field) -> _Layout | None:
    """The layout of a column of ours; None for a column the portable view leaves alone."""
    metadata = text_metadata(field.metadata)
    if metadata.get(KIND) in TENSOR_KINDS:
        layout: _Layout | None = _tensor_layout(field.name, metadata)
    else:
        layout = _array_layout(field.name, metadata, field.type)
    return None if layout is None or len(layout.dims) > MAX_NESTING else layout


def forms(field: pa.Field) -> list[pa.DataType]:
    """The Arrow types a column of ours may have in a file: ``field``'s own type, then its
    stored type and its portable types (none other for a column the portable view leaves
    alone). What :mod:`arrow_dataproto._restore` matches another tool's columns against."""
    layout = _layout(field)
    candidates = [field.type] if layout is None else [field.type, layout.stored_type(), *layout.portable_types()]
    return list(dict.fromkeys(candidates))


# ---------------------------------------------------------------- conversions


def _fsl(values: pa.Array, width: int, rows: int) -> pa.Array:
    # Not FixedSizeListArray.from_arrays: it refuses a width of 0 (rows with a zero-size dimension).
    return pa.Array.from_buffers(pa.list_(values.type, width), rows, [None], children=[values])


def _elements_to_portable(elements: pa.Array, layout: _Layout, name: str) -> pa.Array:
    """Stored elements (values, or ``fixed_size_list`` of ``prod(dims)`` values) -> portable
    elements (widened values nested one ``fixed_size_list`` per dimension)."""
    values = elements.flatten() if layout.dims else elements
    out = layout.leaf.widen(values, name)
    rows = len(elements)
    for k in reversed(range(len(layout.dims))):
        out = _fsl(out, layout.dims[k], rows * math.prod(layout.dims[:k]))
    return out


def _elements_to_stored(elements: pa.Array, layout: _Layout, name: str) -> pa.Array:
    """Inverse of :func:`_elements_to_portable`."""
    values = elements
    for _ in layout.dims:
        no_nulls(name, values, _NULLS)
        values = values.flatten()
    if values.null_count and not layout.leaf.nulls:
        no_nulls(name, values, _NULLS)
    out = layout.leaf.narrow(values, name)
    return _fsl(out, math.prod(layout.dims), len(elements)) if layout.dims else out


_NULLS = "values where the format has none"
"""What :func:`no_nulls` says of the nulls a portable column cannot hold."""


def _list_parts(array: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Offsets rebased to 0 (int64) and the child slice they cover, for a (sliced) list array."""
    if len(array) == 0:
        return np.zeros(1, dtype=np.int64), array.values.slice(0, 0)
    offsets = array.offsets.to_numpy().astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    return offsets - start, array.values.slice(start, end - start)


def _list_of(offsets: np.ndarray, child: pa.Array, large: bool) -> pa.Array:
    list_type = pa.large_list(child.type) if large else pa.list_(child.type)
    offsets = offsets.astype(np.int64 if large else np.int32)
    return pa.Array.from_buffers(list_type, len(offsets) - 1, [None, pa.py_buffer(offsets)], children=[child])


def _column_to_portable(array: pa.Array, layout: _Layout, name: str) -> pa.Array:
    if layout.form == "flat":
        storage = array.storage if layout.dims else array
        return _elements_to_portable(storage, layout, name)
    if layout.form == "strided":
        data = _column_to_portable(array.field("data"), _Layout("list", layout.dims, layout.leaf), name)
        return pa.StructArray.from_arrays([data, array.field("shape")], names=["data", "shape"])
    offsets, child = _list_parts(array)
    return _list_of(offsets, _elements_to_portable(child, layout, name), large=int(offsets[-1]) > _INT32_MAX)


def _column_to_stored(array: pa.Array, layout: _Layout, name: str) -> pa.Array:
    if layout.form == "flat":
        if not layout.leaf.nulls:
            no_nulls(name, array, _NULLS)
        out = _elements_to_stored(array, layout, name)
        return pa.ExtensionArray.from_storage(layout.stored_type(), out) if layout.dims else out
    no_nulls(name, array, _NULLS)
    if layout.form == "strided":
        data = _column_to_stored(array.field("data"), _Layout("list", layout.dims, layout.leaf), name)
        return pa.StructArray.from_arrays([data, array.field("shape")], names=["data", "shape"])
    offsets, child = _list_parts(array)
    return _list_of(offsets, _elements_to_stored(child, layout, name), large=True)


# ---------------------------------------------------------------- entry points


def to_portable(record_batch: pa.RecordBatch) -> pa.RecordBatch:
    """The portable view of a RecordBatch made by :func:`~arrow_dataproto.to_arrow` (see the
    module docstring); a batch already portable, or one without ``adp.format`` (another
    tool's, plain Arrow already), is returned as it is.

    Copies the columns whose values change (widened floats, bools, NaT, int32 offsets); the
    others, and the nesting of fixed-size lists, view the same buffers. Field metadata is
    kept; the schema metadata gains ``adp.portable``. Raises :class:`EncodeError` naming the
    column for a column whose type is not the one its metadata says was stored, or a bool
    tensor holding bytes other than 0 and 1.
    """
    schema = record_batch.schema
    metadata = schema.metadata or {}
    if _PORTABLE_KEY in metadata or _FORMAT_KEY not in metadata:  # portable already, or another tool's
        return record_batch
    fields, arrays = [], []
    for field, array in zip(schema, record_batch.columns):
        layout = _layout(field)
        if layout is not None and layout.portable_types()[0] != field.type:
            if field.type != layout.stored_type():
                raise column_error(EncodeError, field.name, f"type {field.type}, expected {layout.stored_type()}")
            array = _column_to_portable(array, layout, field.name)
            field = field.with_type(array.type)
        fields.append(field)
        arrays.append(array)
    metadata = {**(schema.metadata or {}), _PORTABLE_KEY: b"true"}
    return _rebuilt(record_batch, fields, arrays, metadata)


def from_portable(record_batch: pa.RecordBatch) -> pa.RecordBatch:
    """The stored form of a portable RecordBatch (exact inverse of :func:`to_portable`); a
    batch without ``adp.portable`` is returned as it is, and so is every column whose type
    is not one of its portable types (a column stored as it was, or one the decoder will
    refuse).

    Copies the columns it converts back. Raises :class:`DecodeError` naming the column for
    a value that no stored value widens to (a float32 that is not a bfloat16, say: the
    column was changed after it was widened) or a null where the format has none. The
    batch must have passed ``validate_arrow``.
    """
    schema = record_batch.schema
    metadata = dict(schema.metadata or {})
    if metadata.pop(_PORTABLE_KEY, None) is None:
        return record_batch
    fields, arrays = [], []
    for field, array in zip(schema, record_batch.columns):
        try:
            layout = _layout(field)
            if layout is not None and field.type != layout.stored_type() and field.type in layout.portable_types():
                array = _column_to_stored(array, layout, field.name)
                field = field.with_type(array.type)
        except (pa.ArrowException, KeyError, TypeError, ValueError, OverflowError, RecursionError) as e:  # DecodeError: a ValueError
            if isinstance(e, DecodeError):
                raise
            raise column_error(DecodeError, field.name, f"malformed portable column: {e!r}") from e
        fields.append(field)
        arrays.append(array)
    return _rebuilt(record_batch, fields, arrays, metadata)


def _rebuilt(record_batch: pa.RecordBatch, fields: list, arrays: list, metadata: dict) -> pa.RecordBatch:
    schema = pa.schema(fields, metadata=metadata)
    if arrays:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    return record_batch.replace_schema_metadata(metadata)
