"""The way back from other tools: a table another tool derived from one of our files, read
with that file's schema, so that every stored type comes back.

pandas, polars, DuckDB and HF ``datasets`` keep a table's columns but drop this format's
schema and field metadata (torch dtypes, row shapes, the TensorDict tree, ``meta_info``), so
their tables read by the rule for other tools' tables (:mod:`arrow_dataproto._foreign`),
where a bf16 column is its uint16 bits. :func:`restore` puts the metadata back from the
original schema (``schema=`` of ``from_arrow`` and the file readers): each column present
gets its field, its values are brought back to the stored (or portable) Arrow type they
came from, and the normal decoding path applies (rows filtered, sorted, sampled or limited,
columns selected or reordered, chunks combined: the batch size is the rows present).

A column matches the form of the original whose values are of the same family (the
stored bits, ``uint16``, or the portable values, ``float32``); lists come back to
fixed-size lists (every row must keep its length), large lists, structs by field name.
:class:`DecodeError` names a column whose values no longer fit (an integer tensor a tool
turned into fractions, a bf16 column holding a float32 no bf16 widens to, a row of
another length, a null), :class:`SchemaMismatchError` a column the schema lacks.

Without ``schema=``, :func:`suspects` names the columns of another tool's table that look
like one of our stored forms (the raw bits of bf16/fp8, bool bytes, JSON text, flattened
rows of tensors), so that the decoder warns instead of silently reading them as something
else (:class:`StoredFormWarning`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._format import FORMAT, META_INFO, META_INFO_ENCODING, PORTABLE, check_schema, text_metadata
from ._ipc import extension_errors
from ._meta_info import decode_meta_info, encode_meta_info
from ._portable import forms
from .errors import ArgumentTypeError, DecodeError, SchemaMismatchError, column_error

class StoredFormWarning(UserWarning):
    """Columns of another tool's table look like this format's stored forms and were read
    as they are (raw bits, bytes, text): pass ``schema=`` to read them as stored."""


# ---------------------------------------------------------------- the original schema


def original_schema(schema: Any, *, allow_pickle: bool = False) -> pa.Schema:
    """The schema ``schema=`` names: a ``pa.Schema`` of ours as it is, or the schema of the file
    at a path (an IPC file or IPC stream file of ours, read with pyarrow). A file of several
    batches gives its ``meta_info`` by the rule of every reader: the first batch's, updated
    by each later batch's (later keys win), which reads each batch's header (and decompresses
    a compressed file's batches). :class:`SchemaMismatchError` for a schema without this
    format's metadata, :class:`ArgumentTypeError` for anything else."""
    if isinstance(schema, (str, os.PathLike)):
        schema = _file_schema(os.fspath(schema), allow_pickle)
    elif not isinstance(schema, pa.Schema):
        raise ArgumentTypeError(f"schema= takes a pyarrow.Schema or a file's path, got {type(schema).__name__}")
    if FORMAT.encode() not in (schema.metadata or {}):
        raise SchemaMismatchError("schema= is not a schema of arrow-dataproto (no adp.format metadata): "
                                  "pass the schema or the path of the file the table came from")
    check_schema(schema)
    return schema


def _file_schema(path: str, allow_pickle: bool) -> pa.Schema:
    with extension_errors(path, keep=(OSError,)):  # OSError: no such file, as before
        try:
            source = pa.memory_map(path)
            try:
                reader: Any = pa.ipc.open_file(source)
                customs = [reader.get_batch_with_custom_metadata(i)[1] for i in range(reader.num_record_batches)]
            except pa.ArrowInvalid:
                reader = pa.ipc.open_stream(pa.memory_map(path))
                customs = [batch.custom_metadata for batch in iter(reader.read_next_batch_with_custom_metadata, None)]
            schema = reader.schema
            if FORMAT.encode() not in (schema.metadata or {}) or len(customs) <= 1:
                return schema
            merged: dict = {}
            for custom in customs:
                merged.update(decode_meta_info(text_metadata(custom), allow_pickle=allow_pickle))
        except (pa.ArrowException, EOFError) as e:
            raise DecodeError(f"{path}: cannot read its schema: {e}") from e
    metadata = {k: v for k, v in text_metadata(schema.metadata).items() if k not in (META_INFO, META_INFO_ENCODING)}
    return schema.with_metadata({**metadata, **encode_meta_info(merged)})


# ---------------------------------------------------------------- restoring


def restore(record_batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``record_batch`` (another tool's, validated) with the fields and schema metadata of
    ``schema`` (ours, from :func:`original_schema`), each column brought back to the Arrow
    type of the form it holds (see the module docstring). Columns that need no change are
    not copied; lists and casts are new memory."""
    names = record_batch.schema.names
    unknown = [n for n in names if schema.get_field_index(n) < 0]
    if unknown:
        raise SchemaMismatchError(
            f"columns {unknown[:20]} are not in the schema given (schema=): select only the original "
            "file's columns, or read the table without schema="
        )
    fields, arrays = [], []
    stored_order = sorted(range(len(names)), key=lambda i: schema.get_field_index(names[i]))
    for name, array in ((names[i], record_batch.column(i)) for i in stored_order):  # the file's column order
        original = schema.field(name)
        target = _matching_form(name, array.type, forms(original))
        if not original.nullable and array.null_count:
            raise column_error(DecodeError, name, f"{array.null_count} nulls in a column stored without nulls")
        try:
            array = _conform(name, array, target)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
            if isinstance(e, DecodeError):
                raise
            raise column_error(DecodeError, name, f"its values no longer fit the stored type {target}: {e}") from e
        fields.append(original.with_type(target))
        arrays.append(array)
    metadata = {**(schema.metadata or {}), PORTABLE.encode(): b"true"}  # each portable column back to stored
    if not arrays:
        no_fields = pa.Array.from_buffers(pa.struct([]), record_batch.num_rows, [None], children=[])
        return pa.RecordBatch.from_struct_array(no_fields).replace_schema_metadata(metadata)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


def _matching_form(name: str, actual: pa.DataType, candidates: list[pa.DataType]) -> pa.DataType:
    """The candidate type equal to ``actual``, else the first whose values are of the same
    family; :class:`DecodeError` if none is (text where numbers were stored, say)."""
    if actual in candidates:
        return actual
    family = _family(actual)
    found = next((c for c in candidates if _family(c) == family), None)
    if found is None:
        raise column_error(DecodeError, name, f"holds {actual} values where the file stored {candidates[0]}")
    return found


def _leaf(t: pa.DataType) -> pa.DataType:
    """The value type under extensions, dictionaries, lists and a strided column's ``data``."""
    while True:
        if isinstance(t, pa.BaseExtensionType):
            t = t.storage_type
        elif pa.types.is_dictionary(t):
            t = t.value_type
        elif _is_list(t):
            t = t.value_type
        elif pa.types.is_struct(t) and t.get_field_index("data") >= 0 and t.get_field_index("shape") >= 0:
            t = t.field("data").type
        else:
            return t


def _family(t: pa.DataType) -> str:
    leaf = _leaf(t)
    if pa.types.is_floating(leaf):
        return "float"
    if pa.types.is_integer(leaf):
        return "integer"
    if pa.types.is_boolean(leaf):
        return "bool"
    if pa.types.is_string(leaf) or pa.types.is_large_string(leaf) or pa.types.is_string_view(leaf):
        return "text"
    if pa.types.is_temporal(leaf):
        return "time"
    if pa.types.is_struct(leaf) or pa.types.is_map(leaf):
        return "struct"
    if pa.types.is_binary(leaf) or pa.types.is_large_binary(leaf) or pa.types.is_binary_view(leaf):
        return "binary"
    return str(leaf)


def _is_list(t: pa.DataType) -> bool:
    return (
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)
    )


def _validity(array: pa.Array) -> pa.Buffer | None:
    return pc.is_valid(array).buffers()[1] if array.null_count else None


def _conform(name: str, array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as an array of type ``target``: the same values, the same rows."""
    if array.type == target:
        return array
    if pa.types.is_dictionary(array.type):
        return _conform(name, array.dictionary_decode(), target)
    if isinstance(array, pa.ExtensionArray):
        return _conform(name, array.storage, target)
    if isinstance(target, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(target, _conform(name, array, target.storage_type))
    if _is_list(target) and _is_list(array.type):
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        child = _conform(name, pc.list_flatten(array), target.value_type)
        if pa.types.is_fixed_size_list(target):
            if array.null_count:
                raise column_error(DecodeError, name, f"{array.null_count} null rows where the stored rows have none")
            wrong = lengths != target.list_size
            if wrong.any():
                raise column_error(
                    DecodeError, name,
                    f"a row of {int(lengths[wrong][0])} values where each stored row holds {target.list_size}",
                )
            return pa.Array.from_buffers(target, len(array), [None], children=[child])
        offsets = np.zeros(len(array) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if not (pa.types.is_large_list(target) or pa.types.is_large_list_view(target)):
            if offsets[-1] > 2**31 - 1:
                raise column_error(DecodeError, name, "more values than a 32-bit list holds")
            offsets = offsets.astype(np.int32)
        if pa.types.is_list_view(target) or pa.types.is_large_list_view(target):
            target = pa.large_list(target.value_field) if pa.types.is_large_list_view(target) else pa.list_(target.value_field)
        return pa.Array.from_buffers(target, len(array), [_validity(array), pa.py_buffer(offsets)], children=[child])
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        children = dict(zip([f.name for f in array.type], array.flatten()))
        missing = [f.name for f in target if f.name not in children]
        if missing:
            raise column_error(DecodeError, name, f"the struct lacks the stored fields {missing}")
        converted = [_conform(name, children[f.name], f.type) for f in target]
        return pa.Array.from_buffers(target, len(array), [_validity(array)], children=converted)
    return pc.cast(array, target, safe=True)


# ---------------------------------------------------------------- without schema=

_FLOAT_NAMES = ("log_prob", "logprob", "advantage", "value", "return", "reward", "score", "entrop", "logit", "loss", "kl")
"""Name parts of verl's float columns: a uint8 column so named looks like float8 bits."""


def suspects(record_batch: pa.RecordBatch) -> dict[str, str]:
    """Columns of another tool's table that look like one of this format's stored forms,
    each with what it looks like; empty if none does. Reads each column's type and name,
    and the first value of a text column."""
    found: dict[str, str] = {}
    for field, array in zip(record_batch.schema, record_batch.columns):
        name = field.name
        leaf = _leaf(array.type)
        lowered = name.lower()
        if leaf == pa.uint16():
            found[name] = "uint16: the bits of a bfloat16 tensor"
        elif leaf == pa.uint8() and any(part in lowered for part in _FLOAT_NAMES):
            found[name] = "uint8: the bits of a float8 tensor"
        elif leaf == pa.int8() and not isinstance(array.type, pa.Bool8Type) and lowered.endswith("mask"):
            found[name] = "int8: the bytes of a bool tensor"
        elif (
            _family(array.type) == "text" and not _is_list(array.type)
            and not isinstance(array.type, pa.BaseExtensionType) and _json_text(array)  # arrow.json reads as JSON
        ):
            found[name] = "text holding JSON: a JSON column"
    if any(not why.startswith("text") for why in found.values()):  # a default file's stored bits: its
        # lists of one length may be the flattened rows of tensors of several dimensions
        for field, array in zip(record_batch.schema, record_batch.columns):
            if isinstance(array.type, pa.FixedShapeTensorType):
                continue  # its type keeps the shape of its rows
            kind = array.type.storage_type if isinstance(array.type, pa.BaseExtensionType) else array.type
            if field.name in found or not _is_list(kind) or _is_list(kind.value_type) or _family(kind) == "text":
                continue
            if pa.types.is_fixed_size_list(kind) or _one_length(array):
                found[field.name] = "lists of one length: the flattened rows of a tensor, whatever their shape"
    return found


def _one_length(array: pa.Array) -> bool:
    lengths = pc.list_value_length(array.storage if isinstance(array, pa.ExtensionArray) else array)
    bounds = pc.min_max(lengths)
    return len(array) > 0 and bounds["min"].as_py() == bounds["max"].as_py()


def _json_text(array: pa.Array) -> bool:
    """Whether the first non-null value among the first rows is a JSON object or array."""
    first = next((v.as_py() for v in array.slice(0, 64) if v.is_valid), None)
    if not isinstance(first, str) or not first.lstrip().startswith(("{", "[")):
        return False
    try:
        json.loads(first)
    except ValueError:
        return False
    return True


def suspects_message(found: dict[str, str]) -> str:
    """The :class:`StoredFormWarning` text for what :func:`suspects` found."""
    listed = "; ".join(f"{name!r} ({why})" for name, why in list(found.items())[:20])
    more = f" and {len(found) - 20} more" if len(found) > 20 else ""
    return (
        f"columns {listed}{more} look like arrow-dataproto's stored forms but the table has lost its metadata "
        "(another tool dropped it), so they were read as they are; pass schema= (the original file's path or "
        "its pyarrow.Schema) to from_arrow / open_file / read_file to get the stored dtypes, shapes and meta_info back"
    )
