"""Arrow IPC files and stream files as their metadata describes them, with pyarrow and numpy
alone (no torch: what the command line's ``inspect`` reads).

:func:`read_layout` gives each batch's rows, schema metadata (batch size, tree, ``meta_info``),
the bytes each column's buffers take stored and decompressed, and the row lengths of list-like
columns, from the footer or the message headers, the 8 bytes in front of each compressed
buffer and the offsets buffers alone; every offset is checked against the file first.
The IPC framing it reads by (footer, message headers, stream index) is :mod:`arrow_dataproto._ipc`.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .. import _checksum, _limits
from .._format import (
    CHECKSUMS,
    COMPRESSION,
    DEVICE,
    DTYPE,
    KEY_PREFIX,
    KIND,
    ROW_SHAPE,
    SHAPE,
    TENSOR_KINDS,
    check_field_names,
    check_schema,
    text_metadata,
)
from .._ipc import CONTINUATION, MAGIC, FlatTable, block_header, file_blocks, header_codec, header_rows, open_regular, read_scalar, scan_stream
from ..errors import DecodeError

# ---------------------------------------------------------------- layout from the IPC metadata


@dataclass(frozen=True)
class BatchLayout:
    """One record batch of a file as its IPC metadata describes it (see :func:`read_layout`).

    ``compression`` is the codec of its buffers (``"lz4"``, ``"zstd"`` or None);
    ``stored_bytes`` and ``raw_bytes`` map each column to the bytes its buffers take in
    the file and once decompressed (equal in an uncompressed file); ``row_lengths`` maps
    each list-like column (jagged and strided tensors, lists of objects) to the length of
    each of its rows (int64 array); ``metadata`` is the batch's schema metadata (batch
    size, TensorDict tree, ``meta_info``).
    """

    rows: int
    compression: str | None
    metadata: dict[str, str]
    stored_bytes: dict[str, int]
    raw_bytes: dict[str, int]
    row_lengths: dict[str, np.ndarray]


@dataclass(frozen=True)
class FileLayout:
    """A file as its IPC metadata describes it (see :func:`read_file_layout`): its ``schema``,
    footer metadata (``{}`` for a stream), whether it is a ``stream`` file, and each batch."""

    schema: pa.Schema
    footer: dict[str, str]
    stream: bool
    batches: list[BatchLayout]


def read_layout(path: str | os.PathLike, *, row_lengths: bool = True) -> list[BatchLayout]:
    """Each batch's row count, metadata, per-column stored and raw sizes and row lengths,
    from the file's footer (an IPC file) or message headers (an IPC stream file), without
    decompressing or decoding values.

    Reads only the IPC metadata, 8 bytes in front of each compressed buffer (its
    uncompressed size), and, if ``row_lengths``, the offsets buffer of each list-like
    column (decompressing that buffer alone). Every offset and length is checked against
    the file before anything is read. Raises :class:`DecodeError` for a file that is not
    Arrow, names another format, is corrupt or holds a column type it cannot size
    (:func:`layout_readable`). Needs pyarrow and numpy only (no torch).
    """
    return read_file_layout(path, row_lengths=row_lengths).batches


def read_file_layout(path: str | os.PathLike, *, row_lengths: bool = True) -> FileLayout:
    """:func:`read_layout` with the file's schema, footer metadata and kind."""
    with os.fdopen(open_regular(path), "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise DecodeError(f"{path}: empty file")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    # not closed here: pyarrow buffers over it may outlive this call (an error's traceback); freed with them
    footer_metadata: dict[str, str] = {}
    stream = data[: len(CONTINUATION)] == CONTINUATION
    if stream:
        index = scan_stream(pa.py_buffer(data), str(path))
        schema, blocks, footer_start = index.schema, index.blocks, len(data)
    else:
        if data[: len(MAGIC)] != MAGIC or len(data) < 2 * len(MAGIC) + 6 or data[-len(MAGIC):] != MAGIC:
            raise DecodeError(f"{path}: not a complete Arrow IPC file (no ARROW1 magic at both ends)")
        try:
            reader = pa.ipc.open_file(pa.py_buffer(data))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DecodeError(f"{path}: corrupt Arrow file footer: {e}") from e
        schema = reader.schema
        footer_metadata = text_metadata(reader.metadata)
        try:
            blocks, footer_start = file_blocks(data)
        except DecodeError as e:
            raise DecodeError(f"{path}: {e}") from None
    if any(key.startswith(KEY_PREFIX) for key in text_metadata(schema.metadata)):
        check_schema(schema)
    else:
        check_field_names(schema)
    fields = [(field.name, *_field_layout(field.type)) for field in schema]
    schema_metadata = text_metadata(schema.metadata)
    layouts = []
    for i, block in enumerate(blocks):
        offset, meta_length, body_length = block
        body = offset + meta_length
        try:
            message, header = block_header(data, block, footer_start)
            codec = header_codec(header)
            rows = header_rows(header)
        except DecodeError as e:
            raise DecodeError(f"{path}: batch {i}: {e}") from None
        nodes = header.structs(1, 16)
        buffers = header.structs(2, 16)
        if len(nodes) != sum(f[1] for f in fields) or len(buffers) != sum(f[2] for f in fields):
            raise DecodeError(f"{path}: batch {i}: its buffers do not match the schema")
        spans = [struct.unpack_from("<qq", data, at) for at in buffers]
        if any(o < 0 or n < 0 or o + n > body_length or (codec and 0 < n < 8) for o, n in spans):
            raise DecodeError(f"{path}: batch {i}: a buffer lies outside the batch")

        def raw_size(o: int, n: int) -> int:
            if codec is None or n == 0:
                return n
            size = read_scalar(data, "<q", body + o, body + o + n)
            if size < -1:
                raise DecodeError(f"{path}: batch {i}: negative uncompressed size")
            return n - 8 if size == -1 else size

        stored, raw, lengths = {}, {}, {}
        node, buffer = 0, 0
        for name, n_field_nodes, n_field_buffers, list_at in fields:
            own = spans[buffer:buffer + n_field_buffers]
            stored[name] = sum(n for _, n in own)
            raw[name] = sum(raw_size(o, n) for o, n in own)
            if row_lengths and list_at is not None:
                list_node, list_buffer, width = list_at
                # field nodes are in pre-order: the list's own node, then its values' node
                length, values = (struct.unpack_from("<q", data, nodes[node + list_node + k])[0] for k in (0, 1))
                o, n = own[list_buffer]
                where = f"{path}: batch {i}: column {name!r}"
                lengths[name] = _row_lengths(data, body + o, n, raw_size(o, n), codec, length, width, where, values)
            node += n_field_nodes
            buffer += n_field_buffers
        metadata = message.key_values(4) or schema_metadata  # as FileReader reads it
        layouts.append(BatchLayout(rows, codec, metadata, stored, raw, lengths))
    return FileLayout(schema, footer_metadata, stream, layouts)


def verify_checksums(path: str | os.PathLike, *, max_decoded_bytes: _limits.MaxDecoded = "auto") -> tuple[int, int, int]:
    """Check the structure of an IPC file or stream file, and every buffer of every batch
    against the checksums it was written with (``FileWriter(checksums=True)``), with pyarrow
    alone; returns ``(batches, buffers checked, batches without checksums)``.

    The structure: the footer against the file's messages (an IPC file), each batch's size
    (at most ``max_decoded_bytes`` decoded, checked from its header before anything is
    decompressed) and Arrow's full validation of each batch. A batch written without
    checksums passes with these checks alone (it is counted as such). :class:`DecodeError`
    names the batch, column and buffer that differ, or what is malformed.
    """
    with os.fdopen(open_regular(path), "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise DecodeError(f"{path}: empty file")
        data = pa.py_buffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    layout = read_file_layout(path, row_lengths=False)  # the structure, checked
    schema = layout.schema
    if any(pa.types.is_dictionary(field.type) for field in schema):
        raise DecodeError(f"{path}: dictionary-encoded columns, not a file of ours with checksums")
    try:
        if layout.stream:
            blocks = scan_stream(data, str(path)).blocks
        else:
            blocks = check_footer(data, schema, layout.footer, f"{path}: the footer")
    except (pa.ArrowException, OSError, ValueError, EOFError) as e:
        if isinstance(e, DecodeError):
            raise
        raise DecodeError(f"{path}: corrupt Arrow file: {e}") from e
    schema_text = _checksum.schema_text(schema)
    allowed = _limits.limit(max_decoded_bytes, data.size)
    schema_metadata = text_metadata(schema.metadata)
    checked = unchecked = 0
    for i, block in enumerate(blocks):
        where = f"{path}: batch {i}"
        try:
            _limits.check(_limits.block_decoded_bytes(data, block), allowed, where)
            offset, meta_length, body_length = block
            message = pa.ipc.read_message(data.slice(offset, meta_length + body_length))
            batch = pa.ipc.read_record_batch(message, schema)
            batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError, EOFError) as e:
            if isinstance(e, DecodeError):
                raise
            raise DecodeError(f"{where} is corrupt: {e}") from e
        metadata = FlatTable.root(memoryview(message.metadata)).key_values(4) or schema_metadata  # as FileReader reads it
        recorded = metadata.get(CHECKSUMS)
        if recorded is None:
            unchecked += 1
            continue
        checked += _checksum.verify(batch, recorded, where, i, schema_text, metadata)
    return len(blocks), checked, unchecked


def check_footer(data: pa.Buffer, schema: pa.Schema, footer_metadata: dict[str, str], where: str) -> list:
    """Check what the footer of an IPC file (``data``, whose footer gave ``schema`` and
    ``footer_metadata``) says against the messages before it: the same batches at the same
    places (none left out, none twice), the same schema as the file's first message, the
    compression its batches use. Reads the message headers only; returns the footer's blocks.
    :class:`DecodeError` for any disagreement."""
    try:
        blocks, _ = file_blocks(memoryview(data))
    except (pa.ArrowException, OSError, ValueError, IndexError) as e:
        raise DecodeError(f"{where} is corrupt: {e}") from None
    scanned = scan_stream(data.slice(len(MAGIC) + 2), where)  # the magic is padded to 8 bytes
    if [(offset - 8, meta, body) for offset, meta, body in blocks] != scanned.blocks:
        raise DecodeError(f"{where} does not list the file's {len(scanned.blocks)} record batches as they lie")
    if not scanned.schema.equals(schema, check_metadata=True):
        raise DecodeError(f"{where}'s schema differs from the schema at the start of the file")
    recorded = footer_metadata.get(COMPRESSION)
    if recorded is not None and recorded != (scanned.compression or "none"):
        raise DecodeError(f"{where} records compression {recorded!r}, its batches use {scanned.compression or 'none'!r}")
    return blocks


def layout_readable(t: pa.DataType) -> bool:
    """Whether :func:`read_layout` can size a column of Arrow type ``t`` from the IPC
    metadata alone (every type this library writes; not the view types of other tools,
    whose buffer count varies from batch to batch)."""
    try:
        _field_layout(t)
        return True
    except DecodeError:
        return False


def _field_layout(t: pa.DataType) -> tuple[int, int, tuple[int, int, int] | None]:
    """(nodes, buffers, list) of a column of type ``t`` in an IPC record batch; ``list`` is
    ``(node, buffer, offset width)`` of the list whose offsets give its row lengths, or None."""
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pa.types.is_null(t):
        return 1, 0, None
    if pa.types.is_map(t):  # a list of struct<key, value> entries
        key, item = _field_layout(t.key_type), _field_layout(t.item_type)
        return 2 + key[0] + item[0], 3 + key[1] + item[1], (0, 1, 4)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        nodes, buffers, _ = _field_layout(t.value_type)
        return 1 + nodes, 2 + buffers, (0, 1, 8 if pa.types.is_large_list(t) else 4)
    if pa.types.is_fixed_size_list(t):
        nodes, buffers, _ = _field_layout(t.value_type)
        return 1 + nodes, 1 + buffers, None
    if pa.types.is_struct(t):
        children = [_field_layout(t.field(k).type) for k in range(t.num_fields)]
        first = children[0][2] if children and t.field(0).name == "data" else None  # a strided tensor's rows
        list_at = None if first is None else (1 + first[0], 1 + first[1], first[2])
        return 1 + sum(c[0] for c in children), 1 + sum(c[1] for c in children), list_at
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return 1, 3, None
    if pa.types.is_dictionary(t) or pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return 1, 2, None
    raise DecodeError(f"Arrow type {t} is not one arrow-dataproto writes")


def _row_lengths(
    data: mmap.mmap, at: int, stored: int, raw: int, codec: str | None, rows: int, width: int, where: str, values: int
) -> np.ndarray:
    """The row lengths of a list column of ``rows`` rows whose offsets buffer is at ``at``
    and whose values array has ``values`` entries (the offsets must stay inside it)."""
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    need = (rows + 1) * width
    if rows < 0 or not need <= raw <= need + 64:
        raise DecodeError(f"{where}: its offsets buffer holds {raw} bytes for {rows} rows")
    if codec is None or read_scalar(data, "<q", at, at + stored) == -1:
        skip = 0 if codec is None else 8
        offsets = np.frombuffer(data[at + skip:at + skip + need], dtype=f"<i{width}")
    else:
        try:
            plain = pa.decompress(data[at + 8:at + stored], decompressed_size=raw, codec=codec)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DecodeError(f"{where}: cannot decompress its offsets: {e}") from e
        offsets = np.frombuffer(plain, dtype=f"<i{width}", count=rows + 1)
    lengths = np.diff(offsets).astype(np.int64)
    if rows and (offsets[0] < 0 or (lengths < 0).any()):
        raise DecodeError(f"{where}: its offsets are not increasing")
    if rows and offsets[-1] > values:
        raise DecodeError(f"{where}: its offsets end at {offsets[-1]}, past its {values} values")
    return lengths


@dataclass(frozen=True)
class ColumnInfo:
    """One column as recorded in a file's schema (no data is read).

    ``kind`` is ``"tensor"``, ``"jagged"`` or ``"strided"`` for TensorDict leaves and
    ``"numeric"``, ``"string"``, ``"object"``, ``"json"`` or ``"pickle"`` for ``non_tensor_batch``
    columns; ``dtype`` the torch dtype name (leaves) or numpy dtype (others); ``shape``
    the shape of one row, ``None`` for a ragged dimension; ``device`` where a leaf was
    when written (``None`` for non-tensor columns). A column of another tool's file has
    ``kind`` ``"arrow"``, its Arrow type as ``dtype`` and ``shape`` None (what it decodes
    to follows the rule of :func:`~arrow_dataproto.from_arrow`).
    """

    name: str
    kind: str
    dtype: str
    shape: list | None
    device: str | None

    @property
    def is_tensor(self) -> bool:
        return self.kind in TENSOR_KINDS

    @classmethod
    def from_field(cls, field: pa.Field) -> "ColumnInfo":
        meta = text_metadata(field.metadata)
        if KIND not in meta:  # another tool's column: its Arrow type (the rule of from_arrow reads it)
            return cls(field.name, "arrow", str(field.type), None, None)
        kind = meta.get(KIND, "?")
        dtype = meta.get(DTYPE, "?")
        shape_text = meta.get(SHAPE if kind in TENSOR_KINDS else ROW_SHAPE, "null")
        try:
            shape = json.loads(shape_text)
        except (ValueError, RecursionError):
            shape = shape_text
        if kind not in TENSOR_KINDS:
            try:  # "<i8" -> "int64", "|O" -> "object"; a structured dtype's JSON stays as it is
                dtype = str(np.dtype(dtype))
            except (TypeError, ValueError):
                pass
        return cls(field.name, kind, dtype, shape, meta.get(DEVICE))
