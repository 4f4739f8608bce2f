"""The codec: DataProto parts <-> Arrow RecordBatch <-> Arrow IPC stream.

A DataProto becomes one RecordBatch with a row per sample: first one column
per TensorDict leaf (depth-first, in key order; nested keys are joined with
``.``), then one column per ``non_tensor_batch`` entry. The metadata is
written and read through :mod:`arrow_dataproto._format`; each column through
its kind in :mod:`arrow_dataproto._tensors` or :mod:`arrow_dataproto._objects`.
``docs/format.md`` is the full spec.

This module knows nothing of the container class: :func:`decode` returns the
three parts (:class:`Parts`), and :mod:`arrow_dataproto._decoding` wraps them in a
:class:`~arrow_dataproto.DataProto`.

Encoding and decoding cost metadata only: no tensor byte is copied unless a
tensor is non-contiguous, off the CPU, or the caller asks for a copy.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import replace
from functools import lru_cache
from typing import Any, Iterable, Iterator, NamedTuple

import pyarrow as pa
import torch
from tensordict import TensorDict, is_non_tensor, is_tensor_collection

from . import _foreign, _jagged, _limits, _meta_info, _objects, _portable, _restore
from ._compat import ragged_idx
from ._format import (
    COMPRESSIONS,
    KIND,
    META_INFO,
    META_INFO_ENCODING,
    Node,
    TensorSpec,
    check_field_names,
    check_schema,
    columns_of,
    is_foreign,
    newer_version_rule,
    repeated,
    schema_metadata,
)
from ._ipc import MAGIC, extension_errors
from ._tensors import decode_tensor, encode_tensor
from ._validate import validate_arrow
from .errors import ColumnNotFoundError, DecodeError, EncodeError, OptionError, column_error, not_found


class Parts(NamedTuple):
    """The three fields of a DataProto."""

    batch: TensorDict | None
    non_tensor_batch: dict
    meta_info: dict


# ---------------------------------------------------------------- encode


def parts_of(data: Any) -> Parts:
    """``(batch, non_tensor_batch, meta_info)`` of a DataProto (ours or verl's) or a TensorDict."""
    if is_tensor_collection(data):
        return Parts(data, {}, {})
    try:
        return Parts(data.batch, dict(data.non_tensor_batch or {}), dict(data.meta_info or {}))
    except AttributeError:
        raise EncodeError(
            f"expected a DataProto (batch, non_tensor_batch, meta_info) or a TensorDict, got {type(data).__name__}"
        ) from None


def _flatten(td: Any, key: str, prefix: str, columns: list[tuple[str, Any]]) -> Node:
    """``td``'s tree; its leaves are appended to ``columns`` in column order."""
    entries: list = []
    for sub_key, value in td.items():
        name = f"{prefix}{sub_key}"
        if is_non_tensor(value):
            raise EncodeError(f"column {name!r}: non-tensor data in the TensorDict; put it in non_tensor_batch")
        if is_tensor_collection(value):
            entries.append(_flatten(value, sub_key, f"{name}.", columns))
        else:
            entries.append(sub_key)
            columns.append((name, value))
    device = None if td.device is None else str(td.device)
    return Node(key, tuple(td.batch_size), device, tuple(entries))


@contextlib.contextmanager
def _utf8_only(name: str) -> Iterator[None]:
    """Arrow text is UTF-8: a lone surrogate in a column's name or strings is an EncodeError."""
    try:
        yield
    except UnicodeEncodeError as e:
        raise column_error(EncodeError, name, f"text that is not valid UTF-8 ({e.reason}: {e.object[e.start:e.end]!r})") from None


def to_arrow(data: Any, *, portable: bool = False) -> pa.RecordBatch:
    """Encode a DataProto (ours or verl's) or a bare TensorDict as a RecordBatch.

    Zero-copy: contiguous CPU tensors are exported as views of their memory (the
    RecordBatch keeps them alive, and shows later in-place writes). A slice of a
    larger tensor exports only its own rows. Non-contiguous or off-CPU tensors
    are copied once. Raises :class:`EncodeError` for unsupported content.

    ``portable=True`` gives the portable view instead (``docs/format.md``): plain Arrow
    types that pandas, polars, DuckDB and HF ``datasets`` read as values (bfloat16,
    float16 and float8 widened to float32, bools as Arrow bools, tensors as nested
    fixed-size lists, JSON as strings). It copies the columns whose values change (a
    widened column takes twice or four times the memory); :func:`from_arrow` and every
    reader give the DataProto back bit-exact from either form.
    """
    batch, non_tensor, meta_info = parts_of(data)
    columns: list[tuple[str, Any]] = []
    if batch is not None and batch.batch_dims < 1:
        raise EncodeError("the TensorDict needs at least one batch dimension (rows)")
    tree = None if batch is None else _flatten(batch, "", "", columns)
    metadata = schema_metadata(tree, _meta_info.encode_meta_info(meta_info))

    fields, arrays = [], []
    structures: dict[int, tuple[torch.Tensor, str]] = {}  # id(offsets) -> (offsets, first column)
    for name, tensor in columns:
        with _utf8_only(name):
            array, spec = encode_tensor(name, tensor)
            if _jagged.is_jagged(tensor) and tensor.lengths() is None:
                offsets = tensor.offsets()
                shared = structures.setdefault(id(offsets), (offsets, name))
                if shared[1] != name:  # the same ragged structure as an earlier column
                    spec = replace(spec, offsets_of=shared[1])
            fields.append(pa.field(name, array.type, nullable=False, metadata=spec.metadata()))
        arrays.append(array)
    for name, values in non_tensor.items():
        with _utf8_only(str(name)):
            array, field_meta = _objects.encode_column(str(name), values)
            fields.append(pa.field(str(name), array.type, metadata=field_meta))
        arrays.append(array)

    duplicates = repeated(f.name for f in fields)
    if duplicates:
        raise EncodeError(f"columns {duplicates}: duplicate column names (a key both in batch and non_tensor_batch?)")
    rows = {len(a) for a in arrays}
    if len(rows) > 1:
        raise EncodeError(f"columns disagree on the number of rows: {sorted(rows)}")
    if batch is not None and rows and rows != {batch.batch_size[0]}:
        raise EncodeError(f"non_tensor_batch has {sorted(rows)} rows, the batch {batch.batch_size[0]}")
    num_rows = batch.batch_size[0] if batch is not None else (rows.pop() if rows else 0)
    record_batch = record_batch_of(arrays, pa.schema(fields, metadata=metadata), num_rows)
    return _portable.to_portable(record_batch) if portable else record_batch


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


def check_device(device: str | torch.device) -> torch.device:
    """:class:`OptionError` unless ``device`` names a device of this process (``cpu``
    and ``meta`` always do; ``cuda:1`` needs two CUDA devices); the parsed device. The one check
    of a device asked for: receive options and every decode's ``device=``."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise OptionError(f"device {device!r} is not a torch device: {e}") from None
    if parsed.type in ("cpu", "meta"):
        return parsed
    backend = getattr(torch, parsed.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise OptionError(f"device {device!r}: this process has no {parsed.type} device")
    count = getattr(backend, "device_count", None)
    if parsed.index is not None and count is not None and parsed.index >= count():
        raise OptionError(f"device {device!r}: this process has {count()} {parsed.type} device(s)")
    return parsed


@lru_cache(maxsize=None)
def device_available(device: str) -> bool:
    """Whether this process can hold tensors on ``device`` (``"cuda:1"``...)."""
    try:
        return torch.empty(0, device=device).device.type != "meta"  # meta tensors would drop the data
    except Exception:  # RuntimeError, AssertionError, ModuleNotFoundError ("privateuseone")...
        return False


class Placement:
    """Where decoded tensors go: ``device=`` if given, else the recorded device, else the CPU (one warning)."""

    def __init__(self, override: str | torch.device | None):
        self.override = None if override is None else check_device(override)
        self.missing: set[str] = set()

    def __call__(self, recorded: str | None) -> torch.device | None:
        if self.override is not None:
            return self.override
        if recorded is None:
            return None
        if device_available(recorded):
            return torch.device(recorded)
        self.missing.add(recorded)
        return torch.device("cpu")

    def warn(self) -> None:
        if self.missing:
            warnings.warn(
                f"recorded device(s) {sorted(self.missing)} not available here; tensors were placed on the CPU",
                RuntimeWarning,
                stacklevel=4,
            )

    def place(self, tensor: torch.Tensor, recorded: str | None, copy: bool) -> torch.Tensor:
        """A decoded ``tensor`` (recorded on ``recorded``) on its device: moved off the CPU if
        that is where it goes, else itself, or a private copy with ``copy`` (a jagged tensor's
        values and offsets both copied)."""
        target = self(recorded)
        if target is not None and target.type != "cpu":
            return tensor.to(target)
        if copy:
            return _jagged.clone(tensor) if _jagged.is_jagged(tensor) else tensor.clone()
        return tensor


def unflatten(node: Node, tensors: Iterator[torch.Tensor], placement: Placement) -> TensorDict:
    """The TensorDict of ``node``, its leaves taken from ``tensors`` in column order."""
    content: dict[str, Any] = {}
    for entry in node.entries:
        if isinstance(entry, str):
            content[entry] = next(tensors)
        else:
            content[entry.key] = unflatten(entry, tensors, placement)
    try:
        return TensorDict(content, batch_size=list(node.batch_size), device=placement(node.device))
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise DecodeError(f"tensors do not fit batch_size {list(node.batch_size)}: {e}") from e


def as_record_batch(data: Any, *, validated: bool = False) -> pa.RecordBatch:
    """One RecordBatch of ``data``: a ``pa.RecordBatch`` as it is; a ``pa.Table`` (or a
    ``pa.RecordBatchReader``, or any object exporting an Arrow stream through
    ``__arrow_c_stream__``: a polars DataFrame, a DuckDB relation) as the one batch of its
    rows. Zero-copy for a Table whose columns each have at most one chunk; the columns of
    several chunks are concatenated (a copy), each chunk validated first unless
    ``validated`` (the caller put every chunk through ``validate_arrow``).
    :class:`DecodeError` for anything else."""
    if isinstance(data, pa.RecordBatch):
        return data
    try:
        if isinstance(data, pa.RecordBatchReader):
            data = data.read_all()
        elif not isinstance(data, pa.Table) and hasattr(data, "__arrow_c_stream__"):
            data = pa.table(data)
        if not isinstance(data, pa.Table):
            raise DecodeError(f"expected a pyarrow.RecordBatch or Table, got {type(data).__name__}")
        columns = [
            c.chunk(0) if c.num_chunks == 1 else c.combine_chunks() if validated else _combined(name, c)
            for name, c in zip(data.column_names, data.columns)
        ]
        return record_batch_of(columns, data.schema, data.num_rows)
    except (pa.ArrowException, OSError, TypeError, ValueError) as e:
        if isinstance(e, DecodeError):
            raise
        raise DecodeError(f"cannot read the table as one record batch: {e}") from e


def _combined(name: str, column: pa.ChunkedArray) -> pa.Array:
    """The chunks of ``column`` as one array, each chunk validated first: concatenating the
    chunks of a damaged stream would read past their buffers before the validation gate."""
    try:
        column.validate(full=True)
    except pa.ArrowException as e:
        raise column_error(DecodeError, name, f"invalid Arrow data: {e}") from e
    return column.combine_chunks()


def _narrowed(record_batch: pa.RecordBatch, columns: Iterable[str] | None, rows: tuple[int, int] | None) -> pa.RecordBatch:
    """The batch with only ``columns`` (in its order) and rows ``start:stop`` (zero-copy)."""
    if columns is not None:
        keep = set(columns)
        names = record_batch.schema.names
        missing = sorted(keep - set(names))
        if missing:
            raise not_found(ColumnNotFoundError, "column", missing, "the batch", names)
        if len(keep) < len(names):
            record_batch = record_batch.select([i for i, n in enumerate(names) if n in keep])
    if rows is not None:
        start, stop = rows
        record_batch = record_batch.slice(start, stop - start)
    return record_batch


def _present(record_batch: pa.RecordBatch, tree: Node) -> tuple[pa.RecordBatch, Node]:
    """The tree of the columns present, their leaves first: what another tool left of our
    table after selecting or reordering its columns (``pyarrow.dataset``'s ``columns=``)."""
    names = record_batch.schema.names
    present = set(names)
    if not present.issuperset(tree.leaf_names()):
        tree = tree.select(present)
    leaves = tree.leaf_names()
    if names[: len(leaves)] != leaves:
        position = {n: i for i, n in enumerate(names)}
        chosen = set(leaves)
        record_batch = record_batch.select([position[n] for n in leaves] + [i for i, n in enumerate(names) if n not in chosen])
    return record_batch, tree


def decode(
    record_batch: pa.RecordBatch,
    *,
    columns: Iterable[str] | None = None,
    rows: tuple[int, int] | None = None,
    meta_info: bool = True,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
    schema: pa.Schema | None = None,
    validated: bool = False,
) -> Parts:
    """The three parts of a DataProto from a RecordBatch made by :func:`to_arrow`, or of any
    other tool (:mod:`arrow_dataproto._foreign`: its schema metadata has no ``adp.*`` key).

    ``schema``: the original schema of ours (:func:`arrow_dataproto._restore.original_schema`)
    another tool's batch came from: its columns are read back as stored
    (:func:`arrow_dataproto._restore.restore`). Without it, another tool's columns that
    look like our stored forms raise one :class:`~arrow_dataproto._restore.StoredFormWarning`.

    ``validated``: the caller already put ``record_batch`` through ``validate_arrow``
    (a reader does, before it reads sizes): it is not validated again. Otherwise it is,
    once, before any value is read.

    ``columns``: decode only these (exact column names, see
    :func:`~arrow_dataproto._format.resolve_columns`; the batch may already hold only them); ``rows``: only rows ``start:stop`` (a zero-copy slice);
    ``meta_info=False``: leave ``meta_info`` empty, decoding none of it. The first batch
    dimension of every TensorDict of the tree is the number of rows present (a filtered,
    sliced or concatenated table decodes), and the tree holds the columns present, in any
    order (another tool's projection). Other arguments, copies and errors as in
    :func:`arrow_dataproto.from_arrow`.
    """
    if not isinstance(record_batch, pa.RecordBatch):
        raise DecodeError(f"expected a pyarrow.RecordBatch, got {type(record_batch).__name__}")
    foreign = is_foreign(record_batch.schema)
    if foreign:  # narrowed first: the rule looks at the rows and columns read, nothing else
        check_field_names(record_batch.schema)
        record_batch = _narrowed(record_batch, columns, rows)
        if not validated:
            validate_arrow(record_batch)
        # restore and adopt build their arrays with pyarrow from the validated ones: valid as built
        validated = True
        if schema is not None:  # the way back: our metadata from the original schema
            record_batch = _restore.restore(record_batch, schema)
            foreign = False
        else:
            suspects = _restore.suspects(record_batch)
            if suspects:
                warnings.warn(_restore.suspects_message(suspects), _restore.StoredFormWarning, stacklevel=4)
            record_batch = _foreign.adopt(record_batch)
        columns = rows = None
    metadata = check_schema(record_batch.schema)
    with newer_version_rule(metadata):  # what this reader does not know, in a newer minor version
        tree = Node.parse(metadata)
        record_batch = _narrowed(record_batch, columns, rows)
        if tree is not None:
            if columns is not None:
                tree = tree.select(set(columns))
            tree = tree.with_rows(record_batch.num_rows)

        leaf_names = [] if tree is None else tree.leaf_names()
        names = record_batch.schema.names
        if tree is not None and columns is None:
            record_batch, tree = _present(record_batch, tree)
            leaf_names, names = tree.leaf_names(), record_batch.schema.names
        if len(leaf_names) > record_batch.num_columns:
            raise DecodeError(f"the tree names {len(leaf_names)} tensor columns, the batch has {record_batch.num_columns}")
        if names[: len(leaf_names)] != leaf_names:
            raise DecodeError(f"the tensor columns {names[:len(leaf_names)]} are not the tree's leaves {leaf_names}")
        if not validated:  # a batch narrowed (select, slice) after validation stays valid
            validate_arrow(record_batch)
        record_batch = _portable.from_portable(record_batch)  # a portable batch: back to the stored types
        placement = Placement(device)
        fields = record_batch.schema
        parsed = columns_of(fields)

        tensors, specs = [], []
        for i, name in enumerate(leaf_names):
            spec = parsed.tensor_spec(i)
            specs.append(spec)
            tensors.append(placement.place(decode_tensor(name, record_batch.column(i), spec), spec.device, copy))

        non_tensor = {}
        for i in range(len(leaf_names), record_batch.num_columns):
            name = fields[i].name
            field_metadata = parsed.metadata[i]
            if foreign and KIND not in field_metadata:
                values = _foreign.decode_column(name, record_batch.column(i))
            else:
                values = _objects.decode_column(name, record_batch.column(i), field_metadata, allow_pickle=allow_pickle)
            non_tensor[name] = values.copy() if copy and values.dtype != object else values
        if not meta_info:
            metadata = {k: v for k, v in metadata.items() if k not in (META_INFO, META_INFO_ENCODING)}
        decoded_meta_info = _meta_info.decode_meta_info(metadata, allow_pickle=allow_pickle)

        _share_offsets(leaf_names, specs, tensors)
        batch = None if tree is None else unflatten(tree, iter(tensors), placement)
        placement.warn()
    return Parts(batch, non_tensor, decoded_meta_info)


def _share_offsets(names: list[str], specs: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
    """Give each jagged column recorded as sharing an earlier column's ragged structure
    (``adp.offsets_of``) that column's offsets tensor, so that the two combine (``a * b``)
    as they did when encoded. A column keeps its own offsets when they differ from its
    partner's (a later batch of a file, whose field metadata is the first batch's, may not
    share) or when its partner was not decoded (a column subset): sharing is never believed
    beyond what the bytes show."""
    index = {name: i for i, name in enumerate(names)}
    for i, spec in enumerate(specs):
        j = index.get(spec.offsets_of) if spec.offsets_of is not None else None
        if j is None:
            continue
        if j >= i or specs[j].kind != "jagged":
            raise column_error(DecodeError, names[i], f"adp.offsets_of names {spec.offsets_of!r}, not an earlier jagged column")
        values, offsets = _jagged.parts(tensors[i])
        shared = _jagged.parts(tensors[j])[1]
        if offsets.shape != shared.shape or not torch.equal(offsets, shared.to(offsets.device)):
            continue
        tensors[i] = _jagged.build(values.to(shared.device), shared, ragged_idx(tensors[i]))


def read_stream(buffer: Any, max_decoded_bytes: _limits.MaxDecoded = "auto") -> list[pa.RecordBatch]:
    """The record batches of an Arrow IPC stream (``pa.Buffer``, bytes-like, or memoryview),
    zero-copy over ``buffer`` unless compressed; :class:`DecodeError` if there are none, or
    if decompressing would exceed ``max_decoded_bytes`` (see :mod:`arrow_dataproto._limits`;
    checked from the message headers before anything is decompressed)."""
    try:
        source = buffer if isinstance(buffer, pa.Buffer) else pa.py_buffer(buffer)
    except (BufferError, TypeError, ValueError) as e:  # a non-contiguous memoryview, not bytes-like
        raise DecodeError(f"not a readable Arrow IPC stream: {type(e).__name__}: {e}") from e
    if source.size >= len(MAGIC) and source.slice(0, len(MAGIC)).to_pybytes() == MAGIC:
        raise DecodeError(
            "not an Arrow IPC stream but an Arrow IPC file (it starts with the file magic ARROW1): "
            "read it with arrow_dataproto.files.read_file(path) or files.open_file(path)"
        )
    allowed = _limits.limit(max_decoded_bytes, source.size)
    with extension_errors("not a readable Arrow IPC stream"):
        try:
            if allowed is not None:
                _limits.check(_limits.stream_decoded_bytes(source), allowed, "the IPC stream")
            reader = pa.ipc.open_stream(source)
            batches = list(reader)
        except (pa.ArrowException, OSError, TypeError, ValueError, EOFError) as e:  # OSError: corrupt messages
            if isinstance(e, DecodeError):
                raise
            raise DecodeError(f"not a readable Arrow IPC stream: {e}") from e
    if not batches:
        raise DecodeError("the IPC stream holds no record batch")
    return batches
