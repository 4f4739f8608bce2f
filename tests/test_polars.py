"""arrow_dataproto.polars: the dtypes polars shows of each column kind, and the way back
(filter / sort / select in polars, then from_polars with the schema) bit-exact."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import DecodeError, files
from arrow_dataproto.testing import assert_dataproto_equal

pl = pytest.importorskip("polars", reason="polars is not installed (pip install arrow-dataproto[interop])")
from arrow_dataproto.polars import from_polars, to_polars  # noqa: E402

ROWS = 6


def _dp() -> adp.DataProto:
    g = torch.Generator().manual_seed(0)
    batch = TensorDict({
        "input_ids": torch.randint(0, 32000, (ROWS,), generator=g),
        "old_log_probs": torch.randn(ROWS, 4, generator=g).bfloat16(),
        "scores_fp8": torch.randn(ROWS, 4, generator=g).to(torch.float8_e5m2),
        "response_mask": torch.rand(ROWS, 4, generator=g) > 0.5,
        "position_ids": torch.arange(ROWS * 3 * 4).reshape(ROWS, 3, 4),
        "responses": torch.nested.nested_tensor([torch.arange(n + 1) for n in range(ROWS)], layout=torch.jagged),
        "sub": TensorDict({"values": torch.randn(ROWS, 2, generator=g)}, batch_size=[ROWS]),
    }, batch_size=[ROWS])
    extra = np.empty(ROWS, dtype=object)
    for i in range(ROWS):
        extra[i] = {"index": i} if i % 2 else {"answer": str(i), "index": i}
    non_tensor = {"uid": np.array([f"u{i}" for i in range(ROWS)], dtype=object), "extra_info": extra}
    return adp.DataProto(batch, non_tensor, {"temperature": 0.7, "global_steps": 3})


def test_the_dtypes_polars_shows():
    frame = to_polars(_dp())
    assert frame.columns == ["input_ids", "old_log_probs", "scores_fp8", "response_mask", "position_ids",
                             "responses", "sub.values", "uid", "extra_info"]
    schema = frame.schema
    assert schema["input_ids"] == pl.Int64
    assert schema["old_log_probs"] == pl.Array(pl.Float32, 4)
    assert schema["scores_fp8"] == pl.Array(pl.Float32, 4)
    assert schema["response_mask"] == pl.Array(pl.Boolean, 4)
    assert schema["position_ids"] == pl.Array(pl.Int64, (3, 4))
    assert schema["responses"] == pl.List(pl.Int64)
    assert schema["sub.values"] == pl.Array(pl.Float32, 2)
    assert schema["uid"] == pl.String
    assert schema["extra_info"] == pl.String  # the JSON text
    dp = _dp()
    assert frame["old_log_probs"].to_numpy().tolist() == dp.batch["old_log_probs"].float().tolist()
    assert frame["responses"].to_list() == [row.tolist() for row in dp.batch["responses"].unbind()]


def test_filter_sort_select_and_back_exact_with_the_schema(tmp_path):
    dp = _dp()
    frame = to_polars(dp)
    keep = ["uid", "responses", "old_log_probs", "extra_info", "sub.values", "response_mask", "scores_fp8", "position_ids"]
    derived = frame.filter(pl.col("input_ids") % 2 == 0).sort("uid", descending=True).select(keep)
    rows = sorted((i for i in range(ROWS) if int(dp.batch["input_ids"][i]) % 2 == 0), reverse=True)
    assert derived.height == len(rows) > 0
    expected = dp[rows].select(batch_keys=["old_log_probs", "scores_fp8", "response_mask", "position_ids", "responses", "sub"],
                               non_tensor_batch_keys=["uid", "extra_info"])
    for schema in (adp.to_arrow(dp).schema, adp.to_arrow(dp, portable=True).schema):
        assert_dataproto_equal(from_polars(derived, schema=schema), expected)
    path = tmp_path / "f.arrow"
    files.write_file(path, dp)
    assert_dataproto_equal(from_polars(derived, schema=path), expected)
    # a frame read from the default file shows its stored types (raw bits) and comes back too
    stored = pl.read_ipc(path).filter(pl.col("input_ids") % 2 == 0).sort("uid", descending=True).select(keep)
    assert_dataproto_equal(from_polars(stored, schema=path), expected)


def test_without_the_schema_values_not_dtypes():
    dp = _dp()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = from_polars(to_polars(dp))
    found = [str(w.message) for w in caught if issubclass(w.category, adp.StoredFormWarning)]
    assert len(found) == 1 and "'extra_info' (text holding JSON" in found[0]  # portable values: no bits
    assert "old_log_probs" not in found[0]
    assert json.loads(back.non_tensor_batch["extra_info"][0]) == {"answer": "0", "index": 0}  # text, not a dict
    assert back.batch["old_log_probs"].dtype == torch.float32
    assert torch.equal(back.batch["old_log_probs"], dp.batch["old_log_probs"].float())
    assert back.batch["position_ids"].shape == (ROWS, 3, 4)
    assert back.meta_info == {}
    with pytest.warns(adp.StoredFormWarning, match="old_log_probs"):
        from_polars(pl.from_arrow(pa.table({"old_log_probs": pa.array([[1, 2]] * 3, pa.list_(pa.uint16(), 2))})))


def test_a_changed_value_is_a_decode_error():
    dp = _dp()
    frame = to_polars(dp).with_columns(pl.col("old_log_probs").arr.eval(pl.element() + 1e-4))
    with pytest.raises(DecodeError, match="old_log_probs"):
        from_polars(frame, schema=adp.to_arrow(dp).schema)
