"""Bounds on what untrusted bytes can make a decoder allocate.

Uncompressed Arrow data is decoded zero-copy: memory is the input itself. Two
things can make a small input decode into much more memory, and both are bounded
here, before anything is allocated:

- compressed buffers (lz4/zstd): each records its decoded length in its first 8
  bytes. :func:`stream_decoded_bytes` / :func:`block_decoded_bytes` add those up
  from the message headers (no decompression) so that :func:`check` can refuse a
  compression bomb;
- allocations whose size a metadata value chooses (a fixed-width string dtype):
  :func:`check` with the bytes the values were decoded from.

The rule (:func:`limit`): ``max_decoded_bytes="auto"`` (the default of every entry
point reading untrusted bytes) allows ``max(64 MiB, 256 x input bytes)``;
an int sets the limit; ``None`` lifts it (for inputs you trust).
"""

from __future__ import annotations

from typing import Union

import pyarrow as pa

from ._ipc import Block, FlatTable, read_scalar
from .errors import ArgumentTypeError, DecodeError

FLOOR = 64 << 20
"""Bytes any input may decode to under the ``"auto"`` limit."""
RATIO = 256
"""Under ``"auto"``, an input may also decode to this many times its own size."""

MaxDecoded = Union[int, str, None]
"""``max_decoded_bytes``: ``"auto"``, a number of bytes, or ``None`` (no limit)."""


def limit(max_decoded_bytes: MaxDecoded, input_bytes: int) -> int | None:
    """The limit in bytes for an input of ``input_bytes`` (``None``: unlimited)."""
    check_max_decoded(max_decoded_bytes)
    if max_decoded_bytes == "auto":
        return max(FLOOR, RATIO * input_bytes)
    return None if max_decoded_bytes is None else int(max_decoded_bytes)


def check_max_decoded(max_decoded_bytes: MaxDecoded) -> None:
    """:class:`ArgumentTypeError` unless ``max_decoded_bytes`` is ``"auto"``, a non-negative int or None."""
    if max_decoded_bytes is None or max_decoded_bytes == "auto":
        return
    if type(max_decoded_bytes) is not int or max_decoded_bytes < 0:
        raise ArgumentTypeError(f'max_decoded_bytes must be "auto", a non-negative int or None, got {max_decoded_bytes!r}')


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


# Message: header_type(1) header(2); DictionaryBatch: data(1: RecordBatch); RecordBatch:
# buffers(2) compression(3); Buffer: offset int64, length int64 (see _ipc).


def message_decoded_bytes(metadata: bytes | memoryview, body: pa.Buffer | None) -> int:
    """What the body of one IPC message decodes to: the sum of its buffers' lengths, the
    recorded decoded length for a compressed buffer."""
    message = FlatTable.root(metadata)
    header_type = message.scalar(1, "<B")
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
        offset, length = read_scalar(metadata, "<q", at), read_scalar(metadata, "<q", at + 8)
        if offset < 0 or length < 0 or offset + length > body_size:
            raise DecodeError("corrupt Arrow IPC message: a buffer lies outside the body")
        if compressed and length >= 8 and body is not None:
            decoded = read_scalar(memoryview(body)[offset : offset + 8], "<q", 0)
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


def block_decoded_bytes(data: pa.Buffer, block: Block) -> int:
    """The decoded size of the record batch of a file block."""
    offset, meta_length, body_length = block
    if offset < 0 or meta_length < 8 or body_length < 0 or offset + meta_length + body_length > data.size:
        raise DecodeError("corrupt Arrow file footer: a record batch lies outside the file")
    message = pa.ipc.read_message(data.slice(offset, meta_length + body_length))
    return message_decoded_bytes(memoryview(message.metadata), message.body)
