"""Reading one Arrow IPC file or IPC stream file of DataProto batches: :class:`FileReader`,
:func:`open_file`, :func:`read_file` (what it shares with
:class:`~arrow_dataproto.files.DatasetReader` is :class:`~arrow_dataproto.files.base.BatchReader`).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import pyarrow as pa

from .. import _checksum, _limits
from .._format import CHECKSUMS, COMPRESSION, check_field_names, check_schema, is_foreign, text_metadata
from .._ipc import CONTINUATION, MAGIC, StreamIndex, block_header, extension_errors, file_blocks, header_codec, header_rows, open_regular, scan_stream
from .._validate import validate_arrow
from ..errors import DataProtoError, DecodeError
from .base import BatchReader
from .evolution import row_bits, shared_metadata
from .layout import check_footer
from .options import ReadKeywords, ReadOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .._container import DataProto

_INCOMPLETE = (
    "no Arrow footer at the end of the file: its writer did not finish (killed, or still writing) "
    "or the file was cut short; recover_file(path, new_path) or `arrow-dataproto recover` copies "
    "its complete batches into a valid file"
)


def describe_start(head: bytes) -> str:
    """Why a file that does not start with the Arrow magic is not one of ours, with a hint."""
    if head.startswith(CONTINUATION):
        return "an Arrow IPC stream, not an Arrow IPC file (open_file reads it; recovery needs a file)"
    if head.startswith(b"\x80"):
        return (
            "a Python pickle (verl's DataProto.save_to_disk writes these); if you trust it, "
            "convert it with `arrow-dataproto convert --allow-pickle IN OUT`"
        )
    return "not an Arrow IPC file (it does not start with ARROW1)"


class _StreamFile:
    """What :class:`FileReader` uses of a ``RecordBatchFileReader``, over a mapped IPC stream:
    random access by batch index (zero-copy for uncompressed batches; a stream with
    dictionaries is read in order up to the batch asked for)."""

    metadata = None

    def __init__(self, data: pa.Buffer, index: StreamIndex):
        self.data, self.index, self.schema = data, index, index.schema

    @property
    def num_record_batches(self) -> int:
        return len(self.index.blocks)

    def get_batch_with_custom_metadata(self, i: int) -> tuple[pa.RecordBatch, dict[str, str] | None]:
        if self.index.dictionaries:
            reader = pa.ipc.open_stream(self.data)
            for _ in range(i):
                reader.read_next_batch()
            batch, _ = reader.read_next_batch_with_custom_metadata()
        else:
            offset, meta_length, body_length = self.index.blocks[i]
            message = pa.ipc.read_message(self.data.slice(offset, meta_length + body_length))
            batch = pa.ipc.read_record_batch(message, self.schema)
        return batch, self.index.custom[i]


def _first_codec(data: pa.Buffer, stream: StreamIndex | None) -> str:
    """The compression of a file whose footer does not record it (another tool's), from
    its first record batch's header: ``"none"``, ``"lz4"`` or ``"zstd"``."""
    if stream is not None:
        return stream.compression or "none"
    try:
        blocks, footer_start = file_blocks(memoryview(data))
        if not blocks:
            return "none"
        _, header = block_header(memoryview(data), blocks[0], footer_start)
        return header_codec(header) or "none"
    except (pa.ArrowException, OSError, ValueError, EOFError) as e:  # DecodeError is a ValueError
        raise DecodeError(f"corrupt Arrow file: {e}") from e


class FileReader(BatchReader):
    """An Arrow IPC file of DataProto batches, open for reading; made by :func:`open_file`.

    ``stream`` says whether it is an IPC stream file (no footer), ``foreign`` whether it is
    another tool's (no ``adp.*`` schema metadata: read by the rule of
    :func:`~arrow_dataproto.from_arrow`). How it reads: ``options``
    (:class:`~arrow_dataproto.files.ReadOptions`), each of ``keywords`` replacing its field.
    """

    def __init__(self, path: str | os.PathLike, *, options: ReadOptions | None = None, **keywords: Unpack[ReadKeywords]):
        super().__init__(options, keywords)
        self.path = Path(path)
        self._fd: int | None = open_regular(self.path)
        try:
            self.file_size = os.fstat(self._fd).st_size
            self._stream: StreamIndex | None = None
            reader, data = self._open_mapped()
            self.schema = reader.schema
            self._num_batches = reader.num_record_batches
            footer = text_metadata(reader.metadata)
            self.stream = self._stream is not None
            self.foreign = is_foreign(self.schema)
            if self.foreign:
                check_field_names(self.schema)
            else:
                check_schema(self.schema)
            compression = footer.get(COMPRESSION) or _first_codec(data, self._stream)
        except BaseException:
            self.close()
            raise
        self._footer_schema_metadata = text_metadata(self.schema.metadata)
        self._layout = shared_metadata(self._footer_schema_metadata)
        self.compression: str | None = None if compression == "none" else compression
        narrowest = min(range(len(self.schema)), key=lambda i: row_bits(self.schema.field(i).type), default=None)
        self._probe_fields = None if self.compression is None or narrowest is None else [narrowest]
        self._max_decoded = _limits.limit(self.options.max_decoded_bytes, self.file_size)
        self._blocks: list[tuple[int, int, int]] | None = None if self._stream is None else self._stream.blocks
        self._schema_text: str | None = None
        if self.verify_checksums:
            try:
                self._check_footer()
            except BaseException:
                self.close()
                raise

    @property
    def verify_checksums(self) -> bool:
        """Whether each batch read is checked against its checksums (``options.verify``)."""
        return self.options.verify

    def _open_mapped(self, fields: list[int] | None = None) -> tuple[Any, pa.Buffer]:
        """A fresh private copy-on-write mapping of the file, opened as an Arrow IPC file reading
        only ``fields`` (all if None; an IPC stream: a :class:`_StreamFile`), and the mapped bytes."""
        if self._fd is None:
            raise DataProtoError(f"{self.path} is closed")
        if self.file_size == 0:
            raise DecodeError(f"{self.path}: empty file")
        source = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
        if source[: len(CONTINUATION)] == CONTINUATION:  # an IPC stream (HF datasets' cache files)
            data = pa.py_buffer(source)
            if self._stream is None:
                self._stream = scan_stream(data, str(self.path))
            return _StreamFile(data, self._stream), data
        if source[: len(MAGIC)] != MAGIC:
            raise DecodeError(f"{self.path}: {describe_start(source[:8])}")
        if len(source) < 2 * len(MAGIC) + 6 or source[-len(MAGIC):] != MAGIC:
            raise DecodeError(f"{self.path}: {_INCOMPLETE}")
        options = pa.ipc.IpcReadOptions(included_fields=fields or [])
        data = pa.py_buffer(source)
        with extension_errors(str(self.path)):
            try:
                return pa.ipc.open_file(data, options=options), data
            except (pa.ArrowException, OSError, ValueError) as e:
                raise DecodeError(f"{self.path}: corrupt Arrow file footer: {e}") from e

    def _check_decoded_size(self, data: pa.Buffer, indices: Sequence[int]) -> None:
        """Refuse (before decompressing) batches that decode to more than ``max_decoded_bytes``
        together; every column of a batch counts, read or not."""
        try:
            if self._blocks is None:
                self._blocks, _ = file_blocks(memoryview(data))
            if self._stream is not None and self._stream.dictionaries:  # read in order: every batch before counts
                indices = range(max(indices, default=-1) + 1)
            total = sum(_limits.block_decoded_bytes(data, self._blocks[i]) for i in indices)
        except (pa.ArrowException, OSError, ValueError, IndexError, EOFError) as e:
            if isinstance(e, DecodeError):
                raise DecodeError(f"{self.path}: {e}") from None
            raise DecodeError(f"{self.path}: corrupt Arrow file: {e}") from e
        _limits.check(total, self._max_decoded, f"{self.path}: batch(es) {list(indices)[:10]}")

    @property
    def num_batches(self) -> int:
        return self._num_batches

    def _paths(self) -> list[Path]:
        return [self.path]

    def _read(self, indices, fields):
        # Uncompressed: read whole batches (zero-copy) and select; included_fields would copy.
        # Compressed: included_fields spares decompressing the other columns (IPC files only:
        # a stream file's batches are read whole, then selected).
        pushdown = fields is not None and self.compression is not None and self._stream is None
        reader, data = self._open_mapped(sorted(fields) if pushdown else None)
        if self._max_decoded is not None:  # the footer's word on compression is not trusted
            self._check_decoded_size(data, indices)
        out = []
        for i in indices:
            try:
                batch, custom = reader.get_batch_with_custom_metadata(i)
            except (pa.ArrowException, OSError, ValueError) as e:
                raise DecodeError(f"{self.path}: batch {i} is corrupt: {e}") from e
            validate_arrow(batch, f"{self.path}: batch {i}")  # before anything reads sizes or values
            metadata = text_metadata(custom) if custom else self._footer_schema_metadata
            if shared_metadata(metadata) != self._layout:
                raise DecodeError(f"{self.path}: the metadata of batch {i} does not match the file's schema")
            if fields is not None and not pushdown:
                batch = batch.select(fields)
            if self.verify_checksums:
                self._verify(batch, metadata, i)
            out.append((batch, metadata))
        return out

    def _verify(self, batch: pa.RecordBatch, metadata: dict[str, str], i: int) -> int:
        recorded = metadata.get(CHECKSUMS)
        if recorded is None:
            raise DecodeError(f"{self.path}: batch {i} has no checksums (written without checksums=True)")
        if self._schema_text is None:
            self._schema_text = _checksum.schema_text(self.schema)
        return _checksum.verify(batch, recorded, f"{self.path}: batch {i}", i, self._schema_text, metadata)

    def _check_footer(self) -> None:
        """Check what the footer of an IPC file says against the messages before it: the same
        batches at the same places (none left out, none twice), the same schema as the file's
        first message, the compression its batches use. Reads the message headers only. An IPC
        stream file has no footer: its batches' checksums cover the schema."""
        if self._stream is not None:
            return
        reader, data = self._open_mapped()
        check_footer(data, self.schema, text_metadata(reader.metadata), f"{self.path}: the footer")

    def verify(self) -> int:
        """Check every buffer of every batch against the checksums written with it; returns the
        number of buffers checked. :class:`DecodeError` names the batch, column and buffer that
        differ, or a batch written without checksums. Also checks what lies outside the buffers:
        each batch's lengths, place, row count and metadata and the file's schema (files written
        since format 1.3) and the footer against the file's messages. Reads (and decompresses)
        the whole file."""
        self._check_footer()
        checked = 0
        for i in range(self.num_batches):
            batch, metadata = self._read([i], None)[0]
            checked += self._verify(batch, metadata, i)
        return checked

    def _count_rows(self):
        """From the record batch message headers (a stream's, or those the footer points to)."""
        if self._stream is not None:
            return list(self._stream.rows)
        view = memoryview(self._open_mapped()[1])
        try:
            blocks, footer_start = file_blocks(view)
            return [header_rows(block_header(view, block, footer_start)[1]) for block in blocks]
        except DecodeError as e:
            raise DecodeError(f"{self.path}: {e}") from None

    def _metadata(self, i):
        return self._read([i], self._probe_fields)[0][1]

    def close(self) -> None:
        """Close the file; tensors already read stay valid (their mapping lives on)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        state = "closed " if self._fd is None else ""
        return f"<{state}FileReader {str(self.path)!r}: {self.num_batches} batches, {len(self.columns)} columns>"


def open_file(path: str | os.PathLike, *, options: ReadOptions | None = None, **keywords: Unpack[ReadKeywords]) -> FileReader:
    """Open an Arrow IPC file written by :func:`write_file` / :class:`FileWriter`, or any
    other Arrow IPC file or IPC stream file (see the module docstring; another tool's
    columns are read by the rule of :func:`~arrow_dataproto.from_arrow`).

    Reads only the footer; batches are read on demand, memory-mapped (see the module
    docstring: zero-copy, copy-on-write, each read call its own mapping). The reader has
    ``num_batches``, ``num_rows``, ``batch_rows``, ``schema``, ``columns``,
    :meth:`~FileReader.column_info`, :meth:`~FileReader.read_batch`,
    :meth:`~FileReader.read_rows`, :meth:`~FileReader.read_all` and iterates over batches.

    How it reads (``allow_pickle``, ``device``, ``copy``, ``progress``, ``max_decoded_bytes``,
    ``verify``, ``schema``): ``options``, a :class:`~arrow_dataproto.files.ReadOptions` (which
    states each option), or the same options as keywords; given both, each keyword replaces
    that field of ``options``. A keyword that is no option raises ``TypeError``.

    A file is untrusted input: besides ``max_decoded_bytes``, every batch passes Arrow's full
    validation before its values or sizes are read. Anything but a regular file (a FIFO, a
    device, a folder) is refused with :class:`DecodeError` without being opened for reading.

    Raises ``FileNotFoundError``/``OSError`` as ``open`` does, :class:`DecodeError` for
    a file that is not Arrow (or whose schema names another format), truncated or corrupt, and
    :class:`FormatVersionError` for an incompatible format version.
    """
    return FileReader(path, options=options, **keywords)


def read_file(
    path: str | os.PathLike,
    columns: Iterable[str] | None = None,
    *,
    options: ReadOptions | None = None,
    **keywords: Unpack[ReadKeywords],
) -> DataProto:
    """Every row of a file as one DataProto: ``open_file(path, options=options, **keywords).read_all(columns)``.

    A file of one batch comes back zero-copy (its mapping lives as long as the tensors do);
    several batches are concatenated (one copy).
    """
    with open_file(path, options=options, **keywords) as reader:
        return reader.read_all(columns)
