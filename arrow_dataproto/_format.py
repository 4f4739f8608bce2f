"""The arrow-dataproto format in code: metadata keys, the version rule, the tree, the column specs.

``docs/format.md`` is the prose of the same spec; this module is its only home in
the code. Every other module reads and writes metadata through it:

- the metadata keys (schema level and field level) and :data:`FORMAT_VERSION`;
- :func:`check_schema`: the format name and the version rule;
- :class:`Node`: the TensorDict tree of ``adp.batch_size``/``adp.device``/``adp.tree``,
  parsed and validated once, with the operations decoding needs (leaf names, a
  subset of columns, another row count);
- :class:`TensorSpec` and :class:`ArraySpec`: the field metadata of one tensor
  column and of one ``non_tensor_batch`` column, parsed and validated once.

Nothing here touches tensor bytes. Malformed metadata raises
:class:`~arrow_dataproto.DecodeError` (naming the column where there is one).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Union

import numpy as np
import pyarrow as pa

from .errors import ColumnNotFoundError, DecodeError, EncodeError, FormatVersionError, UnknownContentError, column_error, not_found

if TYPE_CHECKING:
    import torch

FORMAT_NAME = "arrow-dataproto"
FORMAT_VERSION = (1, 3)
"""Major.minor. A reader accepts any minor of its own major and refuses other majors."""

KEY_PREFIX = "adp."
"""Every metadata key of the format starts with it."""

# Schema metadata keys
FORMAT = "adp.format"
VERSION = "adp.version"
BATCH_SIZE = "adp.batch_size"
TD_DEVICE = "adp.device"
TREE = "adp.tree"
META_INFO = "adp.meta_info"
META_INFO_ENCODING = "adp.meta_info.encoding"
COMPRESSION = "adp.compression"
"""File footer metadata key: ``"none"``, ``"lz4"`` or ``"zstd"``."""
CHECKSUMS = "adp.checksums"
"""Per-batch metadata of a file written with checksums: digests of each column's buffers."""
PORTABLE = "adp.portable"
"""Schema metadata of a portable RecordBatch (since 1.2): ``"true"``; its columns use the
plain Arrow types of the portable view (``_portable``), read back through the field metadata."""
PER_BATCH = (BATCH_SIZE, TREE, META_INFO, META_INFO_ENCODING, CHECKSUMS)
"""Schema metadata keys whose values may differ from batch to batch of one file."""

# Field metadata keys
KIND = "adp.kind"
DTYPE = "adp.dtype"
SHAPE = "adp.shape"
RAGGED_IDX = "adp.ragged_idx"
DEVICE = "adp.device"
ROW_SHAPE = "adp.row_shape"
OFFSETS_OF = "adp.offsets_of"
"""Field metadata of a jagged column (since 1.1): the earlier jagged column whose ragged
structure (offsets) it shares."""

TENSOR_KINDS = ("tensor", "jagged", "strided")
"""``adp.kind`` of the columns of TensorDict leaves."""
ARRAY_KINDS = ("numeric", "string", "object", "json", "pickle")
"""``adp.kind`` of the columns of ``non_tensor_batch`` arrays."""
COMPRESSIONS = (None, "lz4", "zstd")


MAX_DIM = 2**63 - 1
"""The largest dimension or row count a metadata field may hold (an int64)."""
MAX_ROW_ELEMENTS = 2**58
"""The largest number of elements one row may hold (times the widest element, 16 bytes, it stays
well inside what numpy and torch can address)."""

_ASCII_UINT = re.compile(r"[0-9]{1,9}")
_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,31}(:[0-9]{1,4})?")


def parse_uint(text: Any, what: str) -> int:
    """A small non-negative integer written in ASCII digits (at most 9 of them); DecodeError
    otherwise (``"²"``, ``"١"``, signs, spaces and 5,000-digit numbers included)."""
    if not isinstance(text, str) or not _ASCII_UINT.fullmatch(text):
        raise DecodeError(f"malformed {what} {str(text)[:40]!r}")
    return int(text)


def parse_device(value: Any, what: str) -> str | None:
    """A recorded device (``"cpu"``, ``"cuda:1"``...; ``None``/``"None"``: none), checked for its
    form only; whether this process has it is decided when placing tensors."""
    if value is None or value == "None":
        return None
    if not isinstance(value, str) or not _DEVICE.fullmatch(value):
        raise DecodeError(f"malformed {what} {str(value)[:40]!r}")
    return value


def check_row_shape(shape: Iterable[int | None], what: str) -> None:
    """Every fixed dimension an int in ``[0, MAX_DIM]`` and their product at most
    :data:`MAX_ROW_ELEMENTS`; DecodeError otherwise."""
    dims = [n for n in shape if n is not None]
    if not all(type(n) is int and 0 <= n <= MAX_DIM for n in dims):
        raise DecodeError(f"malformed {what} {list(shape)!r}"[:200])
    if math.prod(n for n in dims if n) > MAX_ROW_ELEMENTS:
        raise DecodeError(f"{what} {list(shape)} holds more than 2**58 elements per row")


def version_text() -> str:
    return "%d.%d" % FORMAT_VERSION


def newer_minor(metadata: Mapping[str, str]) -> str | None:
    """The payload's format version (``adp.version`` of its schema metadata) if its minor
    version is newer than this reader's, else None."""
    version = metadata.get(VERSION, "")
    major, _, minor = version.partition(".")
    if major == str(FORMAT_VERSION[0]) and minor.isdigit() and int(minor) > FORMAT_VERSION[1]:
        return version
    return None


@contextlib.contextmanager
def newer_version_rule(metadata: Mapping[str, str]) -> Iterator[None]:
    """Inside: an :class:`UnknownContentError` in a payload whose minor format version is newer
    than this reader's is raised as :class:`FormatVersionError` naming both versions."""
    try:
        yield
    except UnknownContentError as e:
        version = newer_minor(metadata)
        if version is None:
            raise
        raise FormatVersionError(
            f"{e}: the payload was written by format version {version}, newer than {version_text()}, "
            f"the newest this version of arrow-dataproto reads; upgrade arrow-dataproto to read it"
        ) from e


def text_metadata(metadata: Mapping[Any, Any] | None) -> dict[str, str]:
    """Arrow key-value metadata (bytes or str) as ``str -> str``; bad UTF-8 is replaced, not raised."""

    def text(x: Any) -> str:
        return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)

    return {text(k): text(v) for k, v in (metadata or {}).items()}


def is_foreign(schema: pa.Schema) -> bool:
    """Whether a schema comes from another tool: its metadata has no key of this format
    (``adp.*``). A schema with some of them but not a valid ``adp.format`` is a damaged
    payload of ours, refused as such."""
    prefix = KEY_PREFIX.encode()
    return not any(key.startswith(prefix) for key in (schema.metadata or {}))


def check_schema(schema: pa.Schema) -> dict[str, str]:
    """The schema's metadata as ``str -> str``, after checking the format name and major version.

    Raises :class:`DecodeError` when the schema is not ours (or a column name is not
    UTF-8), and :class:`FormatVersionError` when its major version is not this library's.
    """
    metadata = text_metadata(schema.metadata)
    if metadata.get(FORMAT) != FORMAT_NAME:
        raise DecodeError(f"not an {FORMAT_NAME} payload (schema metadata {FORMAT!r} is {metadata.get(FORMAT)!r})")
    version = metadata.get(VERSION, "")
    major, _, minor = version.partition(".")
    major_number = parse_uint(major, f"format version {version[:40]!r}: major")
    parse_uint(minor, f"format version {version[:40]!r}: minor")
    if major_number != FORMAT_VERSION[0]:
        raise FormatVersionError(
            f"format version {version} is not readable by this version of arrow-dataproto, "
            f"which reads {FORMAT_VERSION[0]}.x"
        )
    with newer_version_rule(metadata):
        columns_of(schema)  # the fields' own checks
    return metadata


class Columns:
    """What this format reads from the fields of a schema (names, types, field metadata),
    checked and parsed once for each distinct list of fields a process meets (every step
    of a training loop sends the same columns): each column's metadata as text, and the
    :class:`TensorSpec` of each tensor column asked for. Built only for fields that pass
    :func:`check_field_names` and have unique names (:class:`DecodeError` otherwise)."""

    __slots__ = ("fields", "metadata", "_specs")

    def __init__(self, fields: pa.Schema):
        check_field_names(fields)
        twice = repeated(fields.names)
        if twice:  # each column a tree leaf or a non_tensor_batch key: unique
            raise DecodeError(f"column name(s) {twice[:5]} appear more than once: a damaged schema")
        self.fields = fields
        self.metadata: tuple[Mapping[str, str], ...] = tuple(MappingProxyType(text_metadata(f.metadata)) for f in fields)
        self._specs: dict[int, TensorSpec] = {}

    def tensor_spec(self, i: int) -> "TensorSpec":
        """The spec of column ``i`` read as a tensor column (:meth:`TensorSpec.parse`: DecodeError)."""
        spec = self._specs.get(i)
        if spec is None:
            spec = self._specs[i] = TensorSpec.parse(self.fields.field(i).name, self.metadata[i])
        return spec


_COLUMNS_KEPT = 16
_columns_seen: list[Columns] = []
"""The most recent distinct field lists met, newest first (parsing them is a pure function of the fields)."""


def columns_of(schema: pa.Schema) -> Columns:
    """The :class:`Columns` of ``schema``'s fields: parsed again only for fields not met recently."""
    fields = schema.remove_metadata()  # the schema-level metadata (tree, meta_info) changes step to step
    for seen in _columns_seen:
        if seen.fields.equals(fields, check_metadata=True):
            return seen
    made = Columns(fields)
    _columns_seen[:] = [made, *_columns_seen[: _COLUMNS_KEPT - 1]]
    return made


def repeated(names: Iterable[str]) -> list[str]:
    """The names that stand more than once in ``names``, sorted (``[]`` when all are unique)."""
    return sorted(name for name, count in Counter(names).items() if count > 1)


MAX_NESTING = 64
"""The most fields one column nests, the column counted (a ``list`` 63 levels deep, a
``map`` 31): what Arrow's IPC format writes and reads. A deeper type, possible only in
memory, is refused where it arrives (decoding, and the native type of an object column)."""


def nesting(arrow_type: pa.DataType) -> int:
    """How many fields deep a column of ``arrow_type`` is (1 for a primitive), counting
    through extension storage and dictionary values, up to ``MAX_NESTING + 1`` (the walk
    stops there). Iterative: no recursion limit is reached at any depth. Reads every
    nested field's name (pyarrow decodes it on access: ``UnicodeDecodeError`` if it is not
    UTF-8)."""
    deepest, stack = 1, [(arrow_type, 1)]
    while stack:
        kind, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            break
        while isinstance(kind, (pa.BaseExtensionType, pa.DictionaryType)):
            kind = kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind.value_type
        for i in range(kind.num_fields):
            field = kind.field(i)
            field.name  # decoded here: UnicodeDecodeError if it is not UTF-8
            stack.append((field.type, depth + 1))
    return deepest


def check_field_names(schema: pa.Schema) -> None:
    """:class:`DecodeError` if a column name (nested ones too) is not valid UTF-8 (a corrupt
    payload: pyarrow would raise ``UnicodeDecodeError`` wherever the name is read), or a
    column nests more than :data:`MAX_NESTING` fields (naming the column)."""
    try:
        for field in schema:
            field.name  # decoded here: UnicodeDecodeError if it is not UTF-8
            if nesting(field.type) > MAX_NESTING:
                message = f"its type nests more than {MAX_NESTING} fields, deeper than Arrow's IPC format carries"
                raise column_error(DecodeError, field.name, message)
    except UnicodeDecodeError as e:
        raise DecodeError(f"column names are not valid UTF-8: {e}") from None


def _json(metadata: Mapping[str, str], key: str, where: str = "schema metadata") -> Any:
    try:
        return json.loads(metadata[key])
    except KeyError:
        raise DecodeError(f"{where} lacks {key!r}") from None
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise DecodeError(f"{where} {key!r} is not valid JSON: {e!r}") from None


def _is_size(value: Any) -> bool:
    return isinstance(value, list) and all(type(n) is int and 0 <= n <= MAX_DIM for n in value)


# ---------------------------------------------------------------- the TensorDict tree


Entry = Union[str, "Node"]
"""One entry of a tree: a leaf (its key) or a nested TensorDict."""


@dataclass(frozen=True)
class Node:
    """A TensorDict of the tree: its ``key`` (``""`` for the root), ``batch_size``,
    ``device`` and ``entries`` in column order (a leaf is its key, a nested
    TensorDict a :class:`Node`). The root's leaves, depth-first, are the first
    columns of the RecordBatch, named by their key paths joined with ``.``.
    """

    key: str
    batch_size: tuple[int, ...]
    device: str | None
    entries: tuple[Entry, ...]

    # -- metadata

    @classmethod
    def parse(cls, metadata: Mapping[str, str]) -> "Node | None":
        """The tree of a schema's metadata (``None`` when the DataProto has no batch).

        Raises :class:`DecodeError` for missing or malformed entries.
        """
        batch_size, device, tree = (_json(metadata, k) for k in (BATCH_SIZE, TD_DEVICE, TREE))
        entries = _parse_entries(tree)
        if batch_size is None:
            if entries:
                raise DecodeError(f"the tree names tensor columns but batch_size is null: {tree!r}")
            return None
        if not (_is_size(batch_size) and batch_size):
            raise DecodeError(f"malformed batch_size {str(batch_size)[:200]}")
        return cls("", tuple(batch_size), parse_device(device, "TensorDict device"), entries)

    def metadata(self) -> dict[str, str]:
        """The schema metadata entries of this (root) tree."""
        return {
            BATCH_SIZE: json.dumps(list(self.batch_size)),
            TD_DEVICE: json.dumps(self.device),
            TREE: json.dumps(self._entries_json()),
        }

    def _entries_json(self) -> list:
        return [e if isinstance(e, str) else [e.key, list(e.batch_size), e.device, e._entries_json()] for e in self.entries]

    def nesting(self) -> list:
        """The entries as JSON values without the row count of each batch size: what the
        batches of one file share."""
        return [e if isinstance(e, str) else [e.key, list(e.batch_size[1:]), e.device, e.nesting()] for e in self.entries]

    # -- operations

    def leaf_names(self, prefix: str = "") -> list[str]:
        """The column names of the leaves, in column order."""
        names: list[str] = []
        for entry in self.entries:
            if isinstance(entry, str):
                names.append(prefix + entry)
            else:
                names += entry.leaf_names(f"{prefix}{entry.key}.")
        return names

    def select(self, keep: set[str], *, prune: bool = True, prefix: str = "") -> "Node":
        """This tree with only the leaves named in ``keep``; nested TensorDicts left
        without leaves are dropped if ``prune``, kept (empty) otherwise."""
        entries: list[Entry] = []
        for entry in self.entries:
            if isinstance(entry, str):
                if prefix + entry in keep:
                    entries.append(entry)
                continue
            sub = entry.select(keep, prune=prune, prefix=f"{prefix}{entry.key}.")
            if sub.entries or not prune:
                entries.append(sub)
        return Node(self.key, self.batch_size, self.device, tuple(entries))

    def with_rows(self, rows: int) -> "Node":
        """This tree with ``rows`` as the first batch dimension of every TensorDict in it."""
        entries = tuple(e if isinstance(e, str) else e.with_rows(rows) for e in self.entries)
        return Node(self.key, (rows, *self.batch_size[1:]), self.device, entries)


def schema_metadata(tree: Node | None, meta_info: Mapping[str, str]) -> dict[str, str]:
    """The schema metadata of a RecordBatch of ours: the format name and version, the entries
    of ``tree`` (those of a DataProto without a batch when None), then ``meta_info``, the
    ``adp.meta_info*`` entries :func:`arrow_dataproto._objects.encode_meta_info` makes."""
    tree_metadata = {BATCH_SIZE: "null", TD_DEVICE: "null", TREE: "[]"} if tree is None else tree.metadata()
    return {FORMAT: FORMAT_NAME, VERSION: version_text(), **tree_metadata, **meta_info}


def _parse_entries(tree: Any) -> tuple[Entry, ...]:
    """The entries of one TensorDict of the tree. Keys are unique within a TensorDict: a
    duplicate (a leaf and a nested TensorDict of one name, or two leaves) would make one
    column vanish from the decoded batch."""
    if not isinstance(tree, list):
        raise DecodeError("malformed TensorDict tree in the schema metadata")
    entries: list[Entry] = []
    keys: set[str] = set()
    for entry in tree:
        if isinstance(entry, str):
            key = entry
            entries.append(entry)
        elif (
            isinstance(entry, list)
            and len(entry) == 4
            and isinstance(entry[0], str)
            and _is_size(entry[1])
            and entry[1]
        ):
            key = entry[0]
            device = parse_device(entry[2], f"device of nested TensorDict {key[:40]!r}")
            entries.append(Node(key, tuple(entry[1]), device, _parse_entries(entry[3])))
        else:
            raise DecodeError(f"malformed TensorDict tree entry {str(entry)[:200]}")
        if key in keys:
            raise DecodeError(f"duplicate key {key[:40]!r} in a TensorDict of the tree")
        keys.add(key)
    return tuple(entries)


def resolve_columns(names: list[str], wanted: Iterable[str] | str, where: str) -> list[str]:
    """The columns of ``names`` that ``wanted`` asks for, in column order; a name that is
    not a column but a nested TensorDict's selects all its leaves (a column's exact name
    never selects other columns that start with it: ``extra`` is not ``extra.p``).
    :class:`ColumnNotFoundError` for a name that matches nothing (``where`` names the
    payload in the message)."""
    if isinstance(wanted, str):
        wanted = [wanted]
    keep: set[str] = set()
    unknown = []
    exact = set(names)
    for name in wanted:
        matched = [name] if name in exact else [n for n in names if n.startswith(f"{name}.")]
        keep.update(matched)
        if not matched:
            unknown.append(name)
    if unknown:
        raise not_found(ColumnNotFoundError, "column", unknown, where, names)
    return [n for n in names if n in keep]


# ---------------------------------------------------------------- column specs


@dataclass(frozen=True)
class TensorSpec:
    """The field metadata of a tensor column.

    ``shape`` is the per-row shape, ``None`` for a ragged dimension (jagged: exactly
    one, at ``ragged_idx - 1``; strided: all of them); ``device`` where the tensor was.
    """

    kind: str
    dtype: torch.dtype
    shape: tuple[int | None, ...]
    device: str | None = None
    ragged_idx: int | None = None
    offsets_of: str | None = None

    def metadata(self) -> dict[str, str]:
        """The field metadata of this spec (a new dict; the text is made once per distinct spec)."""
        return dict(_spec_metadata(self))

    @classmethod
    def parse(cls, name: str, meta: Mapping[str, str]) -> "TensorSpec":
        """Read and check a tensor column's field metadata; :class:`DecodeError` naming the column."""
        from ._dtypes import dtype_from_name

        try:
            kind = meta[KIND]
            dtype = dtype_from_name(meta[DTYPE], name)
            shape = json.loads(meta[SHAPE])
        except KeyError as e:
            raise column_error(DecodeError, name, f"missing metadata key {e.args[0]!r}") from None
        except UnknownContentError:
            raise
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
            raise column_error(DecodeError, name, f"malformed shape metadata: {e!r}") from None
        check = _SHAPE_RULES.get(kind)
        if check is None:
            raise column_error(UnknownContentError, name, f"unknown column kind {kind[:40]!r}")
        try:
            if not isinstance(shape, list):
                raise DecodeError(f"malformed shape metadata {meta[SHAPE][:200]!r}")
            check_row_shape(shape, "shape")
            ragged_idx = check(name, shape, meta.get(RAGGED_IDX, ""))
            device = parse_device(meta.get(DEVICE), "device")
            offsets_of = meta.get(OFFSETS_OF)
            if offsets_of is not None and kind != "jagged":
                raise DecodeError(f"{OFFSETS_OF} on a {kind} column")
        except DecodeError as e:
            raise column_error(DecodeError, name, str(e)) from None
        return cls(kind, dtype, tuple(shape), device, ragged_idx, offsets_of)


@lru_cache(maxsize=1024)
def _spec_metadata(spec: TensorSpec) -> tuple[tuple[str, str], ...]:
    from ._dtypes import dtype_name  # torch: this module itself imports without it (the CLI reads metadata)

    meta = {DTYPE: dtype_name(spec.dtype), DEVICE: str(spec.device), KIND: spec.kind, SHAPE: json.dumps(list(spec.shape))}
    if spec.ragged_idx is not None:
        meta[RAGGED_IDX] = str(spec.ragged_idx)
    if spec.offsets_of is not None:
        meta[OFFSETS_OF] = spec.offsets_of
    return tuple(meta.items())


def _dense_shape(name: str, shape: list, _: str) -> None:
    if None in shape:
        raise DecodeError(f"dense column with a ragged shape {shape}")
    return None


def _jagged_shape(name: str, shape: list, ragged_idx: str) -> int:
    index = parse_uint(ragged_idx, "ragged_idx")
    if not 1 <= index <= len(shape) or shape[index - 1] is not None:
        raise DecodeError(f"ragged_idx {ragged_idx!r} does not fit shape {shape}")
    if shape.count(None) != 1:
        raise DecodeError(f"jagged shape {shape} must have exactly one ragged dimension")
    return index


def _strided_shape(name: str, shape: list, _: str) -> None:
    if not shape or any(n is not None for n in shape):
        raise DecodeError(f"malformed strided shape {shape}")
    return None


_SHAPE_RULES = {"tensor": _dense_shape, "jagged": _jagged_shape, "strided": _strided_shape}


def numpy_dtype_text(name: str, dtype: np.dtype) -> str:
    """How ``adp.dtype`` records a numpy dtype: ``dtype.str``, or the JSON descr of a
    structured dtype. :class:`EncodeError` if the text would not give ``dtype`` back."""
    text = dtype.str if dtype.fields is None else json.dumps(np.lib.format.dtype_to_descr(dtype))
    try:
        if numpy_dtype_of(text) == dtype:
            return text
    except (TypeError, ValueError):
        pass
    raise column_error(EncodeError, name, f"dtype {dtype} cannot be recorded; convert the column to object dtype")


def numpy_dtype_of(text: str) -> np.dtype:
    """Inverse of :func:`numpy_dtype_text` (``TypeError``/``ValueError`` for bad text)."""
    if text.startswith("["):
        return np.lib.format.descr_to_dtype(json.loads(text))
    return np.dtype(text)


@dataclass(frozen=True)
class ArraySpec:
    """The field metadata of a ``non_tensor_batch`` column: its kind, numpy dtype and per-row shape."""

    kind: str
    dtype: np.dtype
    row_shape: tuple[int, ...]

    def metadata(self, name: str) -> dict[str, str]:
        """The field metadata of this spec (a new dict; the text is made once per distinct spec;
        :class:`EncodeError` naming column ``name`` for a dtype that cannot be recorded)."""
        try:
            return dict(_array_spec_metadata(self))
        except EncodeError:
            numpy_dtype_text(name, self.dtype)  # raises, naming the column
            raise

    @classmethod
    def parse(cls, meta: Mapping[str, str]) -> "ArraySpec":
        """Read a ``non_tensor_batch`` column's field metadata. Raises ``KeyError``,
        ``TypeError`` or ``ValueError`` (the column decoder names the column)."""
        return _array_spec(meta[KIND], meta[DTYPE], meta[ROW_SHAPE])


@lru_cache(maxsize=1024)
def _array_spec_metadata(spec: ArraySpec) -> tuple[tuple[str, str], ...]:
    return ((KIND, spec.kind), (DTYPE, numpy_dtype_text("", spec.dtype)), (ROW_SHAPE, json.dumps(list(spec.row_shape))))


@lru_cache(maxsize=1024)
def _array_spec(kind: str, dtype_text: str, row_shape_text: str) -> ArraySpec:
    """:meth:`ArraySpec.parse` of one distinct metadata (errors are raised, not kept)."""
    dtype = numpy_dtype_of(dtype_text)
    row_shape = json.loads(row_shape_text)
    if not (isinstance(row_shape, list) and None not in row_shape):
        raise ValueError(f"bad row shape {str(row_shape)[:200]}")
    check_row_shape(row_shape, "row shape")
    return ArraySpec(kind, dtype, tuple(row_shape))
