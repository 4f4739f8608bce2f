"""The JSON tier of object columns (format 1.2, issue 10): exact round trips, the boundaries
where pickle takes over, hostile JSON columns, what other tools see, and how a FileWriter
unifies an object column whose later batches infer another Arrow type."""

from __future__ import annotations

import collections
import contextlib
import enum
import json
import math
import re

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrow_dataproto as adp
from arrow_dataproto import _objects, files
from arrow_dataproto import _json as _json_module
from arrow_dataproto._json import JSON_MAX_DEPTH, JSON_TYPES, _is_json, census, json_texts
from arrow_dataproto._objects import decode_column, encode_column
from arrow_dataproto.errors import DecodeError, SchemaMismatchError
from arrow_dataproto.testing import assert_dataproto_equal, strict_equal
from arrow_dataproto.testing.samples import verl_rollout

JSON_TYPE = pa.json_(pa.string())


def objects(*items) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def roundtrip(values: np.ndarray, expected_kind: str = "json") -> pa.Array:
    array, metadata = encode_column("col", values)
    assert metadata["adp.kind"] == expected_kind
    decoded = decode_column("col", array, metadata, allow_pickle=expected_kind == "pickle")
    assert decoded.dtype == object and decoded.shape == values.shape
    assert strict_equal(values, decoded)
    return array


# ---------------------------------------------------------------- the realistic verl columns

ROLLOUT = verl_rollout(rows=64, prompt=4, response=4, seed=5)
JSON_COLUMNS = ["extra_info", "tools_kwargs", "raw_prompt", "messages", "scores", "ground_truth", "multi_modal_data"]


@pytest.mark.parametrize("name", JSON_COLUMNS)
def test_realistic_verl_columns_take_the_json_tier(name):
    values = ROLLOUT[1][name]
    array = roundtrip(values)
    assert array.type == JSON_TYPE
    assert array.null_count == sum(v is None for v in values)  # a None row is an Arrow null
    for text, value in zip(array.storage.to_pylist(), values):
        if value is not None:
            assert json.loads(text) == value and " " not in text.replace(" ", "")  # plain compact JSON


def test_the_rollout_columns_vary_as_described():
    """Guards the sample: without this variety the columns would be native Arrow."""
    nt = ROLLOUT[1]
    assert len({tuple(d) for d in nt["extra_info"]}) > 1
    assert {} in list(nt["tools_kwargs"]) and any(nt["tools_kwargs"])
    assert {type(s) for s in nt["scores"]} == {float, int, type(None)}
    assert {type(s) for s in nt["ground_truth"]} == {str, int}
    assert any("tool_calls" in m for p in nt["raw_prompt"] for m in p)
    for name in ("uid", "data_source", "reward_model"):  # native Arrow still comes first
        assert encode_column(name, nt[name])[1]["adp.kind"] == "object"


def test_realistic_verl_batch_file_has_no_pickled_columns(tmp_path):
    dp = adp.DataProto(*verl_rollout(rows=32, prompt=4, response=4, seed=1))
    files.write_file(tmp_path / "rollout.arrow", dp.chunk(4))
    with files.open_file(tmp_path / "rollout.arrow") as reader:
        assert reader.pickled_columns == []
        kinds = {c.name: c.kind for c in reader.column_info()}
        assert {kinds[n] for n in JSON_COLUMNS} == {"json"}
        assert_dataproto_equal(dp, reader.read_all())  # allow_pickle=False
    assert_dataproto_equal(dp, adp.from_ipc(adp.to_ipc(dp)))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_json_values, max_size=6))
def test_any_json_values_come_back_exactly(rows):
    values = objects(*rows)
    array, metadata = encode_column("col", values)
    assert metadata["adp.kind"] in ("object", "json")  # never pickle
    assert strict_equal(values, decode_column("col", array, metadata, allow_pickle=False))


# ---------------------------------------------------------------- boundaries


class Color(enum.IntEnum):
    RED = 1


class Text(str):
    pass


class Point:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Point and other.x == self.x


def _cycle():
    row: list = [1]
    row.append(row)
    return row


def _nested(depth):
    row: list = []
    for _ in range(depth):
        row = [row]
    return row


NOT_JSON = {  # each column mixes types, so native Arrow is out too; one row is not JSON
    "tuple": objects({"a": 1}, (1, 2)),
    "nested_tuple": objects({"a": 1}, {"b": [1, (2,)]}),
    "bytes": objects("a", b"a"),
    "int_key": objects({"a": 1}, {1: "a"}),
    "none_key": objects({"a": 1}, {None: "a"}),
    "nan": objects(1, float("nan")),
    "inf_in_dict": objects({"a": 1}, {"b": math.inf}),
    "np_float64": objects("a", np.float64(1.5)),
    "np_int64": objects("a", np.int64(1)),
    "int_enum": objects("a", Color.RED),
    "str_subclass": objects(1, Text("a")),
    "ordered_dict": objects(1, collections.OrderedDict(a=1)),
    "set": objects(1, {1, 2}),
    "custom": objects(1, Point(2)),
    "beyond_int64": objects("a", 2**63),
    "too_deep": objects(1, _nested(JSON_MAX_DEPTH)),  # JSON_MAX_DEPTH + 1 lists
}


@pytest.mark.parametrize("values", NOT_JSON.values(), ids=NOT_JSON.keys())
def test_what_json_cannot_carry_is_pickled(values):
    array, metadata = encode_column("col", values)
    assert metadata["adp.kind"] == "pickle"
    decoded = decode_column("col", array, metadata, allow_pickle=True)
    for a, b in zip(values, decoded):
        assert type(a) is type(b) and (a == b or a != a)


def test_a_cycle_is_pickled_not_a_hang():
    array, metadata = encode_column("col", objects(1, _cycle()))
    assert metadata["adp.kind"] == "pickle"


def test_deepest_json_row_still_json():
    roundtrip(objects(1, _nested(JSON_MAX_DEPTH - 1)))  # JSON_MAX_DEPTH lists


def test_none_rows_empty_and_all_none_columns():
    array = roundtrip(objects(None, {"a": 1}, None, [None]))
    assert array.null_count == 2 and array.storage.to_pylist()[3] == "[null]"
    roundtrip(objects(), "object")  # no rows, all None: native null columns as before
    roundtrip(objects(None, None), "object")


def test_text_is_utf8_not_escaped_unless_a_surrogate_forces_it():
    array = roundtrip(objects("héllo 几 🎲", 1))
    assert array.storage.to_pylist()[0] == '"héllo 几 🎲"'
    escaped = roundtrip(objects("lone \ud800", 1, "é"))  # no UTF-8 for a lone surrogate
    assert escaped.storage.to_pylist() == ['"lone \\ud800"', "1", '"\\u00e9"']


def test_large_column_uses_large_string_storage(monkeypatch):
    monkeypatch.setattr(_objects, "MAX_STRING_BYTES", 10)
    values = objects({"a": "x" * 8}, 1, None)
    array = roundtrip(values)
    assert array.type == pa.json_(pa.large_string())
    small = roundtrip(objects(1, "a"))
    assert small.type == JSON_TYPE  # 4 bytes of text


def test_without_pa_json_the_column_is_plain_utf8(monkeypatch):
    """pyarrow < 19 has no ``pa.json_``: the column is its string storage, still kind json."""
    monkeypatch.setattr(_objects, "_JSON_TYPE", None)
    array = roundtrip(objects({"a": 1}, [2]))
    assert array.type == pa.string()


def test_a_sliced_json_column_decodes_its_rows():
    values = objects({"a": 1}, None, [1.5], "x", {"b": {}})
    array, metadata = encode_column("col", values)
    assert strict_equal(values[1:4], decode_column("col", array.slice(1, 3), metadata, allow_pickle=False))


# ---------------------------------------------------------------- hostile JSON columns

META = {"adp.kind": "json", "adp.dtype": "|O", "adp.row_shape": "[]"}


def _json(texts, storage=pa.string()):
    return pa.ExtensionArray.from_storage(pa.json_(storage), pa.array(texts, storage))


HOSTILE = {
    "invalid_json": (_json(['{"a": 1}', "{not json"]), META),
    "trailing_garbage": (_json(["[1] x"]), META),
    "nan_literal": (_json(["NaN"]), META),
    "infinity_in_list": (_json(["[1, -Infinity]"]), META),
    "empty_text": (_json([""]), META),
    "int_storage": (pa.array([1, 2]), META),
    "binary_storage": (pa.array([b"1"]), META),
    "json_over_large_binary_like": (pa.array([[1]]), META),
    "row_shape": (_json(["1"]), {**META, "adp.row_shape": "[1]"}),
    "numeric_dtype": (_json(["1"]), {**META, "adp.dtype": "<i8"}),
    "too_deep": (_json(["[" * 100_000 + "]" * 100_000]), META),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_json_columns_are_decode_errors(case):
    array, metadata = HOSTILE[case]
    with pytest.raises(DecodeError, match="'evil'"):
        decode_column("evil", array, metadata, allow_pickle=True)


def test_json_from_other_writers_with_whitespace_and_plain_strings():
    expected = objects({"a": [1, 2]}, None, 3.0)
    for array in (_json([' { "a" : [1, 2] } ', None, "3.0\n"]), pa.array(['{"a":[1,2]}', None, "3.0"], pa.large_string())):
        assert strict_equal(expected, decode_column("c", array, META, allow_pickle=False))


# ---------------------------------------------------------------- what other tools see


def test_other_tools_show_json_columns_as_json_text(tmp_path):
    pl = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    dp = adp.DataProto(*verl_rollout(rows=8, prompt=3, response=3, seed=2))
    files.write_file(tmp_path / "r.arrow", dp)
    rollout = pa.ipc.open_file(tmp_path / "r.arrow").read_all().select(["extra_info", "scores"])
    first = dp.non_tensor_batch["extra_info"][0]
    assert json.loads(rollout.to_pandas()["extra_info"][0]) == first  # pandas: the JSON text
    frame = pl.read_ipc(tmp_path / "r.arrow", columns=["extra_info"])
    assert json.loads(frame["extra_info"][0]) == first  # polars: strings
    rows = duckdb.sql("select typeof(extra_info), extra_info->>'$.split' from rollout").fetchall()
    assert rows[0] == ("JSON", first["split"])  # DuckDB: JSON it queries


# ---------------------------------------------------------------- FileWriter: schema evolution


def _dp(**columns) -> adp.DataProto:
    return adp.DataProto(None, {k: objects(*v) for k, v in columns.items()}, {})


def _write(path, *batches, **options):
    with files.FileWriter(path, **options) as writer:
        for b in batches:
            writer.write(b)
    return files.open_file(path, **({"verify": True} if options.get("checksums") else {}))


def _field(reader, name):
    return reader.schema.field(name)


def test_batch_values_encoded_in_the_files_wider_type(tmp_path):
    a = _dp(x=[{"a": "s", "b": 1}, {"a": "t", "b": 2}])
    b = _dp(x=[{"a": "u", "b": None}])  # infers struct<a: string, b: null>
    with _write(tmp_path / "f.arrow", a, b) as reader:
        assert _field(reader, "x").type == pa.struct([("a", pa.string()), ("b", pa.int64())])
        assert_dataproto_equal(adp.DataProto.concat([a, b]), reader.read_all())


def test_native_column_widens_to_the_batches_type_rewriting_what_was_written(tmp_path):
    a = _dp(x=[{"image": ["u1"], "video": None}, None])  # struct<image: list<string>, video: null>
    b = _dp(x=[{"image": [], "video": ["v1"]}, {"image": ["u2"], "video": None}])
    with _write(tmp_path / "f.arrow", a, b, a, compression="zstd", checksums=True) as reader:
        assert reader.column_info()[0].kind == "object"
        assert _field(reader, "x").type.field("video").type == pa.list_(pa.string())
        assert reader.num_batches == 3
        assert_dataproto_equal(adp.DataProto.concat([a, b, a]), reader.read_all())


def test_native_column_promoted_to_json_rewriting_what_was_written(tmp_path):
    a = _dp(x=[{"a": 1}, {"a": 2}], y=["s", "t"], n=[1, 2])
    b = _dp(x=[{"b": "other keys"}, {"a": 3}], y=["u", "v"], n=[3, 4.5])
    c = _dp(x=[None, {"c": [1, {"d": None}]}], y=["w", "x"], n=[6, None])
    with _write(tmp_path / "f.arrow", a, b, c, checksums=True) as reader:
        kinds = {c.name: c.kind for c in reader.column_info()}
        assert kinds == {"x": "json", "y": "object", "n": "json"}
        assert _field(reader, "x").type == JSON_TYPE
        assert reader.pickled_columns == []
        assert_dataproto_equal(adp.DataProto.concat([a, b, c]), reader.read_all())


def test_json_column_stays_json(tmp_path):
    a = _dp(x=[1, "a"])  # json
    b = _dp(x=[{"k": 1}, {"k": 2}])  # native struct on its own
    c = _dp(x=[None, None])  # all None
    with _write(tmp_path / "f.arrow", a, b, c) as reader:
        assert reader.column_info()[0].kind == "json"
        assert_dataproto_equal(adp.DataProto.concat([a, b, c]), reader.read_all())


def test_pickled_column_stays_pickled(tmp_path):
    a = _dp(x=[(1, 2), b"raw image bytes"])  # pickle
    b = _dp(x=[{"k": 1}, "text"])  # json on its own
    c = _dp(x=["a", "b"])  # native on its own
    with _write(tmp_path / "f.arrow", a, b, c) as reader:
        assert reader.pickled_columns == ["x"]
        assert_dataproto_equal(adp.DataProto.concat([a, b, c]), files.read_file(tmp_path / "f.arrow", allow_pickle=True))


REFUSED = {
    "native_then_pickle": (_dp(x=["a", "b"]), _dp(x=[(1,), "b"]), "allow_pickle"),
    "json_then_pickle": (_dp(x=[1, "a"]), _dp(x=[b"raw", "b"]), "allow_pickle"),
    "json_then_nan": (_dp(x=[1, "a"]), _dp(x=[float("nan"), 1.0]), "allow_pickle"),
    "old_values_not_json": (_dp(x=[b"raw", b"x"]), _dp(x=["a", 1]), "neither"),
    "numeric_dtype": (adp.DataProto(None, {"x": np.arange(2)}, {}), adp.DataProto(None, {"x": np.arange(2.0)}, {}), "adp.dtype"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_refused_unifications_leave_the_writer_usable(tmp_path, case):
    first, second, message = REFUSED[case]
    with files.FileWriter(tmp_path / "f.arrow") as writer:
        writer.write(first)
        with pytest.raises(SchemaMismatchError, match=message):
            writer.write(second)
        writer.write(first)
    assert_dataproto_equal(adp.DataProto.concat([first, first]), files.read_file(tmp_path / "f.arrow"))


def test_pandas_round_trip_keeps_json_columns():
    from arrow_dataproto.pandas import from_pandas, to_pandas

    dp = adp.DataProto(*verl_rollout(rows=8, prompt=3, response=3, seed=4))
    df = to_pandas(dp)
    assert df["extra_info"][0] == dp.non_tensor_batch["extra_info"][0]  # cells are the values (dicts)
    back = from_pandas(df)
    assert_dataproto_equal(dp, back)
    assert adp.to_arrow(back).schema.field("scores").type == JSON_TYPE


# ---------------------------------------------------------------- the fast exactness checks (issue 21)
# orjson writes the text and a type census over gc.get_referents replaces the per-value walk:
# they must accept exactly the columns the reference walk (_json._is_json) accepts.

_near_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=4)
    | st.sampled_from([Color.RED, Text("s"), np.float64(1.5), (1,), b"x", "\ud800", "\ud83d\ude00", 2**63, -(2**63)]),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner)
    | st.dictionaries(st.text(max_size=2) | st.sampled_from([Text("k"), 1, None]), inner, max_size=3),
    max_leaves=8,
)


def _split_pair(value) -> bool:
    """A str holding a high surrogate then a low one (JSON reads that back as one character)."""
    if isinstance(value, str):
        return re.search("[\ud800-\udbff][\udc00-\udfff]", value) is not None
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (list, tuple)) and any(map(_split_pair, value))


@settings(max_examples=300, deadline=None)
@given(st.lists(_near_json, max_size=5))
def test_fast_check_agrees_with_the_reference_walk(rows):
    expected = all(map(_is_json, rows)) and not _split_pair(rows)
    assert (json_texts(rows) is not None) == expected


@pytest.mark.parametrize("depth", [JSON_MAX_DEPTH - 1, JSON_MAX_DEPTH, 5000])
def test_fast_check_keeps_the_depth_limit(depth):
    rows = [_nested(depth), {"a": _nested(depth - 1)}]  # depth + 1 containers each
    assert (json_texts(rows) is not None) == (depth < JSON_MAX_DEPTH)


def test_json_decode_fast_path_and_per_row_path_agree():
    values = objects({"a": [1, 2.5, None]}, None, "x", 1e16, {"b": {"c": -0.0}}, [], {})
    array, metadata = encode_column("col", values)
    texts = array.storage.to_pylist()
    assert strict_equal(values, decode_column("col", array, metadata, allow_pickle=False))
    respaced = _json([None if t is None else t.replace(":", ": ") for t in texts])  # each row on the slow path
    assert strict_equal(values, decode_column("col", respaced, META, allow_pickle=False))


# ---------------------------------------------------------------- chunk by chunk (issue 21)
# json_texts and load_json_column take CHUNK_ROWS rows at a time: with chunks of 2 rows the
# verdicts and the texts must be those of one pass over the whole column.


@contextlib.contextmanager
def _chunks_of(n):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_json_module, "CHUNK_ROWS", n)
        yield


def _texts(rows):
    """The texts json_texts writes for rows (None: not JSON), one row after another."""
    written = json_texts(rows)
    if written is None:
        return None
    offsets, joined = written
    assert offsets[0] == 0 and offsets[-1] == len(joined) and (np.diff(offsets) >= 0).all()
    return [bytes(joined[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]


@settings(max_examples=300, deadline=None)
@given(st.lists(_near_json, max_size=7))
def test_chunk_by_chunk_agrees_with_the_reference_walk_and_writes_the_same_texts(rows):
    expected = all(map(_is_json, rows)) and not _split_pair(rows)
    whole = _texts(rows)
    with _chunks_of(2):
        chunked = _texts(rows)
    assert (chunked is not None) == expected and chunked == whole
    if expected:
        try:
            texts = [b"" if row is None else orjson.dumps(row) for row in rows]
        except TypeError:  # a surrogate: every row escaped by the stdlib encoder
            texts = [b"" if row is None else json.dumps(row, separators=(",", ":")).encode() for row in rows]
        assert chunked == texts


LATE = {  # in the third chunk of two rows, after four rows that are JSON
    "nan": (float("nan"), False),
    "infinity_in_dict": ({"a": float("-inf")}, False),
    "uint64": ([2**63], False),
    "int64_beyond_53_bits": ({"a": 2**63 - 1, "b": -(2**63)}, True),
    "nan_beside_an_int_beyond_53_bits": ([2**54, float("nan")], False),  # 17 digits: no 19-digit trace
    "float_beside_an_int_beyond_53_bits": ([2**60, 0.5], True),
    "tuple": ({"a": (1,)}, False),
    "int_key": ({1: 2}, False),
    "surrogate": ("lone \ud800", True),
    "split_pair": ("\ud83d\ude00", False),
    "null_text_and_a_float": ({"a": "null", "b": 1.5}, True),
    "digits_in_text": ("1234567890123456789012", True),
}


@pytest.mark.parametrize("case", LATE, ids=list(LATE))
def test_chunk_by_chunk_what_a_late_chunk_holds_decides(case):
    value, is_json = LATE[case]
    values = objects({"a": 1.5}, None, [1, None], "é", value, None)
    with _chunks_of(2):
        array, metadata = encode_column("col", values)
        assert metadata["adp.kind"] == ("json" if is_json else "pickle")
        decoded = decode_column("col", array, metadata, allow_pickle=True)
    assert strict_equal(values, decoded)
    if case == "surrogate":  # the escaped texts of every row, the first chunks' too
        assert array.storage.to_pylist()[:4] == ['{"a":1.5}', None, "[1,null]", '"\\u00e9"']


def test_census_counts_nones_only_when_a_float_may_be_written_as_null():
    assert census([[None, "a"], {"b": None}], JSON_TYPES, JSON_MAX_DEPTH) == ({list, dict, str, type(None)}, 0)
    assert census([[None, 1.5], {"b": None}, None], JSON_TYPES, JSON_MAX_DEPTH) == ({list, dict, float, type(None)}, 2)
    assert census([[(1,)]], JSON_TYPES, JSON_MAX_DEPTH) is None


def test_chunk_by_chunk_decode_reads_each_chunk_the_way_its_texts_ask():
    texts = ['{"a":1}', None, "[1,2]", '{"b": 2.5}', '"x"', "1e2", None, "[]"]  # rows 3 and 5 not canonical
    expected = objects({"a": 1}, None, [1, 2], {"b": 2.5}, "x", 100.0, None, [])
    with _chunks_of(2):
        assert strict_equal(expected, decode_column("col", _json(texts), META, allow_pickle=False))
        with pytest.raises(DecodeError, match="row 7 is not JSON"):  # the row of the column, nulls counted
            decode_column("col", _json([*texts[:6], None, '{"a":1,"a":2}']), META, allow_pickle=False)
        with pytest.raises(DecodeError, match="row 2 is not JSON"):  # of the column, not of the slice
            decode_column("col", _json(["1", "2", "3", "NaN", "5"]).slice(1), META, allow_pickle=False)


@pytest.mark.parametrize(
    "texts, expected",
    [
        (["1,2", "[3", "4]"], "row 0 is not JSON"),  # joined with commas, "[1,2,[3,4]]": three values, other rows
        (['{"a":1', '"b":2}'], "row 0 is not JSON"),
        (["1 ", " 2", "[3 ,4]"], [1, 2, [3, 4]]),  # whitespace beside the commas of the join: read row by row
        (['"a,b"', '"c"'], ["a,b", "c"]),
    ],
)
def test_a_chunk_is_checked_row_by_row_not_as_one_text(texts, expected):
    array = _json(texts)
    if isinstance(expected, str):
        with pytest.raises(DecodeError, match=expected):
            decode_column("col", array, META, allow_pickle=False)
    else:
        assert strict_equal(objects(*expected), decode_column("col", array, META, allow_pickle=False))


def test_chunks_of_numbers_written_in_one_call_give_each_row_its_text():
    rows = [1, -0.0, 1e16, 5e-324, True, False, None, 2**53 - 1, 2**53, -(2**63), 2**63 - 1, 1.5, -7]
    for size in (2, 3, 256):
        with _chunks_of(size):
            assert _texts(rows) == [b"" if row is None else orjson.dumps(row) for row in rows]
            assert _texts([*rows, float("nan")]) is None and _texts([*rows, 2**63]) is None
            assert _texts([None, None]) == [b"", b""]
