"""DataProto <-> pandas DataFrame, one row per sample, through the Arrow RecordBatch.

:func:`to_pandas` encodes the DataProto with :func:`~arrow_dataproto.to_arrow`
(zero-copy) and turns each column of the RecordBatch into a pandas column;
:func:`from_pandas` builds a RecordBatch from the frame and decodes it with the
codec. So pandas sees the same columns, dtypes and tree as every other
transport, and the metadata pandas keeps is the format's own.

Columns, in order: one per TensorDict leaf (nested keys joined with ``.``, as in
the Arrow schema), then one per ``non_tensor_batch`` entry.

- A ``[B]`` tensor is a plain numeric column. A ``[B, d1..dn]`` tensor is an
  object column whose cells are numpy arrays of shape ``(d1..dn)``; a jagged
  tensor's cells have each row's own shape (``(j,)``, or ``(3, j)`` for an
  mRoPE tensor with ``ragged_idx=2``); a strided nested tensor's cells have
  whatever shape each row has.
- Values keep their dtype, except dtypes numpy lacks (the table in
  :mod:`arrow_dataproto._dtypes`): bfloat16 and every float8 are shown as
  float32 (which holds each of their values exactly), complex32 as complex64,
  ``bits8``/``bits16``/``float4_e2m1fn_x2`` as their raw ``uint8``/``uint16`` bits.
- ``non_tensor_batch`` columns keep their values: an object array of strings
  becomes a column of pandas' default string dtype (``str`` in pandas 3;
  ``object`` when a value is missing), other object arrays stay object columns
  (dicts stay dicts), a numeric array a numeric column; an N-D array's rows
  become array cells. datetime64/timedelta64 in the units pandas has (s, ms, us,
  ns) become pandas datetime/timedelta columns; finer units (ps, fs, as) and
  unit-less ones become object columns of numpy scalars, so nothing is truncated.

``DataFrame.attrs["meta_info"]`` holds a copy of ``meta_info`` and
``DataFrame.attrs["arrow_dataproto"]`` the format metadata of the RecordBatch
in JSON form (``docs/format.md`` without the ``adp.`` prefixes): the format
version, ``batch_size``, ``device`` and ``tree``, and under ``columns`` each
column's field metadata (``kind``, ``dtype``, ``shape``/``row_shape``,
``ragged_idx``, ``device``). pandas keeps ``attrs`` through row selection and
column projection, so a filtered frame converts back too.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import torch

from ._optional import missing_dependency

try:
    import pandas as pd
except ModuleNotFoundError as e:
    raise missing_dependency("arrow_dataproto.pandas", e) from e

from . import _jagged
from ._compat import ragged_idx
from ._limits import check_allocation
from ._codec import decode, record_batch_of, to_arrow
from ._container import DataProto
from ._dtypes import NUMPY_NATIVE, STORAGE, dtype_name, shown_dtype
from ._format import (
    ARRAY_KINDS,
    BATCH_SIZE,
    DEVICE,
    DTYPE,
    FORMAT,
    FORMAT_NAME,
    KEY_PREFIX,
    KIND,
    RAGGED_IDX,
    ROW_SHAPE,
    SHAPE,
    TD_DEVICE,
    TENSOR_KINDS,
    TREE,
    VERSION,
    ArraySpec,
    Node,
    TensorSpec,
    check_schema,
    repeated,
    schema_metadata,
    text_metadata,
)
from ._meta_info import decode_meta_info, encode_meta_info
from ._objects import Object, decode_column, encode_column
from ._portable import time_unit, widening_table
from ._tensors import decode_tensor, encode_tensor
from .errors import DecodeError, EncodeError, column_error

__all__ = ["to_pandas", "from_pandas", "RECORD", "META_INFO"]

RECORD = "arrow_dataproto"
"""``DataFrame.attrs`` key of the format metadata :func:`from_pandas` restores from."""
META_INFO = "meta_info"
"""``DataFrame.attrs`` key of ``meta_info``."""

_STRING_DTYPE = pd.Series([""]).dtype
"""pandas' default dtype for strings (``str`` in pandas 3, ``object`` before)."""
_SCHEMA_KEYS = {VERSION: False, BATCH_SIZE: True, TD_DEVICE: True, TREE: True}
"""Schema metadata keys the record holds (True: a JSON value)."""
_JSON_FIELD_KEYS = (SHAPE, ROW_SHAPE, RAGGED_IDX)
"""Field metadata keys whose values the record holds as JSON values, not text."""


# ---------------------------------------------------------------- the record: format metadata as JSON


def _record_key(key: str) -> str:
    return key.removeprefix(KEY_PREFIX)


def _field_record(metadata: dict[str, str]) -> dict[str, Any]:
    return {_record_key(k): json.loads(v) if k in _JSON_FIELD_KEYS else v for k, v in metadata.items()}


def _field_metadata(name: str, record: Any) -> dict[str, str]:
    if not isinstance(record, dict):
        raise column_error(DecodeError, name, f"malformed column record {record!r}")
    keys = {_record_key(k): k for k in (KIND, DTYPE, SHAPE, ROW_SHAPE, RAGGED_IDX, DEVICE)}
    try:
        return {
            keys[k]: json.dumps(v) if keys[k] in _JSON_FIELD_KEYS else str(v)
            for k, v in record.items()
            if k in keys
        }
    except (TypeError, ValueError) as e:
        raise column_error(DecodeError, name, f"malformed column record {record!r}: {e}") from None


def _record_of(schema: pa.Schema) -> dict[str, Any]:
    metadata = text_metadata(schema.metadata)
    record = {_record_key(k): json.loads(metadata[k]) if is_json else metadata[k] for k, is_json in _SCHEMA_KEYS.items()}
    record["columns"] = {field.name: _field_record(text_metadata(field.metadata)) for field in schema}
    return record


def _read_record(attrs: dict) -> tuple[Node | None, dict[str, dict[str, str]]] | None:
    """The tree and each column's field metadata recorded in ``attrs``, checked by the format
    module; None if there is no record."""
    record = attrs.get(RECORD)
    if record is None:
        return None
    where = f"DataFrame.attrs[{RECORD!r}]"
    if not isinstance(record, dict) or not isinstance(record.get("columns"), dict):
        raise DecodeError(f"{where} is not a record made by to_pandas")
    metadata = {FORMAT: FORMAT_NAME}
    try:
        for key, is_json in _SCHEMA_KEYS.items():
            value = record.get(_record_key(key))
            metadata[key] = json.dumps(value) if is_json else str(value)
    except (TypeError, ValueError) as e:
        raise DecodeError(f"{where}: malformed record: {e}") from None
    check_schema(pa.schema([], metadata=metadata))  # the version rule
    tree = Node.parse(metadata)
    return tree, {str(name): _field_metadata(str(name), spec) for name, spec in record["columns"].items()}


# ---------------------------------------------------------------- dtypes


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a column of torch ``dtype`` is shown in."""
    return torch.empty(0, dtype=shown_dtype(dtype)).numpy().dtype


def _to_numpy(t: torch.Tensor, copy: bool) -> np.ndarray:
    """``t`` (on the CPU) as numpy in its shown dtype: a read-only view unless ``copy``
    or a widened dtype makes new memory."""
    t = t.detach().cpu().resolve_conj().resolve_neg()
    storage = STORAGE[t.dtype]
    if storage.widened:
        return t.to(shown_dtype(t.dtype)).numpy()
    array = t.view(shown_dtype(t.dtype)).numpy()
    if copy:
        return array.copy()
    array = array.view()  # the flag must not reach the tensor's other numpy views
    array.flags.writeable = False
    return array


def _narrow(floats: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """float32 values back to a dtype shown as float32, bit-exact for every value it holds.

    A float32 that is the image of exactly one code under torch's conversion (the values
    :func:`to_pandas` shows) becomes that code (NaN payloads and signed zeros included);
    any other value, such as one edited in pandas, is rounded by torch. Only float8_e5m2
    has codes sharing an image (NaN payloads): they come back as torch's NaN.
    """
    table = widening_table(dtype_name(dtype), nan_payloads=False)
    rounded = torch.from_numpy(floats).to(dtype).view(table.bits).numpy().reshape(-1)
    patterns, _ = table.narrow(floats.reshape(-1).view(np.uint32), rounded)
    return torch.from_numpy(patterns.reshape(floats.shape)).view(dtype)


def _cast(name: str, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` (an array this module made) as a C-contiguous array of ``dtype`` in native byte order.

    Follows numpy's ``same_kind`` rule: floats do not silently become integers.
    """
    dtype = dtype.newbyteorder("=")
    if not np.can_cast(values.dtype, dtype, "same_kind"):
        raise column_error(EncodeError, name, f"cannot convert {values.dtype} values to {dtype}")
    return np.ascontiguousarray(values.astype(dtype, copy=False))


def _tensor(name: str, values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``dtype`` from ``values`` shown in that dtype (owns ``values``' memory)."""
    shown = torch.from_numpy(_cast(name, values, _numpy_dtype(dtype)))
    if not STORAGE[dtype].widened:
        return shown.view(dtype)
    if shown.dtype == torch.float32:
        return _narrow(shown.numpy(), dtype)
    return shown.to(dtype)  # complex32


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


# ---------------------------------------------------------------- to_pandas: one converter per column kind


def _object_column(cells: Any, rows: int) -> pd.Series:
    """An object Series holding each item of ``cells`` as it is (arrays stay arrays)."""
    return pd.Series(np.fromiter(cells, dtype=object, count=rows), dtype=object)


def _dense_cells(t: torch.Tensor, copy: bool) -> Any:
    array = _to_numpy(t, copy)
    return array if array.ndim == 1 else _object_column(array, len(array))


def _jagged_cells(t: torch.Tensor, copy: bool) -> pd.Series:
    values, offsets = _jagged.parts(t)
    axis = ragged_idx(t) - 1
    array, bounds = _to_numpy(values, copy), offsets.tolist()
    cells = (np.moveaxis(array[a:b], 0, axis) for a, b in zip(bounds[:-1], bounds[1:]))
    return _object_column(cells, len(bounds) - 1)


def _strided_cells(t: torch.Tensor, copy: bool) -> pd.Series:
    rows = t.unbind()
    return _object_column((_to_numpy(row, copy) for row in rows), len(rows))


_TENSOR_CELLS: dict[str, Callable[[torch.Tensor, bool], Any]] = {
    "tensor": _dense_cells,
    "jagged": _jagged_cells,
    "strided": _strided_cells,
}


def _array_cells(name: str, column: pa.Array, metadata: dict[str, str], copy: bool) -> Any:
    """One ``non_tensor_batch`` column: strings in pandas' default string dtype, 1-D numbers
    as they are, other 1-D object arrays as objects, N-D arrays as cells of rows."""
    strings = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    if metadata.get(KIND) == Object.kind and strings and not column.null_count:
        return column.to_pandas().astype(_STRING_DTYPE)
    values = decode_column(name, column, metadata, allow_pickle=True)  # pickles this call made
    if values.dtype == object and values.ndim == 1:
        return pd.Series(values, dtype=object)
    if values.ndim == 1 and (values.dtype.kind in "biufcUS" or time_unit(values.dtype) is not None):
        return values.astype(values.dtype.newbyteorder("="), copy=False)
    if values.ndim == 1 and values.dtype.kind in "mM":  # ps/fs/as or unit-less: pandas would cut or refuse
        return pd.Series(list(values), dtype=object)
    view = values.copy() if copy else values.view()
    view.flags.writeable = copy
    return _object_column(view, len(view))


def to_pandas(data: Any, *, copy: bool = False) -> pd.DataFrame:
    """A DataFrame with one row per sample of a DataProto (ours or verl's) or a TensorDict.

    See the module docstring for the columns. Plain columns are copied into the
    frame. Array cells of CPU tensors and numeric numpy arrays are read-only views of
    their memory (so later in-place writes to the tensors show in the frame);
    ``copy=True`` copies each column once and gives writable cells. Dtypes shown
    widened (bfloat16, float8, complex32) and tensors on other devices are
    always converted into new memory. ``DataFrame.attrs`` holds ``meta_info``
    (a copy) and the format metadata :func:`from_pandas` restores from.

    Raises :class:`EncodeError` for content a DataProto cannot hold (what
    :func:`~arrow_dataproto.to_arrow` refuses: a non-tensor value in the
    TensorDict, duplicate column names, columns that disagree on the number of
    rows, an unsupported layout).
    """
    record_batch = to_arrow(data)
    schema = record_batch.schema
    tree = Node.parse(text_metadata(schema.metadata))
    leaves = 0 if tree is None else len(tree.leaf_names())
    columns: dict[str, Any] = {}
    for i, field in enumerate(schema):
        metadata = text_metadata(field.metadata)
        column = record_batch.column(i)
        if i < leaves:
            spec = TensorSpec.parse(field.name, metadata)
            columns[field.name] = _TENSOR_CELLS[spec.kind](decode_tensor(field.name, column, spec), copy)
        else:
            columns[field.name] = _array_cells(field.name, column, metadata, copy)
    meta_info = decode_meta_info(text_metadata(schema.metadata), allow_pickle=True)  # a copy
    frame = pd.DataFrame(columns, index=pd.RangeIndex(record_batch.num_rows))
    frame.attrs = {META_INFO: meta_info, RECORD: _record_of(schema)}
    return frame


# ---------------------------------------------------------------- from_pandas


def _fail(name: str, message: str) -> EncodeError:
    return column_error(EncodeError, name, message)


def _plain_values(name: str, series: pd.Series) -> np.ndarray:
    """A new numpy array of a column holding one value per row; missing values (pd.NA) are refused."""
    if not isinstance(series.dtype, np.dtype) and series.isna().any():
        raise _fail(name, "missing values (NA) cannot go into a tensor; fill them or use an object column")
    return series.to_numpy(dtype=getattr(series.dtype, "numpy_dtype", None), copy=True)


def _row_arrays(name: str, series: pd.Series) -> list[np.ndarray]:
    """The cells of a column of arrays (lists are accepted too) as numpy arrays."""
    try:
        return [np.asarray(cell) for cell in series.to_numpy(dtype=object)]
    except ValueError as e:  # a ragged nested list
        raise _fail(name, f"a cell is not an array: {e}") from e


def _check_shapes(name: str, arrays: list[np.ndarray], shape: tuple[int | None, ...]) -> None:
    """Each array has ``len(shape)`` dims, equal to ``shape`` where it is not None."""

    def fits(row_shape: tuple[int, ...]) -> bool:
        return len(row_shape) == len(shape) and all(n is None or n == m for n, m in zip(shape, row_shape))

    if all(map(fits, {a.shape for a in arrays})):
        return
    i = next(i for i, a in enumerate(arrays) if not fits(a.shape))
    expected = ", ".join("?" if n is None else str(n) for n in shape)
    raise _fail(name, f"row {i} has shape {arrays[i].shape}, expected ({expected}{',' * (len(shape) == 1)})")


def _dense(name: str, series: pd.Series, spec: TensorSpec) -> torch.Tensor:
    """A ``[B, *shape]`` tensor from a plain column (``shape == ()``) or a column of arrays."""
    if series.dtype != object:
        values = _plain_values(name, series)
        if spec.shape:
            raise _fail(name, f"holds one value per row, expected arrays of shape {spec.shape}")
    else:
        arrays = _row_arrays(name, series)
        _check_shapes(name, arrays, spec.shape)
        empty_shape = (0, *(int(n or 0) for n in spec.shape))  # dense: no ragged dimension
        values = np.array(arrays) if arrays else np.empty(empty_shape, dtype=_numpy_dtype(spec.dtype))
    return _tensor(name, values, spec.dtype)


def _jagged_of(name: str, arrays: list[np.ndarray], dtype: torch.dtype, ragged_idx: int, shape: tuple) -> torch.Tensor:
    """A jagged nested tensor whose rows are ``arrays`` (shape ``shape``, None at ``ragged_idx - 1``)."""
    axis = ragged_idx - 1
    _check_shapes(name, arrays, shape)
    if arrays:
        values = np.concatenate([np.moveaxis(a, axis, 0) for a in arrays])
    else:
        values = np.empty([0] + [n for n in shape if n is not None], dtype=_numpy_dtype(dtype))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.shape[axis] for a in arrays], out=offsets[1:])
    return _jagged.build(_tensor(name, values, dtype), torch.from_numpy(offsets), ragged_idx)


def _strided_of(name: str, arrays: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    """A strided nested tensor whose rows are ``arrays`` (same number of dims, any sizes)."""
    if not arrays:
        raise _fail(name, "a strided nested tensor needs at least one row")
    if len({a.ndim for a in arrays}) > 1:
        ndims = sorted({a.ndim for a in arrays})
        raise _fail(name, f"rows of a nested tensor need the same number of dims, got {ndims}")
    return torch.nested.nested_tensor([_tensor(name, np.array(a), dtype) for a in arrays], dtype=dtype)


_TENSOR_FROM_CELLS: dict[str, Callable[[str, pd.Series, TensorSpec], torch.Tensor]] = {
    "tensor": _dense,
    "jagged": lambda name, series, spec: _jagged_of(
        name, _row_arrays(name, series), spec.dtype, spec.ragged_idx or 1, spec.shape
    ),
    "strided": lambda name, series, spec: _strided_of(name, _row_arrays(name, series), spec.dtype),
}


def _restore_array(name: str, series: pd.Series, spec: ArraySpec) -> np.ndarray:
    """The numpy array of a ``non_tensor_batch`` column in its recorded dtype."""
    dtype, row_shape = spec.dtype, spec.row_shape
    if row_shape:
        arrays = _row_arrays(name, series)
        _check_shapes(name, arrays, row_shape)
        values = np.array(arrays) if arrays else np.empty((0, *row_shape), dtype=dtype)
    else:
        values = series.to_numpy(dtype=object if dtype == object else None, copy=True)
    try:
        if dtype.kind in "US":  # strings edited in pandas may have grown: widen, never truncate
            values = values.astype(dtype.kind)
            if values.dtype.itemsize > dtype.itemsize:
                return values
            try:  # a width from attrs (parquet keeps them) may not blow up the memory
                check_allocation(values.size * dtype.itemsize, values.nbytes, f"dtype {dtype}")
            except DecodeError as e:
                raise column_error(DecodeError, name, str(e)) from None
            return values.astype(dtype)
        return values.astype(dtype, copy=False)
    except (TypeError, ValueError) as e:
        raise _fail(name, f"cannot convert the values to the recorded dtype {dtype}: {e}") from e


def _infer(name: str, series: pd.Series) -> torch.Tensor | np.ndarray:
    """A column without a record: numbers become tensors, cells of numeric arrays stacked or
    nested tensors, anything else a ``non_tensor_batch`` array (see :func:`from_pandas`)."""
    dtype = series.dtype
    numeric = getattr(dtype, "numpy_dtype", dtype)
    if isinstance(numeric, np.dtype) and _is_tensor_dtype(numeric):
        if isinstance(dtype, np.dtype) or not series.isna().any():
            values = _plain_values(name, series)
            return _tensor(name, values, _torch_dtype(values.dtype.newbyteorder("=")))
    elif isinstance(dtype, np.dtype) and dtype != object:  # datetimes, long doubles, bytes
        return series.to_numpy(copy=True)
    cells = series.to_numpy(dtype=object, na_value=None, copy=True)
    arrays = [c for c in cells if isinstance(c, np.ndarray) and _is_tensor_dtype(c.dtype)]
    if not cells.size or len(arrays) != len(cells) or len({a.ndim for a in arrays}) > 1:
        return cells
    torch_dtype = _torch_dtype(np.result_type(*{a.dtype for a in arrays}).newbyteorder("="))
    shapes = {a.shape for a in arrays}
    if len(shapes) == 1:
        return _tensor(name, np.array(arrays), torch_dtype)
    varying = [axis for axis in range(arrays[0].ndim) if len({s[axis] for s in shapes}) > 1]
    if len(varying) == 1:
        shape = tuple(None if axis == varying[0] else n for axis, n in enumerate(arrays[0].shape))
        return _jagged_of(name, arrays, torch_dtype, varying[0] + 1, shape)
    return _strided_of(name, arrays, torch_dtype)


def _is_tensor_dtype(dtype: np.dtype) -> bool:
    """Whether numpy ``dtype`` becomes a tensor (a torch dtype numpy has, any byte order)."""
    try:
        return _torch_dtype(dtype.newbyteorder("=")) in NUMPY_NATIVE
    except TypeError:
        return False


def _column(
    name: str, series: pd.Series, metadata: dict[str, str] | None
) -> tuple[pa.Array, dict[str, str], bool]:
    """One frame column as an Arrow column, its field metadata, and whether it is a tensor."""
    if not metadata:
        value = _infer(name, series)
        if isinstance(value, torch.Tensor):
            array, spec = encode_tensor(name, value)
            return array, spec.metadata(), True
        array, field_meta = encode_column(name, value)
        return array, field_meta, False
    kind = metadata.get(KIND)
    if kind in TENSOR_KINDS:
        spec = TensorSpec.parse(name, metadata)
        array, built = encode_tensor(name, _TENSOR_FROM_CELLS[spec.kind](name, series, spec))
        return array, replace(built, device=spec.device).metadata(), True
    if kind in ARRAY_KINDS:
        try:
            spec_array = ArraySpec.parse(metadata)
        except (KeyError, TypeError, ValueError) as e:
            raise column_error(DecodeError, name, f"malformed column record: {e!r}") from None
        array, field_meta = encode_column(name, _restore_array(name, series, spec_array))
        return array, field_meta, False
    raise column_error(DecodeError, name, f"unknown recorded kind {kind!r}")


def from_pandas(df: pd.DataFrame, *, device: str | torch.device | None = None) -> DataProto:
    """Rebuild a :class:`~arrow_dataproto.DataProto` from a DataFrame, one sample per row.

    The frame becomes an Arrow RecordBatch, decoded by the codec. Every tensor
    and array is new, writable memory (nothing views the frame). The index is
    ignored; rows keep the frame's order.

    A frame made by :func:`to_pandas` (``attrs`` intact) comes back exactly:
    each recorded column gets its torch dtype, layout, ragged dimension and
    device (or numpy dtype) again, bit for bit where values were not edited
    (bfloat16 and float8 shown as float32 included; edited values are rounded to
    the dtype, numpy's ``same_kind`` casting rule applies). Rows may have been
    selected or reordered and columns dropped; added columns are inferred.

    Columns without a record (any frame of your own) are inferred: numeric and
    bool columns become 1-D tensors (nullable ones only without missing
    values); object columns whose cells are all numeric numpy arrays become a
    stacked tensor (equal shapes), a jagged nested tensor (rows that differ in
    one dimension, which becomes the ragged one) or a strided nested tensor
    (rows that differ in more); everything else goes to ``non_tensor_batch``
    (datetimes as numpy datetimes, the rest as object arrays with missing values
    as ``None``). Inferred tensors sit at the top level of the TensorDict, named
    as the columns (a dot is not taken as nesting); batch size ``[len(df)]``.
    ``attrs["meta_info"]`` (copied) becomes ``meta_info``.

    ``device`` places every tensor there; otherwise each goes to its recorded
    device, or to the CPU with one ``RuntimeWarning`` if this process lacks it.

    Raises :class:`EncodeError` for values that do not fit their column
    (different row shapes in a dense column, missing values in a recorded
    tensor column, casts that lose the kind of number) or column names that
    collide, and :class:`DecodeError` for a malformed ``attrs`` record. ``attrs``
    survive parquet, so they are checked like file metadata (``SECURITY.md``): a
    recorded string width may not make a column more than 64 MiB or 256 times its
    strings' own size, and no recorded shape may hold more than 2**58 elements per row.
    """
    if not isinstance(df, pd.DataFrame):
        raise EncodeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    recorded = _read_record(df.attrs)
    tree, specs = recorded if recorded is not None else (None, {})
    meta_info = df.attrs.get(META_INFO, {})
    if not isinstance(meta_info, dict):
        raise EncodeError(f"DataFrame.attrs[{META_INFO!r}] must be a dict, got {type(meta_info).__name__}")
    names = [str(c) for c in df.columns]
    duplicates = repeated(names)
    if duplicates:
        raise EncodeError(f"duplicate column names {duplicates}")

    rows = len(df)
    tensors: dict[str, tuple[pa.Array, dict[str, str]]] = {}
    arrays: dict[str, tuple[pa.Array, dict[str, str]]] = {}
    frame = pd.DataFrame(df, copy=False)  # without attrs, which pandas deep-copies into every column taken
    for name, (_, series) in zip(names, frame.items()):
        array, field_meta, is_tensor = _column(name, series, specs.get(name))
        (tensors if is_tensor else arrays)[name] = (array, field_meta)

    # The recorded tree with the leaves still present, then the other tensor columns at its top level.
    if tree is not None:
        tree = tree.select(set(tensors), prune=False).with_rows(rows)
    elif tensors:
        tree = Node("", (rows,), None, ())
    added: list[str] = []
    if tree is not None:
        recorded_leaves = set(tree.leaf_names())
        added = [name for name in tensors if name not in recorded_leaves]
        nested = {e.key for e in tree.entries if isinstance(e, Node)}
        for name in added:
            if name in nested:
                raise _fail(name, "clashes with a nested TensorDict of the same name")
        tree = Node("", tree.batch_size, tree.device, tree.entries + tuple(added))
    order = [] if tree is None else tree.leaf_names()
    try:
        meta_info_metadata = encode_meta_info(meta_info)
    except EncodeError as e:
        raise EncodeError(f"DataFrame.attrs[{META_INFO!r}]: {e}") from None
    metadata = schema_metadata(tree, meta_info_metadata)
    columns = [(n, *tensors[n]) for n in order] + [(n, *arrays[n]) for n in arrays]
    fields = [pa.field(n, a.type, metadata=m) for n, a, m in columns]
    record_batch = record_batch_of([a for _, a, _ in columns], pa.schema(fields, metadata=metadata), rows)
    try:
        batch, non_tensor, decoded_meta_info = decode(record_batch, device=device, allow_pickle=True)
    except DecodeError as e:  # an added column that does not fit a batch of several dimensions
        if tree is not None and len(tree.batch_size) > 1 and added:
            raise EncodeError(f"columns {added} do not fit batch_size {list(tree.batch_size)}: {e}") from None
        raise
    # Numeric arrays decode as read-only views of the batch just built: give them their own memory.
    non_tensor = {k: v if v.flags.writeable else v.copy() for k, v in non_tensor.items()}
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=decoded_meta_info)
