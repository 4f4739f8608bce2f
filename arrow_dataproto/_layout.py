"""Arrow IPC files and stream files as their metadata describes them, with pyarrow and numpy
alone (no torch: what the command line's ``inspect`` reads).

:func:`read_layout` gives each batch's rows, schema metadata (batch size, tree, ``meta_info``),
the bytes each column's buffers take stored and decompressed, and the row lengths of list-like
columns, from the footer or the message headers, the 8 bytes in front of each compressed
buffer and the offsets buffers alone; every offset is checked against the file first.
:func:`scan_stream` indexes the record batches of an IPC stream from one pass over its
message headers (what :mod:`arrow_dataproto.files` reads stream files by);
:func:`open_regular` refuses FIFOs and devices without blocking.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from . import _checksum, _limits
from ._format import (
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
from .errors import DecodeError

MAGIC = b"ARROW1"
"""What starts and ends an Arrow IPC file."""


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of ``path`` if it is a regular file; :class:`DecodeError` for a
    FIFO, socket, device or folder, which is never opened for reading (a FIFO would block).

    The open itself does not block (``O_NONBLOCK``, dropped once the file is known to be
    regular); ``FileNotFoundError``/``PermissionError`` as ``open`` raises them.
    """
    nonblock = getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, os.O_RDONLY | nonblock | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DecodeError(f"{path}: not a regular file (a FIFO, device, socket or folder)")
        if nonblock:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
CODECS = {0: "lz4", 1: "zstd"}
"""The compression codecs of the IPC format (``CompressionType``), by number."""


def message_header(metadata: Any) -> tuple["FlatTable", "FlatTable | None"]:
    """The ``Message`` flatbuffer of an IPC message's metadata and its record batch header
    (None for another kind of message)."""
    message = FlatTable.root(metadata, 0, len(metadata))
    header = message.table(2)
    return message, header if message.scalar(1, "<B") == 3 else None  # MessageHeader.RecordBatch


def header_codec(header: "FlatTable") -> str | None:
    compression = header.table(3)
    if compression is None:
        return None
    codec = CODECS.get(compression.scalar(0, "<b"))
    if codec is None:
        raise DecodeError("unknown compression codec")
    return codec


@dataclass(frozen=True)
class StreamIndex:
    """Where the record batches of an IPC stream file lie, from one pass over its message
    headers (nothing decompressed): ``blocks`` as a file footer lists them (offset,
    metadata length, body length), each batch's rows and custom metadata, whether the stream
    holds dictionaries (then batches are read in order) and its compression."""

    schema: pa.Schema
    blocks: list[tuple[int, int, int]]
    rows: list[int]
    custom: list[dict[str, str] | None]
    dictionaries: bool
    compression: str | None


def scan_stream(data: pa.Buffer, where: str) -> StreamIndex:
    """The :class:`StreamIndex` of an IPC stream; :class:`DecodeError` if a message is cut
    short or corrupt. The stream ends at its end-of-stream marker or at the end of the file
    (a writer that stopped between two messages)."""
    position = pa.BufferReader(data)
    blocks, rows, custom, codecs = [], [], [], set()
    dictionaries = False
    try:
        message = pa.ipc.read_message(position)
        if message.type != "schema":
            raise DecodeError("it does not start with a schema")
        schema = pa.ipc.read_schema(message)
        while position.tell() < data.size:
            start = position.tell()
            if data.slice(start, len(END_OF_STREAM)).to_pybytes() == END_OF_STREAM:
                break
            message = pa.ipc.read_message(position)
            body = 0 if message.body is None else message.body.size
            if message.type == "dictionary":
                dictionaries = True
            elif message.type == "record batch":
                table, header = message_header(memoryview(message.metadata))
                if header is None:
                    raise DecodeError(f"message at byte {start} is not a record batch")
                blocks.append((start, position.tell() - start - body, body))
                rows.append(header.scalar(0, "<q"))
                codecs.add(header_codec(header))
                kv = fb_key_values(table, 4)
                custom.append(kv or None)
            else:
                raise DecodeError(f"unexpected {message.type} message at byte {start}")
    except (pa.ArrowException, OSError, ValueError, EOFError) as e:  # DecodeError is a ValueError
        raise DecodeError(f"{where}: an Arrow IPC stream cut short or corrupt: {e}") from e
    if any(n < 0 for n in rows):
        raise DecodeError(f"{where}: a record batch of a negative number of rows")
    compression = next(iter(codecs - {None}), None)
    return StreamIndex(schema, blocks, rows, custom, dictionaries, compression)

CONTINUATION = b"\xff\xff\xff\xff"
"""What starts every Arrow IPC message (and the end-of-stream marker)."""

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
    return _read_file_layout(path, data, row_lengths)


def _read_file_layout(path: str | os.PathLike, data: mmap.mmap, row_lengths: bool) -> FileLayout:
    stream = data[: len(CONTINUATION)] == CONTINUATION
    footer_metadata: dict[str, str] = {}
    if stream:
        index = scan_stream(pa.py_buffer(data), str(path))
        schema, footer_start = index.schema, len(data)
        block_list = [(offset, meta, body) for offset, meta, body in index.blocks]
    else:
        if data[: len(MAGIC)] != MAGIC or len(data) < 2 * len(MAGIC) + 6 or data[-len(MAGIC):] != MAGIC:
            raise DecodeError(f"{path}: not a complete Arrow IPC file (no ARROW1 magic at both ends)")
        try:
            reader = pa.ipc.open_file(pa.py_buffer(data))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DecodeError(f"{path}: corrupt Arrow file footer: {e}") from e
        schema = reader.schema
        footer_metadata = text_metadata(reader.metadata)
        end = len(data) - len(MAGIC) - 4
        footer_start = end - fb_read(data, "<i", end, len(data))
        if footer_start < len(MAGIC):
            raise DecodeError(f"{path}: corrupt Arrow file footer")
        footer = FlatTable.root(data, footer_start, end)
        blocks, count = footer.vector(3, 24)
        block_list = []
        for i in range(count):
            offset, meta_length, _, body_length = struct.unpack_from("<qiiq", data, blocks + 24 * i)
            block_list.append((offset, meta_length, body_length))
    if any(key.startswith(KEY_PREFIX) for key in text_metadata(schema.metadata)):
        check_schema(schema)
    else:
        check_field_names(schema)
    fields = [(field.name, *_field_layout(field.type)) for field in schema]
    schema_metadata = text_metadata(schema.metadata)
    layouts = []
    for i, (offset, meta_length, body_length) in enumerate(block_list):
        body = offset + meta_length
        if offset < len(MAGIC) or meta_length < 8 or body_length < 0 or body + body_length > footer_start:
            raise DecodeError(f"{path}: batch {i} lies outside the file")
        start = offset + (8 if data[offset:offset + 4] == b"\xff\xff\xff\xff" else 4)
        message = FlatTable.root(data, start, body)
        header = message.table(2)
        if message.scalar(1, "<B") != 3 or header is None:  # MessageHeader.RecordBatch
            raise DecodeError(f"{path}: block {i} is not a record batch")
        compression = header.table(3)
        codec = None if compression is None else CODECS.get(compression.scalar(0, "<b"))
        if compression is not None and codec is None:
            raise DecodeError(f"{path}: batch {i}: unknown compression codec")
        rows = header.scalar(0, "<q")
        nodes_at, n_nodes = header.vector(1, 16)
        buffers_at, n_buffers = header.vector(2, 16)
        if n_nodes != sum(f[1] for f in fields) or n_buffers != sum(f[2] for f in fields):
            raise DecodeError(f"{path}: batch {i}: its buffers do not match the schema")
        spans = [struct.unpack_from("<qq", data, buffers_at + 16 * b) for b in range(n_buffers)]
        if any(o < 0 or n < 0 or o + n > body_length or (codec and 0 < n < 8) for o, n in spans):
            raise DecodeError(f"{path}: batch {i}: a buffer lies outside the batch")

        def raw_size(o: int, n: int) -> int:
            if codec is None or n == 0:
                return n
            size = fb_read(data, "<q", body + o, body + o + n)
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
                length, values = (struct.unpack_from("<q", data, nodes_at + 16 * (node + list_node + k))[0] for k in (0, 1))
                o, n = own[list_buffer]
                where = f"{path}: batch {i}: column {name!r}"
                lengths[name] = _row_lengths(data, body + o, n, raw_size(o, n), codec, length, width, where, values)
            node += n_field_nodes
            buffer += n_field_buffers
        metadata = fb_key_values(message, 4) or schema_metadata  # as FileReader reads it
        layouts.append(BatchLayout(rows, codec, metadata, stored, raw, lengths))
    return FileLayout(schema, footer_metadata, stream, layouts)


def verify_checksums(path: str | os.PathLike, *, max_decoded_bytes: _limits.MaxDecoded = "auto") -> tuple[int, int]:
    """Check every buffer of every batch of an IPC file or stream file against the checksums
    it was written with (``FileWriter(checksums=True)``), with pyarrow alone; returns
    ``(batches, buffers checked)``, as ``FileReader.verify`` does.

    Each batch may decode to at most ``max_decoded_bytes`` (checked from its header before
    anything is decompressed) and passes Arrow's full validation before its buffers are
    hashed. :class:`DecodeError` names the batch, column and buffer that differ, or a batch
    written without checksums.
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
    checked = 0
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
        table, _ = message_header(memoryview(message.metadata))
        metadata = fb_key_values(table, 4) or schema_metadata  # as FileReader reads it
        recorded = metadata.get(CHECKSUMS)
        if recorded is None:
            raise DecodeError(f"{where} has no checksums (written without checksums=True)")
        checked += _checksum.verify(batch, recorded, where, i, schema_text, metadata)
    return len(blocks), checked


def check_footer(data: pa.Buffer, schema: pa.Schema, footer_metadata: dict[str, str], where: str) -> list:
    """Check what the footer of an IPC file (``data``, whose footer gave ``schema`` and
    ``footer_metadata``) says against the messages before it: the same batches at the same
    places (none left out, none twice), the same schema as the file's first message, the
    compression its batches use. Reads the message headers only; returns the footer's blocks.
    :class:`DecodeError` for any disagreement."""
    try:
        blocks = _limits.file_blocks(data)
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
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
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
    if codec is None or fb_read(data, "<q", at, at + stored) == -1:
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


def fb_read(data: Any, fmt: str, at: int, end: int) -> int:
    """One little-endian scalar at ``at``, which must lie in ``[0, end)``."""
    if at < 0 or at + struct.calcsize(fmt) > min(end, len(data)):
        raise DecodeError("corrupt Arrow IPC metadata (an offset points outside it)")
    return struct.unpack_from(fmt, data, at)[0]


class FlatTable:
    """A flatbuffer table in ``data[start:end]``, read with every offset bounds-checked."""

    def __init__(self, data: Any, at: int, start: int, end: int):
        self.data, self.at, self.start, self.end = data, at, start, end
        self.vtable = at - fb_read(data, "<i", at, end)
        if self.vtable < start:
            raise DecodeError("corrupt Arrow IPC metadata (a vtable points outside it)")
        self.vtable_size = fb_read(data, "<H", self.vtable, end)

    @classmethod
    def root(cls, data: Any, start: int, end: int) -> "FlatTable":
        return cls(data, start + fb_read(data, "<I", start, end), start, end)

    def _field(self, slot: int) -> int:
        entry = 4 + 2 * slot
        return fb_read(self.data, "<H", self.vtable + entry, self.end) if entry + 2 <= self.vtable_size else 0

    def scalar(self, slot: int, fmt: str, default: int = 0) -> int:
        field = self._field(slot)
        return fb_read(self.data, fmt, self.at + field, self.end) if field else default

    def table(self, slot: int) -> "FlatTable | None":
        field = self._field(slot)
        if not field:
            return None
        at = self.at + field
        return FlatTable(self.data, at + fb_read(self.data, "<I", at, self.end), self.start, self.end)

    def vector(self, slot: int, item_size: int) -> tuple[int, int]:
        """Where the items of a vector start, and their count (0, 0 if absent)."""
        field = self._field(slot)
        if not field:
            return 0, 0
        at = self.at + field
        at += fb_read(self.data, "<I", at, self.end)
        count = fb_read(self.data, "<I", at, self.end)
        if at + 4 + count * item_size > self.end:
            raise DecodeError("corrupt Arrow IPC metadata (a vector runs past its end)")
        return at + 4, count

    def string(self, at: int) -> str:
        at += fb_read(self.data, "<I", at, self.end)
        size = fb_read(self.data, "<I", at, self.end)
        if at + 4 + size > self.end:
            raise DecodeError("corrupt Arrow IPC metadata (a string runs past its end)")
        return bytes(self.data[at + 4:at + 4 + size]).decode("utf-8", errors="replace")


def fb_key_values(table: FlatTable, slot: int) -> dict[str, str]:
    """A ``[KeyValue]`` custom metadata vector as a dict."""
    at, count = table.vector(slot, 4)
    out = {}
    for k in range(count):
        item = at + 4 * k
        entry = FlatTable(table.data, item + fb_read(table.data, "<I", item, table.end), table.start, table.end)
        key, value = entry._field(0), entry._field(1)
        out[entry.string(entry.at + key) if key else ""] = entry.string(entry.at + value) if value else ""
    return out


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
