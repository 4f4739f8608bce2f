"""The way back from other tools (``schema=``): a realistic verl file through pandas, polars,
DuckDB and HF datasets, filtered, sorted and projected there, and read back bit-exact with
the original file's schema; without it, no column changes its type silently (a warning
names the columns that look like stored forms)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import arrow_dataproto as adp
from arrow_dataproto import DecodeError, SchemaMismatchError, StoredFormWarning, files
from arrow_dataproto.testing import assert_dataproto_equal
from interop_table import realistic_batch

pd = pytest.importorskip("pandas", reason="pandas is not installed (pip install arrow-dataproto[interop])")
pl = pytest.importorskip("polars", reason="polars is not installed (pip install arrow-dataproto[interop])")
duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install arrow-dataproto[interop])")

TENSORS = ["ref_log_prob", "fp8_scores", "response_mask", "advantages", "position_ids_3d", "responses_jagged"]
OBJECTS = ["data_source", "extra_info", "uid"]
KEEP = ["extra_info", "responses_jagged", "ref_log_prob", "uid", "fp8_scores", "response_mask",
        "position_ids_3d", "advantages", "data_source"]
"""The columns each tool keeps, in another order than the file's."""


def _batches() -> list[adp.DataProto]:
    out = []
    for seed, meta in ((0, {"temperature": 0.7, "global_steps": 1}), (1, {"global_steps": 2, "final": True})):
        dp = realistic_batch(rows=6, seed=seed)
        dp.batch["fp8_scores"] = dp.batch["advantages"].to(torch.float8_e4m3fn)
        dp.batch["position_ids_3d"] = torch.arange(6 * 3 * 4).reshape(6, 3, 4) + seed
        dp.meta_info = meta
        out.append(dp)
    return out


@pytest.fixture(scope="module", params=["default", "portable"])
def written(request, tmp_path_factory) -> tuple[Path, Path, adp.DataProto]:
    folder = tmp_path_factory.mktemp(request.param)
    portable = request.param == "portable"
    path, stream = folder / "f.arrow", folder / "f.arrows"
    files.write_file(path, _batches(), portable=portable)
    files.write_file(stream, _batches(), portable=portable, stream=True)
    return path, stream, files.read_file(path)


def _expected(whole: adp.DataProto, rows: list[int]) -> adp.DataProto:
    picked = whole[rows]
    tensors = [k for k in picked.batch.keys() if k in KEEP]
    objects = [k for k in picked.non_tensor_batch if k in KEEP]
    return picked.select(batch_keys=tensors, non_tensor_batch_keys=objects)


def _rows(whole: adp.DataProto) -> list[int]:
    """Rows whose data_source is not the first row's, sorted by uid descending: what each tool does."""
    source, uid = whole.non_tensor_batch["data_source"], whole.non_tensor_batch["uid"]
    kept = [i for i in range(len(whole)) if source[i] != source[0]]
    return sorted(kept, key=lambda i: uid[i], reverse=True)


def _polars(path: Path, first: str) -> pa.Table:
    frame = pl.read_ipc(path)
    return frame.filter(pl.col("data_source") != first).sort("uid", descending=True).select(KEEP).to_arrow()


def _duckdb(path: Path, first: str) -> pa.Table:
    rollout = pa.ipc.open_file(path).read_all()  # noqa: F841 (named in the query)
    columns = ", ".join(KEEP)
    return duckdb.sql(f"select {columns} from rollout where data_source <> '{first}' order by uid desc").arrow().read_all()


def _pandas(path: Path, first: str) -> pa.Table:
    frame = pd.read_feather(path)
    frame = frame[frame["data_source"] != first].sort_values("uid", ascending=False)[KEEP]
    return pa.Table.from_pandas(frame, preserve_index=False)


TOOLS = {"polars": _polars, "duckdb": _duckdb, "pandas": _pandas}


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tools_table_comes_back_exact_with_the_schema(written, tool):
    path, _, whole = written
    table = TOOLS[tool](path, whole.non_tensor_batch["data_source"][0])
    expected = _expected(whole, _rows(whole))
    assert table.num_rows == len(expected) > 0
    for schema in (path, str(path), files.open_file(path).schema):
        back = adp.from_arrow(table, schema=schema)
        assert_dataproto_equal(back.select(meta_info_keys=[]), expected.select(meta_info_keys=[]))
        assert back.batch["ref_log_prob"].dtype == torch.bfloat16
        assert back.batch["fp8_scores"].dtype == torch.float8_e4m3fn
        assert back.batch["response_mask"].dtype == torch.bool
        assert back.batch["position_ids_3d"].shape[1:] == (3, 4)
        assert back.batch["responses_jagged"].is_nested
        assert isinstance(back.non_tensor_batch["extra_info"][0], dict)
    # a path gives the file's meta_info by the readers' rule (the first batch's updated by the later ones)
    assert adp.from_arrow(table, schema=path).meta_info == whole.meta_info == {"temperature": 0.7, "global_steps": 2, "final": True}
    # a schema object carries the one meta_info it holds (the footer's: the first batch's)
    assert adp.from_arrow(table, schema=files.open_file(path).schema).meta_info == {"temperature": 0.7, "global_steps": 1}


@pytest.mark.parametrize("tool", TOOLS)
def test_without_the_schema_no_silent_type_change(written, tool):
    """A default file's bf16 bits, bool bytes and flattened rows read as they are, with one
    warning naming them; a portable file's values read as values (floats, bools) with no warning."""
    path, _, whole = written
    table = TOOLS[tool](path, whole.non_tensor_batch["data_source"][0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = adp.from_arrow(table)
    found = [w for w in caught if issubclass(w.category, StoredFormWarning)]
    if path.parent.name.startswith("portable"):
        assert back.batch["ref_log_prob"].dtype == torch.float32  # the values, widened exactly
        assert torch.equal(back.batch["ref_log_prob"], _expected(whole, _rows(whole)).batch["ref_log_prob"].float())
        return
    assert len(found) == 1
    message = str(found[0].message)
    for name in ("ref_log_prob", "response_mask", "schema="):
        assert name in message
    if isinstance(table.schema.field("position_ids_3d").type, pa.FixedShapeTensorType):  # polars keeps the type
        assert "position_ids_3d" not in message  # and with it the shape of the rows: nothing lost
        assert back.batch["position_ids_3d"].shape == whole.batch["position_ids_3d"][_rows(whole)].shape
    else:
        assert "position_ids_3d" in message
    assert back.batch["ref_log_prob"].dtype == torch.uint16


def test_hf_datasets_round_trip(written):
    datasets = pytest.importorskip("datasets", reason="HF datasets is not installed")
    path, stream, whole = written
    if not path.parent.name.startswith("portable"):
        pytest.skip("HF datasets refuses the default file's extension types (the interop table of docs/files.md)")
    first = whole.non_tensor_batch["data_source"][0]
    ds = datasets.Dataset.from_file(str(stream)).filter(lambda row: row["data_source"] != first)
    ds = ds.sort("uid", reverse=True).select_columns(KEEP)
    table = ds.with_format("arrow")[:]
    back = adp.from_arrow(table, schema=stream)
    assert_dataproto_equal(back, _expected(whole, _rows(whole)).select(meta_info_keys=list(whole.meta_info)))


def test_the_file_readers_take_the_schema_too(written, tmp_path):
    path, _, whole = written
    table = _polars(path, whole.non_tensor_batch["data_source"][0])
    derived = tmp_path / "derived.arrow"
    pl.from_arrow(table).write_ipc(derived)
    expected = _expected(whole, _rows(whole))
    with files.open_file(derived, schema=path) as reader:
        back = reader.read_all()
    assert_dataproto_equal(back, expected.select(meta_info_keys=list(whole.meta_info)))
    assert_dataproto_equal(files.read_file(derived, schema=path), back)


def test_rechunked_sampled_and_limited(written):
    path, _, whole = written
    table = pa.ipc.open_file(path).read_all()
    table = table.replace_schema_metadata(None)  # what a tool that drops our metadata leaves
    table = pa.Table.from_batches(table.to_batches(max_chunksize=4))  # re-chunked: several chunks per column
    rows = [7, 2, 11, 0]
    sampled = table.take(rows).slice(0, 3)
    back = adp.from_arrow(sampled, schema=path)
    expected = whole[rows[:3]]
    assert_dataproto_equal(back, expected)


def test_values_that_no_longer_fit_are_a_decode_error_naming_the_column(written):
    path, _, whole = written
    table = pa.ipc.open_file(path).read_all().replace_schema_metadata(None)
    i = table.schema.get_field_index("uid")
    bad = table.set_column(i, "uid", pa.array(range(table.num_rows)))  # strings became numbers
    with pytest.raises(DecodeError, match="uid"):
        adp.from_arrow(bad, schema=path)
    i = table.schema.get_field_index("responses_jagged")
    fractions = pa.array([[0.5] * 2] * table.num_rows, pa.list_(pa.float64()))
    with pytest.raises(DecodeError, match="responses_jagged"):
        adp.from_arrow(table.set_column(i, "responses_jagged", fractions), schema=path)
    i = table.schema.get_field_index("position_ids_3d")
    short = pa.array([[1] * 11] * table.num_rows, pa.list_(pa.int64()))  # a row of another length
    with pytest.raises(DecodeError, match="position_ids_3d"):
        adp.from_arrow(table.set_column(i, "position_ids_3d", short), schema=path)


def test_a_column_the_schema_lacks_and_a_schema_not_ours(written):
    path, _, _ = written
    table = pa.ipc.open_file(path).read_all().replace_schema_metadata(None)
    extra = table.append_column("new", pa.array(np.arange(table.num_rows)))
    with pytest.raises(SchemaMismatchError, match="new"):
        adp.from_arrow(extra, schema=path)
    with pytest.raises(SchemaMismatchError, match="adp.format"):
        adp.from_arrow(table, schema=pa.schema([("uid", pa.string())]))
    with pytest.raises(adp.ArgumentTypeError):
        adp.from_arrow(table, schema=42)


def test_a_table_that_kept_our_metadata_ignores_the_schema(written):
    path, _, whole = written
    own = pa.ipc.open_file(path).read_all()
    assert_dataproto_equal(adp.from_arrow(own, schema=pa.schema([])), adp.from_arrow(own))
