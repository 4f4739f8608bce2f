"""Any Arrow table back into a DataProto (issue 10, part 2).

Our own tables after another tool filtered, took from, sliced, concatenated or re-chunked
them (the batch size is the rows present, the column metadata still applies); tables and
files of pandas, polars, DuckDB, HF datasets and Ray Data (the rule of
``arrow_dataproto/_foreign.py``, ``docs/format.md`` "Reading tables of other tools"), row
by row of the rule; every impossible case names the column; IPC stream files through the
file readers.
"""

from __future__ import annotations

import datetime
import decimal
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import DecodeError, files
from arrow_dataproto.testing import assert_dataproto_equal, assert_tensor_equal, sample_dataproto


def _table(dp) -> pa.Table:
    return pa.Table.from_batches([adp.to_arrow(dp)])


def _rows(dp, index) -> adp.DataProto:
    """``dp``'s rows ``index`` (meta_info kept), the expected decode of a filtered table."""
    return dp[np.asarray(index, dtype=np.int64)]


def _scored(rows: int = 12) -> adp.DataProto:
    dp = sample_dataproto(rows=rows)
    dp.batch["score"] = torch.arange(rows, dtype=torch.float32) / rows
    return dp


def _write_ipc(path, table: pa.Table, *, stream: bool = False, **options) -> None:
    new = pa.ipc.new_stream if stream else pa.ipc.new_file
    with new(str(path), table.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        writer.write_table(table)


# ---------------------------------------------------------------- our own tables, changed by other tools


def test_filter_take_slice_concat_and_rechunk_of_our_table():
    dp = _scored()
    table = _table(dp)
    mask = [i % 3 != 1 for i in range(len(dp))]
    kept = [i for i, keep in enumerate(mask) if keep]
    assert_dataproto_equal(adp.from_arrow(table.filter(pa.array(mask))), _rows(dp, kept))
    assert_dataproto_equal(adp.from_arrow(table.take([7, 1, 1, 11, 0])), _rows(dp, [7, 1, 1, 11, 0]))
    assert_dataproto_equal(adp.from_arrow(table.slice(3, 5)), _rows(dp, range(3, 8)))
    assert_dataproto_equal(adp.from_arrow(table.slice(4, 0)), _rows(dp, []))
    both = pa.concat_tables([table, table.slice(2, 3)])
    assert both.column(0).num_chunks == 2
    assert_dataproto_equal(adp.from_arrow(both), _rows(dp, [*range(12), 2, 3, 4]))
    rechunked = pa.Table.from_batches(table.to_batches(max_chunksize=5))
    assert_dataproto_equal(adp.from_arrow(rechunked), dp)
    assert_dataproto_equal(adp.from_arrow(rechunked.to_batches()[1]), _rows(dp, range(5, 10)))
    assert_dataproto_equal(adp.from_arrow(pa.RecordBatchReader.from_batches(table.schema, table.to_batches(3))), dp)


def test_a_table_of_one_chunk_per_column_is_read_zero_copy():
    dp = _scored()
    table = _table(dp)
    out = adp.from_arrow(table)
    column = table.column("score").chunk(0)
    assert out.batch["score"].data_ptr() == column.buffers()[1].address


def test_the_batch_size_of_nested_tensordicts_follows_the_rows_and_field_metadata_still_applies():
    rows = 10
    td = TensorDict(
        {
            "bf": torch.randn(rows, 4).bfloat16(),
            "grid": TensorDict({"x": torch.randn(rows, 3, 2)}, batch_size=[rows, 3]),
            "flag": torch.rand(rows) > 0.5,
        },
        batch_size=[rows],
    )
    dp = adp.DataProto(td, {"name": np.array([f"r{i}" for i in range(rows)], dtype=object)}, {"k": 1})
    kept = [i for i in range(rows) if bool(td["flag"][i])]
    out = adp.from_arrow(_table(dp).filter(pa.array(td["flag"].numpy())))
    assert_dataproto_equal(out, _rows(dp, kept))
    assert out.batch["grid"].batch_size == torch.Size([len(kept), 3])
    assert out.batch["bf"].dtype == torch.bfloat16


def test_nested_batch_dimensions_other_than_the_first_must_still_fit_the_data():
    td = TensorDict({"grid": TensorDict({"x": torch.zeros(4, 3, 2)}, batch_size=[4, 3])}, batch_size=[4])
    batch = adp.to_arrow(adp.DataProto(td))
    tree = json.loads(batch.schema.metadata[b"adp.tree"])
    tree[0][1] = [4, 2]  # the nested TensorDict's second dimension no longer fits x
    bad = batch.replace_schema_metadata({**batch.schema.metadata, b"adp.tree": json.dumps(tree).encode()})
    with pytest.raises(DecodeError, match="batch_size"):
        adp.from_arrow(bad)


def test_jagged_columns_after_filter_and_take_keep_their_rows_and_shared_offsets():
    lengths = [3, 1, 4, 1, 5, 9, 2, 6]
    a = torch.nested.nested_tensor([torch.arange(n, dtype=torch.float32) for n in lengths], layout=torch.jagged)
    b = a * 2  # shares a's offsets: adp.offsets_of
    dp = adp.DataProto(TensorDict({"a": a, "b": b}, batch_size=[len(lengths)]))
    table = _table(dp)
    assert table.schema.field("b").metadata[b"adp.offsets_of"] == b"a"
    for changed, index in [
        (table.slice(2, 4), [2, 3, 4, 5]),  # offsets that do not start at 0
        (table.filter(pa.array([n > 2 for n in lengths])), [0, 2, 4, 5, 7]),
        (table.take([5, 0, 5]), [5, 0, 5]),
    ]:
        out = adp.from_arrow(changed)
        assert_dataproto_equal(out, _rows(dp, index))
        assert out.batch["b"].offsets() is out.batch["a"].offsets()
        assert (out.batch["a"] * out.batch["b"]).is_nested  # combine as they did when encoded


def test_fixed_shape_tensor_and_mrope_jagged_after_take():
    dp = sample_dataproto(rows=9)
    out = adp.from_arrow(_table(dp).take([8, 0, 4]))
    assert_dataproto_equal(out, _rows(dp, [8, 0, 4]))
    assert out.batch["position_ids_mrope"].shape[:2] == (3, 3)


def test_a_file_we_wrote_filtered_through_pyarrow_dataset(tmp_path):
    ds = pytest.importorskip("pyarrow.dataset", reason="pyarrow was built without datasets")
    dp = _scored(12)
    files.write_file(tmp_path / "r.arrow", [dp[:7], dp[7:]])
    dataset = ds.dataset(str(tmp_path / "r.arrow"), format="ipc")
    table = dataset.to_table(filter=pc.field("score") >= 0.4)
    kept = [i for i in range(12) if i / 12 >= 0.4]
    assert table.num_rows == len(kept) and table.column(0).num_chunks == 2
    assert_dataproto_equal(adp.from_arrow(table), _rows(dp, kept))
    picked = dataset.to_table(columns=["score", "uid"], filter=pc.field("score") < 0.2)
    out = adp.from_arrow(picked)
    assert list(out.batch.keys()) == ["score"] and list(out.non_tensor_batch) == ["uid"]
    assert out.non_tensor_batch["uid"].tolist() == dp.non_tensor_batch["uid"][:3].tolist()


# ---------------------------------------------------------------- the rule, row by row


def test_numeric_scalars_become_1d_tensors_of_their_dtype():
    columns = {
        "i8": pa.array([-1, 2], pa.int8()), "i16": pa.array([-3, 4], pa.int16()),
        "i32": pa.array([5, -6], pa.int32()), "i64": pa.array([2**40, -7], pa.int64()),
        "u8": pa.array([255, 0], pa.uint8()), "u16": pa.array([65535, 1], pa.uint16()),
        "u32": pa.array([2**32 - 1, 2], pa.uint32()), "u64": pa.array([2**64 - 1, 3], pa.uint64()),
        "f16": pa.array(np.array([1.5, -0.25], np.float16)), "f32": pa.array([0.1, 2.5], pa.float32()),
        "f64": pa.array([float("nan"), -1e300]), "b": pa.array([True, False]),
        "b8": pa.array([1, 0], pa.int8()).cast(pa.bool8()),
    }
    out = adp.from_arrow(pa.table(columns))
    assert list(out.batch.keys()) == list(columns) and out.non_tensor_batch == {} and out.meta_info == {}
    for name, array in columns.items():
        tensor = out.batch[name]
        assert tensor.shape == (2,)
        expected = np.asarray(array.to_numpy(zero_copy_only=False)) if name != "b8" else np.array([True, False])
        assert_tensor_equal(tensor, torch.from_numpy(np.array(expected)))
    assert out.batch["b"].dtype == torch.bool and out.batch["b8"].dtype == torch.bool


def test_fixed_size_lists_and_fixed_shape_tensors_become_dense_tensors():
    values = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    nested = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 3), 2)
    tensor = pa.FixedShapeTensorArray.from_numpy_ndarray(values.astype(np.int16))
    permuted_type = pa.fixed_shape_tensor(pa.float64(), [2, 3], permutation=[1, 0])
    permuted = pa.ExtensionArray.from_storage(
        permuted_type, pa.FixedSizeListArray.from_arrays(pa.array(np.arange(24, dtype=np.float64)), 6)
    )
    bits = pa.FixedSizeListArray.from_arrays(pa.array([True, False] * 4), 2)
    out = adp.from_arrow(pa.table({"nested": nested, "tensor": tensor, "permuted": permuted, "bits": bits}))
    assert_tensor_equal(out.batch["nested"], torch.from_numpy(values))
    assert_tensor_equal(out.batch["tensor"], torch.from_numpy(values.astype(np.int16)))
    assert_tensor_equal(out.batch["permuted"], torch.from_numpy(np.ascontiguousarray(permuted.to_numpy_ndarray())))
    assert_tensor_equal(out.batch["bits"], torch.tensor([[True, False]] * 4))
    sliced = adp.from_arrow(pa.table({"nested": nested}).slice(1, 2))
    assert_tensor_equal(sliced.batch["nested"], torch.from_numpy(values[1:3]))


def test_lists_of_one_length_become_dense_tensors():
    rows = [[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]]]
    table = pa.table({
        "list": pa.array([[1, 2, 3], [4, 5, 6]]),
        "large": pa.array([[1, 2], [3, 4]], pa.large_list(pa.int32())),
        "view": pa.array([[1, 2], [3, 4]], pa.list_view(pa.int64())),
        "deep": pa.array(rows, pa.list_(pa.list_(pa.float32()))),
    })
    out = adp.from_arrow(table)
    assert_tensor_equal(out.batch["list"], torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert_tensor_equal(out.batch["large"], torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    assert_tensor_equal(out.batch["view"], torch.tensor([[1, 2], [3, 4]]))
    assert_tensor_equal(out.batch["deep"], torch.tensor(rows))


def test_numeric_lists_of_varying_length_become_jagged():
    table = pa.table({
        "list": pa.array([[1, 2, 3], [], [4]], pa.list_(pa.int16())),
        "view": pa.array([[1.5], [2.5, 3.5], []], pa.large_list_view(pa.float64())),
        "rows_of_pairs": pa.array([[[1, 2]], [[3, 4], [5, 6]], []], pa.list_(pa.list_(pa.uint8(), 2))),
        "bools": pa.array([[True], [False, True], []]),
    })
    out = adp.from_arrow(table.slice(0, 3))
    for name, expected in [
        ("list", [torch.tensor([1, 2, 3], dtype=torch.int16), torch.tensor([], dtype=torch.int16), torch.tensor([4], dtype=torch.int16)]),
        ("view", [torch.tensor([1.5], dtype=torch.float64), torch.tensor([2.5, 3.5], dtype=torch.float64), torch.tensor([], dtype=torch.float64)]),
        ("rows_of_pairs", [torch.tensor([[1, 2]], dtype=torch.uint8), torch.tensor([[3, 4], [5, 6]], dtype=torch.uint8), torch.zeros(0, 2, dtype=torch.uint8)]),
        ("bools", [torch.tensor([True]), torch.tensor([False, True]), torch.tensor([], dtype=torch.bool)]),
    ]:
        tensor = out.batch[name]
        assert tensor.is_nested and tensor.layout == torch.jagged, name
        for row, want in zip(tensor.unbind(), expected):
            assert_tensor_equal(row, want.to(row.dtype) if want.numel() == 0 else want, name)
    later = adp.from_arrow(table.slice(1, 2))  # a slice: offsets that do not start at 0
    assert [r.tolist() for r in later.batch["list"].unbind()] == [[], [4]]


def test_other_columns_go_to_non_tensor_batch_as_python_values():
    json_type = pa.json_(pa.string())
    stamp = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)
    table = pa.table({
        "n": pa.array([1, 2, 3]),
        "s": pa.array(["a", None, "ç"], pa.string_view()),
        "ls": pa.array(["x", "y", "z"], pa.large_string()),
        "bin": pa.array([b"\x00", b"", None], pa.binary()),
        "st": pa.array([{"a": 1, "b": "x"}, None, {"a": 3, "b": None}]),
        "strs": pa.array([["a"], [], None]),
        "ragged2": pa.array([[[1], [2, 3]], [[4]], []]),
        "json": pa.array(['{"k": [1, 2.5, null]}', None, '"text"'], json_type),
        "cat": pa.array(["u", "v", "u"]).dictionary_encode(),
        "ts": pa.array([stamp, None, stamp], pa.timestamp("us", tz="Europe/Paris")),
        "day": pa.array([datetime.date(2024, 1, 2), None, datetime.date(1999, 12, 31)]),
        "dur": pa.array([5, None, -1], pa.duration("ms")),
        "dec": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-3.00")]),
        "map": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        "tod": pa.array([datetime.time(1, 2), None, datetime.time(23, 59)]),
    })
    out = adp.from_arrow(table)
    assert list(out.batch.keys()) == ["n"]
    assert list(out.non_tensor_batch) == [n for n in table.column_names if n != "n"]  # table order
    got = {k: v.tolist() for k, v in out.non_tensor_batch.items()}
    assert got["s"] == ["a", None, "ç"] and got["ls"] == ["x", "y", "z"]
    assert got["bin"] == [b"\x00", b"", None]
    assert got["st"] == [{"a": 1, "b": "x"}, None, {"a": 3, "b": None}]
    assert got["strs"] == [["a"], [], None]
    assert got["ragged2"] == [[[1], [2, 3]], [[4]], []]
    assert got["json"] == [{"k": [1, 2.5, None]}, None, "text"]
    assert got["cat"] == ["u", "v", "u"]
    assert got["dec"] == [decimal.Decimal("1.25"), None, decimal.Decimal("-3.00")]
    assert got["map"] == [{"k": 1}, {}, None]
    assert got["tod"] == [datetime.time(1, 2), None, datetime.time(23, 59)]
    ts = out.non_tensor_batch["ts"]
    assert ts.dtype == np.dtype("datetime64[us]") and np.isnat(ts[1])
    assert ts[0] == np.datetime64("2024-05-01T12:30:00", "us")  # UTC
    assert out.non_tensor_batch["day"].dtype == np.dtype("datetime64[D]")
    assert out.non_tensor_batch["dur"].dtype == np.dtype("timedelta64[ms]")
    assert out.non_tensor_batch["dur"][2] == np.timedelta64(-1, "ms")
    for name, values in out.non_tensor_batch.items():
        if values.dtype == object:
            assert values.shape == (3,), name


def test_another_tools_schema_metadata_is_not_meta_info():
    table = pa.table({"x": [1, 2]}).replace_schema_metadata({"pandas": "{}", "huggingface": "{}"})
    assert adp.from_arrow(table).meta_info == {}


def test_columns_device_and_copy_apply_to_another_tools_table():
    table = pa.table({"x": pa.array([1.0, 2.0, 3.0]), "s": ["a", "b", "c"], "l": [[1], [2, 3], []]})
    only = adp.from_arrow(table, columns=["l", "s"])
    assert list(only.batch.keys()) == ["l"] and list(only.non_tensor_batch) == ["s"]
    with pytest.raises(adp.ColumnNotFoundError):
        adp.from_arrow(table, columns=["nope"])
    viewing = adp.from_arrow(table)
    assert viewing.batch["x"].data_ptr() == table.column("x").chunk(0).buffers()[1].address
    owning = adp.from_arrow(table, copy=True)
    assert owning.batch["x"].data_ptr() != table.column("x").chunk(0).buffers()[1].address
    assert adp.from_arrow(table, device="cpu").batch["x"].device.type == "cpu"


def test_empty_tables():
    schema = pa.schema([("x", pa.float32()), ("s", pa.string()), ("l", pa.list_(pa.int64()))])
    out = adp.from_arrow(schema.empty_table())
    assert len(out) == 0 and out.batch["x"].shape == (0,) and out.non_tensor_batch["s"].shape == (0,)
    assert len(adp.from_arrow(pa.table({}))) == 0


# ---------------------------------------------------------------- where no mapping exists: the column is named


@pytest.mark.parametrize(
    "column, message",
    [
        (pa.array([1.0, None]), "null values"),
        (pa.array([1, None], pa.int32()), "null values"),
        (pa.array([True, None]), "null values"),
        (pa.array([[1, 2], None]), "null rows"),
        (pa.array([[1, None], [3]]), "null values"),
        (pa.array([[[1, 2]], None, [[3, 4]]]), "null"),
        (pa.FixedSizeListArray.from_arrays(pa.array([1, 2, None, 4]), 2), "null values"),
        (pa.array([[("k", 1), ("k", 2)]], pa.map_(pa.string(), pa.int64())), "duplicate|Python values"),
    ],
)
def test_impossible_columns_raise_a_decode_error_naming_the_column(column, message):
    table = pa.table({"fine": pa.array(range(len(column))), "the_column": column})
    with pytest.raises(DecodeError, match=message) as caught:
        adp.from_arrow(table)
    assert "the_column" in str(caught.value)
    if "null" in message:
        assert "fill" in str(caught.value) and "columns=" in str(caught.value)
        assert list(adp.from_arrow(table, columns=["fine"]).batch.keys()) == ["fine"]  # the way out


def test_two_columns_of_one_name_are_refused():
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    with pytest.raises(DecodeError, match="'x'|\\['x'\\]"):
        adp.from_arrow(table)


def test_anything_but_a_table_is_refused():
    with pytest.raises(DecodeError, match="RecordBatch or Table"):
        adp.from_arrow({"x": [1]})


# ---------------------------------------------------------------- tools


def test_pandas_feather(tmp_path):
    pd = pytest.importorskip("pandas", reason="pandas is not installed")
    frame = pd.DataFrame({
        "i": [1, 2, 3],
        "f": np.array([0.5, 1.5, 2.5], dtype=np.float32),
        "ok": [True, False, True],
        "text": ["a", None, "c"],
        "cat": pd.Categorical(["x", "y", "x"]),
        "when": pd.to_datetime(["2024-01-01", "2024-02-01", None]),
        "vec": [np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([5.0, 6.0])],
        "ids": [[1, 2, 3], [4], []],
        "meta": [{"a": 1}, {"a": 2}, {"a": 3}],
    })
    frame.to_feather(tmp_path / "pd.arrow")
    out = files.read_file(tmp_path / "pd.arrow")
    assert list(out.batch.keys()) == ["i", "f", "ok", "vec", "ids"]
    assert list(out.non_tensor_batch) == ["text", "cat", "when", "meta"]
    assert out.meta_info == {}
    assert_tensor_equal(out.batch["i"], torch.tensor([1, 2, 3]))
    assert_tensor_equal(out.batch["f"], torch.tensor([0.5, 1.5, 2.5]))
    assert_tensor_equal(out.batch["ok"], torch.tensor([True, False, True]))
    assert_tensor_equal(out.batch["vec"], torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.float64))
    assert [r.tolist() for r in out.batch["ids"].unbind()] == [[1, 2, 3], [4], []]
    assert out.non_tensor_batch["text"].tolist() == ["a", None, "c"]
    assert out.non_tensor_batch["cat"].tolist() == ["x", "y", "x"]
    when = out.non_tensor_batch["when"]
    assert when.dtype.kind == "M" and np.isnat(when[2])  # pandas' own resolution (us in pandas 3)
    assert (when[:2] == np.array(["2024-01-01", "2024-02-01"], dtype="datetime64[s]")).all()
    assert out.non_tensor_batch["meta"].tolist() == [{"a": 1}, {"a": 2}, {"a": 3}]
    # pandas writes a NaN float as a null: no tensor can hold it, the error names the column
    pd.DataFrame({"x": [1.0, None]}).to_feather(tmp_path / "nan.arrow")
    with pytest.raises(DecodeError, match="'x'.*null"):
        files.read_file(tmp_path / "nan.arrow")


def test_polars_tables_and_files(tmp_path):
    pl = pytest.importorskip("polars", reason="polars is not installed")
    frame = pl.DataFrame({
        "i": [1, 2, 3],
        "s": ["a", "bb", None],
        "ragged": [[1, 2], [3], []],
        "arr": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
        "st": [{"k": 1}, {"k": 2}, {"k": None}],
    }).with_columns(pl.col("arr").cast(pl.Array(pl.Float32, 2)))
    frame.write_ipc(tmp_path / "pl.arrow")
    frame.write_ipc(tmp_path / "plz.arrow", compression="zstd")
    frame.write_ipc_stream(tmp_path / "pls.arrow")
    assert pa.ipc.open_file(str(tmp_path / "pl.arrow")).schema.field("s").type == pa.string_view()
    outs = [adp.from_arrow(frame.to_arrow()), adp.from_arrow(frame)]  # __arrow_c_stream__
    outs += [files.read_file(tmp_path / name) for name in ("pl.arrow", "plz.arrow", "pls.arrow")]
    for out in outs:
        assert list(out.batch.keys()) == ["i", "ragged", "arr"]
        assert_tensor_equal(out.batch["i"], torch.tensor([1, 2, 3]))
        assert_tensor_equal(out.batch["arr"], torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
        assert [r.tolist() for r in out.batch["ragged"].unbind()] == [[1, 2], [3], []]
        assert out.non_tensor_batch["s"].tolist() == ["a", "bb", None]
        assert out.non_tensor_batch["st"].tolist() == [{"k": 1}, {"k": 2}, {"k": None}]
    assert files.open_file(tmp_path / "plz.arrow").compression == "zstd"
    stored = files.open_file(tmp_path / "pls.arrow").read_arrow(0, columns=["arr", "s"])
    assert stored.schema.names == ["s", "arr"] and adp.from_arrow(stored).non_tensor_batch["s"][1] == "bb"
    assert files.open_file(tmp_path / "pls.arrow").stream


def test_duckdb_tables():
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed")
    query = """
        select range::INTEGER as i, range / 4 as f, [range, range + 1] as pair,
               list_value(range)[1:range::INTEGER] as grow, 'row ' || range as s,
               {'a': range, 'b': 'x'} as st, '{"k": [1, 2]}'::JSON as j,
               TIMESTAMP '2024-01-01 00:00:00' + to_seconds(range) as ts,
               range::DECIMAL(10, 2) as dec, MAP {'k': range} as mp
        from range(4)
    """
    connection = duckdb.connect()
    whole = connection.sql(query).to_arrow_table()
    grow = whole.column("grow").to_pylist()
    for table in [whole, connection.sql(query).arrow()]:  # a Table, a RecordBatchReader
        out = adp.from_arrow(table)
        assert list(out.batch.keys()) == ["i", "f", "pair", "grow"]
        assert_tensor_equal(out.batch["i"], torch.arange(4, dtype=torch.int32))
        assert len({len(g) for g in grow}) > 1 and [r.tolist() for r in out.batch["grow"].unbind()] == grow
        assert_tensor_equal(out.batch["f"], torch.arange(4, dtype=torch.float64) / 4)
        assert_tensor_equal(out.batch["pair"], torch.tensor([[r, r + 1] for r in range(4)]))
        got = {k: v.tolist() for k, v in out.non_tensor_batch.items()}
        assert got["s"] == [f"row {r}" for r in range(4)]
        assert got["st"] == [{"a": r, "b": "x"} for r in range(4)]
        assert got["j"] == ['{"k": [1, 2]}'] * 4  # DuckDB exports JSON as plain strings
        assert got["dec"] == [decimal.Decimal(f"{r}.00") for r in range(4)]
        assert got["mp"] == [{"k": r} for r in range(4)]
        assert out.non_tensor_batch["ts"].dtype.kind == "M"
        assert duckdb.sql("select 1").fetchall() == [(1,)]


def test_hf_datasets_tables_and_cache_files(tmp_path):
    datasets = pytest.importorskip("datasets", reason="HF datasets is not installed (pip install arrow-dataproto[interop])")
    features = datasets.Features({
        "prompt": datasets.Value("string"),
        "ids": datasets.Sequence(datasets.Value("int32")),
        "image": datasets.Array2D((2, 3), "float32"),
        "reward": datasets.Value("float32"),
        "label": datasets.ClassLabel(names=["bad", "good"]),
    })
    rows = {
        "prompt": ["hi", "there", "you"],
        "ids": [[1, 2], [3], [4, 5, 6]],
        "image": [np.full((2, 3), i, dtype=np.float32).tolist() for i in range(3)],
        "reward": [0.5, -1.0, 2.0],
        "label": [1, 0, 1],
    }
    ds = datasets.Dataset.from_dict(rows, features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    (cache,) = (tmp_path / "saved").glob("*.arrow")
    assert cache.read_bytes()[:4] == b"\xff\xff\xff\xff"  # an IPC stream
    outs = [adp.from_arrow(ds.data.table), files.read_file(cache), files.open_dataset(tmp_path / "saved").read_all()]
    for out in outs:
        assert list(out.batch.keys()) == ["ids", "image", "reward", "label"]
        assert [r.tolist() for r in out.batch["ids"].unbind()] == rows["ids"]
        assert_tensor_equal(out.batch["image"], torch.tensor(rows["image"]))
        assert_tensor_equal(out.batch["reward"], torch.tensor(rows["reward"]))
        assert out.batch["label"].tolist() == [1, 0, 1]
        assert out.non_tensor_batch["prompt"].tolist() == rows["prompt"] and out.meta_info == {}


def test_ray_data_tensor_columns_with_and_without_ray_registered():
    pytest.importorskip("ray.data", reason="ray is not installed")
    from ray.data.extensions import ArrowTensorArray

    values = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    table = pa.table({"t": ArrowTensorArray.from_numpy(values), "s": ["a", "b", "c", "d"]})
    assert_tensor_equal(adp.from_arrow(table).batch["t"], torch.from_numpy(values))
    # read by a process without Ray: the storage and the field metadata naming the type
    storage = table.column("t").chunk(0).storage
    field = pa.field("t", storage.type, metadata=table.schema.field("t").metadata or {
        b"ARROW:extension:name": b"ray.data.arrow_tensor_v2", b"ARROW:extension:metadata": b"[2, 3]"})
    plain = pa.Table.from_arrays([storage], schema=pa.schema([field]))
    assert_tensor_equal(adp.from_arrow(plain).batch["t"], torch.from_numpy(values))


def test_ray_data_blocks_of_our_table(ray_session):
    ray_data = pytest.importorskip("ray.data", reason="ray is not installed")
    dp = _scored(16)
    dataset = ray_data.from_arrow(_table(dp)).filter(expr="score >= 0.5")
    blocks = [ray_session.get(ref) for ref in dataset.to_arrow_refs()]
    out = adp.from_arrow(pa.concat_tables(blocks))
    kept = [i for i in range(16) if i / 16 >= 0.5]
    assert out.batch["score"].tolist() == [i / 16 for i in kept]
    assert out.non_tensor_batch["uid"].tolist() == dp.non_tensor_batch["uid"][kept].tolist()
    assert out.batch["ref_log_prob"].dtype == torch.bfloat16


# ---------------------------------------------------------------- IPC stream files through the file readers


def _stream_of(*batches: pa.RecordBatch, **options) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_stream_files_of_ours_read_zero_copy_with_random_access(tmp_path):
    dp = _scored(9)
    path = tmp_path / "ours.arrows"
    path.write_bytes(_stream_of(adp.to_arrow(dp[:4]), adp.to_arrow(dp[4:])))
    with files.open_file(path) as reader:
        assert reader.stream and not reader.foreign and reader.batch_rows == [4, 5]
        assert_dataproto_equal(reader.read_batch(1), dp[4:])
        assert_dataproto_equal(reader.read_rows(2, 7), dp[2:7])
        assert_dataproto_equal(reader.read_all(), dp)
        first = reader.read_batch(0)
        first.batch["score"][0] = 42.0  # a private copy-on-write mapping: the file is unchanged
    assert_dataproto_equal(files.read_file(path), dp)
    assert_dataproto_equal(adp.from_ipc(path.read_bytes()), dp)


def test_stream_files_with_dictionaries_and_compression(tmp_path):
    schema = pa.schema([("x", pa.int64()), ("c", pa.dictionary(pa.int32(), pa.string()))])
    batches = [
        pa.record_batch({"x": [k, k + 1], "c": pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), ["a", "b"])}, schema=schema)
        for k in range(3)
    ]
    (tmp_path / "dict.arrows").write_bytes(_stream_of(*batches))
    with files.open_file(tmp_path / "dict.arrows") as reader:
        assert reader.batch_rows == [2, 2, 2]
        assert reader.read_batch(2).batch["x"].tolist() == [2, 3]
        assert reader.read_all().non_tensor_batch["c"].tolist() == ["a", "b"] * 3
    big = pa.record_batch({"z": np.zeros(1 << 20)})
    (tmp_path / "zstd.arrows").write_bytes(_stream_of(big, compression="zstd"))
    with files.open_file(tmp_path / "zstd.arrows") as reader:
        assert reader.compression == "zstd" and reader.num_rows == 1 << 20
    with pytest.raises(DecodeError, match="max_decoded_bytes"):
        files.open_file(tmp_path / "zstd.arrows", max_decoded_bytes=1000).read_all()


def test_damaged_stream_files_are_decode_errors_never_crashes(tmp_path):
    data = _stream_of(*(adp.to_arrow(_scored(5)) for _ in range(2)))
    path = tmp_path / "cut.arrows"
    outcomes = set()
    for cut in sorted({*range(4, len(data), max(1, len(data) // 97)), len(data) - 8, len(data) - 1}):
        path.write_bytes(data[:cut])
        try:
            with files.open_file(path) as reader:
                reader.read_all()
            outcomes.add("read")  # a cut between two messages: the batches before it
        except DecodeError:
            outcomes.add("DecodeError")
    assert "DecodeError" in outcomes
    path.write_bytes(b"\xff\xff\xff\xff" + b"\x10\x00\x00\x00" + b"garbage" * 4)
    with pytest.raises(DecodeError):
        files.open_file(path)


@pytest.mark.parametrize("stream", [True, False])
def test_column_names_that_are_not_utf8_are_decode_errors(tmp_path, stream):
    data = _stream_of(pa.record_batch({"zzzz": [1, 2]})) if stream else None
    if data is None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, pa.schema([("zzzz", pa.int64())])) as writer:
            writer.write_batch(pa.record_batch({"zzzz": [1, 2]}))
        data = sink.getvalue().to_pybytes()
    damaged = data.replace(b"zzzz", b"\xc8\xc8zz")
    (tmp_path / "names.arrow").write_bytes(damaged)
    with pytest.raises(DecodeError, match="UTF-8"):
        files.read_file(tmp_path / "names.arrow")
    if stream:
        with pytest.raises(DecodeError, match="UTF-8"):
            adp.from_ipc(damaged)


# ---------------------------------------------------------------- generated tables


@st.composite
def _numeric_tables(draw):
    rows = draw(st.integers(0, 6))
    kinds = {"int8": pa.int8(), "uint32": pa.uint32(), "float16": pa.float16(), "float64": pa.float64(), "bool": pa.bool_()}
    columns, expected = {}, {}
    for k in range(draw(st.integers(1, 4))):
        name = f"c{k}"
        dtype_name = draw(st.sampled_from(sorted(kinds)))
        np_dtype = np.dtype(dtype_name)
        lengths = draw(st.lists(st.integers(0, 4), min_size=rows, max_size=rows))
        shape = draw(st.sampled_from(["scalar", "fixed", "list"]))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        flat = rng.integers(0, 100, size=sum(lengths) if shape == "list" else rows * 3).astype(np_dtype)
        if shape == "scalar":
            flat = flat[:rows]
            columns[name] = pa.array(flat, kinds[dtype_name])
            expected[name] = ("dense", flat)
        elif shape == "fixed":
            columns[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat, kinds[dtype_name]), 3)
            expected[name] = ("dense", flat.reshape(rows, 3))
        else:
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            columns[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, kinds[dtype_name]))
            split = np.split(flat, offsets[1:-1]) if rows else []
            one_length = rows > 0 and len(set(lengths)) == 1
            expected[name] = ("dense", flat.reshape(rows, lengths[0])) if one_length else ("jagged", split)
    return pa.table(columns), expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_numeric_tables())
def test_generated_numeric_tables_follow_the_rule(drawn):
    table, expected = drawn
    out = adp.from_arrow(table)
    assert list(out.batch.keys()) == list(expected) and len(out) == table.num_rows
    for name, (kind, values) in expected.items():
        tensor = out.batch[name]
        if kind == "dense":
            assert not tensor.is_nested, name
            assert_tensor_equal(tensor, torch.from_numpy(np.ascontiguousarray(values)), name)
        else:
            assert tensor.is_nested, name
            assert [r.tolist() for r in tensor.unbind()] == [v.tolist() for v in values]


@pytest.mark.parametrize("storage", [pa.string(), pa.large_string(), pa.string_view()])
def test_another_tools_json_column_is_read_by_the_json_kind(storage):
    """``arrow.json`` of another tool goes through the json kind's strict decoder: values come
    back as Python values over every text storage, and a non-JSON literal (NaN) is refused."""
    from arrow_dataproto import from_arrow

    good = pa.ExtensionArray.from_storage(pa.json_(storage), pa.array(['{"a": [1, 2.5]}', None, '"x"'], storage))
    assert list(from_arrow(pa.table({"j": good})).non_tensor_batch["j"]) == [{"a": [1, 2.5]}, None, "x"]
    bad = pa.ExtensionArray.from_storage(pa.json_(storage), pa.array(["1", "NaN"], storage))
    with pytest.raises(DecodeError, match=r"'j'.*row 1 is not JSON"):
        from_arrow(pa.table({"j": bad}))
