"""Arrow IPC framing read with pyarrow and the standard library alone (no torch, no numpy).

The constants of the format (:data:`MAGIC`, :data:`CONTINUATION`, :data:`END_OF_STREAM`,
:data:`CODECS`), :func:`open_regular` (a file opened for reading only if it is a regular
file), :class:`FlatTable` (the one flatbuffer reader: every offset checked against the bytes
it reads), :func:`file_blocks` (an IPC file's footer), :func:`message_header` /
:func:`block_header` / :func:`header_codec` (a record batch's header) and :func:`scan_stream`
(an IPC stream's batches, from one pass over its message headers). Every malformed input
raises :class:`~arrow_dataproto.errors.DecodeError`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from .errors import DataProtoError, DecodeError

MAGIC = b"ARROW1"
"""What starts and ends an Arrow IPC file."""
CONTINUATION = b"\xff\xff\xff\xff"
"""What starts every Arrow IPC message (and the end-of-stream marker)."""
END_OF_STREAM = CONTINUATION + b"\x00\x00\x00\x00"
"""What ends an Arrow IPC stream: a message of no metadata."""
CODECS = {0: "lz4", 1: "zstd"}
"""The compression codecs of the IPC format (``CompressionType``), by number."""

Block = tuple[int, int, int]
"""A record batch's place in a file, as a footer lists it: (offset, metadata length, body length)."""


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


# ---------------------------------------------------------------- a bounds-checked flatbuffer reader


def read_scalar(data: Any, fmt: str, at: int, end: int | None = None) -> int:
    """The little-endian scalar ``fmt`` at ``at``, which must lie in ``data[:end]``
    (:class:`DecodeError` otherwise)."""
    limit = len(data) if end is None else min(end, len(data))
    if at < 0 or at + struct.calcsize(fmt) > limit:
        raise DecodeError("corrupt Arrow IPC metadata (an offset points outside it)")
    return struct.unpack_from(fmt, data, at)[0]


class FlatTable:
    """A flatbuffer table at ``at`` of a buffer whose flatbuffer lies in ``data[start:end]``;
    fields by slot number, every offset checked to stay inside (:class:`DecodeError`)."""

    def __init__(self, data: Any, at: int, start: int, end: int):
        self.data, self.at, self.start, self.end = data, at, start, end
        self.vtable = at - read_scalar(data, "<i", at, end)
        if self.vtable < start:
            raise DecodeError("corrupt Arrow IPC metadata (a vtable points outside it)")
        self.vtable_size = read_scalar(data, "<H", self.vtable, end)

    @classmethod
    def root(cls, data: Any, start: int = 0, end: int | None = None) -> "FlatTable":
        """The root table of the flatbuffer in ``data[start:end]`` (``end`` None: to the end)."""
        end = len(data) if end is None else end
        return cls(data, start + read_scalar(data, "<I", start, end), start, end)

    def _field(self, slot: int) -> int:
        entry = 4 + 2 * slot
        return read_scalar(self.data, "<H", self.vtable + entry, self.end) if entry + 2 <= self.vtable_size else 0

    def _target(self, at: int) -> int:
        """Where the offset stored at ``at`` points."""
        return at + read_scalar(self.data, "<I", at, self.end)

    def scalar(self, slot: int, fmt: str, default: int = 0) -> int:
        field = self._field(slot)
        return read_scalar(self.data, fmt, self.at + field, self.end) if field else default

    def table(self, slot: int) -> "FlatTable | None":
        field = self._field(slot)
        return FlatTable(self.data, self._target(self.at + field), self.start, self.end) if field else None

    def structs(self, slot: int, size: int) -> range:
        """The positions of the items (structs of ``size`` bytes, or 4-byte offsets) of a
        vector field; empty if the field is absent."""
        field = self._field(slot)
        if not field:
            return range(0)
        at = self._target(self.at + field)
        count = read_scalar(self.data, "<I", at, self.end)
        if at + 4 + count * size > self.end:
            raise DecodeError("corrupt Arrow IPC metadata (a vector runs past its end)")
        return range(at + 4, at + 4 + count * size, size)

    def _string(self, at: int) -> str:
        at = self._target(at)
        size = read_scalar(self.data, "<I", at, self.end)
        if at + 4 + size > self.end:
            raise DecodeError("corrupt Arrow IPC metadata (a string runs past its end)")
        return bytes(self.data[at + 4 : at + 4 + size]).decode("utf-8", errors="replace")

    def key_values(self, slot: int) -> dict[str, str]:
        """A ``[KeyValue]`` vector field (custom metadata) as a dict."""
        out = {}
        for item in self.structs(slot, 4):
            entry = FlatTable(self.data, self._target(item), self.start, self.end)
            key, value = entry._field(0), entry._field(1)
            out[entry._string(entry.at + key) if key else ""] = entry._string(entry.at + value) if value else ""
        return out


# ---------------------------------------------------------------- messages and footers
# Message: version(0) header_type(1) header(2) bodyLength(3) custom_metadata(4); header types:
# 2 dictionary batch, 3 record batch. RecordBatch: length(0) nodes(1) buffers(2) compression(3).
# Footer: version(0) schema(1) dictionaries(2) recordBatches(3).


def message_header(data: Any, start: int = 0, end: int | None = None) -> tuple[FlatTable, FlatTable | None]:
    """The ``Message`` flatbuffer in ``data[start:end]`` (an IPC message's metadata) and its
    record batch header (None for another kind of message)."""
    message = FlatTable.root(data, start, end)
    header = message.table(2)
    return message, header if message.scalar(1, "<B") == 3 else None


def header_codec(header: FlatTable) -> str | None:
    """The compression codec of a record batch header (None: uncompressed);
    :class:`DecodeError` for a codec the format does not define."""
    compression = header.table(3)
    if compression is None:
        return None
    codec = CODECS.get(compression.scalar(0, "<b"))
    if codec is None:
        raise DecodeError("unknown compression codec")
    return codec


def file_blocks(data: Any) -> tuple[list[Block], int]:
    """The record batch blocks an Arrow IPC file's footer lists, and where the footer starts
    (``data`` is known to end with :data:`MAGIC`). The blocks are not checked against the
    file: :func:`block_header` does that."""
    end = len(data) - len(MAGIC) - 4
    start = end - read_scalar(data, "<i", end)
    if start < 8 or start >= end:
        raise DecodeError("corrupt Arrow file footer")
    footer = FlatTable.root(data, start, end)
    # Block: offset int64, metaDataLength int32 (+4 padding), bodyLength int64
    blocks = []
    for at in footer.structs(3, 24):
        offset, meta_length, _, body_length = struct.unpack_from("<qiiq", data, at)
        blocks.append((offset, meta_length, body_length))
    return blocks, start


def block_header(data: Any, block: Block, end: int | None = None) -> tuple[FlatTable, FlatTable]:
    """The ``Message`` flatbuffer and record batch header of the file block ``block``, read in
    place (nothing of the body); :class:`DecodeError` if the block does not lie in
    ``data[8:end]`` or is not a record batch."""
    offset, meta_length, body_length = block
    end = len(data) if end is None else end
    if offset < 8 or meta_length < 8 or body_length < 0 or offset + meta_length + body_length > end:
        raise DecodeError("a record batch lies outside the file")
    prefix = 8 if bytes(data[offset : offset + 4]) == CONTINUATION else 4  # (before format 0.15: no marker)
    message, header = message_header(data, offset + prefix, offset + meta_length)
    if header is None:
        raise DecodeError("a footer block is not a record batch")
    return message, header


def header_rows(header: FlatTable) -> int:
    """The number of rows a record batch header records; :class:`DecodeError` if negative."""
    rows = header.scalar(0, "<q")
    if rows < 0:
        raise DecodeError("a record batch of a negative number of rows")
    return rows


# ---------------------------------------------------------------- streams


@dataclass(frozen=True)
class StreamIndex:
    """Where the record batches of an IPC stream file lie, from one pass over its message
    headers (nothing decompressed): ``blocks`` as a file footer lists them (offset,
    metadata length, body length), each batch's rows and custom metadata, whether the stream
    holds dictionaries (then batches are read in order) and its compression."""

    schema: pa.Schema
    blocks: list[Block]
    rows: list[int]
    custom: list[dict[str, str] | None]
    dictionaries: bool
    compression: str | None


@contextlib.contextmanager
def extension_errors(where: str, keep: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Around a pyarrow call that reads a schema: a registered extension type's
    ``__arrow_ext_deserialize__`` runs on the bytes and may raise anything, which becomes a
    :class:`DecodeError` naming ``where``. The library's own errors, ``MemoryError`` and the
    types in ``keep`` pass through."""
    passing: tuple[type[BaseException], ...] = (DataProtoError, MemoryError, *keep)
    try:
        yield
    except passing:
        raise
    except Exception as e:  # noqa: BLE001 -- whatever an extension type's deserializer raises
        raise DecodeError(f"{where}: {type(e).__name__} while reading its schema: {e}") from e


def scan_stream(data: pa.Buffer, where: str) -> StreamIndex:
    """The :class:`StreamIndex` of an IPC stream; :class:`DecodeError` if a message is cut
    short or corrupt. The stream ends at its end-of-stream marker or at the end of the file
    (a writer that stopped between two messages)."""
    position = pa.BufferReader(data)
    blocks, rows, custom, codecs = [], [], [], set()
    dictionaries = False
    with extension_errors(where):
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
                    custom.append(table.key_values(4) or None)
                else:
                    raise DecodeError(f"unexpected {message.type} message at byte {start}")
        except (pa.ArrowException, OSError, ValueError, EOFError) as e:  # DecodeError is a ValueError
            raise DecodeError(f"{where}: an Arrow IPC stream cut short or corrupt: {e}") from e
    if any(n < 0 for n in rows):
        raise DecodeError(f"{where}: a record batch of a negative number of rows")
    compression = next(iter(codecs - {None}), None)
    return StreamIndex(schema, blocks, rows, custom, dictionaries, compression)
