"""Tables of other tools: one rule that reads any Arrow table as a DataProto.

A RecordBatch whose schema metadata has no ``adp.*`` key was not written by this
library (pandas ``to_feather``, polars, DuckDB, HF ``datasets``, Ray Data, a
hand-built table). :func:`adopt` turns it into a RecordBatch of this format, so the
normal decoding path (validation, ``columns=``, ``rows=``, ``device=``, ``copy=``)
applies. The rule, column by column (``docs/format.md``, "Reading tables of other
tools", says the same):

========================================================  ==========================
Arrow column                                              DataProto
========================================================  ==========================
integer, float (``float16`` too), ``bool``, ``bool8``     ``batch``: 1-D tensor ``[B]``
a struct of such columns (at every level, no null), in a  ``batch``: nested TensorDict
table whose every column is a tensor by this rule (what   (its leaves named by their
``tensordict.to_arrow`` writes)                           key paths joined with ``.``)
``fixed_size_list`` (nested: one dimension per level),    ``batch``: dense tensor
``arrow.fixed_shape_tensor``, Ray Data's tensor types,    ``[B, d1..dn]``
lists (``list``, ``large_list``, ``list_view``) whose
lists all have the same length at every level
numeric lists whose outermost lists vary in length        ``batch``: jagged
(inner levels of one length each)                         ``torch.nested`` ``[B, j, ...]``
``arrow.json``                                            ``non_tensor_batch``: parsed
                                                          Python values (the ``json``
                                                          kind: strict JSON, no NaN)
timestamp, date, duration                                 ``non_tensor_batch``:
                                                          ``datetime64``/``timedelta64``
everything else: strings, binaries, other structs, maps,  ``non_tensor_batch``: object
lists of non-numbers, lists ragged at more than the       array of Python values
outermost level, dictionary-encoded columns (decoded),    (``None`` for a null)
decimals, times of day, unions
========================================================  ==========================

Tensor columns go into ``batch`` (a TensorDict of batch size ``[B]``, no device) in
table order, the others into ``non_tensor_batch`` in table order; ``meta_info`` is
``{}`` (a tool's own schema metadata, such as pandas', is not ``meta_info``). Another
extension type is read as its storage type. A column that still carries this
library's field metadata (``adp.kind``: a tool kept the field metadata but dropped
the schema's) is decoded as that kind.

Where no mapping exists, :func:`adopt` raises :class:`DecodeError` naming the column
and what to do: nulls in a column that is a tensor (a null row of a numeric list, a
null value), two columns of one name, a map with a duplicate key.

Copies: tensors view the table's buffers (zero-copy) except ``bool`` (bit-packed in
Arrow: unpacked into one byte per value), the offsets of a jagged column (rebuilt as
int64), ``list_view`` columns and ``fixed_shape_tensor`` columns with a permutation
(made row-major); ``non_tensor_batch`` columns are new Python objects / numpy arrays.
Whether lists of one length become a dense tensor depends on the rows read, so read a
table whole (``from_arrow(table)``, ``read_all``) for one decision over all its rows.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ._dtypes import STORAGE
from ._format import (
    ARRAY_KINDS,
    ArraySpec,
    KIND,
    TENSOR_KINDS,
    Entry,
    Node,
    TensorSpec,
    schema_metadata,
    text_metadata,
)
from ._validate import no_nulls
from .errors import DecodeError, column_error

_NUMERIC: dict[pa.DataType, torch.dtype] = {
    pa.int8(): torch.int8, pa.int16(): torch.int16, pa.int32(): torch.int32, pa.int64(): torch.int64,
    pa.uint8(): torch.uint8, pa.uint16(): torch.uint16, pa.uint32(): torch.uint32, pa.uint64(): torch.uint64,
    pa.float16(): torch.float16, pa.float32(): torch.float32, pa.float64(): torch.float64,
    pa.bool_(): torch.bool, pa.bool8(): torch.bool,
}
"""Arrow value types that are tensor elements, and their torch dtype."""

_RAY_TENSORS = ("ray.data.arrow_tensor", "ray.data.arrow_tensor_v2")
"""Ray Data's fixed-shape tensor extension types: a list of ``prod(shape)`` values per row."""
_JSON = "arrow.json"
_EXTENSION_NAME = "ARROW:extension:name"
_EXTENSION_METADATA = "ARROW:extension:metadata"

_AS_TENSOR = (
    "in a column read as a tensor; "
    "fill the nulls first (pyarrow.compute.fill_null, DataFrame.fillna) or leave the column out with columns=[...]"
)
"""The end of the message refusing the nulls of a column read as a tensor (after "N null values")."""


def adopt(record_batch: pa.RecordBatch) -> pa.RecordBatch:
    """The RecordBatch of this format that reads as the rule above says: tensor columns
    first (in table order) with their field metadata, then the others, a flat TensorDict
    tree of batch size ``[rows]``. Non-tensor columns keep their Arrow type; they carry no
    ``adp.kind`` and are decoded by :func:`decode_column`. Expects a validated batch.
    :class:`DecodeError` naming the column where the rule has no mapping."""
    names = record_batch.schema.names
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})[:20]
        raise DecodeError(f"columns {duplicates}: two columns of one name; select or rename them first")
    tensors: list[tuple[pa.Field, pa.Array]] = []
    others: list[tuple[pa.Field, pa.Array]] = []
    entries: list[Entry] = []  # the root TensorDict's, in column order
    columns = []
    for field, array in zip(record_batch.schema, record_batch.columns):
        kind = text_metadata(field.metadata).get(KIND)
        nested = None if kind is not None else _nested(field.name, array, "", set(names))
        adopted = None if kind in ARRAY_KINDS or kind in TENSOR_KINDS or nested is not None else _tensor(field, array)
        columns.append((field, array, kind, adopted, nested))
    # structs are nested TensorDicts only in a table of tensors alone (tensordict.to_arrow's)
    all_tensors = all(kind in TENSOR_KINDS or adopted or nested for _, _, kind, adopted, nested in columns)
    for field, array, kind, adopted, nested in columns:
        if kind in TENSOR_KINDS:
            tensors.append((field, array))
            entries.append(field.name)
            continue
        if nested is not None and all_tensors:
            node, leaves = nested
            tensors += leaves
            entries.append(node)
            continue
        if adopted is None and kind is None and _is_json_text(array.type):
            # arrow.json over string: our json kind, so its strict decoder reads it (no NaN)
            if array.type.storage_type == pa.string_view():
                array = pa.ExtensionArray.from_storage(pa.json_(pa.large_string()), array.storage.cast(pa.large_string()))
            json_field = ArraySpec("json", np.dtype(object), ()).metadata(field.name)
            others.append((pa.field(field.name, array.type, metadata=json_field), array))
        elif adopted is None:
            others.append((field if kind in ARRAY_KINDS else field.remove_metadata(), array))
        else:
            values, spec = adopted
            tensors.append((pa.field(field.name, values.type, nullable=False, metadata=spec.metadata()), values))
            entries.append(field.name)
    tree = Node("", (record_batch.num_rows,), None, tuple(entries))
    metadata = schema_metadata(tree, {})
    fields = [f for f, _ in tensors + others]
    arrays = [a for _, a in tensors + others]
    if not arrays:
        no_fields = pa.Array.from_buffers(pa.struct([]), record_batch.num_rows, [None], children=[])
        return pa.RecordBatch.from_struct_array(no_fields).replace_schema_metadata(metadata)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


# ---------------------------------------------------------------- tensor columns


def _nested(key: str, array: pa.Array, prefix: str, taken: set[str]) -> tuple[Node, list[tuple[pa.Field, pa.Array]]] | None:
    """A struct column whose every field, at every level, is a tensor by the rule (and holds
    no null), as a nested TensorDict: its :class:`Node` and its leaf columns, named by their
    key paths joined with ``.`` (``tensordict.to_arrow`` writes a nested TensorDict so). None
    for any other column, and where a leaf's name is already a column's (``taken``)."""
    if not pa.types.is_struct(array.type) or array.null_count or not array.type.num_fields:
        return None
    entries: list[Entry] = []
    leaves: list[tuple[pa.Field, pa.Array]] = []
    for i in range(array.type.num_fields):
        child_field, child = array.type.field(i), array.field(i)
        name = f"{prefix}{key}.{child_field.name}"
        if name in taken or "." in child_field.name:
            return None
        sub = _nested(child_field.name, child, f"{prefix}{key}.", taken)
        if sub is not None:
            entries.append(sub[0])
            leaves += sub[1]
            continue
        if child.null_count:
            return None
        adopted = _tensor(pa.field(name, child_field.type), child)
        if adopted is None:
            return None
        values, spec = adopted
        leaves.append((pa.field(name, values.type, nullable=False, metadata=spec.metadata()), values))
        entries.append(child_field.name)
    return Node(key, (len(array),), None, tuple(entries)), leaves


def _tensor(field: pa.Field, array: pa.Array) -> tuple[pa.Array, TensorSpec] | None:
    """The tensor column of ``array`` and its spec, or None if it is not a tensor by the rule."""
    name, kind = field.name, array.type
    extension = kind.extension_name if isinstance(kind, pa.BaseExtensionType) else None
    meta = text_metadata(field.metadata)
    extension = extension or meta.get(_EXTENSION_NAME)  # an extension type this process lacks
    if extension == _JSON:
        return None
    if isinstance(kind, pa.FixedShapeTensorType):
        return _fixed_shape_tensor(name, array)
    if isinstance(array, pa.ExtensionArray) and kind != pa.bool8():
        array = array.storage
    if extension in _RAY_TENSORS:
        return _ray_tensor(name, array, kind, meta)
    if array.type in _NUMERIC:
        return _dense(name, array, [], len(array))
    if _is_list(array.type):
        return _lists(name, array)
    return None


def _is_list(t: pa.DataType) -> bool:
    return (
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)
    )


def _leaf(t: pa.DataType) -> pa.DataType:
    while _is_list(t):
        t = t.value_type
    return t


def _values(name: str, values: pa.Array) -> tuple[pa.Array, torch.dtype]:
    """A flat numeric array as tensor storage: nulls refused, ``bool`` unpacked into ``bool8``."""
    no_nulls(name, values, f"values {_AS_TENSOR}")
    dtype = _NUMERIC[values.type]
    if values.type == pa.bool_():  # bit-packed: one byte per value (a copy)
        values = pa.ExtensionArray.from_storage(pa.bool8(), pc.cast(values, pa.int8()))
    return values, dtype


def _dense(name: str, flat: pa.Array, shape: list[int], rows: int) -> tuple[pa.Array, TensorSpec]:
    """A dense ``[rows, *shape]`` column over ``flat`` (all values, row-major), zero-copy."""
    values, dtype = _values(name, flat)
    spec = TensorSpec("tensor", dtype, tuple(shape), None)
    if not shape:
        return values, spec
    width = math.prod(shape)
    # Not FixedSizeListArray.from_arrays: it refuses a width of 0.
    storage = pa.Array.from_buffers(pa.list_(values.type, width), rows, [None], children=[values])
    return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(STORAGE[dtype].arrow_type, shape), storage), spec


def _fixed_shape_tensor(name: str, array: pa.Array) -> tuple[pa.Array, TensorSpec] | None:
    """``arrow.fixed_shape_tensor``: ``shape`` is the physical (row-major) shape of each row;
    a ``permutation`` says that logical dimension ``i`` is physical dimension
    ``permutation[i]``, so the tensor is the physical one with its dimensions permuted, made
    row-major (a copy; pyarrow's own ``to_numpy_ndarray`` gets the strides of a permuted
    tensor wrong). ``dim_names`` name the physical dimensions and change nothing."""
    kind = array.type
    if kind.value_type not in _NUMERIC:
        return None
    no_nulls(name, array, f"rows {_AS_TENSOR}")
    shape, permutation = list(kind.shape), kind.permutation
    flat = array.storage.flatten()  # the values of the rows present
    if permutation is None or list(permutation) == list(range(len(shape))):
        return _dense(name, flat, shape, len(array))
    if sorted(permutation) != list(range(len(shape))):
        raise column_error(DecodeError, name, f"fixed_shape_tensor permutation {list(permutation)} is not one of {len(shape)} dimensions")
    no_nulls(name, flat, f"values {_AS_TENSOR}")
    physical = flat.to_numpy(zero_copy_only=False).reshape(len(array), *shape)
    logical = np.ascontiguousarray(physical.transpose(0, *(p + 1 for p in permutation)))
    return _dense(name, pa.array(logical.reshape(-1)), list(logical.shape[1:]), len(array))


def _ray_tensor(name: str, array: pa.Array, kind: pa.DataType, meta: dict[str, str]) -> tuple[pa.Array, TensorSpec] | None:
    """Ray Data's tensor type: each row a list of ``prod(shape)`` values, the shape in the type."""
    shape = getattr(kind, "shape", None)
    if shape is None:
        try:
            shape = json.loads(meta.get(_EXTENSION_METADATA, ""))
        except ValueError:
            shape = None
    if not (isinstance(shape, (list, tuple)) and all(type(n) is int and n >= 0 for n in shape)):
        return _lists(name, array)
    if not _is_list(array.type) or array.type.value_type not in _NUMERIC:
        return None
    no_nulls(name, array, f"rows {_AS_TENSOR}")
    if pa.types.is_fixed_size_list(array.type):
        lengths = np.full(len(array), array.type.list_size)
    else:
        lengths = np.asarray(pc.list_value_length(array))
    if (lengths != math.prod(shape)).any():
        raise column_error(DecodeError, name, f"a Ray tensor row does not hold the {math.prod(shape)} values of shape {list(shape)}")
    return _dense(name, array.flatten(), list(shape), len(array))


def _contiguous(view: pa.Array) -> pa.LargeListArray:
    """A ``list_view`` column as a ``large_list`` of the same rows (a copy of its values;
    pyarrow 26's cast between the two builds invalid arrays)."""
    offsets = np.zeros(len(view) + 1, dtype=np.int64)
    np.cumsum(np.asarray(view.sizes), out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), pc.list_flatten(view))


def _lists(name: str, array: pa.Array) -> tuple[pa.Array, TensorSpec] | None:
    """A list column of numbers: dense if every level has one length, jagged if only the
    outermost varies, else None (objects)."""
    if _leaf(array.type) not in _NUMERIC:
        return None
    rows = len(array)
    dims: list[int | None] = []
    offsets = None
    current = array
    while _is_list(current.type):
        kind = current.type
        no_nulls(name, current, f"{'lists' if dims else 'rows'} {_AS_TENSOR}")
        if pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
            current = _contiguous(current)
            kind = current.type
        if pa.types.is_fixed_size_list(kind):
            dims.append(kind.list_size)
        else:
            bounds = np.asarray(current.offsets)  # of the rows present (a slice's own)
            lengths = np.diff(bounds)
            dims.append(int(lengths[0]) if len(lengths) and bool((lengths == lengths[0]).all()) else None)
            if offsets is None and len(dims) == 1:
                offsets = bounds.astype(np.int64) - bounds[0]
        current = current.flatten()  # the values of the rows present
    ragged = [i for i, n in enumerate(dims) if n is None]
    if not ragged:
        return _dense(name, current, [int(n) for n in dims if n is not None], rows)
    if ragged != [0]:
        return None  # not one tensor: ragged at an inner level, or at more than one
    assert offsets is not None
    inner = [int(n) for n in dims[1:] if n is not None]
    values, dtype = _values(name, current)
    if inner:  # one element of the ragged dimension: a fixed_size_list of the inner dimensions
        values = pa.Array.from_buffers(pa.list_(values.type, math.prod(inner)), int(offsets[-1]), [None], children=[values])
    jagged = pa.Array.from_buffers(pa.large_list(values.type), rows, [None, pa.py_buffer(offsets)], children=[values])
    return jagged, TensorSpec("jagged", dtype, (None, *inner), None, 1)


# ---------------------------------------------------------------- non-tensor columns


def _is_json_text(t: pa.DataType) -> bool:
    """``arrow.json`` over UTF-8 text: read by the ``json`` kind of :mod:`arrow_dataproto._objects`."""
    return (
        isinstance(t, pa.BaseExtensionType)
        and t.extension_name == _JSON
        and t.storage_type in (pa.string(), pa.large_string(), pa.string_view())
    )


def decode_column(name: str, array: pa.Array) -> np.ndarray:
    """A non-tensor column of another tool as a numpy array (new memory): ``datetime64`` /
    ``timedelta64`` for timestamps, dates and durations (time-zone-aware timestamps in UTC;
    NaT for a null), else a 1-D object array of Python values (maps
    as dicts, dictionary-encoded columns decoded; ``None`` for a null). :class:`DecodeError`
    naming the column if a value has no Python form (a map with a duplicate key)."""
    try:
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        kind = array.type
        if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_duration(kind):
            return np.array(array.to_numpy(zero_copy_only=False))
        rows = array.to_pylist(maps_as_pydicts="strict")
        return np.fromiter(rows, dtype=object, count=len(array))
    except Exception as e:  # pyarrow, json and numpy errors of any type
        raise column_error(DecodeError, name, f"cannot read its {array.type} values as Python values: {e}") from e
