"""Writing DataProto batches to an Arrow IPC file (or IPC stream file): :class:`FileWriter`
and :func:`write_file`. How a batch's columns are compared and unified with the file's is
:mod:`arrow_dataproto.files.evolution`.
"""

from __future__ import annotations

import mmap
import os
import secrets
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from .. import _checksum
from .._format import CHECKSUMS, COMPRESSION, COMPRESSIONS, META_INFO_ENCODING, PORTABLE, text_metadata
from .._meta_info import pickled_meta_keys
from .._objects import decode_column
from .._progress import progress_bar
from ..errors import ArgumentTypeError, DataProtoError, EncodeError, OptionError, SchemaMismatchError
from .evolution import conform, evolve, rewritten, schema_difference, unified_schema


class FileWriter:
    """Append DataProto batches with the same columns to one Arrow IPC file.

    >>> with FileWriter("rollouts.arrow", compression="zstd") as writer:
    ...     for batch in batches:
    ...         writer.write(batch)

    Each :meth:`write` encodes the batch (zero-copy, see :func:`~arrow_dataproto.to_arrow`)
    and copies its bytes into the file once (per-buffer compressed if ``compression`` is
    ``"lz4"`` or ``"zstd"``). A batch whose columns differ from the first batch's (names,
    order, dtypes, per-row shapes, devices, layouts) is refused with
    :class:`SchemaMismatchError` naming each difference, and the file is left as it was;
    the batch size and ``meta_info`` may differ from batch to batch. Object columns of
    ``non_tensor_batch`` take their Arrow type from their values (see
    :mod:`arrow_dataproto._objects`): a column of only ``None`` (or of no rows) adopts the
    file's type, and values that give another type (dicts with other keys, floats where
    the file has ints) are unified with the file's column by the schema-evolution rule of
    ``docs/format.md``: encoded in the file's type when they come back exactly in it, else
    the column is widened to the batch's native type or promoted to JSON, which rewrites the
    batches written so far once (one read and one write of them). Values that would need
    pickling in a column the file does not pickle are refused with
    :class:`SchemaMismatchError` (reading the file would newly need ``allow_pickle=True``).

    Bytes go to ``PATH.<random>.partial`` in the same folder; :meth:`close` writes the
    footer and renames it over ``PATH``, so ``PATH`` never holds a half-written file and a
    reader that has the old ``PATH`` open keeps reading the old file. Leaving the ``with``
    block by an exception deletes the partial file and leaves ``PATH`` untouched
    (:meth:`abort`), unless the writer itself failed (below): then the partial file stays. A process killed while writing (or a writer never closed) leaves the
    partial file behind: :func:`recover_file` reads its complete batches. A writer closed without any batch
    writes a valid file with no columns and no batches.

    ``portable=True`` writes the portable view of each batch (see
    :func:`~arrow_dataproto.to_arrow`: plain Arrow types that pandas, polars, DuckDB and HF
    ``datasets`` read as values; the widened columns are copies); the readers of this
    module give the DataProtos back bit-exact from either form. ``stream=True`` writes an
    Arrow IPC *stream* file (no footer, no ``ARROW1`` magic) instead of an IPC file: what
    ``datasets.Dataset.from_file`` and ``pyarrow.ipc.open_stream`` open; it cannot record
    the compression in a footer (each batch's message header says it) nor be recovered
    by :func:`recover_file`, which needs the file format.

    ``mode``: ``"w"`` (the default) writes a new file, replacing ``PATH`` at :meth:`close` if
    it exists; ``"x"`` refuses an existing ``PATH`` (:class:`OptionError` here, and
    :class:`EncodeError` at :meth:`close` if one appeared meanwhile: it is never replaced);
    ``"a"`` appends to the file of this library at ``PATH`` (a new file if there is none): its
    batches are copied first into the partial file, as Arrow data (nothing decoded; one read
    and one write of them), so the batches written next follow the schema rules above as if
    this writer had written them, and ``PATH`` stays the complete old file until :meth:`close`
    replaces it: a process killed mid-append leaves it readable as it was. ``compression``,
    ``stream``, ``portable`` and ``checksums`` left as None are the file's (its compression, its
    form, whether it has checksums); given, the whole file is written so. Another tool's file
    at ``PATH`` is refused (:class:`SchemaMismatchError`). Appending writers of one ``PATH``
    must not run at the same time: each replaces ``PATH`` with what it read and wrote, and
    the last to close wins. Keep one writer open to append batch after batch.

    ``progress=True`` shows the bytes written (needs tqdm). ``checksums=True``
    records a digest of every buffer of every batch (xxHash3; see
    :mod:`arrow_dataproto._checksum`, needs ``xxhash``), which ``open_file(verify=True)``,
    :meth:`FileReader.verify` and ``arrow-dataproto verify`` check.

    A write or close that fails half-way (disk full, file-size limit) raises
    :class:`EncodeError`; the partial file is cut back to its last complete batch, kept, and
    the writer refuses any further use (:meth:`write` and :meth:`close` raise
    :class:`EncodeError`; ``PATH`` is left as it was; :func:`recover_file` reads the complete
    batches of the partial file). So once :meth:`write` returns, its batch survives any later
    failure of the writer; a batch refused (:class:`SchemaMismatchError`, or a promotion
    rewrite that fails) changes nothing on disk and leaves the writer usable.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "w",
        *,
        compression: str | None = None,
        progress: bool = False,
        checksums: bool | None = None,
        portable: bool | None = None,
        stream: bool | None = None,
    ):
        if compression not in COMPRESSIONS:
            raise EncodeError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        if mode not in MODES:
            raise OptionError(f"mode must be one of {MODES}, got {mode!r}")
        self.path = Path(path)
        self.mode = mode
        if mode == "x" and os.path.lexists(self.path):
            raise OptionError(f"{self.path} exists: mode='x' writes only a new file ('w' replaces it, 'a' appends to it)")
        appended = _appended(self.path) if mode == "a" and os.path.lexists(self.path) else None
        if appended is not None:
            compression = appended.compression if compression is None else compression
            stream = appended.stream if stream is None else stream
            portable = PORTABLE.encode() in (appended.schema.metadata or {}) if portable is None else portable
            checksums = bool(appended.num_batches) and CHECKSUMS in appended._metadata(0) if checksums is None else checksums
        self.compression = compression
        self.num_batches = 0
        self.num_rows = 0
        self._options = pa.ipc.IpcWriteOptions(compression=compression, allow_64bit=True)
        self._partial = self.path.with_name(f"{self.path.name}.{secrets.token_hex(4)}.partial")
        self._sink = pa.OSFile(str(self._partial), "wb")
        self._writer: Any = None  # a pyarrow IPC file or stream writer
        self._schema: pa.Schema | None = None
        self._bar = progress_bar(progress, desc=f"writing {self.path.name}", unit="B", unit_scale=True)
        self._done = False
        self._failed: str | None = None
        self._fields: dict[str, pa.Field] = {}
        self._warned = False  # about a pickled meta_info
        self._schema_text = ""  # the written schema, as checksums hash it (_checksum.schema_text)
        self.checksums = bool(checksums)
        self.portable = bool(portable)
        self.stream = bool(stream)
        if appended is not None:
            with appended:
                try:
                    for i in range(appended.num_batches):
                        batch, metadata = appended._read([i], None)[0]
                        self._write(batch.replace_schema_metadata(metadata))
                except BaseException:
                    self.abort()
                    raise

    def write(self, data: Any) -> None:
        """Append one DataProto (ours or verl's) or TensorDict as the next batch.

        A ``meta_info`` that needs pickling (values neither JSON nor tensors) is written
        pickled with a warning naming the keys: reading it back will need ``allow_pickle=True``."""
        from .._codec import to_arrow

        batch = to_arrow(data, portable=self.portable)
        if (batch.schema.metadata or {}).get(META_INFO_ENCODING.encode()) == b"pickle" and not self._warned:
            self._warned = True
            keys = ", ".join(pickled_meta_keys(getattr(data, "meta_info", None) or {}))
            warnings.warn(
                f"{self.path}: meta_info key(s) {keys} need pickling (neither JSON nor tensors): "
                "reading the file will need allow_pickle=True",
                stacklevel=2,
            )
        self._write(batch)

    def _write(self, batch: pa.RecordBatch) -> None:
        """Append a RecordBatch of ours (either form); it is written in this writer's form.
        The columns are compared and unified in the stored form (``self._schema``).

        Everything that can refuse the batch runs before a byte is written; a batch that
        widens or promotes a column is written with the rewritten batches into a new partial
        file, which replaces the old one only once complete (:meth:`_rewrite`)."""
        from .. import _portable

        batch = _portable.from_portable(batch)
        if self._failed:
            raise EncodeError(self._failed)
        if self._done:
            raise DataProtoError(f"the writer of {self.path} is closed")
        metadata = batch.schema.metadata or {}
        if CHECKSUMS.encode() in metadata:  # a copied batch's record is of its old bytes
            batch = batch.replace_schema_metadata({k: v for k, v in metadata.items() if k != CHECKSUMS.encode()})
        if self._writer is None or self._schema is None:
            self._append(batch, first=True)
            return
        where = f"batch {self.num_batches} does not match the columns of {self.path}"
        batch, targets = evolve(conform(batch, self._fields), self._fields, self._written_rows, where)
        expected = unified_schema(self._schema, targets)
        differences = schema_difference(expected, batch.schema)
        if differences:
            raise SchemaMismatchError(f"{where}: " + "; ".join(differences))
        if targets:
            self._rewrite(targets, batch)
        else:
            self._append(batch)

    def _custom(self, written: pa.RecordBatch, index: int, metadata: dict[bytes, bytes] | None = None) -> dict[bytes, bytes]:
        """The custom metadata batch ``index`` (written form) is written with: ``metadata`` (by
        default its schema metadata; a batch read back from a stream must pass its own) less
        any old checksums, and, if this writer records them, the checksums of ``written`` with
        that metadata. Every batch written (first, appended, rewritten, copied, recovered)
        takes its metadata from here."""
        custom = dict(written.schema.metadata or {}) if metadata is None else dict(metadata)
        custom.pop(CHECKSUMS.encode(), None)
        if self.checksums:
            record = _checksum.checksums(written, index, self._schema_text, custom)
            custom[CHECKSUMS.encode()] = record.encode()
        return custom

    def _append(self, batch: pa.RecordBatch, first: bool = False) -> None:
        """Write ``batch`` (stored form) at the end of the partial file; on an I/O error cut the
        file back to its last complete batch and fail the writer (:meth:`_fail`)."""
        written = self._form(batch)
        before = self._sink.tell()
        try:
            if first:
                self._start(batch.schema, written.schema)
            self._writer.write_batch(written, custom_metadata=self._custom(written, self.num_batches))
        except (pa.ArrowException, OSError) as e:  # disk full, file-size limit...
            self._fail(before, f"cannot write batch {self.num_batches} to {self.path}: {e}")
            raise EncodeError(self._failed) from e
        self.num_batches += 1
        self.num_rows += batch.num_rows
        self._bar.update(self._sink.tell() - before)

    def _fail(self, good_size: int, message: str) -> None:
        """After a failed write: cut the partial file back to its last complete batch (what
        :func:`recover_file` reads) and refuse any further use of this writer; the partial file
        is kept (:meth:`abort` does not delete it)."""
        self._failed = (
            f"{message}; the writer refuses further use: {self._partial} keeps the "
            f"{self.num_batches} complete batch(es) (recover_file reads them)"
        )
        try:
            os.truncate(self._partial, good_size)
        except OSError:
            pass  # recover_file stops at the cut batch anyway

    def _form(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (stored form) as this writer writes it: its portable view if ``portable``."""
        from .. import _portable

        return _portable.to_portable(batch) if self.portable else batch

    def _new_writer(self, sink: Any, schema: pa.Schema) -> Any:
        """An IPC stream writer if ``stream``, else an IPC file writer (the footer names the compression)."""
        if self.stream:
            return pa.ipc.new_stream(sink, schema, options=self._options)
        return pa.ipc.new_file(sink, schema, options=self._options, metadata={COMPRESSION: self.compression or "none"})

    def _written_batches(self) -> Iterator[tuple[pa.RecordBatch, dict[bytes, bytes]]]:
        """The batches written so far, in the stored form, read back from the partial file (a
        stream after the magic bytes of a file, whose footer is not written yet), viewing a
        read-only mapping of it."""
        from .. import _portable

        with open(self._partial, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        stream = pa.ipc.open_stream(pa.py_buffer(mapped).slice(0 if self.stream else 8))
        for _ in range(self.num_batches):
            batch, custom = stream.read_next_batch_with_custom_metadata()
            yield _portable.from_portable(batch), dict(custom or {})

    def _written_rows(self, field: pa.Field) -> Iterator[np.ndarray]:
        """The rows of column ``field`` in each batch written so far."""
        meta = text_metadata(field.metadata)
        for batch, _ in self._written_batches():
            yield decode_column(field.name, batch.column(field.name), meta, allow_pickle=False)

    def _rewrite(self, targets: dict[str, pa.Field], batch: pa.RecordBatch) -> None:
        """Write the batches written so far, with the columns ``targets`` taking their new field
        (each old column decoded and encoded again), and then ``batch``, into a new partial file,
        and continue in it. Costs one read and one write of what was written (decompressing and
        compressing again for a compressed file).

        The old partial file is deleted only once the new one holds every batch, ``batch``
        included: a process killed meanwhile leaves the old one complete (:func:`recover_file`).
        On an error (disk full, file-size limit) the new file is deleted and the writer is as it
        was, ``batch`` not written (:class:`EncodeError`)."""
        assert self._schema is not None and self._writer is not None  # a batch was written
        schema = unified_schema(self._schema, targets)
        old_fields = dict(self._fields)
        partial = self.path.with_name(f"{self.path.name}.{secrets.token_hex(4)}.partial")
        sink = pa.OSFile(str(partial), "wb")
        writer, schema_text, index = None, self._schema_text, 0
        try:
            for old, custom in self._written_batches():
                written = self._form(rewritten(old, old_fields, targets, schema))
                if writer is None:
                    writer = self._new_writer(sink, written.schema)
                    self._schema_text = _checksum.schema_text(written.schema)
                writer.write_batch(written, custom_metadata=self._custom(written, index, custom))
                index += 1
            written = self._form(batch)
            if writer is None:  # (a rewrite follows a batch: there is one to rewrite)
                writer = self._new_writer(sink, written.schema)
            writer.write_batch(written, custom_metadata=self._custom(written, index))
        except BaseException as e:
            self._schema_text = schema_text
            sink.close()
            partial.unlink(missing_ok=True)
            if isinstance(e, (pa.ArrowException, OSError)):
                raise EncodeError(
                    f"cannot rewrite {self.path} with the unified columns {list(targets)}: {e}; "
                    f"batch {self.num_batches} was not written, the {self.num_batches} before it are kept"
                ) from e
            raise
        old_sink, old_writer, old_partial = self._sink, self._writer, self._partial
        self._partial, self._sink, self._writer = partial, sink, writer
        self._schema, self._fields = schema, dict(zip(schema.names, schema))
        old_partial.unlink(missing_ok=True)
        old_sink.close()
        try:  # its sink is closed: nothing more is written (no footer), its resources are freed
            old_writer.close()
        except (pa.ArrowException, OSError, ValueError):
            pass
        self.num_batches += 1
        self.num_rows += batch.num_rows
        self._bar.update(self._sink.tell())

    def _start(self, schema: pa.Schema, written: pa.Schema) -> None:
        """Begin the file: ``schema`` is the columns in the stored form, ``written`` in the form written."""
        self._schema = schema
        self._fields = dict(zip(schema.names, schema))
        self._schema_text = _checksum.schema_text(written) if self.checksums else ""
        self._writer = self._new_writer(self._sink, written)

    def close(self) -> None:
        """Write the footer and move the file to ``path`` (replacing any file there).

        After a failed :meth:`write` it raises :class:`EncodeError` instead, and ``path`` is
        left as it was (the partial file keeps the complete batches, see :func:`recover_file`).
        If the footer cannot be written (disk full, file-size limit) or the file cannot be
        moved, the same: :class:`EncodeError` names the partial file, which keeps every batch.
        """
        if self._failed:
            self._finish()
            raise EncodeError(self._failed)
        if self._done:
            return
        before = self._sink.tell()
        try:
            if self._writer is None:
                from .._codec import to_arrow
                from .._container import DataProto

                empty = to_arrow(DataProto())
                self._start(empty.schema, self._form(empty).schema)
            self._writer.close()
            self._sink.close()
        except (pa.ArrowException, OSError) as e:  # the footer could not be written (disk full...)
            self._fail(before, f"cannot finish {self.path}: {e}; the file was not written")
            self._finish()
            raise EncodeError(self._failed) from e
        try:
            if self.mode == "x":  # never replaces a file that appeared meanwhile
                os.link(self._partial, self.path)
                os.unlink(self._partial)
            else:
                os.replace(self._partial, self.path)
        except OSError as e:
            self._failed = (
                f"cannot move {self._partial} to {self.path}: {e}; {self.path} was not written, "
                f"{self._partial} is complete (every batch, footer included: rename it)"
            )
            self._finish()
            raise EncodeError(self._failed) from e
        self._done = True
        self._bar.close()

    def _finish(self) -> None:
        """Stop after a failure: close the partial file, which stays for :func:`recover_file`."""
        self._done = True
        self._bar.close()
        try:
            self._sink.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Stop writing and delete the partial file; ``path`` is left as it was. After a failed
        write or close the partial file is kept instead (it holds the complete batches)."""
        if self._failed:
            self._finish()
            return
        self._done = True
        self._bar.close()
        self._sink.close()
        self._partial.unlink(missing_ok=True)

    def __enter__(self) -> "FileWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


MODES = ("w", "a", "x")
"""What :class:`FileWriter` does with an existing path: replace it, append to it, refuse it."""


def _appended(path: Path) -> Any:
    """The reader of the file of this library at ``path`` that a writer in mode ``"a"`` appends
    to (:class:`SchemaMismatchError` for another tool's file; the reader's errors otherwise)."""
    from .reader import open_file

    reader = open_file(path)
    if reader.foreign:
        reader.close()
        raise SchemaMismatchError(f"{path} is not a file of arrow-dataproto: mode='a' appends only to one")
    return reader


def _as_batches(data: Any) -> Iterable[Any]:
    """A single DataProto (ours or verl's) or TensorDict as a one-item list; other iterables
    (of them) as they are. :class:`ArgumentTypeError` naming the type given for anything else
    (a dict of tensors included: it is not a batch)."""
    from tensordict import is_tensor_collection

    if is_tensor_collection(data) or hasattr(data, "non_tensor_batch"):
        return [data]
    if isinstance(data, (Mapping, str, bytes)) or not isinstance(data, Iterable):
        hint = " (a dict of tensors: DataProto.from_dict(it) or TensorDict(it, batch_size=[rows]))" if isinstance(data, Mapping) else ""
        raise ArgumentTypeError(
            f"write_file takes a DataProto, a TensorDict or an iterable of them, got {type(data).__name__}{hint}"
        )
    return data


def write_file(
    path: str | os.PathLike,
    data: Any,
    *,
    compression: str | None = None,
    progress: bool = False,
    checksums: bool | None = None,
    portable: bool | None = None,
    stream: bool | None = None,
    mode: str = "w",
) -> None:
    """Write a DataProto, or an iterable of DataProtos with the same columns, to an Arrow IPC file.

    One record batch per DataProto; see :class:`FileWriter` for what is copied, the
    errors, how ``path`` is replaced (``mode``: ``"w"``, ``"a"`` to append, ``"x"``),
    ``checksums``, ``portable`` (the portable view, for other tools) and ``stream`` (an IPC
    stream file). ``compression``: ``None``, ``"lz4"`` or ``"zstd"``.
    """
    with FileWriter(
        path, mode, compression=compression, progress=progress, checksums=checksums, portable=portable, stream=stream
    ) as writer:
        for item in _as_batches(data):
            writer.write(item)
