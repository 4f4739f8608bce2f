"""Copying files batch by batch (:func:`copy_file`: another compression or form) and recovering
the complete batches of a file whose writer did not finish (:func:`recover_file`). Nothing is
decoded: batches are copied as Arrow data.
"""

from __future__ import annotations

import itertools
import mmap
import os
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa

from .. import _limits
from .._format import CHECKSUMS, check_schema
from .._ipc import CONTINUATION, MAGIC, extension_errors, open_regular
from .._validate import validate_arrow
from ..errors import DecodeError
from .reader import describe_start, open_file
from .writer import FileWriter


def _write_all(batches: Iterable[tuple[pa.RecordBatch, dict[str, str]]], out: str | os.PathLike, compression: str | None, **options: bool) -> FileWriter:
    """Write ``(batch, schema metadata)`` pairs as they are (nothing decoded) into a new file ``out``;
    on an error the partial file is deleted and ``out`` left as it was. Returns the writer, to close.
    ``options``: ``portable``, ``stream`` and ``checksums`` of :class:`FileWriter` (a source
    batch's checksums are never carried over: they are of its old bytes)."""
    writer = FileWriter(out, "w", compression=compression, **options)
    try:
        for batch, metadata in batches:
            writer._write(batch.replace_schema_metadata(metadata))
    except BaseException:
        writer.abort()
        raise
    return writer


def copy_file(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    compression: str | None = None,
    max_decoded_bytes: int | str | None = "auto",
    portable: bool = False,
    stream: bool = False,
    checksums: bool | None = None,
) -> int:
    """Copy a complete file batch by batch into ``out`` with another ``compression``; returns
    the batch count.

    ``checksums``: record checksums in ``out`` (of its own bytes, see :class:`FileWriter`);
    ``None`` (the default): if the source has them (its first batch does).

    Works on the Arrow data: nothing is decoded, so pickled columns are copied without
    being unpickled (each batch still passes Arrow's full validation first). ``out`` may be
    ``path`` itself. ``portable`` and ``stream`` choose the form of ``out`` as in
    :class:`FileWriter` (a portable file copied without ``portable=True`` gets its stored
    types back, exactly). Errors and ``max_decoded_bytes`` as in :func:`open_file`; for a
    file whose writer did not finish, see :func:`recover_file`.
    """
    with open_file(path, max_decoded_bytes=max_decoded_bytes) as reader:
        if checksums is None:
            checksums = bool(reader.num_batches) and CHECKSUMS in reader._metadata(0)
        batches = (reader._read([i], None)[0] for i in range(reader.num_batches))
        writer = _write_all(batches, out, compression, portable=portable, stream=stream, checksums=checksums)
    writer.close()
    return writer.num_batches


def recover_file(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    compression: str | None = None,
    max_decoded_bytes: int | str | None = "auto",
    checksums: bool | None = None,
) -> int:
    """Copy the complete batches of a file whose writer did not finish into a valid file ``out``.

    Reads ``path`` as the Arrow stream it holds after its magic bytes and stops at the
    first batch that is cut short, fails validation, or is not followed by the start of
    another message, the end of the stream or the end of the file (a batch whose bytes were
    cut and then followed by another batch's would otherwise read as complete); returns
    the number of batches copied (bytes are copied once; compressed input is
    decompressed, within ``max_decoded_bytes`` as in :func:`open_file`; ``out`` uses
    ``compression``). Works on complete files too (a copy). ``out`` may be ``path``
    itself. ``checksums`` as in :func:`copy_file` (``None``: if the first complete batch has
    them). Raises :class:`DecodeError` if ``path`` holds no complete batch or is not a
    regular file.
    """
    source = Path(path)
    fd = open_regular(source)
    try:
        size = os.fstat(fd).st_size
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
    except (OSError, ValueError) as e:
        raise DecodeError(f"{source}: cannot map the file: {e}") from e
    finally:
        os.close(fd)
    buffer = pa.py_buffer(mapped)  # read-only is fine: batches only get copied
    if buffer.size < 8 or buffer[: len(MAGIC)].to_pybytes() != MAGIC:
        raise DecodeError(f"{source}: {describe_start(buffer[:8].to_pybytes())}")
    body = buffer.slice(8)
    allowed = _limits.limit(max_decoded_bytes, buffer.size)
    position = pa.BufferReader(body)
    with extension_errors(str(source)):
        try:
            stream = pa.ipc.open_stream(position)
            check_schema(stream.schema)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DecodeError(f"{source}: no complete schema at the start of the file: {e}") from e

    def complete_batches() -> Iterator[tuple[pa.RecordBatch, dict[str, str]]]:
        fallback = stream.schema.metadata
        count = 0
        while True:
            start = position.tell()
            if allowed is not None:  # from the message header, before decompressing
                decoded = _decoded_at(body, start)
                if decoded is not None:
                    _limits.check(decoded, allowed, f"{source}: batch {count}")
            try:
                batch, custom = stream.read_next_batch_with_custom_metadata()
                validate_arrow(batch)
            except (StopIteration, EOFError):  # the end of the stream (marker or file)
                return
            except (pa.ArrowException, OSError, ValueError):  # DecodeError is a ValueError
                return  # the cut (or a damaged batch): keep what came before
            end = position.tell()
            after = body[end : end + len(CONTINUATION)].to_pybytes()
            if after != CONTINUATION[: len(after)]:  # (a marker cut at the end of the file is fine)
                return  # its bytes ran into another message's: it was cut, then written over
            count += 1
            yield batch, custom or fallback

    batches = complete_batches()
    first = next(batches, None)
    if checksums is None:
        checksums = first is not None and CHECKSUMS.encode() in (first[1] or {})
    writer = _write_all(itertools.chain([] if first is None else [first], batches), out, compression, checksums=checksums)
    if not writer.num_batches:
        writer.abort()
        raise DecodeError(f"{source}: no complete batch before the end of the file")
    writer.close()
    return writer.num_batches


def _decoded_at(body: pa.Buffer, start: int) -> int | None:
    """What the message at ``body[start:]`` decodes to, from its header; None if no complete
    message header is there (the end, or the cut: the reader stops there anyway)."""
    try:
        message = pa.ipc.read_message(body.slice(start))
        return _limits.message_decoded_bytes(memoryview(message.metadata), message.body)
    except (pa.ArrowException, OSError, ValueError, EOFError):  # DecodeError is a ValueError
        return None
