"""Exact JSON: which values JSON gives back exactly, their compact texts, and the strict reader.

The ``json`` kind of object columns (:mod:`arrow_dataproto._objects`) stores one text per row
written by :func:`json_texts` and reads them with :func:`load_json_column`; ``meta_info``
(:mod:`arrow_dataproto._meta_info`) reads its JSON with :data:`JSON_DECODER`. Exact means
:func:`same`: equal values of identical types, so a round trip that turns a tuple into a list,
``1.0`` into ``1`` or merges a duplicate key does not count.

A value is JSON (:func:`_is_json`) when it is built only of ``None``, ``bool``, ``int`` in the
int64 range, finite ``float``, ``str``, ``list`` and ``dict`` with ``str`` keys, exact types,
at most :data:`JSON_MAX_DEPTH` deep, and no string holds a high then a low surrogate (JSON
reads the pair back as one character). Texts are written by orjson (UTF-8), or ASCII-escaped
by the stdlib encoder for a row holding a surrogate. Reading gives each row's value exactly or
raises ``ValueError``: orjson's value when it writes that value back as the very text stored,
else the strict reader (``NaN``/``Infinity``, a key twice in one object, a number beyond a
double or nonzero below its smallest are errors; ints exact at any size).
"""

from __future__ import annotations

import gc
import io
import itertools
import json
import operator
import re
from functools import partial
from typing import Any

import numpy as np
import orjson as _orjson
import pyarrow as pa

from ._compat import ascii_json_encoder


def same(a: Any, b: Any) -> bool:
    """Strict equality: equal values of identical types, recursing into lists, tuples and dicts.

    NaN equals NaN; dict keys are compared in order and strictly too.
    """
    t = type(a)
    if t is not type(b):
        return False
    if t is list or t is tuple:
        return len(a) == len(b) and all(map(same, a, b))
    if t is dict:
        keys_same = len(a) == len(b) and all(map(same, a, b))
        return keys_same and all(map(same, a.values(), b.values()))
    if t is float and a != a:
        return b != b
    return a == b


_not_none = partial(operator.is_not, None)
_NONE = type(None)


JSON_MAX_DEPTH = 200
"""Rows nested deeper than this (lists and dicts in lists and dicts) are pickled, not JSON."""
_INT64 = (-(2**63), 2**63 - 1)
JSON_TYPES = frozenset({type(None), bool, int, float, str, list, dict})
"""The exact types JSON values are built of (no subclass)."""
_DIGITS_AS_ZEROS = bytes(48 if chr(c).isdigit() and c < 128 else 32 for c in range(256))
"""A ``bytes.translate`` table: each ASCII digit to ``0``, every other byte to a space."""


def _has_long_digits(text: bytes) -> bool:
    """19 digits in a row: an int at the int64 bounds or beyond (orjson writes up to
    2**64 - 1). A table translation and a substring search, 10-20 times faster than the
    regular expression ``\\d{19}`` on text-heavy columns."""
    return text.translate(_DIGITS_AS_ZEROS).find(b"0" * 19) >= 0


def _is_json(value: Any, depth: int = JSON_MAX_DEPTH) -> bool:
    """Whether JSON gives ``value`` back exactly: built only of ``None``, ``bool``, ``int`` in
    the int64 range, finite ``float``, ``str``, ``list`` and ``dict`` with ``str`` keys, exact
    types (no subclass: ``IntEnum``, ``np.float64``, ``OrderedDict`` are not), at most
    :data:`JSON_MAX_DEPTH` containers deep (which also rules out cycles).

    The reference walk over every value, one at a time; :func:`json_texts` reaches the same
    verdict over a whole column at C speed and calls this only where its cheap checks cannot
    decide. Leaves are checked inline, containers recursively."""
    kind = type(value)
    if kind is dict:
        for key in value:
            if type(key) is not str:
                return False
        items: Any = value.values()
    elif kind is list:
        items = value
    else:
        return _is_json_leaf(value, kind)
    if depth == 0:
        return False
    low, high = _INT64
    for item in items:
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is dict or kind is list:
            if _is_json(item, depth - 1):
                continue
            return False
        if kind is int:
            if low <= item <= high:
                continue
            return False
        if kind is float and item - item == 0.0:  # finite (NaN and infinities give NaN)
            continue
        return False
    return True


def _is_json_leaf(value: Any, kind: type) -> bool:
    if kind is str or value is None or kind is bool:
        return True
    if kind is int:
        return _INT64[0] <= value <= _INT64[1]
    return kind is float and value - value == 0.0


def census(rows: list, types: frozenset[type], depth: int) -> tuple[set[type], int] | None:
    """Whether every value of ``rows`` is of one of ``types`` (exact types) and no row holds
    lists and dicts more than ``depth`` deep (a row that is a list: 1). One level of
    nesting at a time, through ``gc.get_referents`` (the items of lists, the values of
    dicts, and their keys only when one is not an exact ``str``, which is exactly when
    CPython's dict visits its keys): C speed, no recursion, and no other object is
    entered. Returns the types found (at any depth, the rows' own included) and, when
    ``float`` is among them, the number of ``None`` values inside the rows (JSON writes NaN
    and the infinities as ``null`` too), else 0; or None when a type or the depth rules the
    column out."""
    level, found, with_none = rows, set(), []
    for position in range(1, depth + 2):
        kinds = set(map(type, level))
        if not kinds <= types:
            return None
        found |= kinds
        if position > 1 and _NONE in kinds:
            with_none.append(level)  # counted only if a float turns up (exact builtin types: no user __eq__ runs)
        if list not in kinds and dict not in kinds:
            return found, sum(map(list.count, with_none, itertools.repeat(None))) if float in found else 0
        if position > depth:
            return None
        level = gc.get_referents(*level)  # the items of this level's containers (others have none)
    return None  # unreachable: the loop returns at position depth + 1


CHUNK_ROWS = 256
"""Rows :func:`json_texts` checks and writes, and :func:`load_json_column` reads and
verifies, at a time: few enough that one pass leaves a chunk's objects in the CPU cache
for the next (the census, then orjson; ``orjson.loads``, then ``orjson.dumps``)."""
_STRICT = _orjson.OPT_STRICT_INTEGER
"""orjson refuses ints beyond ``±(2**53 - 1)``: what it writes with it holds no int beyond int64."""
_SCALARS = frozenset({type(None), bool, int, float})
"""Rows of these types only have texts without a comma."""


def json_texts(rows: list) -> tuple[np.ndarray, bytes] | None:
    """The compact JSON texts (UTF-8) of the rows end to end, and where each row's text starts
    and ends in them (``len(rows) + 1`` int64 offsets; a ``None`` row is an empty text), or
    None when a row is not JSON (:func:`_is_json`).

    A chunk of :data:`CHUNK_ROWS` rows at a time: :func:`census` refuses every type but the
    exact JSON ones and the depth, then orjson writes the text; it refuses non-``str`` keys,
    ints beyond 64 bits and surrogates (then every row goes to :func:`_stdlib_texts`). What
    orjson would write inexactly is left: NaN/infinities (``null``) and ints in
    ``[2**63, 2**64)``. Where the census found a float, more ``null`` than ``None`` values in
    the text, and where orjson refused an int beyond 53 bits, 19 digits in a row in the text,
    send that chunk to the reference walk."""
    out, lengths = io.BytesIO(), []
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        found = census(chunk, JSON_TYPES, JSON_MAX_DEPTH)
        if found is None:
            return None
        kinds, nones = found
        present, scalars = list(filter(_not_none, chunk)), kinds <= _SCALARS
        begin, long_digits = out.tell(), False
        try:
            lengths.append(_write_all(present, out, _STRICT, scalars))
        except TypeError:  # orjson.JSONEncodeError: an int beyond 53 bits, or what it refuses below
            out.seek(begin)
            out.truncate()
            try:
                lengths.append(_write_all(present, out, 0, scalars))
            except TypeError:  # a non-str key, a huge int, a surrogate
                return _stdlib_texts(rows)
            long_digits = True
        if long_digits or float in kinds:
            with out.getbuffer() as written:
                text = bytes(written[begin:])
            suspect = (long_digits and _has_long_digits(text)) or (float in kinds and text.count(b"null") > nones)
            if suspect and not all(map(_is_json, chunk)):
                return None
    return _offsets(rows, lengths), out.getvalue()  # getvalue: no copy


def _write_all(rows: list, out: io.BytesIO, option: int, scalars: bool) -> np.ndarray:
    """Write orjson's text of each row to ``out``; their lengths.

    Each text is written and dropped at once: holding thousands of orjson's results alive
    (a list of them, then ``b"".join``) makes each further ``orjson.dumps`` slower, up to
    20 times (a fresh page of memory for each, costly on a virtual machine). Rows that are
    all numbers and booleans (``scalars``) are written in one call, as a list, and split at
    its commas: no such text holds one."""
    if scalars and rows:
        texts: Any = _orjson.dumps(rows, None, option)[1:-1].split(b",")
    else:
        texts = map(_orjson.dumps, rows, itertools.repeat(None), itertools.repeat(option))  # (value, default, option)
    return np.fromiter(map(out.write, texts), dtype=np.int64, count=len(rows))


def _offsets(rows: list, lengths: list[np.ndarray]) -> np.ndarray:
    """The ``len(rows) + 1`` offsets of the rows' texts end to end, from the lengths of the
    texts of the rows that are not ``None`` (in order, in pieces); a ``None`` row's is empty."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    present = np.concatenate(lengths) if lengths else offsets[:0]
    if len(present) == len(rows):
        np.cumsum(present, out=offsets[1:])
    else:
        full = np.zeros(len(rows), dtype=np.int64)
        full[np.fromiter(map(_not_none, rows), dtype=bool, count=len(rows))] = present
        np.cumsum(full, out=offsets[1:])
    return offsets


def _stdlib_texts(rows: list) -> tuple[np.ndarray, bytes] | None:
    """Where orjson refuses (a string holds a surrogate, which has no UTF-8; or a row is not
    JSON): the reference walk, then the stdlib encoder, ASCII-escaped (``\\uXXXX``). A string
    holding a high surrogate then a low one (a pair split into two code points) would read
    back as one character: not JSON. Returns what :func:`json_texts` does."""
    if not all(map(_is_json, rows)):
        return None
    texts = [b"" if row is None else _JSON_ASCII(row).encode() for row in rows]
    for row, text in zip(rows, texts):
        if row is not None and not same(row, JSON_DECODER.decode(text.decode())):
            return None
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=offsets[1:])
    return offsets, b"".join(texts)


_JSON_ASCII = ascii_json_encoder()
"""Compact, ASCII-escaped JSON text of a value :func:`_is_json` accepted (so no NaN, no cycles)."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key[:100]!r} in an object")
            seen.add(key)
    return out


_MANTISSA_DIGITS = re.compile(r"[1-9]")


def _exact_float(text: str) -> float:
    """A JSON number with a fraction or an exponent as a double, refusing one that no double
    holds: beyond the largest (``1e999``: it would be infinity) or a nonzero number so small
    it would be zero (``1e-400``)."""
    value = float(text)
    if value - value != 0.0:
        raise ValueError(f"the number {text[:100]} overflows a double")
    if value == 0.0 and _MANTISSA_DIGITS.search(text.lower().partition("e")[0]):
        raise ValueError(f"the number {text[:100]} underflows a double to zero")
    return value


JSON_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_exact_float, object_pairs_hook=_unique_keys)
"""The reference reader: strict JSON (no ``NaN``/``Infinity``), no duplicate keys, no number
a double cannot hold, ints exact at any size."""


def _load_json(text: bytes) -> Any:
    """One row's value from its JSON text, exactly or ``ValueError``: orjson's value when
    orjson writes it back as this very text (then no key was merged, no number rounded to
    infinity or zero, no escape misread: the text is the canonical form of that value), else
    the reference reader (:data:`JSON_DECODER`; whitespace around the value allowed)."""
    try:
        value = _orjson.loads(text)
        if _orjson.dumps(value) == text:
            return value
    except (TypeError, ValueError):  # orjson.JSONDecodeError, or a surrogate it cannot write
        pass
    return JSON_DECODER.decode(str(text, "utf-8"))


def _load_canonical(texts: list[bytes]) -> list | None:
    """What :func:`_load_json` gives for each text when every one is the canonical text of its
    value (orjson writes the value it reads back as that very text), else None.

    One ``orjson.dumps`` of all the values, compared with the texts joined the way it joins
    them (``[``, commas, ``]``), checks every row at once: a text orjson reads is one JSON
    value (only whitespace around it), and the written texts are compact values, so the
    joined texts split into comma-separated values in one way only, and the two joins are
    equal exactly when each written text equals its own row's."""
    try:
        values = list(map(_orjson.loads, texts))
        if _orjson.dumps(values) == b"[" + b",".join(texts) + b"]":
            return values
    except (TypeError, ValueError):  # orjson.JSONDecodeError, or a surrogate it cannot write
        pass
    return None


def load_json_column(storage: pa.Array) -> np.ndarray:
    """The rows of a string column of JSON texts (a null: ``None``), exactly.

    :data:`CHUNK_ROWS` rows at a time: orjson reads each row and writes the values back;
    when every written text is the stored one, the chunk's values are orjson's
    (:func:`_load_canonical`), else each row of the chunk is read alone (:func:`_load_json`;
    ``ValueError`` naming the first row that is not JSON)."""
    out = np.empty(len(storage), dtype=object)
    valid = storage if storage.null_count == 0 else storage.drop_null()
    texts = valid.view(pa.large_binary() if valid.type == pa.large_string() else pa.binary()).to_pylist()
    values: list = []
    for start in range(0, len(texts), CHUNK_ROWS):
        chunk = texts[start : start + CHUNK_ROWS]
        canonical = _load_canonical(chunk)
        if canonical is not None:
            values += canonical
            continue
        for i, text in enumerate(chunk, start):
            try:
                values.append(_load_json(text))
            except (ValueError, RecursionError) as exc:
                row = i if storage.null_count == 0 else int(np.flatnonzero(storage.is_valid())[i])
                raise ValueError(f"row {row} is not JSON: {exc}") from None
    filled = np.fromiter(values, dtype=object, count=len(values))
    if storage.null_count == 0:
        return filled
    out[np.asarray(storage.is_valid())] = filled
    return out
