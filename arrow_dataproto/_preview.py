"""Stored columns as the rows a reader would decode, with pyarrow and numpy alone: what the
command line's ``head`` shows without importing torch.

:func:`decoded_rows` takes the record batches of a few rows as :meth:`FileReader.read_arrow`
gives them (validated, our schema metadata on each) and returns, per column, what
:func:`~arrow_dataproto.from_arrow` would decode: a tensor column as one numpy array per row,
holding the values as torch would show them (bfloat16 widened exactly to float32, ``bool8``
as bools, real/imaginary pairs as complex numbers); a ``non_tensor_batch`` column as the
numpy array the decoder returns (:mod:`arrow_dataproto._objects`, the same code). The checks
the decoder makes of a tensor column (no nulls, the Arrow type its metadata names, offsets in
order) raise the same :class:`DecodeError`.

It returns None where numpy cannot show a file's values exactly or the decoder does more than
view the bytes: float8, float4, bits and complex32 dtypes, strided nested tensors, jagged
tensors that share another column's offsets, TensorDicts with batch dimensions after the
first, portable files and other tools' files. The caller decodes those with the library
(torch); ``tests/test_cli.py`` checks that both give the same rows.
"""

from __future__ import annotations

import json
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa

from ._format import DTYPE, FORMAT, KIND, OFFSETS_OF, PORTABLE, RAGGED_IDX, SHAPE, TENSOR_KINDS, Node, text_metadata
from ._objects import decode_column
from .errors import DecodeError, column_error


def _bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits as the float32 values they are (exact: bfloat16 is float32's upper half)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


class _Shown(NamedTuple):
    """How one torch dtype is stored and shown: the Arrow value type of its column, the
    numpy view of those values as torch shows them, and 2 for (real, imaginary) pairs."""

    arrow_type: pa.DataType
    show: Callable[[np.ndarray], np.ndarray]
    pair: int = 1


def _same(values: np.ndarray) -> np.ndarray:
    return values


def _view(array: pa.Array, dtype: np.dtype, count: int) -> np.ndarray:
    """The first ``count`` fixed-width values of ``array`` (its data buffer, or a list's
    offsets) as a numpy view; ``Array.to_numpy`` would import pandas."""
    buffer = array.buffers()[1]
    if buffer is None or count == 0:
        return np.zeros(count, dtype)
    return np.frombuffer(buffer, dtype=dtype, count=count, offset=array.offset * dtype.itemsize)


_SHOWN: dict[str, _Shown] = {
    "bool": _Shown(pa.int8(), lambda v: v.view(np.bool_)),  # arrow.bool8: one byte per value
    **{name: _Shown(pa.from_numpy_dtype(np.dtype(name)), _same) for name in (
        "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "float32", "float64")},
    "bfloat16": _Shown(pa.uint16(), _bfloat16),
    "complex64": _Shown(pa.float32(), lambda v: np.ascontiguousarray(v).view(np.complex64)[..., 0], 2),
    "complex128": _Shown(pa.float64(), lambda v: np.ascontiguousarray(v).view(np.complex128)[..., 0], 2),
}
"""The dtypes numpy shows exactly, by the name the metadata records; the others go to torch."""


class TensorRows(NamedTuple):
    """A tensor column to show: its torch dtype name, which dimensions of a row are ragged,
    and each row's values."""

    dtype: str
    ragged: list[bool]
    rows: list[np.ndarray]


def _fail(name: str, message: str) -> DecodeError:
    return column_error(DecodeError, name, message)


def _storage(array: pa.Array) -> pa.Array:
    return array.storage if isinstance(array, pa.ExtensionArray) else array


def _values(name: str, array: pa.Array, shown: _Shown, element: list[int]) -> np.ndarray:
    """The values of a flat column (scalars, or fixed-size lists of ``prod(element) * pair``)
    as ``[n, *element]`` shown values, checked as the decoder checks them."""
    width = int(np.prod(element, dtype=np.int64)) * shown.pair
    flat = _storage(array)
    if element or shown.pair == 2:
        if not pa.types.is_fixed_size_list(flat.type) or flat.type.list_size != width:
            raise _fail(name, f"elements of type {flat.type}, expected fixed_size_list of {width}")
        if flat.null_count:
            raise _fail(name, f"{flat.null_count} null values in a tensor column")
        flat = _storage(flat.flatten())
    if flat.null_count:
        raise _fail(name, f"{flat.null_count} null values in a tensor column")
    if flat.type != shown.arrow_type:
        raise _fail(name, f"values of type {flat.type}, expected {shown.arrow_type}")
    values = _view(flat, np.dtype(flat.type.to_pandas_dtype()), len(flat)).reshape(len(array), *element, *([2] * (shown.pair == 2)))
    return shown.show(values)


def _dense(name: str, array: pa.Array, shape: list[int], shown: _Shown) -> list[np.ndarray]:
    if not shape and shown.pair == 1:
        return list(_values(name, array, shown, []))
    arrow_shape = shape + [2] * (shown.pair == 2)
    kind = array.type
    if not isinstance(kind, pa.FixedShapeTensorType) or list(kind.shape) != arrow_shape:
        raise _fail(name, f"type {kind}, expected fixed_shape_tensor of shape {arrow_shape}")
    if kind.permutation is not None and list(kind.permutation) != list(range(len(arrow_shape))):
        raise _fail(name, f"fixed_shape_tensor with permutation {list(kind.permutation)}, expected row-major values")
    value_type = kind.value_type.storage_type if isinstance(kind.value_type, pa.BaseExtensionType) else kind.value_type
    if value_type != shown.arrow_type:
        raise _fail(name, f"value type {kind.value_type}, expected {shown.arrow_type}")
    return list(_values(name, array.storage, shown, shape))


def _jagged(name: str, array: pa.Array, shape: list, ragged_idx: int, shown: _Shown) -> list[np.ndarray]:
    if not pa.types.is_large_list(array.type):
        raise _fail(name, f"type {array.type}, expected large_list")
    if len(array) == 0:
        return []
    offsets = _view(array, np.dtype(np.int64), len(array) + 1)
    start, end = int(offsets[0]), int(offsets[-1])
    if not 0 <= start <= end <= len(array.values) or bool((offsets[1:] < offsets[:-1]).any()):
        raise _fail(name, "list offsets out of order or outside the values")
    element = [int(n) for n in shape if n is not None]
    values = _values(name, array.values.slice(start, end - start), shown, element)
    rows = [values[a - start : b - start] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return rows if ragged_idx == 1 else [np.moveaxis(row, 0, ragged_idx - 1) for row in rows]  # stored ragged first


def _tensor(name: str, array: pa.Array, meta: dict[str, str]) -> TensorRows | None:
    shown = _SHOWN.get(meta.get(DTYPE, ""))
    kind = meta.get(KIND)
    try:
        shape = json.loads(meta.get(SHAPE, "null"))
    except (ValueError, RecursionError):
        return None  # the decoder words the error
    if shown is None or not isinstance(shape, list) or not all(n is None or type(n) is int and n >= 0 for n in shape):
        return None
    if kind == "tensor" and None not in shape:
        return TensorRows(meta[DTYPE], [False] * len(shape), _dense(name, array, shape, shown))
    ragged_idx = 1 + shape.index(None) if shape.count(None) == 1 else None
    if kind == "jagged" and ragged_idx is not None and meta.get(RAGGED_IDX) == str(ragged_idx) and OFFSETS_OF not in meta:
        return TensorRows(meta[DTYPE], [n is None for n in shape], _jagged(name, array, shape, ragged_idx, shown))
    return None


def _one_dimension(node: Node) -> bool:
    """Whether every TensorDict of the tree has a batch size of one dimension (then any
    leaf fits it, and the decoder checks nothing more)."""
    return len(node.batch_size) == 1 and all(isinstance(e, str) or _one_dimension(e) for e in node.entries)


def decoded_rows(batches: list[pa.RecordBatch], *, allow_pickle: bool) -> dict[str, TensorRows | np.ndarray] | None:
    """Each column of ``batches`` (rows of one file, in order, each batch validated and
    carrying its schema metadata) as :func:`~arrow_dataproto.from_arrow` would decode the
    rows, or None if numpy cannot show them (see the module docstring).

    :class:`DecodeError` where the decoder would raise it for a column read;
    :class:`~arrow_dataproto.errors.PickleNotAllowedError` for a pickled column without
    ``allow_pickle``."""
    if not batches:
        return None
    out: dict[str, TensorRows | np.ndarray] = {}
    for batch in batches:
        metadata = text_metadata(batch.schema.metadata)
        if FORMAT not in metadata or PORTABLE in metadata:
            return None
        tree = Node.parse(metadata)
        if tree is not None and not _one_dimension(tree):
            return None  # batch dimensions after the first: the decoder checks the leaves against them
        tensors = [f.name for f in batch.schema if text_metadata(f.metadata).get(KIND) in TENSOR_KINDS]
        if tensors != ([] if tree is None else tree.leaf_names()):
            return None
        for field, array in zip(batch.schema, batch.columns):
            meta = text_metadata(field.metadata)
            part: TensorRows | np.ndarray | None
            if meta.get(KIND) in TENSOR_KINDS:
                part = _tensor(field.name, array, meta)
                if part is None:
                    return None
            else:
                part = decode_column(field.name, array, meta, allow_pickle=allow_pickle)
            seen = out.setdefault(field.name, part)
            if seen is part:
                continue
            if isinstance(seen, TensorRows) and isinstance(part, TensorRows):
                seen.rows.extend(part.rows)
            elif isinstance(seen, np.ndarray) and isinstance(part, np.ndarray) and seen.dtype == part.dtype:
                out[field.name] = np.concatenate([seen, part])
            else:  # rows of two batches that concatenating would convert: the decoder's rules
                return None
    return out
