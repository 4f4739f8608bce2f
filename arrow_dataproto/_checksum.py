"""Optional per-buffer checksums of the batches of a file (xxHash3, 64 bits).

Arrow files carry no checksum: a flipped bit inside tensor values reads back
unnoticed. A :class:`~arrow_dataproto.files.FileWriter` made with
``checksums=True`` records, in each batch's metadata (``adp.checksums``), one
digest per buffer of each column; a reader verifies them only when asked
(``open_file(verify=True)``, ``FileReader.verify()``, ``arrow-dataproto verify``),
so the memory-mapped open stays O(1) and unverified reads touch no extra byte.

What is hashed is the *logical* content of each buffer, the bytes the column's
values occupy, so that it does not depend on padding, on slicing or on whether
the file is compressed: a validity bitmap (only if the column has nulls, as the
bits of its rows), the values of a fixed-width column, the offsets of a list or
string column rebased to 0 and the bytes they cover; children recursively.
Needs the ``xxhash`` package (``pip install 'arrow-dataproto[integrity]'``).
"""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import pyarrow as pa

from .errors import DecodeError, EncodeError

ALGORITHM = "xxh3_64"


def _hasher():
    try:
        import xxhash
    except ImportError:
        raise EncodeError("checksums need the xxhash package: pip install 'arrow-dataproto[integrity]'") from None
    return xxhash.xxh3_64_hexdigest


def _offsets(array: pa.Array, width: int) -> np.ndarray:
    dtype = np.int32 if width == 4 else np.int64
    n = len(array)
    if n == 0:
        return np.zeros(1, dtype=dtype)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=n + 1, offset=array.offset * width)


def _buffers(array: pa.Array) -> Iterator[object]:
    """The logical bytes of each buffer of ``array`` (see the module docstring)."""
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    kind, n, offset = array.type, len(array), array.offset
    if pa.types.is_null(kind):
        return
    if array.null_count:
        yield np.packbits(array.is_valid().to_numpy(zero_copy_only=False))
    if pa.types.is_boolean(kind):
        yield np.packbits(array.fill_null(False).to_numpy(zero_copy_only=False))
    elif pa.types.is_primitive(kind) or pa.types.is_fixed_size_binary(kind):
        width = kind.bit_width // 8
        yield memoryview(array.buffers()[1])[offset * width : (offset + n) * width]
    elif pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        offsets = _offsets(array, 4 if pa.types.is_string(kind) or pa.types.is_binary(kind) else 8)
        yield offsets - offsets[0]
        data = array.buffers()[2]
        yield b"" if data is None else memoryview(data)[int(offsets[0]) : int(offsets[-1])]
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = _offsets(array, 4 if pa.types.is_list(kind) else 8)
        yield offsets - offsets[0]
        yield from _buffers(array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
    elif pa.types.is_fixed_size_list(kind):
        yield from _buffers(array.values.slice(offset * kind.list_size, n * kind.list_size))
    elif pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            yield from _buffers(array.field(i))
    else:
        raise EncodeError(f"no checksum for Arrow type {kind}")


def _digests(array: pa.Array, digest) -> list[str]:
    return [digest(buffer) for buffer in _buffers(array)]


def checksums(batch: pa.RecordBatch) -> str:
    """The ``adp.checksums`` value of ``batch``: JSON of the algorithm and, per column, the digests."""
    digest = _hasher()
    columns = {name: _digests(column, digest) for name, column in zip(batch.schema.names, batch.columns)}
    return json.dumps({"algorithm": ALGORITHM, "columns": columns})


def verify(batch: pa.RecordBatch, recorded: str, where: str) -> int:
    """Check the columns of ``batch`` against the ``recorded`` checksums; returns the number of
    buffers checked. :class:`DecodeError` naming the column and buffer that differ, or for
    a malformed record."""
    try:
        record = json.loads(recorded)
        if record["algorithm"] != ALGORITHM or not isinstance(record["columns"], dict):
            raise ValueError(f"unknown checksum algorithm {str(record['algorithm'])[:40]!r}")
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise DecodeError(f"{where}: malformed checksums: {e!r}"[:300]) from None
    digest = _hasher()
    checked = 0
    for name, column in zip(batch.schema.names, batch.columns):
        expected = record["columns"].get(name)
        if not (isinstance(expected, list) and all(isinstance(d, str) for d in expected)):
            raise DecodeError(f"{where}: column {name!r} has no recorded checksum")
        got = _digests(column, digest)
        if len(got) != len(expected):
            raise DecodeError(f"{where}: column {name!r}: {len(got)} buffers, {len(expected)} checksummed")
        for i, (a, b) in enumerate(zip(got, expected)):
            if a != b:
                raise DecodeError(f"{where}: column {name!r}: buffer {i} does not match its checksum (corrupt data)")
        checked += len(got)
    return checked
