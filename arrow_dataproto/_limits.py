"""Bounds on what untrusted bytes can make a decoder allocate.

Uncompressed Arrow data is decoded zero-copy: memory is the input itself. Two
things can make a small input decode into much more memory, and both are bounded
here, before anything is allocated:

- compressed buffers (lz4/zstd): each records its decoded length in its first 8
  bytes. :func:`stream_decoded_bytes` / :func:`file_decoded_bytes` add those up
  from the message headers (no decompression) so that :func:`check` can refuse a
  compression bomb;
- allocations whose size a metadata value chooses (a fixed-width string dtype):
  :func:`check` with the bytes the values were decoded from.

The rule (:func:`limit`): ``max_decoded_bytes="auto"`` (the default of every entry
point reading untrusted bytes) allows ``max(64 MiB, 256 x input bytes)``;
an int sets the limit; ``None`` lifts it (for inputs you trust).
"""

from __future__ import annotations

import struct
from typing import Union

import pyarrow as pa

from .errors import ArgumentTypeError, DecodeError

FLOOR = 64 << 20
"""Bytes any input may decode to under the ``"auto"`` limit."""
RATIO = 256
"""Under ``"auto"``, an input may also decode to this many times its own size."""

MaxDecoded = Union[int, str, None]
"""``max_decoded_bytes``: ``"auto"``, a number of bytes, or ``None`` (no limit)."""


def limit(max_decoded_bytes: MaxDecoded, input_bytes: int) -> int | None:
    """The limit in bytes for an input of ``input_bytes`` (``None``: unlimited)."""
    if max_decoded_bytes is None:
        return None
    if max_decoded_bytes == "auto":
        return max(FLOOR, RATIO * input_bytes)
    if type(max_decoded_bytes) is not int or max_decoded_bytes < 0:
        raise ArgumentTypeError(f'max_decoded_bytes must be "auto", a non-negative int or None, got {max_decoded_bytes!r}')
    return max_decoded_bytes


def check(decoded: int, allowed: int | None, what: str) -> None:
    """:class:`DecodeError` if ``decoded`` bytes exceed ``allowed``."""
    if allowed is not None and decoded > allowed:
        raise DecodeError(
            f"{what} would decode to {decoded:,} bytes, over max_decoded_bytes ({allowed:,}); "
            "pass a larger max_decoded_bytes (or None) if you trust the input"
        )


def check_allocation(allocated: int, source_bytes: int, what: str) -> None:
    """:class:`DecodeError` if a metadata-sized allocation exceeds the ``"auto"`` limit for
    the bytes it is decoded from (``max(64 MiB, 256 x source_bytes)``): memory stays
    proportional to the input whatever the metadata says."""
    allowed = max(FLOOR, RATIO * source_bytes)
    if allocated > allowed:
        raise DecodeError(
            f"{what} would take {allocated:,} bytes decoded from {source_bytes:,}: over the limit of "
            f"{allowed:,} (64 MiB or 256 times the input) for sizes chosen by metadata"
        )


# ---------------------------------------------------------------- a bounds-checked flatbuffer reader


def _unpack(fmt: str, buf: bytes | memoryview, pos: int):
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise DecodeError("corrupt Arrow IPC metadata (an offset points outside it)")
    return struct.unpack_from(fmt, buf, pos)[0]


class _Table:
    """One flatbuffer table: fields by index (scalars, sub-tables, vectors of structs)."""

    def __init__(self, buf: bytes | memoryview, pos: int):
        self.buf, self.pos = buf, pos
        self.vtable = pos - _unpack("<i", buf, pos)
        self.vtable_size = _unpack("<H", buf, self.vtable)

    def _offset(self, field: int) -> int:
        slot = 4 + 2 * field
        return _unpack("<H", self.buf, self.vtable + slot) if slot + 2 <= self.vtable_size else 0

    def scalar(self, field: int, fmt: str, default: int) -> int:
        offset = self._offset(field)
        return _unpack(fmt, self.buf, self.pos + offset) if offset else default

    def table(self, field: int) -> "_Table | None":
        offset = self._offset(field)
        if not offset:
            return None
        at = self.pos + offset
        return _Table(self.buf, at + _unpack("<I", self.buf, at))

    def structs(self, field: int, size: int) -> list[int]:
        """Positions of the structs of a vector field (empty if absent)."""
        offset = self._offset(field)
        if not offset:
            return []
        at = self.pos + offset
        start = at + _unpack("<I", self.buf, at)
        count = _unpack("<I", self.buf, start)
        if start + 4 + count * size > len(self.buf):
            raise DecodeError("corrupt Arrow IPC metadata (a vector runs past its end)")
        return [start + 4 + i * size for i in range(count)]


def _root(buf: bytes | memoryview) -> _Table:
    return _Table(buf, _unpack("<I", buf, 0))


# Message: version(0) header_type(1) header(2) bodyLength(3); header types: 2 dictionary batch, 3 record batch.
# RecordBatch: length(0) nodes(1) buffers(2) compression(3); Buffer: offset int64, length int64.
# DictionaryBatch: id(0) data(1: RecordBatch).


def message_decoded_bytes(metadata: bytes | memoryview, body: pa.Buffer | None) -> int:
    """What the body of one IPC message decodes to: the sum of its buffers' lengths, the
    recorded decoded length for a compressed buffer."""
    message = _root(metadata)
    header_type = message.scalar(1, "<B", 0)
    header = message.table(2)
    if header_type == 2 and header is not None:
        header = header.table(1)
    elif header_type != 3:
        return 0
    if header is None:
        return 0
    compressed = header.table(3) is not None
    body_size = 0 if body is None else body.size
    total = 0
    for at in header.structs(2, 16):
        offset, length = _unpack("<q", header.buf, at), _unpack("<q", header.buf, at + 8)
        if offset < 0 or length < 0 or offset + length > body_size:
            raise DecodeError("corrupt Arrow IPC message: a buffer lies outside the body")
        if compressed and length >= 8 and body is not None:
            decoded = _unpack("<q", memoryview(body)[offset : offset + 8], 0)
            total += length - 8 if decoded == -1 else max(decoded, 0)
        else:
            total += length
    return total


def stream_decoded_bytes(buffer: pa.Buffer) -> int:
    """The decoded size of every batch of an IPC stream, from its message headers."""
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(buffer))
    total = 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return total
        total += message_decoded_bytes(memoryview(message.metadata), message.body)


def file_blocks(data: pa.Buffer) -> list[tuple[int, int, int]]:
    """``(offset, metadata length, body length)`` of each record batch of an Arrow IPC file,
    from its footer (the file is known to end with ``ARROW1``)."""
    view = memoryview(data)
    footer_size = _unpack("<i", view, len(view) - 10)
    start = len(view) - 10 - footer_size
    if footer_size <= 0 or start < 8:
        raise DecodeError("corrupt Arrow file footer")
    footer = _root(view[start : start + footer_size])
    # Footer: version(0) schema(1) dictionaries(2) recordBatches(3); Block: offset int64,
    # metaDataLength int32 (+4 padding), bodyLength int64.
    return [
        (_unpack("<q", footer.buf, at), _unpack("<i", footer.buf, at + 8), _unpack("<q", footer.buf, at + 16))
        for at in footer.structs(3, 24)
    ]


def block_decoded_bytes(data: pa.Buffer, block: tuple[int, int, int]) -> int:
    """The decoded size of the record batch of a file block."""
    offset, meta_length, body_length = block
    if offset < 0 or meta_length < 8 or body_length < 0 or offset + meta_length + body_length > data.size:
        raise DecodeError("corrupt Arrow file footer: a record batch lies outside the file")
    message = pa.ipc.read_message(data.slice(offset, meta_length + body_length))
    return message_decoded_bytes(memoryview(message.metadata), message.body)
