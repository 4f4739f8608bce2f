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
Needs the ``xxhash`` package (the ``integrity`` extra; without it, a :class:`~arrow_dataproto.errors.MissingDependencyError`).

Since format 1.3 the record also covers what lies outside the buffers, so that any
single changed byte of a checksummed file is either detected or changes nothing a reader
sees: ``"nodes"`` holds one digest per column of the length and null count of each of its
arrays (children included, as the buffers are walked), and ``"batch"`` one digest of the
batch's index in the file, its row count, its schema metadata (every key but
``adp.checksums``) and the file's schema (:func:`schema_text`: names, types, extension
parameters, nullability and metadata of every field, and the schema metadata). The footer
itself (its list of batches, its metadata) is checked against the file's messages by
:meth:`~arrow_dataproto.files.FileReader.verify`. Readers of 1.1 and 1.2 ignore the two
keys; a record without them (a 1.1 or 1.2 file) is checked on its buffers alone.
"""

from __future__ import annotations

import json
import struct
from typing import Iterator, Mapping

import numpy as np
import pyarrow as pa

from ._optional import require
from .errors import DecodeError, EncodeError

ALGORITHM = "xxh3_64"


def _hasher():
    return require("xxhash", "checksumming a file").xxh3_64_hexdigest


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


def _nodes(array: pa.Array) -> Iterator[int]:
    """The length and null count of ``array`` and of each array below it, in the order
    :func:`_buffers` walks them (the logical arrays: a slice's, not its parent's)."""
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    kind = array.type
    yield len(array)
    yield array.null_count
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = _offsets(array, 4 if pa.types.is_list(kind) else 8)
        yield from _nodes(array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
    elif pa.types.is_fixed_size_list(kind):
        yield from _nodes(array.values.slice(array.offset * kind.list_size, len(array) * kind.list_size))
    elif pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            yield from _nodes(array.field(i))


def _digests(array: pa.Array, digest) -> list[str]:
    return [digest(buffer) for buffer in _buffers(array)]


def _node_digest(array: pa.Array, digest) -> str:
    return digest(np.fromiter(_nodes(array), dtype="<i8"))


def _field_text(field: pa.Field) -> list:
    return [field.name, field.nullable, sorted(_text(field.metadata).items()), _type_text(field.type)]


def _listed(value: object) -> object:
    return None if value is None else [x if isinstance(x, (int, str)) else str(x) for x in value]  # type: ignore[attr-defined]


def _type_text(kind: pa.DataType) -> object:
    """``kind`` in words that do not depend on the pyarrow version: a nested type by its type
    id, list size and fields; an extension type by its name, parameters and storage."""
    if isinstance(kind, pa.BaseExtensionType):
        if hasattr(kind, "__arrow_ext_serialize__"):  # one defined in Python (Ray Data's tensors)
            params: object = kind.__arrow_ext_serialize__().hex()
        else:  # Arrow's canonical ones: fixed_shape_tensor, bool8, json
            params = [_listed(getattr(kind, key, None)) for key in ("shape", "permutation", "dim_names")]
        return ["extension", kind.extension_name, params, _type_text(kind.storage_type)]
    if kind.num_fields:
        return [kind.id, getattr(kind, "list_size", None), [_field_text(kind.field(i)) for i in range(kind.num_fields)]]
    return str(kind)


def _text(metadata: Mapping | None) -> dict[str, str]:
    return {
        (k.decode("utf-8", "replace") if isinstance(k, bytes) else k): (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
        for k, v in (metadata or {}).items()
    }


def schema_text(schema: pa.Schema) -> str:
    """Every part of ``schema`` a reader uses, as one text: each field's name, nullability,
    metadata and type (children and extension parameters included), and the schema metadata."""
    return json.dumps([[_field_text(field) for field in schema], sorted(_text(schema.metadata).items())])


def _batch_digest(batch: pa.RecordBatch, index: int, schema: str, custom: Mapping | None, digest) -> str:
    metadata = sorted((k, v) for k, v in _text(custom).items() if k != "adp.checksums")
    head = struct.pack("<qq", index, batch.num_rows)
    return digest(head + json.dumps([schema, metadata]).encode("utf-8", "surrogatepass"))


def checksums(batch: pa.RecordBatch, index: int, schema: str, custom: Mapping | None) -> str:
    """The ``adp.checksums`` value of ``batch``, batch ``index`` of a file whose schema is
    ``schema`` (:func:`schema_text`), written with the custom metadata ``custom`` (what the
    file records for it, and what :func:`verify` is given back; any ``adp.checksums`` in it is
    left out): JSON of the algorithm and, per column, the digests of its buffers (``columns``)
    and of its arrays' lengths (``nodes``), and the digest of the batch's place, rows and
    ``custom`` (``batch``). ``batch.schema.metadata`` is not read: a batch read back from a
    stream carries the stream's first metadata, not its own."""
    digest = _hasher()
    names, arrays = batch.schema.names, batch.columns
    columns = {name: _digests(column, digest) for name, column in zip(names, arrays)}
    nodes = {name: _node_digest(column, digest) for name, column in zip(names, arrays)}
    whole = _batch_digest(batch, index, schema, custom, digest)
    return json.dumps({"algorithm": ALGORITHM, "columns": columns, "nodes": nodes, "batch": whole})


def verify(
    batch: pa.RecordBatch, recorded: str, where: str, index: int, schema: str, custom: Mapping | None
) -> int:
    """Check the columns of ``batch`` (batch ``index`` of a file of schema ``schema``, with the
    schema metadata ``custom``) against the ``recorded`` checksums; returns the number of
    buffers checked. :class:`DecodeError` naming the column and buffer that differ, or for
    a malformed record. ``batch`` may hold some of the file's columns only."""
    try:
        record = json.loads(recorded)
        if record["algorithm"] != ALGORITHM or not isinstance(record["columns"], dict):
            raise ValueError(f"unknown checksum algorithm {str(record['algorithm'])[:40]!r}")
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise DecodeError(f"{where}: malformed checksums: {e!r}"[:300]) from None
    digest = _hasher()
    checked = 0
    nodes, whole = record.get("nodes"), record.get("batch")
    if whole is not None and whole != _batch_digest(batch, index, schema, custom, digest):
        raise DecodeError(f"{where}: its place, row count, metadata or the file's schema does not match its checksum")
    for name, column in zip(batch.schema.names, batch.columns):
        if nodes is not None and (not isinstance(nodes, dict) or nodes.get(name) != _node_digest(column, digest)):
            raise DecodeError(f"{where}: column {name!r}: its lengths or null counts do not match their checksum")
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
