"""DataProto <-> pandas DataFrame, one row per sample.

:func:`to_pandas` works from the tensors and numpy arrays themselves, not from
the Arrow RecordBatch: pandas wants numpy values, which CPU tensors give without
a copy, while the Arrow route would re-encode every non-tensor column (strings,
dicts) only to decode it again.

Columns, in order: one per TensorDict leaf (nested keys joined with ``.``, as in
the Arrow schema), then one per ``non_tensor_batch`` entry.

- A ``[B]`` tensor is a plain numeric column. A ``[B, d1..dn]`` tensor is an
  object column whose cells are numpy arrays of shape ``(d1..dn)``; a jagged
  tensor's cells have each row's own shape (``(j,)``, or ``(3, j)`` for an
  mRoPE tensor with ``ragged_idx=2``); a strided nested tensor's cells have
  whatever shape each row has.
- Values keep their dtype, except dtypes numpy lacks: bfloat16 and every float8
  are shown as float32 (which holds each of their values exactly), complex32 as
  complex64, ``bits8``/``bits16``/``float4_e2m1fn_x2`` as their raw
  ``uint8``/``uint16`` bits.
- ``non_tensor_batch`` columns keep their values: an object array stays an
  object column (strings stay ``str``, dicts stay dicts), a numeric array a
  numeric column; an N-D array's rows become array cells.

``DataFrame.attrs["meta_info"]`` holds a deep copy of ``meta_info`` and
``DataFrame.attrs["arrow_dataproto"]`` a JSON-compatible record of what
:func:`from_pandas` needs to rebuild the DataProto exactly: each column's torch
dtype, layout, per-row shape, ragged dimension and device (or numpy dtype), the
batch size and the TensorDict tree. pandas keeps ``attrs`` through row
selection and column projection, so a filtered frame converts back too.
"""

from __future__ import annotations

import copy as _copy
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

try:
    import pandas as pd
except ImportError as e:  # pragma: no cover - pandas is an optional dependency
    raise ImportError("arrow_dataproto.pandas needs pandas: pip install 'arrow-dataproto[interop]'") from e

from ._codec import _count_leaves, _flatten, _parts, _Placement, _unflatten  # TODO
from ._dtypes import dtype_from_name, dtype_name
from .errors import DecodeError, EncodeError, column_error
from ._objects import _dtype_from_str, _dtype_to_str
from ._container import DataProto

__all__ = ["to_pandas", "from_pandas", "RECORD", "META_INFO"]

RECORD = "arrow_dataproto"
"""``DataFrame.attrs`` key of the record :func:`from_pandas` restores from."""
META_INFO = "meta_info"
"""``DataFrame.attrs`` key of ``meta_info``."""
RECORD_VERSION = 1

# torch dtypes numpy lacks: shown converted to a wider dtype (exact), or as their raw bits
_AS_FLOAT32 = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
_WIDENED = {getattr(torch, n): torch.float32 for n in _AS_FLOAT32 if hasattr(torch, n)}
_WIDENED[torch.complex32] = torch.complex64
_RAW_BITS = {
    getattr(torch, n): bits
    for n, bits in (("bits8", torch.uint8), ("bits16", torch.uint16), ("float4_e2m1fn_x2", torch.uint8))
    if hasattr(torch, n)
}
_TENSOR_KINDS = ("tensor", "jagged", "strided")
_NUMPY_KIND = "numpy"
# numpy dtypes that become tensors (torch.from_numpy accepts them, in native byte order)
_TENSOR_NUMPY_DTYPES = {
    np.dtype(n)
    for n in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
}


# ---------------------------------------------------------------- dtypes


def _shown_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a column of torch ``dtype`` is shown in."""
    shown = _WIDENED.get(dtype) or _RAW_BITS.get(dtype) or dtype
    return torch.empty(0, dtype=shown).numpy().dtype


def _to_numpy(t: torch.Tensor, copy: bool) -> np.ndarray:
    """``t`` as numpy in its shown dtype: a read-only view of a CPU tensor unless ``copy``
    or a conversion (widened dtypes, other devices) makes new memory."""
    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.dtype in _WIDENED:
        return t.to(_WIDENED[t.dtype]).numpy()
    array = t.view(_RAW_BITS.get(t.dtype, t.dtype)).numpy()
    if copy:
        return array.copy()
    array = array.view()  # the flag must not reach the tensor's other numpy views
    array.flags.writeable = False
    return array


@lru_cache(maxsize=None)
def _codes(dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The float32 bit patterns of ``dtype``'s codes that no other code shares (sorted), and those codes."""
    storage = torch.uint8 if dtype.itemsize == 1 else torch.uint16
    codes = torch.arange(2 ** (8 * dtype.itemsize), dtype=torch.int32).to(storage)
    images = codes.view(dtype).float().numpy().view(np.uint32)
    unique, first, counts = np.unique(images, return_index=True, return_counts=True)
    return unique[counts == 1], codes.numpy()[first[counts == 1]]


def _narrow(floats: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """float32 values back to a dtype shown as float32, bit-exact for every value it holds.

    A float32 that is the image of exactly one code becomes that code (NaN
    payloads and signed zeros included); any other value, such as one edited in
    pandas, is rounded by torch. Only float8_e5m2 has codes sharing an image
    (NaN payloads): they come back as torch's NaN.
    """
    result = torch.from_numpy(floats).to(dtype)
    bits = floats.reshape(-1).view(np.uint32)
    differ = np.flatnonzero(result.float().numpy().reshape(-1).view(np.uint32) != bits)
    if differ.size:  # NaN payloads, edited values: look those up
        images, codes = _codes(dtype)
        where = np.searchsorted(images, bits[differ]).clip(max=len(images) - 1)
        exact = images[where] == bits[differ]
        raw = result.view(torch.uint8 if dtype.itemsize == 1 else torch.uint16).numpy().reshape(-1)
        raw[differ[exact]] = codes[where[exact]]
    return result


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
    shown = _cast(name, values, _shown_dtype(dtype))
    if dtype in _RAW_BITS:
        return torch.from_numpy(shown).view(dtype)
    if _WIDENED.get(dtype) == torch.float32:
        return _narrow(shown, dtype)
    return torch.from_numpy(shown).to(dtype)  # a no-op but for complex32


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


# ---------------------------------------------------------------- to_pandas


def _object_column(cells: Any, rows: int) -> pd.Series:
    """An object Series holding each item of ``cells`` as it is (arrays stay arrays)."""
    return pd.Series(np.fromiter(cells, dtype=object, count=rows), dtype=object)


def _tensor_column(name: str, t: torch.Tensor, copy: bool) -> tuple[Any, dict]:
    """One TensorDict leaf as a column (a 1-D array or an object Series of arrays) and its record."""
    if t.device.type == "meta":
        raise column_error(EncodeError, name, "tensors on the meta device hold no data")
    spec = {"kind": "tensor", "dtype": dtype_name(t.dtype), "device": str(t.device)}
    if t.is_nested and t.layout == torch.jagged:
        if t.lengths() is not None:  # holes between rows
            t = t.contiguous()
        axis = t._ragged_idx - 1
        offsets = t.offsets().cpu().numpy()
        values = _to_numpy(t.values(), copy)
        values = values[(slice(None),) * axis + (slice(int(offsets[0]), int(offsets[-1])),)]
        cells = np.split(values, offsets[1:-1] - offsets[0], axis=axis) if len(offsets) > 1 else []
        shape = [None if i == axis else int(n) for i, n in enumerate(t.shape[1:])]
        spec.update(kind="jagged", shape=shape, ragged_idx=axis + 1)
        return _object_column(cells, len(cells)), spec
    if t.is_nested:
        rows = t.unbind()
        spec.update(kind="strided", shape=[None] * (t.dim() - 1))
        return _object_column((_to_numpy(row, copy) for row in rows), len(rows)), spec
    if t.layout != torch.strided:
        raise column_error(EncodeError, name, f"layout {t.layout} is not supported (use dense or nested)")
    array = _to_numpy(t, copy)
    spec["shape"] = list(array.shape[1:])
    return (array if array.ndim == 1 else _object_column(array, len(array))), spec


def _numpy_column(name: str, values: Any, copy: bool) -> tuple[Any, dict]:
    """One ``non_tensor_batch`` array as a column and its record."""
    if not isinstance(values, np.ndarray) or values.ndim == 0:
        raise column_error(EncodeError, name, f"expected a numpy array with rows on dim 0, got {type(values).__name__}")
    spec = {"kind": _NUMPY_KIND, "dtype": _dtype_to_str(name, values.dtype), "row_shape": list(values.shape[1:])}
    if values.dtype == object and values.ndim == 1:
        return pd.Series(values, dtype=object), spec
    if values.ndim == 1 and values.dtype.kind in "biufcmMUS":
        return values.astype(values.dtype.newbyteorder("="), copy=False), spec
    view = values.copy() if copy else values.view()
    view.flags.writeable = copy
    return _object_column(view, len(view)), spec


def to_pandas(data: Any, *, copy: bool = False) -> pd.DataFrame:
    """A DataFrame with one row per sample of a DataProto (ours or verl's) or a TensorDict.

    See the module docstring for the columns. Plain columns are copied into the
    frame. Array cells of CPU tensors and numpy arrays are read-only views of
    their memory (so later in-place writes to the tensors show in the frame);
    ``copy=True`` copies each column once and gives writable cells. Dtypes shown
    widened (bfloat16, float8, complex32) and tensors on other devices are
    always converted into new memory. ``DataFrame.attrs`` holds ``meta_info``
    (deep-copied) and the record :func:`from_pandas` restores from.

    Raises :class:`EncodeError` for content a DataProto cannot hold (a
    non-tensor value in the TensorDict, duplicate column names, columns that
    disagree on the number of rows, an unsupported layout).
    """
    batch, non_tensor, meta_info = _parts(data)
    record: dict[str, Any] = {"version": RECORD_VERSION, "batch_size": None, "device": None, "tree": [], "columns": {}}
    leaves: list[tuple[str, torch.Tensor]] = []
    if batch is not None:
        if batch.batch_dims < 1:
            raise EncodeError("the TensorDict needs at least one batch dimension (rows)")
        record["tree"] = _flatten(batch, "", leaves)
        record["batch_size"] = list(batch.batch_size)
        record["device"] = None if batch.device is None else str(batch.device)
    columns: dict[str, Any] = {}
    named = [(name, tensor, _tensor_column) for name, tensor in leaves]
    named += [(str(name), values, _numpy_column) for name, values in non_tensor.items()]
    for name, value, convert in named:
        if name in columns:
            raise column_error(EncodeError, name, "duplicate column name (a key both in batch and non_tensor_batch?)")
        columns[name], record["columns"][name] = convert(name, value, copy)
    lengths = {len(column) for column in columns.values()}
    rows = batch.batch_size[0] if batch is not None else next(iter(lengths), 0)
    if lengths - {rows}:
        raise EncodeError(f"columns disagree on the number of rows: {sorted(lengths | {rows})}")
    frame = pd.DataFrame(columns, index=pd.RangeIndex(rows))
    frame.attrs = {META_INFO: _copy.deepcopy(meta_info), RECORD: record}
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


def _check_shapes(name: str, arrays: list[np.ndarray], shape: list[int | None]) -> None:
    """Each array has ``len(shape)`` dims, equal to ``shape`` where it is not None."""

    def fits(row_shape: tuple[int, ...]) -> bool:
        return len(row_shape) == len(shape) and all(n is None or n == m for n, m in zip(shape, row_shape))

    if all(map(fits, {a.shape for a in arrays})):
        return
    i = next(i for i, a in enumerate(arrays) if not fits(a.shape))
    expected = ", ".join("?" if n is None else str(n) for n in shape)
    raise _fail(name, f"row {i} has shape {arrays[i].shape}, expected ({expected}{',' * (len(shape) == 1)})")


def _dense(name: str, series: pd.Series, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A ``[B, *shape]`` tensor from a plain column (``shape == []``) or a column of arrays."""
    if series.dtype != object:
        values = _plain_values(name, series)
        if shape:
            raise _fail(name, f"holds one value per row, expected arrays of shape {tuple(shape)}")
    else:
        arrays = _row_arrays(name, series)
        _check_shapes(name, arrays, shape)
        values = np.array(arrays) if arrays else np.empty((0, *shape), dtype=_shown_dtype(dtype))
    return _tensor(name, values, dtype)


def _jagged(name: str, arrays: list[np.ndarray], dtype: torch.dtype, ragged_idx: int, shape: list) -> torch.Tensor:
    """A jagged nested tensor whose rows are ``arrays`` (shape ``shape``, None at ``ragged_idx - 1``)."""
    axis = ragged_idx - 1
    _check_shapes(name, arrays, shape)
    if arrays:
        values = np.concatenate(arrays, axis=axis)
    else:
        values = np.empty([0 if n is None else n for n in shape], dtype=_shown_dtype(dtype))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.shape[axis] for a in arrays], out=offsets[1:])
    return torch.nested.nested_tensor_from_jagged(
        _tensor(name, values, dtype), torch.from_numpy(offsets), jagged_dim=ragged_idx
    )


def _strided(name: str, arrays: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    """A strided nested tensor whose rows are ``arrays`` (same number of dims, any sizes)."""
    if not arrays:
        raise _fail(name, "a strided nested tensor needs at least one row")
    if len({a.ndim for a in arrays}) > 1:
        ndims = sorted({a.ndim for a in arrays})
        raise _fail(name, f"rows of a nested tensor need the same number of dims, got {ndims}")
    return torch.nested.nested_tensor([_tensor(name, np.array(a), dtype) for a in arrays], dtype=dtype)


def _restore_tensor(name: str, series: pd.Series, spec: dict) -> torch.Tensor:
    """The tensor of a column :func:`to_pandas` recorded (its dtype, layout and per-row shape)."""
    kind, shape = spec.get("kind"), spec.get("shape")
    dtype = dtype_from_name(str(spec.get("dtype")), name)
    if not isinstance(shape, list) or not all(n is None or (type(n) is int and n >= 0) for n in shape):
        raise column_error(DecodeError, name, f"malformed recorded shape {shape!r}")
    if kind == "tensor" and None not in shape:
        return _dense(name, series, dtype, shape)
    if kind == "jagged":
        ragged_idx = spec.get("ragged_idx")
        if type(ragged_idx) is not int or not 1 <= ragged_idx <= len(shape) or shape[ragged_idx - 1] is not None:
            raise column_error(DecodeError, name, f"recorded ragged_idx {ragged_idx!r} does not fit shape {shape}")
        return _jagged(name, _row_arrays(name, series), dtype, ragged_idx, shape)
    if kind == "strided":
        return _strided(name, _row_arrays(name, series), dtype)
    raise column_error(DecodeError, name, f"malformed record {spec!r}")


def _restore_numpy(name: str, series: pd.Series, spec: dict) -> np.ndarray:
    """The numpy array of a ``non_tensor_batch`` column :func:`to_pandas` recorded, in its recorded dtype."""
    row_shape = spec.get("row_shape")
    try:
        dtype = _dtype_from_str(str(spec.get("dtype")))
    except (TypeError, ValueError) as e:
        raise column_error(DecodeError, name, f"malformed recorded dtype {spec.get('dtype')!r}") from e
    if not isinstance(row_shape, list) or not all(type(n) is int and n >= 0 for n in row_shape):
        raise column_error(DecodeError, name, f"malformed recorded row shape {row_shape!r}")
    if row_shape:
        arrays = _row_arrays(name, series)
        _check_shapes(name, arrays, row_shape)
        values = np.array(arrays) if arrays else np.empty((0, *row_shape), dtype=dtype)
    else:
        values = series.to_numpy(dtype=object if dtype == object else None, copy=True)
    try:
        if dtype.kind in "US":  # strings edited in pandas may have grown: widen, never truncate
            values = values.astype(dtype.kind)
            return values.astype(dtype) if values.dtype.itemsize <= dtype.itemsize else values
        return values.astype(dtype, copy=False)
    except (TypeError, ValueError) as e:
        raise _fail(name, f"cannot convert the values to the recorded dtype {dtype}: {e}") from e


def _infer(name: str, series: pd.Series) -> torch.Tensor | np.ndarray:
    """A column without a record: numbers become tensors, cells of numeric arrays stacked or
    nested tensors, anything else a ``non_tensor_batch`` array (see :func:`from_pandas`)."""
    dtype = series.dtype
    numeric = getattr(dtype, "numpy_dtype", dtype)
    if isinstance(numeric, np.dtype) and numeric.newbyteorder("=") in _TENSOR_NUMPY_DTYPES:
        if isinstance(dtype, np.dtype) or not series.isna().any():
            values = _plain_values(name, series)
            return _tensor(name, values, _torch_dtype(values.dtype.newbyteorder("=")))
    elif isinstance(dtype, np.dtype) and dtype != object:  # datetimes, long doubles, bytes
        return series.to_numpy(copy=True)
    cells = series.to_numpy(dtype=object, na_value=None, copy=True)
    arrays = [c for c in cells if isinstance(c, np.ndarray) and c.dtype.newbyteorder("=") in _TENSOR_NUMPY_DTYPES]
    if not cells.size or len(arrays) != len(cells) or len({a.ndim for a in arrays}) > 1:
        return cells
    torch_dtype = _torch_dtype(np.result_type(*{a.dtype for a in arrays}).newbyteorder("="))
    shapes = {a.shape for a in arrays}
    if len(shapes) == 1:
        return _tensor(name, np.array(arrays), torch_dtype)
    varying = [axis for axis in range(arrays[0].ndim) if len({s[axis] for s in shapes}) > 1]
    if len(varying) == 1:
        shape = [None if axis == varying[0] else n for axis, n in enumerate(arrays[0].shape)]
        return _jagged(name, arrays, torch_dtype, varying[0] + 1, shape)
    return _strided(name, arrays, torch_dtype)


def _record(attrs: dict) -> dict | None:
    """The record :func:`to_pandas` left in ``attrs``, checked; None if there is none."""
    record = attrs.get(RECORD)
    if record is None:
        return None
    where = f"DataFrame.attrs[{RECORD!r}]"
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        raise DecodeError(f"{where} is not a version-{RECORD_VERSION} record made by to_pandas")
    batch_size, device = record.get("batch_size"), record.get("device")
    if batch_size is not None and not (
        isinstance(batch_size, list) and batch_size and all(type(n) is int and n >= 0 for n in batch_size)
    ):
        raise DecodeError(f"{where}: malformed batch_size {batch_size!r}")
    if device is not None and not isinstance(device, str):
        raise DecodeError(f"{where}: malformed device {device!r}")
    _count_leaves(record.get("tree"))
    columns = record.get("columns")
    if not isinstance(columns, dict) or not all(isinstance(spec, dict) for spec in columns.values()):
        raise DecodeError(f"{where}: malformed column records")
    return record


def _prune(tree: list, prefix: str, present: dict, rows: int, order: list[str]) -> list:
    """``tree`` without the leaves absent from ``present``, its batch sizes set to ``rows`` rows;
    appends the kept leaves' column names to ``order``."""
    kept: list = []
    for entry in tree:
        if isinstance(entry, str):
            if prefix + entry in present:
                kept.append(entry)
                order.append(prefix + entry)
        else:
            key, size, device, subtree = entry
            kept.append([key, [rows, *size[1:]], device, _prune(subtree, f"{prefix}{key}.", present, rows, order)])
    return kept


def _batch(
    record: dict | None, tensors: dict[str, torch.Tensor], rows: int, placement: _Placement
) -> TensorDict | None:
    """The TensorDict: the recorded tree with the columns still present, then the other tensor
    columns at the top level."""
    if record is not None and record["batch_size"] is not None:
        order: list[str] = []
        tree = _prune(record["tree"], "", tensors, rows, order)
        batch_size = [rows, *record["batch_size"][1:]]
        batch = _unflatten(tree, batch_size, record["device"], iter([tensors.pop(n) for n in order]), placement)
    elif tensors:
        batch = TensorDict({}, batch_size=[rows], device=placement(None))
    else:
        return None
    for name, tensor in tensors.items():
        if name in batch.keys():
            raise _fail(name, "clashes with a nested TensorDict of the same name")
        try:
            batch[name] = tensor
        except (RuntimeError, ValueError) as e:
            raise _fail(name, f"does not fit batch_size {list(batch.batch_size)}: {e}") from e
    return batch


def from_pandas(df: pd.DataFrame, *, device: str | torch.device | None = None) -> DataProto:
    """Rebuild a :class:`~arrow_dataproto.DataProto` from a DataFrame, one sample per row.

    Every tensor and array is new memory (nothing views the frame). The index is
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
    ``attrs["meta_info"]`` (deep-copied) becomes ``meta_info``.

    ``device`` places every tensor there; otherwise each goes to its recorded
    device, or to the CPU with one ``RuntimeWarning`` if this process lacks it.

    Raises :class:`EncodeError` for values that do not fit their column
    (different row shapes in a dense column, missing values in a recorded
    tensor column, casts that lose the kind of number) or column names that
    collide, and :class:`DecodeError` for a malformed ``attrs`` record.
    """
    if not isinstance(df, pd.DataFrame):
        raise EncodeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    record = _record(df.attrs)
    meta_info = df.attrs.get(META_INFO, {})
    if not isinstance(meta_info, dict):
        raise EncodeError(f"DataFrame.attrs[{META_INFO!r}] must be a dict, got {type(meta_info).__name__}")
    names = [str(c) for c in df.columns]
    if len(set(names)) != len(names):
        raise EncodeError(f"duplicate column names {sorted({n for n in names if names.count(n) > 1})}")

    specs = record["columns"] if record is not None else {}
    placement = _Placement(device)
    tensors: dict[str, torch.Tensor] = {}
    non_tensor: dict[str, np.ndarray] = {}
    frame = pd.DataFrame(df, copy=False)  # without attrs, which pandas deep-copies into every column taken
    for name, (_, series) in zip(names, frame.items()):
        spec = specs.get(name, {})
        if not spec:
            value = _infer(name, series)
        elif spec.get("kind") == _NUMPY_KIND:
            value = _restore_numpy(name, series, spec)
        elif spec.get("kind") in _TENSOR_KINDS:
            value = _restore_tensor(name, series, spec)
        else:
            raise column_error(DecodeError, name, f"unknown recorded kind {spec.get('kind')!r}")
        if isinstance(value, torch.Tensor):
            recorded = spec.get("device")
            target = placement(recorded if isinstance(recorded, str) else None)
            tensors[name] = value if target is None or target.type == "cpu" else value.to(target)
        else:
            non_tensor[name] = value
    batch = _batch(record, tensors, len(df), placement)
    placement.warn()
    return DataProto(batch, non_tensor, _copy.deepcopy(meta_info))
