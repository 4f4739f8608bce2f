"""``from_arrow`` and ``from_ipc``: the codec's decoded parts as a :class:`~arrow_dataproto.DataProto`."""

from __future__ import annotations

import os
from typing import Any, Iterable

import pyarrow as pa
import torch

from . import _restore
from ._codec import as_record_batch, decode, read_stream
from ._container import DataProto, assemble
from ._format import is_foreign, resolve_columns


def from_arrow(
    record_batch: pa.RecordBatch | pa.Table | Any,
    *,
    columns: Iterable[str] | None = None,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
    schema: pa.Schema | str | os.PathLike | None = None,
) -> DataProto:
    """Rebuild a :class:`~arrow_dataproto.DataProto` from a RecordBatch made by :func:`to_arrow`,
    or from any Arrow table.

    ``record_batch`` is a ``pa.RecordBatch`` or a ``pa.Table`` (also a ``pa.RecordBatchReader``,
    or any object exporting an Arrow stream, ``__arrow_c_stream__``: a polars DataFrame, a
    DuckDB relation). A Table whose columns have one chunk each is read zero-copy; columns
    of several chunks are concatenated first (one copy of those columns).

    Our own tables may have been filtered, sliced, taken from, concatenated or re-chunked
    by another tool: the first batch dimension of the TensorDict (and of every nested
    TensorDict) is the number of rows present, and the column metadata (torch dtype,
    per-row shape, layout, device) still applies. ``meta_info`` is the first batch's.

    A table without our metadata (no ``adp.*`` schema key: pandas, polars, DuckDB, HF
    ``datasets``, Ray Data, hand-built) is read by one rule (``docs/format.md``,
    "Reading tables of other tools"): numeric columns become 1-D tensors;
    ``fixed_size_list``, ``arrow.fixed_shape_tensor`` and numeric lists that all have one
    length become dense tensors ``[B, ...]``; numeric lists of varying length jagged
    ``torch.nested`` tensors; everything else (strings, structs, JSON, dictionaries,
    other lists) goes to ``non_tensor_batch`` as object arrays (timestamps, dates and
    durations as ``datetime64``/``timedelta64``), in table order; ``meta_info`` is ``{}``.
    Nulls in a column that would be a tensor raise :class:`DecodeError` naming the column.
    Columns that look like our stored forms (uint16 bits of a bf16, bool bytes, JSON text,
    flattened tensor rows) are read as they are with one ``StoredFormWarning`` naming them.

    ``schema``: the way back for a table another tool derived from one of our files (rows
    filtered, sorted, sampled or limited, columns selected or reordered, re-chunked), when
    the tool dropped our metadata: the original file's path, or its ``pa.Schema``
    (``open_file(path).schema``, ``to_arrow(dp).schema``, stored or portable). Every stored
    dtype, row shape, nested layout, TensorDict tree, JSON column and ``meta_info`` comes
    back (``docs/format.md``, "The way back from other tools"); a column whose values no
    longer fit its stored type is a :class:`DecodeError` naming it, a column the schema
    lacks a :class:`SchemaMismatchError`. Ignored for a table that kept our metadata.

    Zero-copy by default: CPU tensors (and numeric numpy columns) view the
    RecordBatch's buffers, so they are only as writable as that memory, and
    writes show in every other view of it. ``copy=True`` gives tensors that own
    their memory. ``device`` (like ``map_location``) places every tensor there
    (one copy each; a device this process lacks is an :class:`OptionError`, as in
    ``receive_options``); otherwise each goes to its recorded device, or to the CPU
    with one ``RuntimeWarning`` if this process lacks it. ``columns`` decodes
    only those columns (a nested TensorDict's name selects all its leaves;
    :class:`ColumnNotFoundError` for an unknown name); the others are not read.

    Pickled non-tensor columns or ``meta_info`` are refused with
    :class:`PickleNotAllowedError` unless ``allow_pickle=True``: only allow
    pickles from a trusted source. Every length, offset and shape is checked
    against the buffers before a tensor is built; a malformed batch raises
    :class:`DecodeError`; another major version, or content a newer minor version
    wrote that this reader does not know, :class:`FormatVersionError`.
    """
    record_batch = as_record_batch(record_batch)
    if columns is not None:
        columns = resolve_columns(record_batch.schema.names, columns, "the batch")
    original = None
    if schema is not None and is_foreign(record_batch.schema):
        original = _restore.original_schema(schema, allow_pickle=allow_pickle)
    batch, non_tensor_batch, meta_info = decode(
        record_batch, columns=columns, device=device, copy=copy, allow_pickle=allow_pickle, schema=original
    )
    return assemble(DataProto, batch, non_tensor_batch, meta_info)


def from_ipc(
    buffer: Any,
    *,
    columns: Iterable[str] | None = None,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
    max_decoded_bytes: int | str | None = "auto",
    schema: pa.Schema | str | os.PathLike | None = None,
) -> DataProto:
    """Decode an Arrow IPC stream written by :func:`to_ipc`, or by any other tool (read as
    :func:`from_arrow` says), from a ``pa.Buffer``, bytes-like, or memoryview.

    Zero-copy for uncompressed streams: tensors view ``buffer`` itself, which
    stays alive as long as they do. Do not write to them unless the buffer is
    yours and writable (a ``bytes`` object is not), or pass ``copy=True``.
    Compressed streams are decompressed into new memory. Other arguments and
    errors as in :func:`from_arrow`; a stream holding several record batches is
    concatenated (a copy; the batches of another tool's stream are read as one table).

    ``buffer`` is untrusted: a compressed stream may decode to at most
    ``max_decoded_bytes`` (default ``"auto"``: 64 MiB or 256 times the stream's size,
    whichever is larger; an int: that many bytes; ``None``: no limit), checked from the
    message headers before anything is decompressed (:class:`DecodeError` beyond it).
    ``schema``: the original schema of another tool's stream, as in :func:`from_arrow`.
    An Arrow IPC *file* (``files.write_file``'s) is a :class:`DecodeError` that says so:
    read it with :func:`arrow_dataproto.files.read_file`.
    """
    batches = read_stream(buffer, max_decoded_bytes)
    if len(batches) > 1 and is_foreign(batches[0].schema):  # one rule over all the rows
        return from_arrow(
            pa.Table.from_batches(batches), columns=columns, device=device, copy=copy, allow_pickle=allow_pickle, schema=schema
        )
    parts = [
        from_arrow(b, columns=columns, device=device, copy=copy, allow_pickle=allow_pickle, schema=schema) for b in batches
    ]
    return parts[0] if len(parts) == 1 else DataProto.concat(parts, meta_info="update")
