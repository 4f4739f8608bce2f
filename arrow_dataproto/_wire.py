"""The pickled state of a RecordBatch (the wire form), made and read with plans kept per structure.

A DataProto pickles as ``(schema_bytes, num_rows, columns)``: the serialized Arrow schema and,
per column, ``(length, null_count, offset, buffers, children)`` of its storage, every buffer a
``pa.Buffer`` (out of band under protocol 5). :func:`batch_state` and :func:`batch_from_state`
make and read it for any RecordBatch; this module also makes and reads the same state faster
for the batches a training loop sends again and again, without changing a byte of it:

- :func:`fast_state` (encode): a batch whose tensors are all dense CPU tensors gets a
  structure key (the TensorDict tree, names, dtypes, shapes, devices). Per key, the tensor
  columns' fields are built once; per key, object columns' types and field metadata and the
  ``meta_info`` entries, the serialized schema is built once. The tensor columns' states are
  then written straight from the tensors' memory, without building Arrow arrays. Anything
  else (no batch, nested or jagged tensors, a device) gives ``None``: the caller encodes
  through :func:`~arrow_dataproto._codec.to_arrow`.
- :func:`fast_parts` (decode): per distinct schema (its bytes), a decode plan: the tree, and
  per dense tensor column the exact state layout the encoder writes (a primitive column, or a
  fixed-size list over one) with its dtype and row shape. A column state that has that exact
  layout, offsets 0, no validity bitmap, lengths equal to the rows and a buffer holding at
  least the bytes the shape needs becomes a tensor viewing the buffer. Any state the plan
  cannot prove (another layout, an offset, a short buffer, a wrong length) gives ``None``,
  and the caller decodes through :func:`batch_from_state` and the full validation of
  :func:`~arrow_dataproto._codec.decode`, which raises the :class:`DecodeError` it always
  raised. Object columns are built as Arrow arrays, validated, and decoded as always.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict
from functools import lru_cache
from typing import Any, NamedTuple

import pyarrow as pa
import torch
from tensordict import TensorDict

from . import _meta_info, _objects, _shm
from ._codec import Parts, Placement, parts_of, record_batch_of, to_arrow, unflatten
from ._dtypes import STORAGE
from ._format import PORTABLE, Node, check_schema, columns_of, is_foreign
from ._validate import validate_arrow
from .errors import DecodeError, column_error

# ---------------------------------------------------------------- any record batch <-> state


def array_state(array: pa.Array) -> tuple:
    """``(length, null_count, offset, buffers, children)`` of an array's storage (buffers stay pa.Buffer)."""
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    kind = array.type
    if pa.types.is_struct(kind):
        if array.offset:  # struct children are exposed pre-sliced: make the offset 0 first
            array = pa.concat_arrays([array])
        children = [array.field(i) for i in range(kind.num_fields)]
    elif kind.num_fields:  # list, large_list, fixed_size_list
        children = [array.values]
    else:
        children = []
    buffers = array.buffers()[: kind.num_buffers]
    return len(array), array.null_count, array.offset, buffers, [array_state(c) for c in children]


def _array(kind: pa.DataType, state: tuple, private: dict[int, pa.Buffer]) -> pa.Array:
    storage_kind = kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind
    length, null_count, offset, buffers, children = state
    if pa.types.is_struct(storage_kind):
        child_kinds = [storage_kind.field(i).type for i in range(storage_kind.num_fields)]
    elif storage_kind.num_fields:
        child_kinds = [storage_kind.value_type]
    else:
        child_kinds = []
    if len(child_kinds) != len(children):
        raise DecodeError(f"pickled column of type {kind} has {len(children)} children, expected {len(child_kinds)}")
    # Integers pyarrow can take (not too large, not negative); from_arrow checks the rest.
    if not (
        all(type(n) is int for n in (length, null_count, offset))
        and 0 <= length < 2**63
        and 0 <= offset < 2**63
        and -1 <= null_count <= length
    ):
        raise DecodeError(f"array of type {kind}: bad length {length!r}, null count {null_count!r} or offset {offset!r}")
    buffers = [None if b is None else private.get(id(b)) or pa.py_buffer(b) for b in buffers]
    child_arrays = [_array(k, c, private) for k, c in zip(child_kinds, children)] or None
    storage = pa.Array.from_buffers(storage_kind, length, buffers, null_count, offset, child_arrays)
    return pa.ExtensionArray.from_storage(kind, storage) if storage_kind is not kind else storage


def _column(field: pa.Field, state: tuple, private: dict[int, pa.Buffer]) -> pa.Array:
    """One pickled column's array; :class:`DecodeError` naming the column if its state is corrupt."""
    try:
        return _array(field.type, state, private)
    except (pa.ArrowException, OSError, TypeError, ValueError) as e:
        raise column_error(DecodeError, field.name, f"corrupt pickled column: {e}") from e


def batch_state(record_batch: pa.RecordBatch) -> tuple[bytes, int, list[tuple]]:
    """A picklable state of a RecordBatch whose buffers are ``pa.Buffer`` objects (out of band with protocol 5)."""
    return (
        record_batch.schema.serialize().to_pybytes(),
        record_batch.num_rows,
        [array_state(c) for c in record_batch.columns],
    )


def state_buffers(state: tuple) -> list:
    """Every buffer object of a column state (a malformed state yields what it can; :func:`batch_from_state` rejects it)."""
    if not (isinstance(state, tuple) and len(state) == 5):
        return []
    buffers, children = state[3], state[4]
    found = [b for b in buffers if b is not None] if isinstance(buffers, (list, tuple)) else []
    for child in children if isinstance(children, (list, tuple)) else ():
        found += state_buffers(child)
    return found


_CACHED_SCHEMA_BYTES = 64 * 1024
"""Larger schemas (a large ``meta_info`` rides in the schema metadata) are parsed each time, not kept."""


@lru_cache(maxsize=64)
def _read_schema(schema_bytes: bytes) -> pa.Schema:
    """The schema these bytes serialize (each distinct one parsed once: a training loop sends a few)."""
    return pa.ipc.read_schema(pa.py_buffer(schema_bytes))


def _schema(schema_bytes: bytes) -> pa.Schema:
    if type(schema_bytes) is bytes and len(schema_bytes) <= _CACHED_SCHEMA_BYTES:
        return _read_schema(schema_bytes)
    return pa.ipc.read_schema(pa.py_buffer(schema_bytes))


def batch_from_state(schema_bytes: bytes, num_rows: int, columns: list[tuple], *, private: bool = False) -> pa.RecordBatch:
    """Inverse of :func:`batch_state`: zero-copy over the buffers it is given, or,
    with ``private=True``, over copy-on-write views (or copies) of them."""
    if type(num_rows) is not int or not 0 <= num_rows < 2**63:
        raise DecodeError(f"corrupt pickled DataProto: row count {str(num_rows)[:40]}")
    try:
        schema = _schema(schema_bytes)
        if len(columns) != len(schema):
            raise DecodeError(f"pickled batch has {len(columns)} columns, its schema {len(schema)}")
        views = _shm.private_views_by_id([b for c in columns for b in state_buffers(c)]) if private else {}
        return record_batch_of([_column(f, c, views) for f, c in zip(schema, columns)], schema, num_rows)
    except (pa.ArrowException, OSError, TypeError, ValueError) as e:  # pyarrow: OSError for corrupt schema bytes
        if isinstance(e, DecodeError):
            raise
        raise DecodeError(f"corrupt pickled DataProto: {e}") from e


# ---------------------------------------------------------------- encode plans


class _Leaf(NamedTuple):
    """How a dense tensor column's state is written: ``width`` stored values a row (a
    fixed-size list of them when ``listed``, else a primitive column)."""

    listed: bool
    width: int


def _dense_leaf(t: torch.Tensor) -> _Leaf | None:
    storage = STORAGE.get(t.dtype)
    if storage is None or t.dim() < 1:
        return None
    if t.dim() == 1 and storage.pair == 1:
        return _Leaf(False, 1)
    return _Leaf(True, math.prod(t.shape[1:]) * storage.pair)


_CPU = torch.device("cpu")


def _structure(td: Any, leaves: list[torch.Tensor]) -> tuple | None:
    """The structure key of TensorDict ``td`` (its leaves appended to ``leaves`` in column
    order), or ``None`` when a leaf is not a dense CPU tensor (or anything but a plain TensorDict)."""
    if type(td) is not TensorDict or td.batch_dims < 1:
        return None
    entries: list = []
    for key, value in td.items():
        if type(key) is not str:
            return None
        if type(value) is TensorDict:
            sub = _structure(value, leaves)
            if sub is None:
                return None
            entries.append((key, sub))
        elif type(value) is torch.Tensor and not value.is_nested and value.layout == torch.strided and value.device == _CPU:
            if value.dim() < 1 or value.dtype not in STORAGE:
                return None
            entries.append((key, value.dtype, tuple(value.shape)))
            leaves.append(value)
        else:
            return None
    return tuple(td.batch_size), str(td.device) if td.device is not None else None, tuple(entries)


class _EncodePlan(NamedTuple):
    schema_bytes: bytes
    leaves: tuple[_Leaf, ...]


_PLANS_KEPT = 64
_encode_plans: OrderedDict[tuple, _EncodePlan] = OrderedDict()
"""Structure key + object columns' fields + meta_info entries -> plan, the last made kept."""
_plans_lock = threading.Lock()


def _buffer(t: torch.Tensor) -> pa.Buffer:
    nbytes = t.numel() * t.element_size()
    return pa.foreign_buffer(t.data_ptr(), nbytes, base=t) if nbytes else pa.py_buffer(b"")


def _tensor_state(t: torch.Tensor, leaf: _Leaf) -> tuple:
    """What :func:`array_state` gives for the column :func:`~arrow_dataproto._tensors.encode_tensor` makes of ``t``."""
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    t = t.contiguous()  # autograd is no matter: only the memory is read
    rows = t.shape[0]
    if not leaf.listed:
        return rows, 0, 0, [None, _buffer(t)], []
    return rows, 0, 0, [None], [(rows * leaf.width, 0, 0, [None, _buffer(t)], [])]


def fast_state(data: Any) -> tuple[bytes, int, list[tuple]] | None:
    """:func:`batch_state` of :func:`~arrow_dataproto._codec.to_arrow` of ``data``, the same
    state, for a DataProto (or TensorDict) whose batch holds only dense CPU tensors; ``None``
    for any other (the caller encodes it through ``to_arrow``). Copies what ``to_arrow``
    copies (non-contiguous tensors), nothing else. :class:`EncodeError` as ``to_arrow``."""
    batch, non_tensor, meta_info = parts_of(data)
    leaves: list[torch.Tensor] = []
    structure = None if batch is None else _structure(batch, leaves)
    if batch is None or structure is None:
        return None
    rows = batch.batch_size[0]
    arrays, object_key = [], []
    for name, values in non_tensor.items():
        if type(name) is not str:
            return None
        array, field_meta = _objects.encode_column(name, values)
        arrays.append(array)
        object_key.append((name, array.type, tuple(field_meta.items()), len(array)))
    meta_entries = _meta_info.encode_meta_info(meta_info)
    key = (structure, tuple(object_key), tuple(meta_entries.items()))
    plan = _encode_plans.get(key)
    if plan is None:
        state = batch_state(to_arrow(data))  # every check of the encoder, once per key
        plan = _EncodePlan(state[0], tuple(_dense_leaf(t) for t in leaves))  # type: ignore[misc]
        if len(plan.schema_bytes) <= _CACHED_SCHEMA_BYTES:
            with _plans_lock:  # Ray serializes on several threads
                _encode_plans[key] = plan
                while len(_encode_plans) > _PLANS_KEPT:
                    _encode_plans.popitem(last=False)
        return state
    columns = [_tensor_state(t, leaf) for t, leaf in zip(leaves, plan.leaves)]
    columns += [array_state(a) for a in arrays]
    return plan.schema_bytes, rows, columns


# ---------------------------------------------------------------- decode plans


class _Dense(NamedTuple):
    """A dense tensor column as the encoder writes it."""

    name: str
    dtype: torch.dtype
    row_shape: tuple[int, ...]
    listed: bool
    width: int  # stored values a row
    itemsize: int  # bytes a stored value
    device: str | None


class _DecodePlan(NamedTuple):
    tree: Node
    dense: tuple[_Dense, ...]
    objects: pa.Schema  # the fields of the non_tensor_batch columns
    object_metadata: tuple
    metadata: dict


def _plan_of(schema: pa.Schema) -> _DecodePlan | None:
    """The decode plan of one of our schemas whose tensor columns are all dense, else ``None``."""
    if is_foreign(schema):
        return None
    metadata = check_schema(schema)
    if PORTABLE in metadata:
        return None
    tree = Node.parse(metadata)
    if tree is None:
        return None
    names = schema.names
    leaf_names = tree.leaf_names()
    if names[: len(leaf_names)] != leaf_names:
        return None
    parsed = columns_of(schema)
    dense = []
    for i, name in enumerate(leaf_names):
        spec = parsed.tensor_spec(i)
        storage = STORAGE[spec.dtype]
        if spec.kind != "tensor" or None in spec.shape:
            return None
        row_shape = tuple(int(n) for n in spec.shape)  # type: ignore[arg-type]
        listed = row_shape != () or storage.pair != 1
        expected = (
            pa.fixed_shape_tensor(storage.arrow_type, list(row_shape) + [2] * (storage.pair == 2))
            if listed
            else storage.arrow_type
        )
        if schema.field(i).type != expected:
            return None
        width = math.prod(row_shape) * storage.pair
        raw = storage.arrow_type.storage_type if isinstance(storage.arrow_type, pa.BaseExtensionType) else storage.arrow_type
        dense.append(_Dense(name, spec.dtype, row_shape, listed, width, raw.bit_width // 8, spec.device))
    n = len(leaf_names)
    objects = pa.schema(list(schema)[n:])
    return _DecodePlan(tree, tuple(dense), objects, parsed.metadata[n:], metadata)


@lru_cache(maxsize=64)
def _plan(schema_bytes: bytes) -> _DecodePlan | None:
    try:
        return _plan_of(_read_schema(schema_bytes))
    except (DecodeError, pa.ArrowException, OSError, TypeError, ValueError, KeyError):
        return None  # the full path raises what it raises for it


def _parts(state: Any, length: int, buffers: int, children: int) -> tuple | None:
    """``(buffers, children)`` of a column state of exactly ``length`` values at offset 0,
    without nulls or a validity bitmap, with ``buffers`` buffers and ``children`` children;
    ``None`` for any other state."""
    if type(state) is not tuple or len(state) != 5:
        return None
    count, nulls, offset, found, kids = state
    if not (type(count) is type(nulls) is type(offset) is int and count == length and offset == 0 and -1 <= nulls <= 0):
        return None
    if type(found) not in (list, tuple) or len(found) != buffers or found[0] is not None:
        return None
    if type(kids) not in (list, tuple) or len(kids) != children:
        return None
    return found, kids


def _dense_tensor(column: _Dense, state: Any, rows: int, views: dict[int, pa.Buffer]) -> torch.Tensor | None:
    """The tensor of one dense column state, viewing its buffer, or ``None`` where the
    state is not exactly what the plan expects (the layout the encoder writes, a buffer
    holding at least the bytes of the shape)."""
    values = rows * column.width
    if column.listed:
        outer = _parts(state, rows, 1, 1)
        found = None if outer is None else _parts(outer[1][0], values, 2, 0)
    else:
        found = _parts(state, values, 2, 0)
    if found is None:
        return None
    buffer = found[0][1]
    buffer = views.get(id(buffer), buffer)
    count = values * column.itemsize // column.dtype.itemsize
    if count == 0:
        return torch.empty((rows, *column.row_shape), dtype=column.dtype)
    try:
        memory = memoryview(buffer)
        if memory.ndim != 1 or memory.format not in ("b", "B"):
            memory = memory.cast("B")
        tensor = torch.frombuffer(memory, dtype=column.dtype, count=count)
    except (TypeError, ValueError, BufferError, RuntimeError):  # not a buffer, a strided one, too short
        return None
    if tensor.data_ptr() % column.dtype.itemsize:  # torch crashes on misaligned complex128
        tensor = torch.frombuffer(memory, dtype=torch.uint8, count=count * column.dtype.itemsize).clone().view(column.dtype)
    return tensor.view(rows, *column.row_shape)


def fast_parts(
    schema_bytes: Any, num_rows: Any, columns: Any, *, device: str | None, copy: bool, private: bool
) -> Parts | None:
    """The parts :func:`~arrow_dataproto._codec.decode` gives for :func:`batch_from_state` of
    this state (with ``allow_pickle=True``), for a state whose tensor columns the plan of its
    schema proves; ``None`` otherwise (the caller takes the full path, which validates
    everything and raises :class:`DecodeError` for a malformed state). Tensors view the
    buffers (``private``: copy-on-write views or copies of them; ``copy``: copies), placed
    on ``device`` or as recorded."""
    if type(schema_bytes) is not bytes or len(schema_bytes) > _CACHED_SCHEMA_BYTES:
        return None
    if type(num_rows) is not int or type(columns) is not list:
        return None
    plan = _plan(schema_bytes)
    if plan is None or len(columns) != len(plan.dense) + len(plan.objects):
        return None
    if plan.tree.batch_size[0] != num_rows:
        return None
    views: dict[int, pa.Buffer] = {}
    if private:
        try:
            views = _shm.private_views_by_id([b for c in columns for b in state_buffers(c)])
        except (TypeError, ValueError, BufferError):
            return None
    with warnings.catch_warnings():  # a read-only buffer: the receive options' contract
        warnings.simplefilter("ignore", UserWarning)
        tensors = []
        for column, state in zip(plan.dense, columns):
            tensor = _dense_tensor(column, state, num_rows, views)
            if tensor is None:
                return None
            tensors.append(tensor)
    n = len(plan.dense)
    try:
        object_batch = record_batch_of(
            [_column(f, c, views) for f, c in zip(plan.objects, columns[n:])], plan.objects, num_rows
        )
    except (pa.ArrowException, OSError, TypeError, ValueError):  # DecodeError too: the full path says which
        return None
    validate_arrow(object_batch)
    placement = Placement(device)
    placed = [placement.place(tensor, column.device, copy) for column, tensor in zip(plan.dense, tensors)]
    non_tensor = {}
    for i, field in enumerate(plan.objects):
        values = _objects.decode_column(field.name, object_batch.column(i), plan.object_metadata[i], allow_pickle=True)
        non_tensor[field.name] = values.copy() if copy and values.dtype != object else values
    meta_info = _meta_info.decode_meta_info(plan.metadata, allow_pickle=True)
    batch = unflatten(plan.tree, iter(placed), placement)
    placement.warn()
    return Parts(batch, non_tensor, meta_info)

