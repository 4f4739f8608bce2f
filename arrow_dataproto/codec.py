"""DataProto <-> Arrow RecordBatch <-> Arrow IPC stream.

A DataProto becomes one RecordBatch with a row per sample: first one column
per TensorDict leaf (depth-first, in key order; nested keys are joined with
``.``), then one column per ``non_tensor_batch`` entry. The schema metadata
holds the format name and version, the batch size, the device, the shape of
the TensorDict tree and ``meta_info``; each column's metadata holds its torch
dtype, per-row shape, layout and device. ``docs/format.md`` is the full spec.

Encoding and decoding cost metadata only: no tensor byte is copied unless a
tensor is non-contiguous, off the CPU, or the caller asks for a copy.
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from typing import Any

import pyarrow as pa
import torch
from tensordict import TensorDict, is_non_tensor, is_tensor_collection

from . import objects
from .errors import DecodeError, EncodeError, FormatVersionError, column_error
from .tensors import DEVICE, decode_tensor, encode_tensor

FORMAT_NAME = "arrow-dataproto"
FORMAT_VERSION = (1, 0)
"""Major.minor. A reader accepts any minor of its own major and refuses other majors."""

_FORMAT = "adp.format"
_VERSION = "adp.version"
_BATCH_SIZE = "adp.batch_size"
_DEVICE = "adp.device"
_TREE = "adp.tree"

COMPRESSIONS = (None, "lz4", "zstd")


# ---------------------------------------------------------------- input


def _parts(data: Any) -> tuple[TensorDict | None, dict, dict]:
    """``(batch, non_tensor_batch, meta_info)`` of a DataProto (ours or verl's) or a TensorDict."""
    if is_tensor_collection(data):
        return data, {}, {}
    try:
        return data.batch, dict(data.non_tensor_batch or {}), dict(data.meta_info or {})
    except AttributeError:
        raise EncodeError(
            f"expected a DataProto (batch, non_tensor_batch, meta_info) or a TensorDict, got {type(data).__name__}"
        ) from None


def _flatten(td: TensorDict, prefix: str, columns: list[tuple[str, torch.Tensor]]) -> list:
    """Append ``td``'s leaves to ``columns`` and return its tree (see :func:`_unflatten`)."""
    tree: list = []
    for key, value in td.items():
        name = f"{prefix}{key}"
        if is_non_tensor(value):
            raise EncodeError(f"column {name!r}: non-tensor data in the TensorDict; put it in non_tensor_batch")
        if is_tensor_collection(value):
            device = None if value.device is None else str(value.device)
            tree.append([key, list(value.batch_size), device, _flatten(value, f"{name}.", columns)])
        else:
            tree.append(key)
            columns.append((name, value))
    return tree


# ---------------------------------------------------------------- encode


def to_arrow(data: Any) -> pa.RecordBatch:
    """Encode a DataProto (ours or verl's) or a bare TensorDict as a RecordBatch.

    Zero-copy: contiguous CPU tensors are exported as views of their memory (the
    RecordBatch keeps them alive, and shows later in-place writes). A slice of a
    larger tensor exports only its own rows. Non-contiguous or off-CPU tensors
    are copied once. Raises :class:`EncodeError` for unsupported content.
    """
    batch, non_tensor, meta_info = _parts(data)
    columns: list[tuple[str, torch.Tensor]] = []
    metadata = {_FORMAT: FORMAT_NAME, _VERSION: "%d.%d" % FORMAT_VERSION}
    if batch is None:
        metadata.update({_BATCH_SIZE: "null", _DEVICE: "null", _TREE: "[]"})
    else:
        if batch.batch_dims < 1:
            raise EncodeError("the TensorDict needs at least one batch dimension (rows)")
        metadata[_BATCH_SIZE] = json.dumps(list(batch.batch_size))
        metadata[_DEVICE] = json.dumps(None if batch.device is None else str(batch.device))
        metadata[_TREE] = json.dumps(_flatten(batch, "", columns))
    metadata.update(objects.encode_meta_info(meta_info))

    fields, arrays = [], []
    for name, tensor in columns:
        array, field_meta = encode_tensor(name, tensor)
        fields.append(pa.field(name, array.type, nullable=False, metadata=field_meta))
        arrays.append(array)
    for name, values in non_tensor.items():
        array, field_meta = objects.encode_column(str(name), values)
        fields.append(pa.field(str(name), array.type, metadata=field_meta))
        arrays.append(array)

    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise EncodeError(f"duplicate column names {duplicates} (a key both in batch and non_tensor_batch?)")
    rows = {len(a) for a in arrays}
    if len(rows) > 1:
        raise EncodeError(f"columns disagree on the number of rows: {sorted(rows)}")
    if batch is not None and rows and rows != {batch.batch_size[0]}:
        raise EncodeError(f"non_tensor_batch has {sorted(rows)} rows, the batch {batch.batch_size[0]}")
    num_rows = batch.batch_size[0] if batch is not None else (rows.pop() if rows else 0)
    return record_batch_of(arrays, pa.schema(fields, metadata=metadata), num_rows)


def record_batch_of(arrays: list[pa.Array], schema: pa.Schema, num_rows: int) -> pa.RecordBatch:
    """A RecordBatch of ``arrays``; with no columns it still has ``num_rows`` rows
    (the row count of an empty TensorDict matters), built in constant memory."""
    if arrays:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    no_fields = pa.Array.from_buffers(pa.struct([]), num_rows, [None], children=[])
    return pa.RecordBatch.from_struct_array(no_fields).replace_schema_metadata(schema.metadata)


def to_ipc(data: Any, *, compression: str | None = None) -> pa.Buffer:
    """Encode as one Arrow IPC stream (schema + one record batch) in a new buffer.

    Writing the stream copies every byte once (it is one contiguous buffer):
    uncompressed streams are sized first and written into one exact allocation,
    never regrown. ``compression`` is ``None``, ``"lz4"`` or ``"zstd"`` (per buffer).
    """
    if compression not in COMPRESSIONS:
        raise EncodeError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    record_batch = to_arrow(data)
    options = pa.ipc.IpcWriteOptions(compression=compression, allow_64bit=True)

    def write(sink) -> None:
        with pa.ipc.new_stream(sink, record_batch.schema, options=options) as writer:
            writer.write_batch(record_batch)

    if compression is not None:  # sizing would compress twice: let the buffer grow instead
        sink = pa.BufferOutputStream()
        write(sink)
        return sink.getvalue()
    sizer = pa.MockOutputStream()
    write(sizer)
    buffer = pa.allocate_buffer(sizer.size())
    write(pa.FixedSizeBufferWriter(buffer))
    return buffer


# ---------------------------------------------------------------- decode


def check_format(schema: pa.Schema) -> dict[str, str]:
    """The schema's metadata as ``str -> str``, after checking the format name and major version.

    Raises :class:`DecodeError` when the schema is not ours, and
    :class:`FormatVersionError` when its major version is not this library's.
    """
    metadata = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in (schema.metadata or {}).items()}
    if metadata.get(_FORMAT) != FORMAT_NAME:
        raise DecodeError(f"not an {FORMAT_NAME} payload (schema metadata {_FORMAT!r} is {metadata.get(_FORMAT)!r})")
    version = metadata.get(_VERSION, "")
    major, _, minor = version.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise DecodeError(f"malformed format version {version!r}")
    if int(major) != FORMAT_VERSION[0]:
        raise FormatVersionError(
            f"format version {version} is not readable by this version of arrow-dataproto, "
            f"which reads {FORMAT_VERSION[0]}.x"
        )
    try:
        _field_names(list(schema))
    except UnicodeDecodeError as e:  # a corrupt payload
        raise DecodeError(f"column names are not valid UTF-8: {e}") from None
    return metadata


def _field_names(fields: list[pa.Field]) -> None:
    """Read the name of every field, nested ones too (pyarrow decodes names on access)."""
    for field in fields:
        kind = field.type.storage_type if isinstance(field.type, pa.BaseExtensionType) else field.type
        field.name  # pyarrow decodes the name here: UnicodeDecodeError if it is not UTF-8
        _field_names([kind.field(i) for i in range(kind.num_fields)])


def _json(metadata: dict[str, str], key: str) -> Any:
    try:
        return json.loads(metadata[key])
    except KeyError:
        raise DecodeError(f"schema metadata lacks {key!r}") from None
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise DecodeError(f"schema metadata {key!r} is not valid JSON: {e!r}") from None


def _count_leaves(tree: Any) -> int:
    if not isinstance(tree, list):
        raise DecodeError("malformed TensorDict tree in the schema metadata")
    count = 0
    for entry in tree:
        if isinstance(entry, str):
            count += 1
        elif (
            isinstance(entry, list)
            and len(entry) == 4
            and isinstance(entry[0], str)
            and isinstance(entry[1], list)
            and (entry[2] is None or isinstance(entry[2], str))
        ):
            count += _count_leaves(entry[3])
        else:
            raise DecodeError(f"malformed TensorDict tree entry {entry!r}")
    return count


def _leaf_names(tree: list, prefix: str = "") -> list[str]:
    """The column names :func:`to_arrow` gives the leaves of a tree that passed :func:`_count_leaves`."""
    names: list[str] = []
    for entry in tree:
        if isinstance(entry, str):
            names.append(prefix + entry)
        else:
            names += _leaf_names(entry[3], f"{prefix}{entry[0]}.")
    return names


def _check_offsets(name: str, array: pa.Array) -> None:
    """What Arrow's full validation skips (pyarrow 26): a negative offset, and a fixed_size_list
    whose values end before its offset + length. Either would let a view read outside the
    buffers; only hand-built arrays (``Array.from_buffers``: a pickled state) can have them."""
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    kind = array.type
    if array.offset < 0:
        raise column_error(DecodeError, name, f"negative array offset {array.offset}")
    if pa.types.is_fixed_size_list(kind) and len(array.values) < (array.offset + len(array)) * kind.list_size:
        raise column_error(DecodeError, name, "fixed_size_list values end before its offset + length")
    if pa.types.is_struct(kind):
        children = [array.field(i) for i in range(kind.num_fields)]
    elif pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        children = [array.values]
    else:
        children = []
    for child in children:
        _check_offsets(name, child)


@lru_cache(maxsize=None)
def _available(device: str) -> bool:
    try:
        return torch.empty(0, device=device).device.type != "meta"  # meta tensors would drop the data
    except (RuntimeError, AssertionError, ValueError):
        return False


class _Placement:
    """Where decoded tensors go: ``device=`` if given, else the recorded device, else the CPU (one warning)."""

    def __init__(self, override: str | torch.device | None):
        self.override = None if override is None else torch.device(override)
        self.missing: set[str] = set()

    def __call__(self, recorded: str | None) -> torch.device | None:
        if self.override is not None:
            return self.override
        if recorded is None:
            return None
        if _available(recorded):
            return torch.device(recorded)
        self.missing.add(recorded)
        return torch.device("cpu")

    def warn(self) -> None:
        if self.missing:
            warnings.warn(
                f"recorded device(s) {sorted(self.missing)} not available here; tensors were placed on the CPU",
                RuntimeWarning,
                stacklevel=3,
            )


def from_arrow(
    record_batch: pa.RecordBatch,
    *,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
):
    """Rebuild a :class:`~arrow_dataproto.DataProto` from a RecordBatch made by :func:`to_arrow`.

    Zero-copy by default: CPU tensors (and numeric numpy columns) view the
    RecordBatch's buffers, so they are only as writable as that memory, and
    writes show in every other view of it. ``copy=True`` gives tensors that own
    their memory. ``device`` (like ``map_location``) places every tensor there
    (one copy each); otherwise each goes to its recorded device, or to the CPU
    with one ``RuntimeWarning`` if this process lacks it.

    Pickled non-tensor columns or ``meta_info`` are refused with
    :class:`PickleNotAllowedError` unless ``allow_pickle=True``: only allow
    pickles from a trusted source. Every length, offset and shape is checked
    against the buffers before a tensor is built; a malformed batch raises
    :class:`DecodeError`, an unknown major version :class:`FormatVersionError`.
    """
    from .protocol import DataProto

    if not isinstance(record_batch, pa.RecordBatch):
        raise DecodeError(f"expected a pyarrow.RecordBatch, got {type(record_batch).__name__}")
    metadata = check_format(record_batch.schema)
    batch_size, td_device, tree = (_json(metadata, k) for k in (_BATCH_SIZE, _DEVICE, _TREE))
    leaves = _count_leaves(tree)
    if leaves > record_batch.num_columns:
        raise DecodeError(f"the tree names {leaves} tensor columns, the batch has {record_batch.num_columns}")
    names = record_batch.schema.names
    if names[:leaves] != _leaf_names(tree):
        raise DecodeError(f"the tensor columns {names[:leaves]} are not the tree's leaves {_leaf_names(tree)}")
    if len(set(names)) != len(names):
        raise DecodeError(f"duplicate column names {sorted({n for n in names if names.count(n) > 1})}")
    try:
        record_batch.validate(full=True)
    except pa.ArrowException as e:
        raise DecodeError(f"invalid Arrow data: {e}") from e
    for name, column in zip(names, record_batch.columns):
        _check_offsets(name, column)
    placement = _Placement(device)
    fields = record_batch.schema

    def field_meta(i: int) -> dict[str, str]:
        return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in (fields[i].metadata or {}).items()}

    tensors = []
    for i in range(leaves):
        name, meta = fields[i].name, field_meta(i)
        tensor = decode_tensor(name, record_batch.column(i), meta)
        target = placement(meta.get(DEVICE))
        if target is not None and target.type != "cpu":
            tensor = tensor.to(target)
        elif copy and tensor.is_nested and tensor.layout == torch.jagged:  # its clone() shares the offsets
            tensor = torch.nested.nested_tensor_from_jagged(
                tensor.values().clone(), tensor.offsets().clone(), jagged_dim=tensor._ragged_idx
            )
        elif copy:
            tensor = tensor.clone()
        tensors.append(tensor)

    non_tensor = {}
    for i in range(leaves, record_batch.num_columns):
        name = fields[i].name
        values = objects.decode_column(name, record_batch.column(i), field_meta(i), allow_pickle=allow_pickle)
        non_tensor[name] = values.copy() if copy and values.dtype != object else values
    meta_info = objects.decode_meta_info(metadata, allow_pickle=allow_pickle)

    if batch_size is None:
        batch = None
    else:
        if not (isinstance(batch_size, list) and batch_size and all(isinstance(n, int) and n >= 0 for n in batch_size)):
            raise DecodeError(f"malformed batch_size {batch_size!r}")
        if batch_size[0] != record_batch.num_rows:
            raise DecodeError(f"batch_size {batch_size} disagrees with the {record_batch.num_rows} rows present")
        if td_device is not None and not isinstance(td_device, str):
            raise DecodeError(f"malformed device {td_device!r}")
        batch = _unflatten(tree, batch_size, td_device, iter(tensors), placement)
    placement.warn()
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta_info)


def _unflatten(tree: list, batch_size: list[int], device: str | None, tensors, placement: _Placement) -> TensorDict:
    """Rebuild a TensorDict from its tree: a list whose entries are a leaf's key, or
    ``[key, batch_size, device, subtree]`` for a nested TensorDict."""
    content: dict[str, Any] = {}
    for entry in tree:
        if isinstance(entry, str):
            content[entry] = next(tensors)
        else:
            key, sub_size, sub_device, subtree = entry
            content[key] = _unflatten(subtree, sub_size, sub_device, tensors, placement)
    try:
        return TensorDict(content, batch_size=batch_size, device=placement(device))
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise DecodeError(f"tensors do not fit batch_size {batch_size}: {e}") from e


def from_ipc(
    buffer: Any,
    *,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
):
    """Decode an Arrow IPC stream written by :func:`to_ipc` (``pa.Buffer``, bytes-like, or memoryview).

    Zero-copy for uncompressed streams: tensors view ``buffer`` itself, which
    stays alive as long as they do. Do not write to them unless the buffer is
    yours and writable (a ``bytes`` object is not), or pass ``copy=True``.
    Compressed streams are decompressed into new memory. Other arguments and
    errors as in :func:`from_arrow`; a stream holding several record batches is
    concatenated (a copy).
    """
    from .protocol import DataProto

    try:
        source = buffer if isinstance(buffer, pa.Buffer) else pa.py_buffer(buffer)
        reader = pa.ipc.open_stream(source)
        batches = list(reader)
    except (pa.ArrowException, OSError, TypeError, ValueError) as e:  # pyarrow raises OSError for corrupt messages
        raise DecodeError(f"not a readable Arrow IPC stream: {e}") from e
    if not batches:
        raise DecodeError("the IPC stream holds no record batch")
    parts = [from_arrow(b, device=device, copy=copy, allow_pickle=allow_pickle) for b in batches]
    return parts[0] if len(parts) == 1 else DataProto.concat(parts, meta_info="update")

