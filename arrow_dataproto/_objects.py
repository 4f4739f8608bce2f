"""Encode the ``non_tensor_batch`` arrays of a DataProto for Arrow: the column kinds.

Every column is a numpy array with rows on dim 0. :func:`encode_column` turns it into an
Arrow array with one entry per row plus field metadata; :func:`decode_column` inverts it.
The field metadata always holds three keys:

``adp.kind``
    How the column is stored: ``"numeric"``, ``"string"``, ``"object"``, ``"json"`` (since
    format 1.2) or ``"pickle"``.
``adp.dtype``
    The numpy dtype of the column: ``np.dtype.str`` (``"<i4"``, ``"|O"``, ``">M8[ns]"``),
    or, for a structured dtype, the JSON of ``np.lib.format.dtype_to_descr``.
``adp.row_shape``
    JSON list of the shape of one row (``values.shape[1:]``); the row count is the length
    of the Arrow array, so a sliced array decodes to the matching rows.

Representations, by numpy dtype kind:

- ``b i u f c M m`` (kind ``numeric``): 1-D becomes a primitive array (bool: the canonical
  ``pa.bool8()`` extension, one byte per value; datetime64/timedelta64: ``int64``); N-D
  becomes ``pa.fixed_shape_tensor(value_type, row_shape)`` (bool values stored as
  ``int8``). Complex values are stored as pairs of floats (real, imaginary): always a
  ``fixed_shape_tensor`` whose shape is ``row_shape + [2]``, 1-D columns included.
  Encoding is zero-copy for a C-contiguous array in native byte order; anything else is
  first copied into that layout. Decoding is zero-copy (a read-only view of the Arrow
  buffers) except for a big-endian dtype, which is restored with a copy.
- ``U S`` (kind ``string``): a string / binary column (``fixed_shape_tensor`` of strings /
  binaries for N-D); decoding copies into an array of the recorded dtype.
- ``O`` 1-D (kind ``object``): the column Arrow infers (strings, int64, float64, bool,
  bytes, nulls for ``None``, lists and structs of those), kept only if converting it back
  gives values equal to the originals with the same Python types, recursively (so bool
  stays distinct from int, tuple from list, dict key order counts; NaN equals NaN). Where
  every position holds one exact type, the type is built from them and that alone shows it.
- ``O`` 1-D failing that check (kind ``json``): when every row is a JSON value that JSON
  gives back exactly (:mod:`arrow_dataproto._json`: exact builtin types, int64-range ints,
  finite floats, ``str`` keys, at most ``JSON_MAX_DEPTH`` deep), the canonical ``arrow.json``
  extension type over ``string``: one compact JSON text per row, a ``None`` row a null. Rows
  may mix types and dict keys: JSON keeps ``1`` / ``1.0`` / ``True`` apart and dict key
  order. Tuples, bytes, non-``str`` keys, NaN/infinities, bigger ints, subclasses
  (``IntEnum``, ``np.float64``) and other objects are not JSON. Decoding gives each row's
  value exactly or raises an error naming the row.
- everything else, including N-D object arrays, structured dtypes, longdouble and object
  columns failing both checks above (kind ``pickle``): ``pa.large_binary()`` holding one
  ``pickle.dumps(row, protocol=5)`` per row. Decoding needs ``allow_pickle=True``.

String and object columns use 32-bit offsets unless a column holds more than 2 GiB of
string, binary or list data, in which case it is re-encoded with the ``large_`` types; a
JSON column uses ``large_string`` storage past :data:`MAX_STRING_BYTES` of text.
Pickled columns are always ``large_binary``. ``meta_info`` is encoded by
:mod:`arrow_dataproto._meta_info`.
"""

from __future__ import annotations

import itertools
import operator
import pickle
from functools import lru_cache, partial
from typing import Any, Callable, Mapping, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _limits
from ._format import ARRAY_KINDS, KIND, MAX_NESTING, TENSOR_KINDS, ArraySpec, text_metadata
from ._json import JSON_TYPES, census, json_texts, load_json_column, same
from .errors import PICKLE_REFUSED, DecodeError, EncodeError, PickleNotAllowedError, UnknownContentError, column_error

NUMERIC, STRING, OBJECT, JSON, PICKLE = ARRAY_KINDS

# Arrow types an object column may use natively: to_pylist gives back builtin values.
_PLAIN_LEAVES = {
    pa.null(), pa.bool_(), pa.int64(), pa.float64(),
    pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
}
_PLAIN_TYPES: dict[type, tuple[pa.DataType, pa.DataType]] = {
    str: (pa.string(), pa.large_string()), bytes: (pa.binary(), pa.large_binary())
}
"""The Arrow types that give exact ``str`` and ``bytes`` rows back exactly, by offset width."""
_STRING_ROWS: dict[str, type] = {"U": str, "S": bytes}
"""What a numpy ``U`` / ``S`` array's rows are in Python (``tolist()``), which picks their Arrow types."""


# --- helpers shared by the kinds --------------------------------------------------------


def _storage_dtype(dtype: np.dtype) -> tuple[np.dtype, tuple[int, ...]]:
    """The native numpy dtype a numeric dtype is stored as, and the trailing dims it adds."""
    if dtype.kind == "c":
        return np.dtype(f"f{dtype.itemsize // 2}"), (2,)
    if dtype.kind in "bMm":
        return np.dtype(f"i{dtype.itemsize}"), ()
    return dtype.newbyteorder("="), ()


def _shaped(value_type: pa.DataType, row_shape: tuple[int, ...]) -> pa.DataType:
    return pa.fixed_shape_tensor(value_type, row_shape) if row_shape else value_type


def _numeric_type(dtype: np.dtype, row_shape: tuple[int, ...]) -> pa.DataType:
    """The Arrow type of a numeric column (raises ArrowNotImplementedError for longdouble)."""
    storage, extra = _storage_dtype(dtype)
    shape = (*row_shape, *extra)
    if dtype.kind == "b" and not shape:
        return pa.bool8()
    return _shaped(pa.from_numpy_dtype(storage), shape)


def _large(t: pa.DataType) -> pa.DataType:
    """``t`` with every string, binary and list type swapped for its 64-bit-offset variant."""
    if pa.types.is_string(t):
        return pa.large_string()
    if pa.types.is_binary(t):
        return pa.large_binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.large_list(_large(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([field.with_type(_large(field.type)) for field in t])
    return t


@lru_cache(maxsize=256)
def _is_plain(t: pa.DataType) -> bool:
    """Whether an object column of type ``t`` gives its rows back as the Python values they were
    (each distinct type checked once: every step of a training loop sends the same types)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _is_plain(t.value_type)
    if pa.types.is_struct(t):
        return all(_is_plain(field.type) for field in t)
    return t in _PLAIN_LEAVES


def _to_arrow(data: Any, arrow_type: pa.DataType | None = None) -> pa.Array:
    """``pa.array(data)``; pyarrow returns a ChunkedArray past 2 GiB of offsets: go large.

    The chunks are widened (``cast``: new offsets, the same value bytes) and joined (one
    copy of the bytes), not converted from the Python objects a second time (several times
    slower than the copy, and the two conversions were alive at once)."""
    array = pa.array(data, type=arrow_type)
    if isinstance(array, pa.ChunkedArray):
        large = _large(array.type)
        chunks = array.chunks
        del array
        try:
            return pa.concat_arrays([chunk.cast(large) for chunk in chunks])
        except pa.ArrowNotImplementedError:  # a type whose cast pyarrow lacks: convert again
            del chunks
            return pa.array(data, type=large)
    return array


def _wrap(flat: pa.Array, arrow_type: pa.DataType, length: int) -> pa.Array:
    """Put ``flat`` (all values, row-major) into ``arrow_type`` with ``length`` rows."""
    if not isinstance(arrow_type, pa.BaseExtensionType):
        return flat
    storage = flat
    if flat.type != arrow_type.storage_type:  # fixed_shape_tensor: a fixed-size list
        storage = pa.Array.from_buffers(arrow_type.storage_type, length, [None], children=[flat])
    return pa.ExtensionArray.from_storage(arrow_type, storage)


def _flat_values(array: pa.Array) -> pa.Array:
    """Inverse of :func:`_wrap`: the values of the rows of ``array`` (honours slicing)."""
    storage = array.storage if isinstance(array, pa.ExtensionArray) else array
    return storage.flatten() if pa.types.is_fixed_size_list(storage.type) else storage


def _check_string_width(flat: pa.Array, dtype: np.dtype) -> None:
    """The recorded width of a ``U``/``S`` dtype must hold every value (a narrower one would
    truncate them silently), and may not make the decoded array larger than
    :func:`arrow_dataproto._limits.check_allocation` allows for the bytes it is decoded from (a width
    of 100,000,000 would turn a few bytes into gigabytes)."""
    width = dtype.itemsize // (4 if dtype.kind == "U" else 1)
    if len(flat):
        lengths = pc.utf8_length(flat) if dtype.kind == "U" else pc.binary_length(flat)
        longest = pc.max(lengths).as_py() or 0
        _check(longest <= width, f"values up to {longest} long, longer than the recorded dtype {dtype}")
    _limits.check_allocation(len(flat) * dtype.itemsize, flat.nbytes, f"a {dtype} column of {len(flat)} values")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_type(array: pa.Array, expected: pa.DataType) -> None:
    _check(array.type == expected, f"expected Arrow type {expected}, got {array.type}")


_not_none = partial(operator.is_not, None)


def _may_be_native(group: list, depth: int = 3) -> bool:
    """False when no Arrow type can hold the values found at one position of an object column
    (the rows; the items of their lists; the values of one dict key) and give each back with
    its Python type: two Python types besides None (Arrow gives one type back per column:
    ``1`` and ``2.5`` come back as floats), or dicts whose keys differ (Arrow makes one struct
    of all the keys). Looks ``depth`` positions deep; True means "try": :meth:`Object.encode`
    still checks every value. A cheap test that spares the native attempt for most columns
    that would fail it (most JSON columns)."""
    types = set(map(type, group))
    types.discard(type(None))
    if len(types) != 1 or depth == 0:
        return len(types) <= 1
    kind = types.pop()
    present = list(filter(_not_none, group)) if kind is list or kind is dict else []
    if kind is list:
        return _may_be_native(list(itertools.chain.from_iterable(present)), depth - 1)
    if kind is dict:
        keys = tuple(present[0])
        if not all(map(keys.__eq__, map(tuple, present))):  # stops at the first other keys (most JSON columns: soon)
            return False
        return all(_may_be_native(list(field), depth - 1) for field in zip(*map(dict.values, present)))
    return True


_FIRST_ROWS = 64
"""Rows :meth:`Object.encode` checks with :func:`_may_be_native` before all of them."""
_NATIVE_TYPES = JSON_TYPES | {bytes}
"""What a native object column may hold: :meth:`Object.encode` gives any other type (a
tuple, a subclass) back as another, so it does not try."""
_JSON_TYPE: Callable[[pa.DataType], pa.DataType] | None = getattr(pa, "json_", None)
"""``pa.json_`` (pyarrow >= 19); on older pyarrow a JSON column is its plain UTF-8 storage."""
MAX_STRING_BYTES = 2**31 - 1
"""The most bytes of text a JSON column stores with 32-bit offsets (``string``); more: ``large_string``."""


def json_type(storage: pa.DataType = pa.string()) -> pa.DataType:
    """The Arrow type of a JSON column: the canonical ``arrow.json`` extension over ``storage``
    (``string`` or ``large_string``), or ``storage`` itself where pyarrow lacks ``pa.json_``."""
    return storage if _JSON_TYPE is None else _JSON_TYPE(storage)


def _as_json(storage: pa.Array) -> pa.Array:
    return pa.ExtensionArray.from_storage(json_type(storage.type), storage) if _JSON_TYPE else storage


def _json_storage(array: pa.Array) -> pa.Array:
    return array.storage if isinstance(array, pa.ExtensionArray) else array


# --- the kinds: encode returns None to fall back to pickle; decode raises any exception
# on malformed input (decode_column names the column) ------------------------------------


class Numeric:
    """``b i u f c M m``: a primitive or ``fixed_shape_tensor`` column, zero-copy both ways."""

    kind = NUMERIC
    dtype_kinds = "biufcMm"

    @staticmethod
    def encode(name: str, values: np.ndarray) -> pa.Array | None:
        try:
            arrow_type = _numeric_type(values.dtype, values.shape[1:])
        except pa.ArrowNotImplementedError:  # longdouble / clongdouble
            return None
        native = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
        storage_dtype, extra = _storage_dtype(native.dtype)
        store = (native[..., None] if extra else native).view(storage_dtype)
        flat = pa.Array.from_buffers(
            pa.from_numpy_dtype(storage_dtype), store.size, [None, pa.py_buffer(store)]
        )
        return _wrap(flat, arrow_type, len(values))

    @staticmethod
    def decode(array: pa.Array, dtype: np.dtype, row_shape: tuple[int, ...]) -> np.ndarray:
        _check_type(array, _numeric_type(dtype, row_shape))
        flat = _flat_values(array)
        _check(array.null_count == 0 and flat.null_count == 0, "numeric columns cannot hold nulls")
        extra = _storage_dtype(dtype)[1]
        shaped = flat.to_numpy(zero_copy_only=True).reshape(len(array), *row_shape, *extra)
        out = shaped.view(dtype.newbyteorder("="))
        if extra:
            out = out[..., 0]
        return out if out.dtype == dtype else out.astype(dtype)


def beyond_unicode(values: np.ndarray) -> int | None:
    """The first code point above U+10FFFF in a numpy ``U`` array, else ``None``. numpy holds
    any 32-bit value (an array built from bytes); Python cannot (``tolist()`` raises
    ``SystemError``), and pyarrow turns one into bytes that are not UTF-8."""
    codes = np.ascontiguousarray(values).view(np.dtype("u4").newbyteorder(values.dtype.byteorder))
    beyond = np.flatnonzero(codes > 0x10FFFF)
    return int(codes.reshape(-1)[beyond[0]]) if len(beyond) else None


class String:
    """``U S``: a string / binary column (``fixed_shape_tensor`` of them for N-D)."""

    kind = STRING
    dtype_kinds = "US"

    @staticmethod
    def encode(name: str, values: np.ndarray) -> pa.Array | None:
        # Via Python objects: pa.array(<numpy U/S array>) cuts values at the first NUL.
        if values.dtype.kind == "U" and (code := beyond_unicode(values)) is not None:
            raise column_error(EncodeError, name, f"a value holds {code:#x}, beyond Unicode (U+10FFFF): not text")
        flat = _plain_array(values.reshape(-1).tolist(), _STRING_ROWS[values.dtype.kind])
        return _wrap(flat, _shaped(flat.type, values.shape[1:]), len(values))

    @staticmethod
    def decode(array: pa.Array, dtype: np.dtype, row_shape: tuple[int, ...]) -> np.ndarray:
        value_type = (
            array.type.value_type if isinstance(array.type, pa.FixedShapeTensorType) else array.type
        )
        _check(
            value_type in _PLAIN_TYPES[_STRING_ROWS[dtype.kind]],
            f"expected string or binary values for dtype {dtype}, got {value_type}",
        )
        _check_type(array, _shaped(value_type, row_shape))
        flat = _flat_values(array)
        _check(array.null_count == 0 and flat.null_count == 0, "string columns cannot hold nulls")
        _check_string_width(flat, dtype)
        values = flat.to_numpy(zero_copy_only=False).astype(dtype)
        return values.reshape(len(array), *row_shape)


def _plain_kind(rows: list) -> type | None:
    """``str`` or ``bytes`` if every row is exactly one of them (no subclass, no None): Arrow
    gives such rows back exactly without a check (``pa.array`` refuses text that is not UTF-8)."""
    kinds = set(map(type, rows))
    return kinds.pop() if len(kinds) == 1 and kinds <= _PLAIN_TYPES.keys() else None


_LARGE_TEXT = 1 << 26
"""Plain rows with more characters (or bytes) than this are built by :func:`_text_array`."""
_TEXT_PIECE = 1 << 24
"""Bytes of text :func:`_text_array` joins at a time: what it holds beside its result."""


def _plain_array(rows: list, kind: type) -> pa.Array:
    """Rows that are all exactly ``str`` or all exactly ``bytes`` (``kind``), as a string or
    binary array: the large type past :data:`MAX_STRING_BYTES` bytes, so that they are
    converted once, in one piece.

    Up to :data:`_LARGE_TEXT` characters ``pa.array`` (the fastest); more, :func:`_text_array`.
    Raises ``UnicodeEncodeError`` for a ``str`` that is not text (a lone surrogate), as
    ``pa.array`` does."""
    sizes = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    chars = int(sizes.sum())
    if chars <= _LARGE_TEXT:  # UTF-8 takes at least as many bytes as characters
        return _to_arrow(rows, _PLAIN_TYPES[kind][chars > MAX_STRING_BYTES])
    if kind is str and not all(map(str.isascii, rows)):  # UTF-8 sizes: each row encoded once more
        sizes = np.fromiter(map(len, map(str.encode, rows)), dtype=np.int64, count=len(rows))
    return _text_array(rows, kind, sizes)


def _text_array(rows: list, kind: type, sizes: np.ndarray) -> pa.Array:
    """:func:`_plain_array` for ``sizes`` (each row's UTF-8 or byte length), built into
    buffers of exactly the text's size, a piece of :data:`_TEXT_PIECE` bytes at a time.
    ``pa.array``'s builder grows its buffer by doubling: it held about twice the text at its
    peak, and in a process whose memory is new its page faults made it five times slower."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    data = pa.allocate_buffer(total)
    out = np.frombuffer(data, dtype=np.uint8)
    start = 0
    while start < len(rows):
        stop = int(np.searchsorted(offsets, offsets[start] + _TEXT_PIECE, side="right")) - 1
        stop = max(stop, start + 1)
        piece = b"".join(rows[start:stop]) if kind is bytes else "".join(rows[start:stop]).encode()
        out[offsets[start] : offsets[stop]] = np.frombuffer(piece, dtype=np.uint8)
        start = stop
    large = total > MAX_STRING_BYTES
    offsets_buffer = pa.py_buffer(offsets if large else offsets.astype(np.int32))
    return pa.Array.from_buffers(_PLAIN_TYPES[kind][large], len(rows), [None, offsets_buffer, data])


_LEAF_TYPES: dict[type, pa.DataType] = {
    bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string(), bytes: pa.binary()
}
"""The plain Arrow type that holds values of one exact Python type and gives them back as it."""


def _native_type(values: list) -> pa.DataType | None:
    """The Arrow type that gives ``values`` back exactly (:func:`same`) by construction, or
    None when there is none to build from their types alone: at every position (the values;
    the items of their lists; the values of one dict key) the values are ``None`` or of one
    exact type of :data:`_LEAF_TYPES`, lists, or dicts with the same ``str`` keys in the same
    order. It is the type pyarrow would infer, found in one pass at C speed: ``pa.array``
    with a type is several times faster than with inference, and nothing needs converting back."""
    present = list(filter(_not_none, values))
    kinds = set(map(type, present))
    if not kinds:
        return pa.null()
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    if kind is list:
        item = _native_type(list(itertools.chain.from_iterable(present)))
        return None if item is None else pa.list_(item)
    if kind is dict:
        keys = set(map(tuple, present))
        names = keys.pop()
        if keys or not all(type(name) is str for name in names):
            return None
        fields = [_native_type(list(map(operator.itemgetter(name), present))) for name in names]
        return None if None in fields else pa.struct(list(zip(names, fields)))
    return _LEAF_TYPES.get(kind)


_SAME_ROWS_SLICE = 4096
"""Rows converted back at a time by :func:`_same_rows`: what the check holds in memory."""


def _same_rows(rows: list, array: pa.Array) -> bool:
    """Whether the array's rows convert back to ``rows`` (:func:`same`), a slice at a time."""
    for start in range(0, len(rows), _SAME_ROWS_SLICE):
        back = array.slice(start, _SAME_ROWS_SLICE).to_pylist()
        if not all(map(same, rows[start : start + _SAME_ROWS_SLICE], back)):
            return False
    return True


class Object:
    """1-D ``O``: the column Arrow infers, kept only if it gives back the same values and types."""

    kind = OBJECT
    dtype_kinds = "O"

    @staticmethod
    def encode(name: str, values: np.ndarray) -> pa.Array | None:
        if values.ndim != 1:
            return None
        rows = values.tolist()
        plain = _plain_kind(rows)
        if plain is not None:  # exact str or bytes: they come back as they are
            try:
                return _plain_array(rows, plain)
            except Exception:  # a lone surrogate is not text: another kind (JSON, pickle) keeps the rows
                return None
        # ruled out on some rows is ruled out on all (a position only gains values): most JSON
        # columns are ruled out on their first rows, before a pass over the whole column
        if not _may_be_native(rows[:_FIRST_ROWS]):
            return None
        if census(rows, _NATIVE_TYPES, MAX_NESTING - 1) is None:
            return None  # deeper than MAX_NESTING fields: Arrow's IPC format refuses it (pa.array crashes far deeper)
        arrow_type = _native_type(rows)
        if arrow_type is None and not _may_be_native(rows):
            return None
        try:
            array = _to_arrow(rows, arrow_type)
        except Exception:  # pa.array calls into arbitrary user objects; any failure -> pickle
            return None
        if arrow_type is not None:  # built from the values' exact types: they come back as they are
            return array
        if _is_plain(array.type) and _same_rows(rows, array):
            return array
        return None

    @staticmethod
    def decode(array: pa.Array, dtype: np.dtype, row_shape: tuple[int, ...]) -> np.ndarray:
        _check(not row_shape, f"object columns are 1-D, got row shape {list(row_shape)}")
        _check(_is_plain(array.type), f"unsupported Arrow type for an object column: {array.type}")
        return np.fromiter(array.to_pylist(), dtype=object, count=len(array))


class Json:
    """1-D ``O`` whose rows JSON gives back exactly: one JSON text per row (a ``None`` row is a
    null), as the canonical ``arrow.json`` extension type over ``string`` (``large_string``
    past :data:`MAX_STRING_BYTES` of text)."""

    kind = JSON
    dtype_kinds = "O"

    @staticmethod
    def encode(name: str, values: np.ndarray) -> pa.Array | None:
        return Json.encode_rows(values.tolist()) if values.ndim == 1 else None

    @staticmethod
    def encode_rows(rows: list) -> pa.Array | None:
        """The JSON column of ``rows``, or None if one is not JSON (:mod:`arrow_dataproto._json`)."""
        written = json_texts(rows)
        if written is None:
            return None
        offsets, joined = written
        valid = np.diff(offsets) > 0  # a None row's text is empty, a JSON text never is
        nulls = len(rows) - int(np.count_nonzero(valid))
        bitmap = pa.array(valid).buffers()[1] if nulls else None
        small = offsets[-1] <= MAX_STRING_BYTES
        storage = pa.Array.from_buffers(
            pa.string() if small else pa.large_string(), len(rows),
            [bitmap, pa.py_buffer(offsets.astype(np.int32) if small else offsets), pa.py_buffer(joined)],
            null_count=nulls,
        )
        return _as_json(storage)

    @staticmethod
    def decode(array: pa.Array, dtype: np.dtype, row_shape: tuple[int, ...]) -> np.ndarray:
        _check(not row_shape, f"JSON columns are 1-D, got row shape {list(row_shape)}")
        storage = _json_storage(array)
        _check(
            array.type in (json_type(storage.type), storage.type) and storage.type in (pa.string(), pa.large_string()),
            f"expected JSON text (arrow.json over string or large_string), got {array.type}",
        )
        return load_json_column(storage)


class Pickle:
    """Anything else: ``large_binary``, one protocol-5 pickle per row (decoding needs ``allow_pickle``)."""

    kind = PICKLE
    dtype_kinds = "biufcMmUSOV"

    @staticmethod
    def encode(name: str, values: np.ndarray) -> pa.Array:
        try:
            rows = [pickle.dumps(row, protocol=5) for row in values]
        except Exception as exc:
            raise column_error(EncodeError, name, f"a row cannot be pickled: {exc}") from exc
        return pa.array(rows, type=pa.large_binary())

    @staticmethod
    def decode(array: pa.Array, dtype: np.dtype, row_shape: tuple[int, ...]) -> np.ndarray:
        _check(
            array.type in (pa.binary(), pa.large_binary()),
            f"expected binary pickled rows, got {array.type}",
        )
        _check(array.null_count == 0, "pickled columns cannot hold nulls")
        out = np.empty((len(array), *row_shape), dtype=dtype)
        for i, blob in enumerate(array.to_pylist()):
            row = pickle.loads(blob)
            if row_shape:  # N-D rows must match exactly: numpy would broadcast (1,) into (3,)
                _check(np.shape(row) == row_shape, f"row {i} has shape {np.shape(row)}")
            out[i] = row
        return out


_Kind = Union[type[Numeric], type[String], type[Object], type[Json], type[Pickle]]
_BY_DTYPE_KIND: dict[str, tuple[_Kind, ...]] = {
    **{dtype_kind: (kind,) for kind in (Numeric, String) for dtype_kind in kind.dtype_kinds},
    "O": (Object, Json),
}
"""numpy ``dtype.kind`` -> the kinds tried in order when encoding (Pickle is the fallback)."""
KINDS: dict[str, _Kind] = {kind.kind: kind for kind in (Numeric, String, Object, Json, Pickle)}
"""``adp.kind`` -> the kind's class."""


def encode_column(name: str, values: np.ndarray) -> tuple[pa.Array, dict[str, str]]:
    """Encode one ``non_tensor_batch`` array as an Arrow array with ``len(values)`` rows.

    Returns the array and its field metadata (``adp.kind``, ``adp.dtype``,
    ``adp.row_shape``; see the module docstring for the representation of each dtype).
    Numeric columns that are C-contiguous and native-endian are not copied: the Arrow
    array views ``values``' memory, so do not modify ``values`` while the array is in use.
    Other numeric layouts are copied once; string, object and pickled columns are built
    into new Arrow buffers.

    Raises:
        EncodeError: ``values`` is not a numpy array of at least one dimension, its dtype
            cannot be recorded as a string (numpy 2's ``StringDType``), or a row that needs
            pickling cannot be pickled.
    """
    if not isinstance(values, np.ndarray) or values.ndim == 0:
        got = "a 0-d array" if isinstance(values, np.ndarray) else type(values).__name__
        raise column_error(
            EncodeError, name, f"expected a numpy array with rows on dim 0, got {got}"
        )
    spec = ArraySpec(PICKLE, values.dtype, values.shape[1:])
    metadata = spec.metadata(name)  # EncodeError for a dtype that cannot be recorded
    for kind in _BY_DTYPE_KIND.get(values.dtype.kind, ()):
        array = kind.encode(name, values)
        if array is not None:
            return array, {**metadata, KIND: kind.kind}
    # every kind declined (a longdouble, objects neither Arrow nor JSON gives back): pickle
    return Pickle.encode(name, values), {**metadata, KIND: PICKLE}


def encode_as(name: str, values: np.ndarray, field: pa.Field) -> pa.Array | None:
    """``values`` (an object array) encoded the way an existing column ``field`` (one that
    :func:`encode_column` made, e.g. a file's) stores its rows: in its kind (``object``,
    ``json`` or ``pickle``) and its Arrow type. None when they would not come back exactly
    that way (another kind, a type that changes a value), or the kind is another.

    Raises:
        EncodeError: a row that needs pickling cannot be pickled.
    """
    kind, arrow_type = text_metadata(field.metadata).get(KIND), field.type
    if kind == PICKLE:
        return Pickle.encode(name, values)
    if values.ndim != 1:
        return None
    rows = values.tolist()
    if kind == OBJECT and _is_plain(arrow_type):
        try:
            array = pa.array(rows, type=arrow_type)
        except Exception:  # pa.array calls into arbitrary user objects
            return None
        return array if all(map(same, rows, array.to_pylist())) else None
    array = Json.encode_rows(rows) if kind == JSON else None
    if array is not None:
        try:
            storage = _json_storage(array).cast(getattr(arrow_type, "storage_type", arrow_type))
        except pa.ArrowException:  # more than 2 GiB of text for a string column
            return None
        return _as_json(storage)
    return None


def decode_column(
    name: str, array: pa.Array, metadata: Mapping[str, str], *, allow_pickle: bool
) -> np.ndarray:
    """Decode an array made by :func:`encode_column` (or a slice or chunk of one).

    Numeric columns come back zero-copy: a read-only numpy view of the Arrow buffers
    (big-endian dtypes are the exception: restored with a copy). String, object and
    pickled columns are copied into new numpy arrays; object columns come back as 1-D
    ``dtype=object`` arrays whose items are the row values (lists stay lists).

    Raises:
        PickleNotAllowedError: the column is pickled and ``allow_pickle`` is false.
        DecodeError: the metadata is missing or inconsistent, or the array does not match
            it (type, nulls, lengths, corrupt pickles).
    """
    kind_name = metadata.get(KIND)
    kind = KINDS.get(kind_name or "")
    if kind is None:
        error = DecodeError if kind_name is None or kind_name in TENSOR_KINDS else UnknownContentError
        raise column_error(error, name, f"missing or unknown {KIND}: {kind_name!r}")
    if kind is Pickle and not allow_pickle:
        raise column_error(PickleNotAllowedError, name, PICKLE_REFUSED)
    try:
        _check(isinstance(array, pa.Array), f"expected a pyarrow Array, got {type(array).__name__}")
        array.validate()  # buffer sizes match the lengths; cheap, no per-value scan
        spec = ArraySpec.parse(metadata)
        _check(spec.dtype.kind in kind.dtype_kinds, f"dtype {spec.dtype} cannot be stored as kind {kind_name!r}")
        return kind.decode(array, spec.dtype, spec.row_shape)
    except Exception as exc:  # pyarrow, numpy, json and unpickling errors of any type
        raise column_error(DecodeError, name, f"malformed {kind_name!r} column: {exc!r}") from exc
