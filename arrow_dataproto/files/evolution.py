"""Schema evolution: what the batches of one file must share, and how a new batch's columns
whose Arrow type their rows chose are unified with the file's (``docs/format.md``, "Schema
evolution"). Plain functions of schemas and batches: :class:`~arrow_dataproto.files.FileWriter`
does the writing, :class:`~arrow_dataproto.files.DatasetReader` and the readers compare by them.
"""

from __future__ import annotations

import json
import re
from typing import Callable, Iterable

import numpy as np
import pyarrow as pa

from .._format import DEVICE, DTYPE, FORMAT, KIND, OFFSETS_OF, PER_BATCH, ROW_SHAPE, VERSION, Node, text_metadata
from .._objects import JSON, OBJECT, PICKLE, decode_column, encode_as, json_type
from ..errors import SchemaMismatchError


def shared_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """What every batch of a file (and every file of a dataset) must share: the schema
    metadata except the per-batch entries, with ``adp.version`` as its major version only
    (``1.x``: a reader accepts every minor of its major, ``docs/format.md``; a malformed
    version as it is), plus the batch dimensions after the first and the TensorDict nesting
    (the metadata as it is for another tool's schema, which has none of these)."""
    if FORMAT not in metadata:
        return dict(metadata)
    tree = Node.parse(metadata)
    shared = {k: v for k, v in metadata.items() if k not in PER_BATCH}
    if VERSION in shared and re.fullmatch(r"[0-9]{1,9}\.[0-9]{1,9}", shared[VERSION]):
        shared[VERSION] = shared[VERSION].partition(".")[0] + ".x"
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
    layout_a, layout_b = shared_metadata(text_metadata(expected.metadata)), shared_metadata(text_metadata(got.metadata))
    for key in sorted(set(layout_a) | set(layout_b)):
        if layout_a.get(key) != layout_b.get(key):
            differences.append(f"{key}: {layout_b.get(key)}, expected {layout_a.get(key)}")
    return differences


def row_bits(arrow_type: pa.DataType) -> float:
    """Bits per row of a fixed-width column (infinite for variable-width ones)."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        arrow_type = arrow_type.storage_type
    if pa.types.is_fixed_size_list(arrow_type):
        return row_bits(arrow_type.value_type) * arrow_type.list_size
    try:
        return arrow_type.bit_width
    except ValueError:
        return float("inf")


_KIND_FROM_ROWS = frozenset({OBJECT, JSON, PICKLE})
"""Kinds of a ``non_tensor_batch`` column that its rows choose (no rows: ``object``)."""


def _kind(field: pa.Field) -> str | None:
    return text_metadata(field.metadata).get(KIND)


def _rows_decide(field: pa.Field, expected: pa.Field) -> bool:
    """Whether two columns differ only in what their rows chose: kinds object, json or pickle,
    with the same dtype and row shape (:func:`evolve` unifies them)."""
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


def conform(batch: pa.RecordBatch, fields: dict[str, pa.Field]) -> pa.RecordBatch:
    """``batch`` with the columns whose Arrow type their values cannot decide typed as the
    file's column of the same name in ``fields`` (:func:`_adopts`): they read back the same
    either way. Returns ``batch`` itself if no column changes."""
    schema, columns = batch.schema, list(batch.columns)
    for i, field in enumerate(batch.schema):
        expected = fields.get(field.name)
        if expected is not None and _adopts(field, len(columns[i]), expected):
            schema, columns[i] = schema.set(i, expected), pa.nulls(len(columns[i]), expected.type)
    return batch if schema is batch.schema else pa.RecordBatch.from_arrays(columns, schema=schema)


WrittenRows = Callable[[pa.Field], Iterable[np.ndarray]]
"""The rows of a file's column in each batch written so far (decoded)."""


def evolve(
    batch: pa.RecordBatch, fields: dict[str, pa.Field], written_rows: WrittenRows, where: str
) -> tuple[pa.RecordBatch, dict[str, pa.Field]]:
    """``batch`` with each column whose rows chose another Arrow type than the file's column in
    ``fields`` (object, json and pickle columns of one dtype and row shape) unified with it, by
    the schema-evolution rule of ``docs/format.md``: the batch's values in the file's type if
    they come back exactly in it; else, for a native column of the file, the batch's own type if
    the rows written so far (``written_rows``) come back exactly in it, or else JSON. Returns the
    batch and the columns whose file type changes (``{name: new field}``: the batches written so
    far must be rewritten, :func:`rewritten`). Raises :class:`SchemaMismatchError`, prefixed by
    ``where``, when only pickling would hold the values and the file's column is not pickled
    already (a reader would newly need ``allow_pickle=True``)."""
    targets: dict[str, pa.Field] = {}
    schema, columns = batch.schema, list(batch.columns)
    for i, field in enumerate(batch.schema):
        expected = fields.get(field.name)
        if expected is None or field.equals(expected, check_metadata=True) or not _rows_decide(field, expected):
            continue
        target, columns[i] = _unified(field, columns[i], expected, written_rows, where)
        schema = schema.set(i, target)
        if not target.equals(expected, check_metadata=True):
            targets[field.name] = target
    unified = batch if schema is batch.schema else pa.RecordBatch.from_arrays(columns, schema=schema)
    return unified, targets


def unified_schema(schema: pa.Schema, targets: dict[str, pa.Field]) -> pa.Schema:
    """``schema`` with the columns ``targets`` changed."""
    return pa.schema([targets.get(f.name, f) for f in schema], metadata=schema.metadata)


def _unified(
    field: pa.Field, column: pa.Array, expected: pa.Field, written_rows: WrittenRows, where: str
) -> tuple[pa.Field, pa.Array]:
    """The field a column of a new batch and the file's ``expected`` unify to, and the
    batch's column encoded in it (see :func:`evolve`)."""
    name, kind, file_kind = field.name, _kind(field), _kind(expected)

    def refuse(why: str) -> SchemaMismatchError:
        return SchemaMismatchError(f"{where}: column {name!r}: {why}")

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
        if array is not None and all(encode_as(name, old, target) is not None for old in written_rows(expected)):
            return target, array
    raise refuse(
        f"the batches written so far hold values ({expected.type}) that neither this batch's type "
        f"({field.type}) nor JSON gives back exactly, and pickling would newly need allow_pickle=True"
    )


def rewritten(old: pa.RecordBatch, old_fields: dict[str, pa.Field], targets: dict[str, pa.Field], schema: pa.Schema) -> pa.RecordBatch:
    """A batch written before :func:`evolve` changed the columns ``targets`` (``old_fields``: the
    file's fields it was written with), each of those columns decoded and encoded in its new
    field; ``schema`` is the unified schema (:func:`unified_schema`). A copy of those columns."""
    columns = list(old.columns)
    for name, target in targets.items():
        i = old.schema.get_field_index(name)
        rows = decode_column(name, columns[i], text_metadata(old_fields[name].metadata), allow_pickle=False)
        columns[i] = encode_as(name, rows, target)
    return pa.RecordBatch.from_arrays(columns, schema=schema)
