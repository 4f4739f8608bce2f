"""Files written by arrow_dataproto.files.write_file open in pandas, polars and DuckDB with the right values.

This is the default (stored) form; the portable view (``write_file(..., portable=True)``),
which every tool reads as values, is tested in ``tests/test_portable.py``.

What other readers see of our column kinds (checked below):

- plain tensors ``[B]``, strings, dicts and numeric ``non_tensor_batch`` columns: their
  own types (int64, float32, float16, string, struct...).
- ``fixed_shape_tensor`` columns (tensors ``[B, d1..dn]``): pandas (through pyarrow) gives
  each row as a flat 1-D array; polars an ``Extension`` over ``Array(T, d1*..*dn)`` (use
  ``.ext.storage()`` to compute on it); DuckDB a flat ``T[d1*..*dn]`` array. None applies
  the row shape.
- ``bool8`` columns (bool tensors): pandas and polars show the int8 storage (0/1; polars as
  an ``Extension`` over Int8); DuckDB reads them as BOOLEAN.
- jagged columns are ``large_list``: per-row arrays / ``List`` / ``T[]``; an mRoPE-style
  column (rows ``(3, j)``, ragged_idx=2) is stored ragged dimension first, so readers
  see each row transposed, as ``j`` elements of 3.
- bfloat16 tensors: their raw bits as uint16 (Arrow has no bfloat16).
- DuckDB 2.0 cannot read float16 ("Unsupported Internal Arrow Type e") and refuses a
  whole table (or ``pyarrow.dataset``) holding a float16 column, even when the query
  does not name it: project it away first.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

from arrow_dataproto import DataProto
from arrow_dataproto.files import write_file

pd = pytest.importorskip("pandas", reason="pandas is not installed (pip install arrow-dataproto[interop])")
pl = pytest.importorskip("polars", reason="polars is not installed (pip install arrow-dataproto[interop])")
duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install arrow-dataproto[interop])")


def make_batch(rows: int, seed: int) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (rows,), generator=g).tolist()
    td = TensorDict(
        {
            "ids": torch.arange(rows) + 100 * seed,
            "score": torch.randn(rows, generator=g),
            "half": torch.randn(rows, generator=g).half(),
            "ref": torch.randn(rows, generator=g).bfloat16(),
            "mask": torch.rand(rows, generator=g) > 0.5,
            "grid": torch.randint(-50, 50, (rows, 2, 3), generator=g, dtype=torch.int32),
            "logp": torch.randn(rows, 4, generator=g),
            "responses": torch.nested.nested_tensor(
                [torch.randint(0, 1000, (n,), generator=g) for n in lengths], layout=torch.jagged
            ),
            "mrope": torch.nested.nested_tensor(
                [torch.arange(3 * n).view(3, n) + seed for n in lengths], layout=torch.jagged
            ),
        },
        batch_size=[rows],
    )
    non_tensor = {
        "uid": np.array([f"uid-{seed}-{i}" for i in range(rows)], dtype=object),
        "reward_model": np.array([{"ground_truth": str(i), "style": "rule"} for i in range(rows)], dtype=object),
        "turns": np.arange(rows, dtype=np.int32) * (seed + 1),
    }
    return DataProto(td, non_tensor, {"global_steps": seed})


BATCHES = [make_batch(4, seed=1), make_batch(3, seed=2)]


def expected(column: str) -> list:
    """Every row of ``column`` over the batches written, as numpy arrays or Python values."""
    out = []
    for dp in BATCHES:
        if column in dp.non_tensor_batch:
            out += list(dp.non_tensor_batch[column])
        else:
            t = dp.batch[column]
            out += [r.numpy() for r in (t.unbind() if t.is_nested else t)]
    return out


@pytest.fixture(scope="module", params=[None, "lz4", "zstd"])
def path(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("interop") / "rollout.arrow"
    write_file(path, BATCHES, compression=request.param)
    return path


def test_the_file_is_a_plain_arrow_ipc_file(path):
    with pa.OSFile(str(path)) as source:
        reader = pa.ipc.open_file(source)
        assert reader.num_record_batches == 2
        assert reader.read_all().num_rows == 7


# ---------------------------------------------------------------- pandas


def test_pandas_read_feather_plain_columns(path):
    df = pd.read_feather(path)
    assert len(df) == 7
    assert df["ids"].dtype == np.int64 and df["ids"].tolist() == [int(x) for x in expected("ids")]
    assert df["score"].dtype == np.float32
    np.testing.assert_array_equal(df["score"].to_numpy(), np.array(expected("score")))
    assert df["half"].dtype == np.float16
    np.testing.assert_array_equal(df["half"].to_numpy(), np.array(expected("half")))
    assert df["uid"].tolist() == expected("uid")
    assert df["reward_model"].tolist() == expected("reward_model")
    assert df["turns"].dtype == np.int32 and df["turns"].tolist() == expected("turns")
    bf16_bits = [int(x) for x in torch.cat([dp.batch["ref"] for dp in BATCHES]).view(torch.uint16)]
    assert df["ref"].dtype == np.uint16 and df["ref"].tolist() == bf16_bits


def test_pandas_read_feather_tensor_and_list_columns(path):
    df = pd.read_feather(path, columns=["mask", "grid", "logp", "responses", "mrope"])
    assert list(df.columns) == ["mask", "grid", "logp", "responses", "mrope"]
    assert df["mask"].tolist() == [int(m) for m in expected("mask")]  # bool8: its int8 storage
    for cell, row in zip(df["grid"], expected("grid")):
        assert cell.dtype == np.int32
        np.testing.assert_array_equal(cell, row.reshape(-1))  # flattened by pyarrow
    for cell, row in zip(df["logp"], expected("logp")):
        np.testing.assert_array_equal(cell, row)
    for cell, row in zip(df["responses"], expected("responses")):
        np.testing.assert_array_equal(cell, row)
    for cell, row in zip(df["mrope"], expected("mrope")):
        assert len(cell) == row.shape[1]
        if len(cell):
            np.testing.assert_array_equal(np.stack(cell), row.T)  # ragged dimension first


# ---------------------------------------------------------------- polars


def test_polars_read_ipc_plain_columns(path):
    frame = pl.read_ipc(path)
    assert frame.height == 7
    assert frame.schema["ids"] == pl.Int64 and frame.schema["score"] == pl.Float32
    assert frame.schema["uid"] == pl.String and frame.schema["turns"] == pl.Int32
    assert frame["ids"].to_list() == [int(x) for x in expected("ids")]
    np.testing.assert_array_equal(frame["score"].to_numpy(), np.array(expected("score")))
    np.testing.assert_array_equal(frame["half"].to_numpy(), np.array(expected("half")))
    assert frame["uid"].to_list() == expected("uid")
    assert frame["reward_model"].to_list() == expected("reward_model")
    by_uid = frame.filter(pl.col("uid") == "uid-2-1")
    assert by_uid["ids"].to_list() == [201]


def test_polars_read_ipc_list_columns(path):
    frame = pl.read_ipc(path, columns=["responses", "mrope"])
    assert frame.schema["responses"] == pl.List(pl.Int64)
    assert frame.schema["mrope"] == pl.List(pl.Array(pl.Int64, 3))
    assert frame["responses"].to_list() == [row.tolist() for row in expected("responses")]
    assert frame["mrope"].to_list() == [row.T.tolist() for row in expected("mrope")]
    lengths = frame.select(pl.col("responses").list.len())["responses"].to_list()
    assert lengths == [len(row) for row in expected("responses")]


def test_polars_extension_columns_through_their_storage(path):
    frame = pl.read_ipc(path, columns=["mask", "grid"])
    mask = frame.select(pl.col("mask").ext.storage())["mask"]
    assert mask.dtype == pl.Int8 and mask.to_list() == [int(m) for m in expected("mask")]
    grid = frame.select(pl.col("grid").ext.storage())["grid"]
    assert grid.dtype == pl.Array(pl.Int32, 6)
    assert grid.to_list() == [row.reshape(-1).tolist() for row in expected("grid")]
    sums = frame.select(pl.col("grid").ext.storage().arr.sum())["grid"].to_list()
    assert sums == [int(row.sum()) for row in expected("grid")]


# ---------------------------------------------------------------- DuckDB


@pytest.fixture
def duck(path):
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    con = duckdb.connect()
    con.register("rollout", table.drop_columns(["half"]))  # DuckDB cannot read float16 at all
    yield con
    con.close()


def test_duckdb_plain_columns(duck):
    rows = duck.sql("select ids, score, uid, turns, reward_model.ground_truth from rollout").fetchall()
    assert [r[0] for r in rows] == [int(x) for x in expected("ids")]
    assert [r[1] for r in rows] == [float(x) for x in expected("score")]  # float32 values, exactly
    assert [r[2] for r in rows] == expected("uid")
    assert [r[3] for r in rows] == expected("turns")
    assert [r[4] for r in rows] == [d["ground_truth"] for d in expected("reward_model")]
    relation = duck.sql("select ids, score, uid from rollout")
    assert list(map(str, relation.types)) == ["BIGINT", "FLOAT", "VARCHAR"]


def test_duckdb_tensor_and_list_columns(duck):
    relation = duck.sql("select mask, grid, logp, responses, mrope, len(responses) as n from rollout")
    types = dict(zip(relation.columns, map(str, relation.types)))
    assert types == {
        "mask": "BOOLEAN", "grid": "INTEGER[6]", "logp": "FLOAT[4]",
        "responses": "BIGINT[]", "mrope": "BIGINT[3][]", "n": "BIGINT",
    }
    rows = relation.fetchall()
    assert [r[0] for r in rows] == [bool(m) for m in expected("mask")]
    assert [list(r[1]) for r in rows] == [row.reshape(-1).tolist() for row in expected("grid")]
    assert [list(r[2]) for r in rows] == [row.tolist() for row in expected("logp")]
    assert [r[3] for r in rows] == [row.tolist() for row in expected("responses")]
    assert [[list(x) for x in r[4]] for r in rows] == [row.T.tolist() for row in expected("mrope")]
    assert [r[5] for r in rows] == [len(row) for row in expected("responses")]


def test_duckdb_aggregates(duck):
    total, masked = duck.sql("select sum(ids), count(*) filter (where mask) from rollout").fetchall()[0]
    assert total == sum(int(x) for x in expected("ids"))
    assert masked == sum(bool(m) for m in expected("mask"))
    tokens = duck.sql("select sum(len(responses)) from rollout").fetchall()[0][0]
    assert tokens == sum(len(row) for row in expected("responses"))
