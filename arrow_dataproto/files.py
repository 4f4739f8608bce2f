"""DataProto batches in Arrow IPC files: write, append, open, read rows and columns, recover.

A file is an Arrow IPC *file* (the random-access format, ``.arrow``; pyarrow,
``pandas.read_feather``, polars and DuckDB open it) holding one record batch
per DataProto written, every batch with the same columns. Layout:

- the footer schema is the first batch's schema: the columns, their field
  metadata (torch dtype, per-row shape, device, layout) and that batch's schema
  metadata (see ``docs/format.md``);
- every batch carries its own schema metadata as the batch's custom metadata,
  so its batch size, TensorDict tree and ``meta_info`` read back exactly;
- the footer metadata records the compression (``adp.compression``).

``FileWriter(portable=True)`` writes the portable view of each batch (plain Arrow types other
tools read as values, see ``docs/format.md``) and ``stream=True`` an IPC *stream* file (what
HF ``datasets.Dataset.from_file`` opens); the readers give the same DataProtos back from
every form.

Reading (:func:`open_file`) is zero-copy for uncompressed files: each read call
maps the file privately (``mmap.ACCESS_COPY``) and decoded tensors view the
mapped pages, so nothing is read from disk until a tensor is touched. An
in-place write to such a tensor copies the touched page privately: it never
changes the file, nor what another read call returns (each call has its own
mapping; tensors from one call share it). A mapping lives as long as any tensor
or array viewing it, whether or not the reader is closed. Compressed files are
decompressed into new memory, column by column as read. Measured
(``benchmarks/results/files.md``): a read call costs well under a millisecond
whatever the file size, and the first in-place write over a mapped tensor costs
about what ``clone()`` would (each touched page is copied once). Like any
private writable mapping, it counts toward the commit limit on systems with
strict overcommit; ``copy=True`` reads into ordinary memory instead.

Never truncate or rewrite a file in place while it is open: touching a mapped
page past the new end of the file kills the process (``SIGBUS``). This module
never does: a writer writes ``PATH.<random>.partial`` and renames it over
``PATH`` when closed, which leaves open readers on the old file.

The readers also open any other Arrow IPC file, and IPC *stream* files (no ``ARROW1``
magic: HF ``datasets``' cache files, ``polars.write_ipc_stream``, :func:`~arrow_dataproto.to_ipc`
written to disk), memory-mapped the same way. A stream has no footer: opening one reads its
message headers once (nothing is decompressed) to find each batch, which is then read by
index (zero-copy if uncompressed; a stream with dictionary batches is read in order up to
the batch asked for). Another tool's columns are read by the rule of
:func:`~arrow_dataproto.from_arrow` (``docs/format.md``, "Reading tables of other tools");
``read_all``/``read_rows`` read its batches as one table.

Errors: a file that is not Arrow (or names another format), truncated or corrupt raises
:class:`~arrow_dataproto.errors.DecodeError` (never a raw pyarrow error). Arrow
files carry no checksum: a flipped bit in tensor values reads back unnoticed
unless the file was written with ``checksums=True`` and is read with
``verify=True`` (see :mod:`arrow_dataproto._checksum`); pickled columns or ``meta_info`` raise
:class:`~arrow_dataproto.errors.PickleNotAllowedError` unless the reader was
opened with ``allow_pickle=True``.
"""

from __future__ import annotations

import bisect
import itertools
import json
import mmap
import os
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from . import _checksum, _limits
from .errors import (
    DataProtoError,
    DecodeError,
    EncodeError,
    PickleNotAllowedError,
    SchemaMismatchError,
)
from ._format import (
    CHECKSUMS,
    COMPRESSION,
    COMPRESSIONS,
    DEVICE,
    DTYPE,
    FORMAT,
    KIND,
    META_INFO_ENCODING,
    OFFSETS_OF,
    PER_BATCH,
    PORTABLE,
    ROW_SHAPE,
    Node,
    check_field_names,
    check_schema,
    is_foreign,
    resolve_columns,
    text_metadata,
)
from ._ipc import CONTINUATION, MAGIC, StreamIndex, block_header, file_blocks, header_codec, open_regular, scan_stream
from ._layout import BatchLayout, ColumnInfo, check_footer, layout_readable, read_layout
from ._objects import JSON, OBJECT, PICKLE, decode_column, decode_meta_info, encode_as, json_type, pickled_meta_keys
from ._progress import progress_bar
from ._validate import validate_arrow

if TYPE_CHECKING:
    import torch

    from ._container import DataProto

__all__ = [
    "BatchLayout",
    "ColumnInfo",
    "DatasetReader",
    "FileReader",
    "FileWriter",
    "copy_file",
    "layout_readable",
    "open_dataset",
    "open_file",
    "read_file",
    "read_layout",
    "recover_file",
    "write_file",
]

_INCOMPLETE = (
    "no Arrow footer at the end of the file: its writer did not finish (killed, or still writing) "
    "or the file was cut short; recover_file(path, new_path) or `arrow-dataproto recover` copies "
    "its complete batches into a valid file"
)


# ---------------------------------------------------------------- opening


# ---------------------------------------------------------------- metadata helpers


def _layout(metadata: dict[str, str]) -> dict[str, str]:
    """What every batch of a file must share: the schema metadata except the per-batch
    entries, plus the batch dimensions after the first and the TensorDict nesting (the
    metadata as it is for another tool's schema, which has none of these)."""
    if FORMAT not in metadata:
        return dict(metadata)
    tree = Node.parse(metadata)
    shared = {k: v for k, v in metadata.items() if k not in PER_BATCH}
    shared["batch dimensions after the first"] = json.dumps(None if tree is None else list(tree.batch_size[1:]))
    shared["TensorDict nesting"] = json.dumps([] if tree is None else tree.nesting())
    return shared


def schema_difference(expected: pa.Schema, got: pa.Schema) -> list[str]:
    """Every way ``got`` differs from ``expected`` in what the batches of one file must share:
    column names and order, Arrow types, column metadata (dtype, per-row shape, device...)
    and the batch layout. Per-batch values (batch size, ``meta_info``) may differ. Empty if none."""
    differences = []
    # Linear in the number of columns: fields by name in dicts, never a lookup by name in a list.
    fields_a, fields_b = dict(zip(expected.names, expected)), dict(zip(got.names, got))
    missing = [n for n in expected.names if n not in fields_b]
    added = [n for n in got.names if n not in fields_a]
    if missing:
        differences.append(f"missing column(s) {missing}")
    if added:
        differences.append(f"added column(s) {added}")
    if not (missing or added) and expected.names != got.names:
        differences.append(f"columns in order {got.names}, expected {expected.names}")
    for name, a in fields_a.items():
        b = fields_b.get(name)
        if b is None:
            continue
        meta_a, meta_b = text_metadata(a.metadata), text_metadata(b.metadata)
        changed = [k for k in sorted(set(meta_a) | set(meta_b)) if meta_a.get(k) != meta_b.get(k) and k != OFFSETS_OF]
        differences += [f"column {name!r}: {k} {meta_b.get(k)}, expected {meta_a.get(k)}" for k in changed]
        if not changed and not a.remove_metadata().equals(b.remove_metadata()):
            differences.append(f"column {name!r}: Arrow field {b.type}, expected {a.type}")
    layout_a, layout_b = _layout(text_metadata(expected.metadata)), _layout(text_metadata(got.metadata))
    for key in sorted(set(layout_a) | set(layout_b)):
        if layout_a.get(key) != layout_b.get(key):
            differences.append(f"{key}: {layout_b.get(key)}, expected {layout_a.get(key)}")
    return differences


def _row_bits(arrow_type: pa.DataType) -> float:
    """Bits per row of a fixed-width column (infinite for variable-width ones)."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        arrow_type = arrow_type.storage_type
    if pa.types.is_fixed_size_list(arrow_type):
        return _row_bits(arrow_type.value_type) * arrow_type.list_size
    try:
        return arrow_type.bit_width
    except ValueError:
        return float("inf")


# ---------------------------------------------------------------- writing


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

    ``progress=True`` shows the bytes written (tqdm, if installed). ``checksums=True``
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
        *,
        compression: str | None = None,
        progress: bool = False,
        checksums: bool = False,
        portable: bool = False,
        stream: bool = False,
    ):
        if compression not in COMPRESSIONS:
            raise EncodeError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.path = Path(path)
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
        self.checksums = checksums
        self.portable = portable
        self.stream = stream

    def write(self, data: Any) -> None:
        """Append one DataProto (ours or verl's) or TensorDict as the next batch.

        A ``meta_info`` that needs pickling (values neither JSON nor tensors) is written
        pickled with a warning naming the keys: reading it back will need ``allow_pickle=True``."""
        from ._codec import to_arrow

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
        from . import _portable

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
        batch, targets = self._evolve(self._conform(batch))
        expected = self._schema if not targets else self._unified_schema(targets)
        differences = schema_difference(expected, batch.schema)
        if differences:
            raise SchemaMismatchError(
                f"batch {self.num_batches} does not match the columns of {self.path}: " + "; ".join(differences)
            )
        if targets:
            self._rewrite(targets, batch)
        else:
            self._append(batch)

    def _custom(self, written: pa.RecordBatch, index: int) -> dict[bytes, bytes]:
        """The custom metadata of batch ``index`` (written form): its schema metadata, and its
        checksums if this writer records them."""
        custom = dict(written.schema.metadata or {})
        if self.checksums:
            record = _checksum.checksums(written, index, self._schema_text)
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

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with the columns whose Arrow type their values cannot decide typed as the
        file's column of the same name (:func:`_adopts`): they read back the same either way."""
        schema, columns = batch.schema, list(batch.columns)
        for i, field in enumerate(batch.schema):
            expected = self._fields.get(field.name)
            if expected is not None and _adopts(field, len(columns[i]), expected):
                schema, columns[i] = schema.set(i, expected), pa.nulls(len(columns[i]), expected.type)
        return batch if schema is batch.schema else pa.RecordBatch.from_arrays(columns, schema=schema)

    def _evolve(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, dict[str, pa.Field]]:
        """``batch`` with each column whose rows chose another Arrow type than the file's (object,
        json and pickle columns of one dtype and row shape) unified with the file's column, by
        the schema-evolution rule of ``docs/format.md``: the batch's values in the file's type
        if they come back exactly in it; else, for a native column of the file, the batch's own
        type if the rows written so far come back exactly in it, or else JSON, rewriting the
        batches written so far (:meth:`_rewrite`). Raises :class:`SchemaMismatchError` when
        only pickling would hold the values and the file's column is not pickled already (a
        reader would newly need ``allow_pickle=True``). Writes nothing: returns the batch and the
        columns whose file type changes (``{name: new field}``), which :meth:`_rewrite` rewrites."""
        targets: dict[str, pa.Field] = {}
        schema, columns = batch.schema, list(batch.columns)
        for i, field in enumerate(batch.schema):
            expected = self._fields.get(field.name)
            if expected is None or field.equals(expected, check_metadata=True) or not _rows_decide(field, expected):
                continue
            target, columns[i] = self._unified(field, columns[i], expected)
            schema = schema.set(i, target)
            if not target.equals(expected, check_metadata=True):
                targets[field.name] = target
        unified = batch if schema is batch.schema else pa.RecordBatch.from_arrays(columns, schema=schema)
        return unified, targets

    def _unified_schema(self, targets: dict[str, pa.Field]) -> pa.Schema:
        """The file's schema (stored form) with the columns ``targets`` changed."""
        assert self._schema is not None
        return pa.schema([targets.get(f.name, f) for f in self._schema], metadata=self._schema.metadata)

    def _unified(self, field: pa.Field, column: pa.Array, expected: pa.Field) -> tuple[pa.Field, pa.Array]:
        """The field a column of a new batch and the file's ``expected`` unify to, and the
        batch's column encoded in it (see :meth:`_evolve`)."""
        name, kind, file_kind = field.name, _kind(field), _kind(expected)

        def refuse(why: str) -> SchemaMismatchError:
            return SchemaMismatchError(
                f"batch {self.num_batches} does not match the columns of {self.path}: column {name!r}: {why}"
            )

        if kind == PICKLE:
            raise refuse(
                f"this batch's values need pickling (they are neither native Arrow nor JSON), the file stores "
                f"the column as {file_kind} ({expected.type}): reading it would newly need allow_pickle=True"
            )
        rows = decode_column(name, column, text_metadata(field.metadata), allow_pickle=False)
        array = encode_as(name, rows, expected)
        if array is not None:
            return expected, array
        if file_kind != OBJECT:
            raise refuse("the file stores it as JSON and this batch's values are not JSON (reading them would need allow_pickle=True)")
        as_json = expected.with_type(json_type()).with_metadata({**text_metadata(expected.metadata), KIND: JSON})
        candidates = ([field] if kind == OBJECT else []) + [as_json]
        for target in candidates:
            array = column if target is field else encode_as(name, rows, target)
            if array is not None and all(
                encode_as(name, old, target) is not None for old in self._written_rows(expected)
            ):
                return target, array
        raise refuse(
            f"the batches written so far hold values ({expected.type}) that neither this batch's type "
            f"({field.type}) nor JSON gives back exactly, and pickling would newly need allow_pickle=True"
        )

    def _form(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (stored form) as this writer writes it: its portable view if ``portable``."""
        from . import _portable

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
        from . import _portable

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
        schema = self._unified_schema(targets)
        old_fields = dict(self._fields)
        partial = self.path.with_name(f"{self.path.name}.{secrets.token_hex(4)}.partial")
        sink = pa.OSFile(str(partial), "wb")
        writer, schema_text, index = None, self._schema_text, 0
        try:
            for old, custom in self._written_batches():
                columns = list(old.columns)
                for name, target in targets.items():
                    i = old.schema.get_field_index(name)
                    rows = decode_column(name, columns[i], text_metadata(old_fields[name].metadata), allow_pickle=False)
                    columns[i] = encode_as(name, rows, target)
                written = self._form(pa.RecordBatch.from_arrays(columns, schema=schema))
                if writer is None:
                    writer = self._new_writer(sink, written.schema)
                    self._schema_text = _checksum.schema_text(written.schema)
                custom.pop(CHECKSUMS.encode(), None)
                if self.checksums:
                    custom[CHECKSUMS.encode()] = _checksum.checksums(written, index, self._schema_text).encode()
                writer.write_batch(written, custom_metadata=custom)
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

    def _start(self, schema: pa.Schema, written: pa.Schema) -> Any:
        """Begin the file: ``schema`` is the columns in the stored form, ``written`` in the form written."""
        self._schema = schema
        self._fields = dict(zip(schema.names, schema))
        self._schema_text = _checksum.schema_text(written) if self.checksums else ""
        self._writer = self._new_writer(self._sink, written)
        return self._writer

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
                from ._codec import to_arrow
                from ._container import DataProto

                empty = to_arrow(DataProto())
                self._start(empty.schema, self._form(empty).schema)
            self._writer.close()
            self._sink.close()
        except (pa.ArrowException, OSError) as e:  # the footer could not be written (disk full...)
            self._fail(before, f"cannot finish {self.path}: {e}; the file was not written")
            self._finish()
            raise EncodeError(self._failed) from e
        try:
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


_KIND_FROM_ROWS = frozenset({OBJECT, JSON, PICKLE})
"""Kinds of a ``non_tensor_batch`` column that its rows choose (no rows: ``object``)."""


def _kind(field: pa.Field) -> str | None:
    return text_metadata(field.metadata).get(KIND)


def _rows_decide(field: pa.Field, expected: pa.Field) -> bool:
    """Whether two columns differ only in what their rows chose: kinds object, json or pickle,
    with the same dtype and row shape (:meth:`FileWriter._evolve` unifies them)."""
    got, want = text_metadata(field.metadata), text_metadata(expected.metadata)
    same_array = all(got.get(k) == want.get(k) for k in (DTYPE, ROW_SHAPE))
    return same_array and {got.get(KIND), want.get(KIND)} <= _KIND_FROM_ROWS


def _adopts(field: pa.Field, rows: int, expected: pa.Field) -> bool:
    """Whether a column may take the file's field ``expected``: an all-null column (no rows or
    only ``None``) with the same metadata, or a column of no rows whose kind only its rows
    decide (object or pickled; a strided nested tensor, whose row rank torch forgets without
    rows) with the file's dtype and device."""
    if field.equals(expected, check_metadata=True):
        return False
    if pa.types.is_null(field.type) and not pa.types.is_null(expected.type) and field.metadata == expected.metadata:
        return True
    if rows:
        return False
    got, want = text_metadata(field.metadata), text_metadata(expected.metadata)
    if any(got.get(k) != want.get(k) for k in (DTYPE, DEVICE)):
        return False
    kinds = {got.get(KIND), want.get(KIND)}
    if kinds <= _KIND_FROM_ROWS:
        return got.get(ROW_SHAPE) == want.get(ROW_SHAPE)
    return kinds == {"strided"}


def _as_batches(data: Any) -> Iterable[Any]:
    """A single DataProto (ours or verl's) or TensorDict as a one-item list; other iterables as they are."""
    from tensordict import is_tensor_collection

    if is_tensor_collection(data) or hasattr(data, "non_tensor_batch"):
        return [data]
    return data


def write_file(
    path: str | os.PathLike,
    data: Any,
    *,
    compression: str | None = None,
    progress: bool = False,
    checksums: bool = False,
    portable: bool = False,
    stream: bool = False,
) -> None:
    """Write a DataProto, or an iterable of DataProtos with the same columns, to an Arrow IPC file.

    One record batch per DataProto; see :class:`FileWriter` for what is copied, the
    errors, how ``path`` is replaced, ``checksums``, ``portable`` (the portable view, for
    other tools) and ``stream`` (an IPC stream file). ``compression``: ``None``,
    ``"lz4"`` or ``"zstd"``.
    """
    with FileWriter(
        path, compression=compression, progress=progress, checksums=checksums, portable=portable, stream=stream
    ) as writer:
        for item in _as_batches(data):
            writer.write(item)


# ---------------------------------------------------------------- reading


def _empty() -> DataProto:
    from ._container import DataProto

    return DataProto()


class _Reader:
    """What :class:`FileReader` and :class:`DatasetReader` share: rows, columns, decoding.

    Subclasses provide ``schema``, ``num_batches``, ``_read``, ``_count_rows`` and ``_metadata``.
    """

    schema: pa.Schema

    def __init__(self, *, allow_pickle: bool, device: str | torch.device | None, copy: bool, progress: bool,
                 schema: Any = None):
        self.allow_pickle = allow_pickle
        self.original_schema = None
        if schema is not None:
            from . import _restore

            self.original_schema = _restore.original_schema(schema, allow_pickle=allow_pickle)
        self.device = device
        self.copy = copy
        self.progress = progress
        self._batch_rows: list[int] | None = None

    # -- subclass hooks

    @property
    def num_batches(self) -> int:
        raise NotImplementedError

    def _read(self, indices: Sequence[int], fields: list[int] | None) -> list[tuple[pa.RecordBatch, dict[str, str]]]:
        """Batches ``indices`` with only the columns ``fields`` (all if None) and their schema metadata."""
        raise NotImplementedError

    def _count_rows(self) -> list[int]:
        """The number of rows of each batch, reading as little as possible."""
        raise NotImplementedError

    def _metadata(self, i: int) -> dict[str, str]:
        """The schema metadata of batch ``i``, reading as little as possible."""
        raise NotImplementedError

    def _paths(self) -> list[Path]:
        raise NotImplementedError

    # -- layout

    @property
    def columns(self) -> list[str]:
        """Column names: TensorDict leaves (nested keys joined by ``.``), then non-tensor columns."""
        return list(self.schema.names)

    def column_info(self) -> list[ColumnInfo]:
        """Every column's kind, dtype, per-row shape and device, from the schema alone."""
        return [ColumnInfo.from_field(field) for field in self.schema]

    @property
    def pickled_columns(self) -> list[str]:
        """Columns whose values are pickled (reading them needs ``allow_pickle=True``)."""
        return [c.name for c in self.column_info() if c.kind == PICKLE]

    @property
    def batch_rows(self) -> list[int]:
        """The number of rows of each batch (computed once; a compressed file of several
        batches decompresses one narrow column of each to count them)."""
        if self._batch_rows is None:
            self._batch_rows = self._count_rows()
        return self._batch_rows

    @property
    def num_rows(self) -> int:
        return sum(self.batch_rows)

    def meta_info_encoding(self, i: int = 0) -> str | None:
        """How batch ``i``'s ``meta_info`` is stored: ``"json"``, ``"pickle"``, or None if it has none."""
        return self._metadata(self._index(i)).get(META_INFO_ENCODING)

    def read_meta_info(self, i: int = 0) -> dict:
        """Batch ``i``'s ``meta_info`` alone (:class:`PickleNotAllowedError` if pickled and not allowed)."""
        metadata = self._metadata(self._index(i))
        return self._refusing_pickles(lambda: decode_meta_info(metadata, allow_pickle=self.allow_pickle))

    def column_nbytes(self) -> dict[str, int]:
        """Bytes each column takes in memory, all batches together (uncompressed sizes:
        a compressed file is decompressed batch by batch to count them)."""
        totals = dict.fromkeys(self.columns, 0)
        with progress_bar(self.progress, total=self.num_batches, desc="sizing", unit="batch") as bar:
            for i in range(self.num_batches):
                batch, _ = self._read([i], None)[0]
                for name, column in zip(batch.schema.names, batch.columns):
                    totals[name] += column.nbytes
                bar.update()
        return totals

    def arrow_dataset(self):
        """The file(s) as a ``pyarrow.dataset.Dataset``, for Arrow-level scans and filters.

        Columns appear as stored (bfloat16 as uint16, tensors as fixed_shape_tensor; a
        portable file's in its plain types: float32, nested fixed-size lists); only
        the first batch's ``meta_info`` is visible (as schema metadata)."""
        import pyarrow.dataset as ds

        return ds.dataset([str(p) for p in self._paths()], format="ipc")

    # -- reading

    def _index(self, i: int) -> int:
        n = self.num_batches
        if not -n <= i < n:
            raise IndexError(f"batch {i} out of range for {n} batches")
        return i % n

    def _fields(self, columns: Iterable[str] | None) -> tuple[list[int] | None, list[str] | None]:
        """Indices and names of the columns asked for (a nested TensorDict's name selects its leaves)."""
        if columns is None:
            return None, None
        keep = resolve_columns(self.columns, columns, str(self))
        return [i for i, n in enumerate(self.columns) if n in keep], keep

    def _refusing_pickles(self, decode):
        try:
            return decode()
        except PickleNotAllowedError as e:
            raise PickleNotAllowedError(
                f"{self}: {e}; open it with allow_pickle=True if you trust it, or read without "
                "the pickled parts (columns=[...], meta_info=False)"
            ) from None

    def _decode(
        self,
        batch: pa.RecordBatch,
        metadata: dict[str, str],
        keep: list[str] | None,
        rows: tuple[int, int] | None,
        meta_info: bool,
    ) -> DataProto:
        from ._codec import decode
        from ._container import DataProto

        batch = batch.replace_schema_metadata(metadata)

        def decoded() -> DataProto:
            parts = decode(
                batch, columns=keep, rows=rows, meta_info=meta_info,
                device=self.device, copy=self.copy, allow_pickle=self.allow_pickle, schema=self.original_schema,
            )
            return DataProto(batch=parts.batch, non_tensor_batch=parts.non_tensor_batch, meta_info=parts.meta_info)

        return self._refusing_pickles(decoded)

    def read_batch(self, i: int, columns: Iterable[str] | None = None, *, meta_info: bool = True) -> DataProto:
        """Batch ``i`` as written (zero-copy for uncompressed files).

        ``columns``: read only these (a nested TensorDict's name selects all its leaves);
        ``meta_info=False`` leaves ``meta_info`` empty (nothing of it is decoded).
        """
        fields, keep = self._fields(columns)
        batch, metadata = self._read([self._index(i)], fields)[0]
        return self._decode(batch, metadata, keep, None, meta_info)

    def read_arrow(self, i: int, columns: Iterable[str] | None = None) -> pa.RecordBatch:
        """Batch ``i`` as stored, nothing decoded: a RecordBatch that :func:`~arrow_dataproto.from_arrow`
        turns into the DataProto :meth:`read_batch` gives (its schema metadata holds the
        batch's tree, trimmed to ``columns``, and ``meta_info``).

        Zero-copy for uncompressed files (the columns view the file's memory map); a
        compressed file decompresses only ``columns``. Pickled columns stay bytes, so no
        ``allow_pickle`` is needed here; decoding them is what needs it.
        """
        fields, keep = self._fields(columns)
        batch, metadata = self._read([self._index(i)], fields)[0]
        tree = Node.parse(metadata) if keep is not None and not is_foreign(self.schema) else None
        if tree is not None:
            metadata = {**metadata, **tree.select(set(keep or ())).metadata()}
        return batch.replace_schema_metadata(metadata)

    def read_rows(
        self, start: int = 0, stop: int | None = None, columns: Iterable[str] | None = None, *, meta_info: bool = True
    ) -> DataProto:
        """Rows ``start:stop`` across batches (Python slice rules, step 1).

        Rows within one batch are a zero-copy view (uncompressed files); rows spanning
        several batches are concatenated (one copy), and their ``meta_info`` is the first
        batch's updated by the later ones'. ``columns`` and ``meta_info`` as in :meth:`read_batch`.
        """
        fields, keep = self._fields(columns)
        start, stop, _ = slice(start, stop).indices(self.num_rows)
        stop = max(start, stop)
        bounds = [0, *itertools.accumulate(self.batch_rows)]
        if start == stop:  # no rows, but the columns of the file
            if not self.num_batches:
                return _empty()
            first = min(bisect.bisect_right(bounds, start) - 1, self.num_batches - 1)
            spans: list[tuple[int, int, int | None]] = [(first, 0, 0)]
        else:
            spans = [
                (i, max(start, bounds[i]) - bounds[i], min(stop, bounds[i + 1]) - bounds[i])
                for i in range(self.num_batches)
                if bounds[i] < stop and bounds[i + 1] > start
            ]
        return self._gather(spans, fields, keep, meta_info)

    def read_all(self, columns: Iterable[str] | None = None, *, meta_info: bool = True) -> DataProto:
        """Every row as one DataProto (one batch: zero-copy; several: concatenated, see :meth:`read_rows`)."""
        fields, keep = self._fields(columns)
        if not self.num_batches:
            return _empty()
        return self._gather([(i, 0, None) for i in range(self.num_batches)], fields, keep, meta_info)

    def _gather(self, spans: list[tuple[int, int, int | None]], fields, keep, meta_info: bool) -> DataProto:
        """Rows ``a:b`` of batch ``i`` for each ``(i, a, b)`` (``b`` None: the whole batch), concatenated."""
        parts = []
        batches = self._read([i for i, _, _ in spans], fields)
        if len(batches) > 1 and is_foreign(self.schema):  # one table: one rule over all its rows
            pieces = [batch.slice(a, (batch.num_rows if b is None else b) - a) for (_, a, b), (batch, _) in zip(spans, batches)]
            from ._codec import as_record_batch

            try:
                whole = as_record_batch(pa.Table.from_batches(pieces))
            except (pa.ArrowException, ValueError) as e:  # DecodeError is a ValueError
                raise DecodeError(f"{self}: the batches do not form one table: {e}") from e
            return self._decode(whole, batches[0][1], keep, None, meta_info)
        with progress_bar(self.progress and len(spans) > 1, total=len(spans), desc="reading", unit="batch") as bar:
            for (_, a, b), (batch, metadata) in zip(spans, batches):
                rows = None if b is None or (a, b) == (0, batch.num_rows) else (a, b)
                parts.append(self._decode(batch, metadata, keep, rows, meta_info))
                bar.update()
        return parts[0] if len(parts) == 1 else type(parts[0]).concat(parts, meta_info="update")

    def iter_batches(self, columns: Iterable[str] | None = None, *, meta_info: bool = True) -> Iterator[DataProto]:
        """Each batch in order, as :meth:`read_batch` returns it."""
        with progress_bar(self.progress, total=self.num_batches, desc="reading", unit="batch") as bar:
            for i in range(self.num_batches):
                yield self.read_batch(i, columns, meta_info=meta_info)
                bar.update()

    def __iter__(self) -> Iterator[DataProto]:
        return self.iter_batches()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


def _describe_start(head: bytes) -> str:
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

    def count_rows(self) -> int:
        return sum(self.index.rows)

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


class FileReader(_Reader):
    """An Arrow IPC file of DataProto batches, open for reading; made by :func:`open_file`.

    ``stream`` says whether it is an IPC stream file (no footer), ``foreign`` whether it is
    another tool's (no ``adp.*`` schema metadata: read by the rule of
    :func:`~arrow_dataproto.from_arrow`).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        allow_pickle: bool = False,
        device: str | torch.device | None = None,
        copy: bool = False,
        progress: bool = False,
        max_decoded_bytes: _limits.MaxDecoded = "auto",
        verify: bool = False,
        schema: Any = None,
    ):
        super().__init__(allow_pickle=allow_pickle, device=device, copy=copy, progress=progress, schema=schema)
        self.path = Path(path)
        self.verify_checksums = verify
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
        self._layout = _layout(self._footer_schema_metadata)
        self.compression: str | None = None if compression == "none" else compression
        narrowest = min(range(len(self.schema)), key=lambda i: _row_bits(self.schema.field(i).type), default=None)
        self._probe_fields = None if self.compression is None or narrowest is None else [narrowest]
        self._max_decoded = _limits.limit(max_decoded_bytes, self.file_size)
        self._blocks: list[tuple[int, int, int]] | None = None if self._stream is None else self._stream.blocks
        self._schema_text: str | None = None
        if verify:
            try:
                self._check_footer()
            except BaseException:
                self.close()
                raise

    def _open_ipc(self, fields: list[int] | None = None) -> pa.ipc.RecordBatchFileReader:
        """A fresh private copy-on-write mapping of the file, opened as an Arrow IPC file."""
        return self._open_mapped(fields)[0]

    def _open_mapped(self, fields: list[int] | None = None) -> tuple[Any, pa.Buffer]:
        """:meth:`_open_ipc` and the mapped bytes (an IPC stream: a :class:`_StreamFile`)."""
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
            raise DecodeError(f"{self.path}: {_describe_start(source[:8])}")
        if len(source) < 2 * len(MAGIC) + 6 or source[-len(MAGIC):] != MAGIC:
            raise DecodeError(f"{self.path}: {_INCOMPLETE}")
        options = pa.ipc.IpcReadOptions(included_fields=fields or [])
        data = pa.py_buffer(source)
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
            if _layout(metadata) != self._layout:
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
        if self._stream is not None:  # from the message headers
            return list(self._stream.rows)
        if self.compression is not None and self.num_batches == 1:
            return [self._open_ipc().count_rows()]  # from the batch's message header: nothing decompressed
        return [batch.num_rows for batch, _ in self._read(range(self.num_batches), self._probe_fields)]

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


def open_file(
    path: str | os.PathLike,
    *,
    allow_pickle: bool = False,
    device: str | torch.device | None = None,
    copy: bool = False,
    progress: bool = False,
    max_decoded_bytes: int | str | None = "auto",
    verify: bool = False,
    schema: pa.Schema | str | os.PathLike | None = None,
) -> FileReader:
    """Open an Arrow IPC file written by :func:`write_file` / :class:`FileWriter`, or any
    other Arrow IPC file or IPC stream file (see the module docstring; another tool's
    columns are read by the rule of :func:`~arrow_dataproto.from_arrow`).

    Reads only the footer; batches are read on demand, memory-mapped (see the module
    docstring: zero-copy, copy-on-write, each read call its own mapping). The reader has
    ``num_batches``, ``num_rows``, ``batch_rows``, ``schema``, ``columns``,
    :meth:`~FileReader.column_info`, :meth:`~FileReader.read_batch`,
    :meth:`~FileReader.read_rows`, :meth:`~FileReader.read_all` and iterates over batches.

    ``allow_pickle=True`` allows decoding pickled columns and ``meta_info`` (unpickling
    runs code from the file: only for files you trust). ``device`` places every tensor
    there (like ``map_location``); ``copy=True`` gives tensors that own their memory
    instead of viewing the mapping. ``progress=True`` shows a bar while reading many batches.

    A file is untrusted input: the batches one read call decompresses may decode to at most
    ``max_decoded_bytes`` (default ``"auto"``: 64 MiB or 256 times the file's size, whichever
    is larger; an int: that many bytes; ``None``: no limit), checked from the message headers
    before anything is decompressed; every batch passes Arrow's full validation before its
    values or sizes are read. Anything but a regular file (a FIFO, a device, a folder) is
    refused with :class:`DecodeError` without being opened for reading.

    ``verify=True`` checks each batch read against the checksums it was written with
    (``FileWriter(checksums=True)``; :class:`DecodeError` on a mismatch or a batch without
    them); opening stays O(1) either way.

    ``schema``: for a file another tool wrote from one of ours (polars ``write_ipc`` of a
    filtered frame, say), the original file's path or ``pa.Schema``: its columns read back
    as stored, as :func:`~arrow_dataproto.from_arrow` says.

    Raises ``FileNotFoundError``/``OSError`` as ``open`` does, :class:`DecodeError` for
    a file that is not Arrow (or whose schema names another format), truncated or corrupt, and
    :class:`FormatVersionError` for an incompatible format version.
    """
    return FileReader(
        path, allow_pickle=allow_pickle, device=device, copy=copy, progress=progress,
        max_decoded_bytes=max_decoded_bytes, verify=verify, schema=schema,
    )


def read_file(path: str | os.PathLike, columns: Iterable[str] | None = None, **options: Any) -> DataProto:
    """Every row of a file as one DataProto: ``open_file(path, **options).read_all(columns)``.

    A file of one batch comes back zero-copy (its mapping lives as long as the tensors do);
    several batches are concatenated (one copy).
    """
    with open_file(path, **options) as reader:
        return reader.read_all(columns)


def _stored_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` in the stored form: a portable file's columns as their stored types, without
    ``adp.portable`` (what :func:`_portable.from_portable` makes of its batches)."""
    if is_foreign(schema) or PORTABLE.encode() not in (schema.metadata or {}):
        return schema
    try:
        from . import _portable

        return _portable.from_portable(pa.RecordBatch.from_pylist([], schema=schema)).schema
    except (pa.ArrowException, ValueError, TypeError) as e:  # DecodeError is a ValueError
        raise DecodeError(f"a portable schema that has no stored form: {e}") from e


class DatasetReader(_Reader):
    """Several Arrow files with the same columns read as one; made by :func:`open_dataset`.

    Batches are numbered across the files in order; everything else is as in
    :class:`FileReader`. ``files`` holds each file's reader.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        *,
        allow_pickle: bool = False,
        device: str | torch.device | None = None,
        copy: bool = False,
        progress: bool = False,
        max_decoded_bytes: int | str | None = "auto",
        verify: bool = False,
        schema: Any = None,
    ):
        super().__init__(allow_pickle=allow_pickle, device=device, copy=copy, progress=progress, schema=schema)
        if not paths:
            raise FileNotFoundError("a dataset needs at least one file")
        self.files: list[FileReader] = []
        try:
            for path in paths:
                self.files.append(
                    FileReader(
                        path, allow_pickle=allow_pickle, device=device, copy=copy,
                        max_decoded_bytes=max_decoded_bytes, verify=verify,
                    )
                )
            first = self.files[0]
            stored = _stored_schema(first.schema)
            for other in self.files[1:]:  # compared in the stored form, as FileWriter compares batches
                differences = schema_difference(stored, _stored_schema(other.schema))
                if differences:
                    raise SchemaMismatchError(
                        f"{other.path} does not match the columns of {first.path}: " + "; ".join(differences)
                    )
        except BaseException:
            self.close()
            raise
        self.schema = first.schema
        self._starts = [0, *itertools.accumulate(f.num_batches for f in self.files)]

    @property
    def num_batches(self) -> int:
        return self._starts[-1]

    def _paths(self) -> list[Path]:
        return [f.path for f in self.files]

    def _split(self, indices: Sequence[int]):
        """``(file, local indices)`` groups of consecutive batch indices in the same file."""
        def file_of(i: int) -> int:
            return bisect.bisect_right(self._starts, i) - 1

        for f, group in itertools.groupby(indices, key=file_of):
            yield self.files[f], [i - self._starts[f] for i in group]

    def _read(self, indices, fields):
        return [item for file, local in self._split(indices) for item in file._read(local, fields)]

    def _count_rows(self):
        return [rows for file in self.files for rows in file.batch_rows]

    def _metadata(self, i):
        file, local = next(self._split([i]))
        return file._metadata(local[0])

    def verify(self) -> int:
        """:meth:`FileReader.verify` of every file, in order; the number of buffers checked."""
        return sum(file.verify() for file in self.files)

    def close(self) -> None:
        for file in self.files:
            file.close()

    def __repr__(self) -> str:
        return f"<DatasetReader of {len(self.files)} files: {self.num_batches} batches, {len(self.columns)} columns>"



def open_dataset(paths: str | os.PathLike | Iterable[str | os.PathLike], **options: Any) -> DatasetReader:
    """Open several files as one: a folder (its ``*.arrow`` files, sorted by name) or a list of paths.

    Every file must have the columns of the first (:class:`SchemaMismatchError` names
    the file and the differences), compared in the stored form as :class:`FileWriter` compares
    batches: portable and stored files (and IPC stream files) of the same batches mix. ``options`` as in :func:`open_file`. For Arrow-level
    filtering and scans, :meth:`~DatasetReader.arrow_dataset` gives a ``pyarrow.dataset``.
    """
    if isinstance(paths, (str, os.PathLike)) and Path(paths).is_dir():
        folder, paths = paths, sorted(Path(paths).glob("*.arrow"))
        if not paths:
            raise FileNotFoundError(f"no *.arrow files in {folder}")
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return DatasetReader(list(paths), **options)


# ---------------------------------------------------------------- copying and recovery


def _write_all(batches: Iterable[tuple[pa.RecordBatch, dict[str, str]]], out: str | os.PathLike, compression: str | None, **options: bool) -> FileWriter:
    """Write ``(batch, schema metadata)`` pairs as they are (nothing decoded) into a new file ``out``;
    on an error the partial file is deleted and ``out`` left as it was. Returns the writer, to close.
    ``options``: ``portable``, ``stream`` and ``checksums`` of :class:`FileWriter` (a source
    batch's checksums are never carried over: they are of its old bytes)."""
    writer = FileWriter(out, compression=compression, **options)
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
        raise DecodeError(f"{source}: {_describe_start(buffer[:8].to_pybytes())}")
    body = buffer.slice(8)
    allowed = _limits.limit(max_decoded_bytes, buffer.size)
    position = pa.BufferReader(body)
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
