"""to_pandas / from_pandas: per-row shapes, shown dtypes, exact round trips, inference, errors."""

from __future__ import annotations

import json
import types
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from tensordict import TensorDict
from arrow_dataproto.testing import assert_dataproto_equal, assert_tensor_equal, sample_dataproto

from arrow_dataproto import DataProto, DecodeError, EncodeError
from arrow_dataproto._dtypes import STORAGE
from arrow_dataproto.pandas import META_INFO, RECORD, from_pandas, to_pandas

NARROW_FLOATS = [
    getattr(torch, n)
    for n in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, n)
]
RAW_BITS = {
    getattr(torch, n): bits
    for n, bits in (("bits8", np.uint8), ("bits16", np.uint16), ("float4_e2m1fn_x2", np.uint8))
    if hasattr(torch, n)
}


def all_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 1- or 2-byte dtype, as a [rows, 256] tensor of that dtype."""
    storage = torch.uint8 if dtype.itemsize == 1 else torch.uint16
    codes = torch.arange(2 ** (8 * dtype.itemsize), dtype=torch.int32).to(storage)
    return codes.view(dtype).view(-1, 256)


def one_column(name: str, tensor: torch.Tensor) -> DataProto:
    return DataProto(TensorDict({name: tensor}, batch_size=[tensor.shape[0]]))


# ---------------------------------------------------------------- to_pandas


def test_sample_round_trips_bit_exact():
    dp = sample_dataproto()
    df = to_pandas(dp)
    assert list(df.columns) == [
        "input_ids", "attention_mask", "old_log_probs", "ref_log_prob", "response_mask",
        "responses_jagged", "position_ids_mrope", "extra.values", "uid", "data_source", "reward_model",
    ]
    assert len(df) == len(dp) and isinstance(df.index, pd.RangeIndex)
    assert_dataproto_equal(dp, from_pandas(df))


def test_method_matches_function():
    dp = sample_dataproto()
    pd.testing.assert_frame_equal(dp.to_pandas(), to_pandas(dp))


def test_cells_have_their_rows_real_shape():
    dp = sample_dataproto()
    df = to_pandas(dp)
    for i in range(len(dp)):
        ids = df["input_ids"][i]
        assert ids.shape == (12,) and ids.dtype == np.int64
        np.testing.assert_array_equal(ids, dp.batch["input_ids"][i].numpy())
        jagged = dp.batch["responses_jagged"].unbind()[i]
        np.testing.assert_array_equal(df["responses_jagged"][i], jagged.numpy())
        mrope = dp.batch["position_ids_mrope"].unbind()[i]
        assert df["position_ids_mrope"][i].shape == (3, mrope.shape[1])
        np.testing.assert_array_equal(df["position_ids_mrope"][i], mrope.numpy())
        assert df["response_mask"][i].dtype == np.bool_
        np.testing.assert_array_equal(df["extra.values"][i], dp.batch["extra", "values"][i].numpy())
    assert df["uid"].tolist() == list(dp.non_tensor_batch["uid"])
    assert df["reward_model"][2] == {"ground_truth": "2", "style": "rule"}


def test_dense_multi_dim_rows_strided_nested_and_plain_columns():
    rows = [torch.arange(6.0).view(2, 3), torch.ones(1, 4), torch.zeros(3, 1)]
    td = TensorDict(
        {
            "grid": torch.arange(24, dtype=torch.int32).view(2, 3, 4),
            "score": torch.tensor([0.5, -1.0]),
            "flag": torch.tensor([True, False]),
            "z": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        },
        batch_size=[2],
    )
    df = to_pandas(DataProto(td))
    assert df["grid"][1].shape == (3, 4) and df["grid"][1].dtype == np.int32
    np.testing.assert_array_equal(df["grid"][1], td["grid"][1].numpy())
    assert df["score"].dtype == np.float32 and df["score"].tolist() == [0.5, -1.0]
    assert df["flag"].dtype == np.bool_ and df["z"].dtype == np.complex64
    assert df["z"][1] == -3j

    nested = DataProto(TensorDict({"rows": torch.nested.nested_tensor(rows)}, batch_size=[3]))
    ndf = to_pandas(nested)
    assert [c.shape for c in ndf["rows"]] == [(2, 3), (1, 4), (3, 1)]
    assert_dataproto_equal(nested, from_pandas(ndf))


def test_jagged_with_holes_and_sliced_batches():
    values, offsets = torch.arange(20.0), torch.tensor([0, 5, 10, 15, 20])
    holes = torch.nested.nested_tensor_from_jagged(values, offsets, lengths=torch.tensor([2, 5, 1, 3]))
    df = to_pandas(one_column("h", holes))
    assert [c.tolist() for c in df["h"]] == [[0, 1], [5, 6, 7, 8, 9], [10], [15, 16, 17]]
    assert [r.tolist() for r in from_pandas(df).batch["h"].unbind()] == df["h"].map(list).tolist()
    part = sample_dataproto()[2:5]  # jagged views into a larger values buffer
    assert_dataproto_equal(part, from_pandas(to_pandas(part)))


def test_cells_view_the_tensors_read_only_unless_copied():
    dp = sample_dataproto()
    df = to_pandas(dp)
    cell = df["input_ids"][2]
    assert np.shares_memory(cell, dp.batch["input_ids"].numpy())
    assert not cell.flags.writeable
    with pytest.raises(ValueError):
        cell[0] = 1
    jagged = df["responses_jagged"][1]
    assert np.shares_memory(jagged, dp.batch["responses_jagged"].values().numpy()) and not jagged.flags.writeable
    dp.batch["input_ids"][2, 0] = -5  # later in-place writes to the tensor show in the frame
    assert cell[0] == -5

    copied = to_pandas(dp, copy=True)
    cell = copied["input_ids"][2]
    assert not np.shares_memory(cell, dp.batch["input_ids"].numpy()) and cell.flags.writeable
    cell[0] = 7
    assert dp.batch["input_ids"][2, 0] == -5
    assert dp.batch["input_ids"].numpy().flags.writeable  # the read-only flag stays on the frame's views


def test_plain_columns_are_the_frames_own():
    dp = one_column("x", torch.arange(4))
    df = to_pandas(dp)
    df.loc[0, "x"] = 99
    assert dp.batch["x"][0] == 0


def test_meta_info_and_record_in_attrs():
    dp = sample_dataproto()
    df = to_pandas(dp)
    assert df.attrs[META_INFO] == dp.meta_info
    df.attrs[META_INFO]["global_token_num"].append(1)  # a deep copy
    assert len(dp.meta_info["global_token_num"]) == len(dp)
    record = df.attrs[RECORD]
    assert record["batch_size"] == [6]
    assert record["columns"]["ref_log_prob"] == {"kind": "tensor", "dtype": "bfloat16", "device": "cpu", "shape": [7]}
    assert record["columns"]["position_ids_mrope"]["ragged_idx"] == 2
    assert json.loads(json.dumps(record)) == record  # JSON-compatible (pandas writes attrs to Parquet as JSON)


@pytest.mark.parametrize("dtype", NARROW_FLOATS, ids=str)
def test_narrow_floats_shown_as_float32_and_restored_bit_exact(dtype):
    t = all_codes(dtype)
    df = to_pandas(one_column("x", t))
    cell = df["x"][0]
    assert cell.dtype == np.float32
    shown = np.stack(df["x"].tolist())
    np.testing.assert_array_equal(shown.view(np.uint32), t.float().numpy().view(np.uint32))
    back = from_pandas(df).batch["x"]
    if dtype == getattr(torch, "float8_e5m2", None):
        # its NaN payloads share one float32 image: those come back as a NaN, every other code exactly
        nan = torch.isnan(t.float())
        assert torch.isnan(back.float())[nan].all()
        assert torch.equal(back.view(torch.uint8)[~nan], t.view(torch.uint8)[~nan])
    else:
        assert_tensor_equal(back, t, str(dtype))


@pytest.mark.parametrize("dtype", sorted(STORAGE, key=str), ids=str)
def test_every_dtype_round_trips_dense_and_jagged(dtype):
    raw = torch.randint(0, 256, (4, 3 * dtype.itemsize), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    dense = raw.view(dtype) if dtype != torch.bool else raw.bool()
    jagged = torch.nested.nested_tensor_from_jagged(dense.reshape(-1)[:7], torch.tensor([0, 2, 2, 7]))
    dp = one_column("dense", dense)
    assert_dataproto_equal(dp, from_pandas(to_pandas(dp)))
    dpj = one_column("jagged", jagged)
    df = to_pandas(dpj)
    assert [c.shape for c in df["jagged"]] == [(2,), (0,), (5,)]
    if dtype in RAW_BITS:
        assert df["jagged"][2].dtype == RAW_BITS[dtype]
    assert_dataproto_equal(dpj, from_pandas(df))


def test_non_tensor_columns_keep_values_and_dtypes():
    non_tensor = {
        "uid": np.array(["a", "b", None], dtype=object),
        "fixed": np.array(["ab", "c", ""], dtype="<U5"),
        "raw": np.array([b"ab", b"c", b""], dtype="S3"),
        "day": np.array(["2024-01-01", "2024-01-02", "NaT"], dtype="M8[D]"),
        "score": np.array([1, 2, 3], dtype=np.float16),
        "pairs": np.arange(6, dtype=np.int32).reshape(3, 2),
        "record": np.array([(1, 2.0), (3, 4.0), (5, 6.0)], dtype=[("a", "i4"), ("b", "f8")]),
        "big_endian": np.array([1, 2, 3], dtype=">i4"),
        "dicts": np.array([{"k": 1}, {"k": [2]}, {}], dtype=object),
        "objects_2d": np.array([[[1], "a"], [(2,), "b"], [None, "c"]], dtype=object),
    }
    dp = DataProto(None, non_tensor, {"step": 1})
    df = to_pandas(dp)
    assert df["uid"].dtype == object and df["uid"].tolist() == ["a", "b", None]
    assert df["score"].dtype == np.float16 and df["big_endian"].tolist() == [1, 2, 3]
    assert df["pairs"][1].shape == (2,) and df["pairs"][1].tolist() == [2, 3]
    assert pd.Timestamp("2024-01-02") == df["day"][1]
    assert_dataproto_equal(dp, from_pandas(df))


def test_accepts_tensordicts_and_duck_typed_dataprotos():
    dp = sample_dataproto()
    from_td = to_pandas(dp.batch)
    assert list(from_td.columns) == [c for c in to_pandas(dp).columns if c not in dp.non_tensor_batch]
    assert from_td.attrs[META_INFO] == {}
    verl_like = types.SimpleNamespace(batch=dp.batch, non_tensor_batch=dp.non_tensor_batch, meta_info=dp.meta_info)
    assert_dataproto_equal(dp, from_pandas(to_pandas(verl_like)))


def test_empty_and_multi_dim_batches_round_trip():
    dp = sample_dataproto()[0:0]
    df = to_pandas(dp)
    assert df.shape == (0, 11)
    assert_dataproto_equal(dp, from_pandas(df))

    inner = TensorDict({"y": torch.randn(3, 2)}, batch_size=[3, 2])
    td = TensorDict({"x": torch.arange(12).view(3, 2, 2), "inner": inner}, batch_size=[3, 2])
    dp = DataProto(td)
    df = to_pandas(dp)
    assert df["x"][0].shape == (2, 2) and df["inner.y"][0].shape == (2,)
    assert_dataproto_equal(dp, from_pandas(df))
    assert_dataproto_equal(dp[1:], from_pandas(df.iloc[1:]))


def test_a_file_read_back_shows_in_pandas(tmp_path):
    from arrow_dataproto.files import read_file, write_file

    dp = sample_dataproto()
    write_file(tmp_path / "b.arrow", dp)
    df = read_file(tmp_path / "b.arrow").to_pandas()
    assert df["position_ids_mrope"][1].shape == (3, dp.batch["position_ids_mrope"].unbind()[1].shape[1])
    assert not df["input_ids"][0].flags.writeable  # a view of the file's mapping
    assert_dataproto_equal(dp, from_pandas(df))


def test_no_batch_only_non_tensor():
    dp = DataProto(None, {"uid": np.array(["a", "b"], dtype=object)}, {"k": "v"})
    back = from_pandas(to_pandas(dp))
    assert back.batch is None
    assert_dataproto_equal(dp, back)


# ---------------------------------------------------------------- from_pandas after pandas operations


def test_filtered_and_reordered_rows():
    dp = sample_dataproto()
    df = to_pandas(dp)
    assert_dataproto_equal(dp.select_idxs([4, 1, 3]), from_pandas(df.iloc[[4, 1, 3]]))
    mask = df["data_source"] == "gsm8k"
    assert_dataproto_equal(dp.select_idxs(np.flatnonzero(mask)), from_pandas(df[mask]))


def test_dropped_and_added_columns():
    dp = sample_dataproto()
    df = to_pandas(dp).drop(columns=["old_log_probs", "uid"])
    df["reward"] = np.arange(len(df), dtype=np.float32)
    back = from_pandas(df)
    assert "old_log_probs" not in back.batch.keys() and "uid" not in back.non_tensor_batch
    assert back.batch["reward"].dtype == torch.float32
    assert list(back.batch.keys())[-1] == "reward"  # unrecorded columns follow the recorded tree
    assert_tensor_equal(back.batch["ref_log_prob"], dp.batch["ref_log_prob"])
    assert_tensor_equal(back.batch["extra", "values"], dp.batch["extra", "values"])


def test_edited_cells_are_cast_to_the_recorded_dtype():
    dp = sample_dataproto()
    df = to_pandas(dp)
    df.at[0, "ref_log_prob"] = np.full(7, 0.1)  # float64, not a bfloat16 value: rounded like torch
    df.at[1, "input_ids"] = np.arange(12, dtype=np.int32)
    back = from_pandas(df)
    assert_tensor_equal(back.batch["ref_log_prob"][0], torch.full((7,), 0.1).bfloat16())
    assert_tensor_equal(back.batch["ref_log_prob"][1:], dp.batch["ref_log_prob"][1:])
    assert back.batch["input_ids"].dtype == torch.int64 and back.batch["input_ids"][1].tolist() == list(range(12))


def test_from_pandas_copies():
    df = to_pandas(sample_dataproto(), copy=True)
    back = from_pandas(df)
    back.batch["input_ids"].add_(1)
    back.batch["responses_jagged"].values().add_(1)
    assert df["input_ids"][0].tolist() == sample_dataproto().batch["input_ids"][0].tolist()
    assert df["responses_jagged"][0].tolist() == sample_dataproto().batch["responses_jagged"].unbind()[0].tolist()


def test_device_argument_and_unavailable_recorded_device():
    dp = sample_dataproto()
    df = to_pandas(dp)
    assert from_pandas(df, device="cpu").batch["input_ids"].device.type == "cpu"
    df.attrs[RECORD]["columns"]["old_log_probs"]["device"] = "cuda:7"
    if not torch.cuda.is_available():
        with pytest.warns(RuntimeWarning, match="cuda:7"):
            back = from_pandas(df)
        assert back.batch["old_log_probs"].device.type == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_pandas(df, device="cpu")  # an explicit device wins, no warning


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batch_round_trips_to_cuda():
    dp = sample_dataproto().to("cuda")
    df = to_pandas(dp)
    assert isinstance(df["old_log_probs"][0], np.ndarray)
    back = from_pandas(df)
    assert back.batch["old_log_probs"].device.type == "cuda"
    assert_dataproto_equal(dp, back)


# ---------------------------------------------------------------- inference for frames of one's own


def test_inference_on_a_plain_frame():
    df = pd.DataFrame(
        {
            "ids": np.arange(3),
            "score": np.array([0.5, np.nan, 1.0], dtype=np.float32),
            "ok": [True, False, True],
            "count": pd.array([1, 2, 3], dtype="Int32"),
            "maybe": pd.array([1, None, 3], dtype="Int64"),
            "name": ["a", "b", None],
            "kind": pd.Categorical(["x", "y", "x"]),
            "when": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"]),
            "mixed": [np.zeros(2), "text", 3],
        }
    )
    dp = from_pandas(df)
    assert dp.batch.batch_size == torch.Size([3]) and dp.meta_info == {}
    assert dp.batch["ids"].dtype == torch.int64 and dp.batch["score"].dtype == torch.float32
    assert torch.isnan(dp.batch["score"][1])
    assert dp.batch["ok"].dtype == torch.bool and dp.batch["count"].dtype == torch.int32
    assert dp.non_tensor_batch["maybe"].tolist() == [1, None, 3]
    assert dp.non_tensor_batch["name"].dtype == object and dp.non_tensor_batch["name"].tolist() == ["a", "b", None]
    assert dp.non_tensor_batch["kind"].tolist() == ["x", "y", "x"]
    assert dp.non_tensor_batch["when"].dtype.kind == "M"
    assert dp.non_tensor_batch["mixed"][1] == "text"


def test_inference_of_array_cells():
    df = pd.DataFrame(
        {
            "dense": [np.full((2, 3), i, dtype=np.int16) for i in range(3)],
            "promoted": [np.zeros(2, dtype=np.int32), np.ones(2, dtype=np.int64), np.zeros(2, dtype=np.int32)],
            "jagged": [np.arange(n, dtype=np.float32) for n in (2, 0, 4)],
            "mrope": [np.arange(3 * n).reshape(3, n) for n in (1, 4, 2)],
            "strided": [np.zeros((1, 2)), np.zeros((2, 1)), np.zeros((3, 3))],
            "ranks": [np.zeros(2), np.zeros((2, 2)), np.zeros(2)],
            "strings": [np.array(["a"]), np.array(["b"]), np.array(["c"])],
        }
    )
    batch = from_pandas(df).batch
    assert batch["dense"].shape == (3, 2, 3) and batch["dense"].dtype == torch.int16
    assert batch["promoted"].dtype == torch.int64
    jagged = batch["jagged"]
    assert jagged.layout == torch.jagged and jagged._ragged_idx == 1 and jagged.dtype == torch.float32
    assert [r.shape[0] for r in jagged.unbind()] == [2, 0, 4]
    mrope = batch["mrope"]
    assert mrope.layout == torch.jagged and mrope._ragged_idx == 2
    for cell, row in zip(df["mrope"], mrope.unbind()):
        np.testing.assert_array_equal(cell, row.numpy())
    strided = batch["strided"]
    assert strided.is_nested and strided.layout == torch.strided
    assert [tuple(r.shape) for r in strided.unbind()] == [(1, 2), (2, 1), (3, 3)]
    non_tensor = from_pandas(df).non_tensor_batch
    assert set(non_tensor) == {"ranks", "strings"}  # mixed ranks and non-numeric arrays stay objects


def test_dotted_names_stay_flat_without_a_record():
    df = pd.DataFrame({"a.b": np.arange(2), 3: np.arange(2)})
    dp = from_pandas(df)
    assert list(dp.batch.keys()) == ["a.b", "3"]


def test_round_trip_through_parquet_keeps_attrs(tmp_path):
    pytest.importorskip("pyarrow.parquet")
    dp = DataProto(
        TensorDict({"x": torch.arange(4), "y": torch.randn(4).bfloat16()}, batch_size=[4]),
        {"uid": np.array(list("abcd"), dtype=object)},
        {"step": 3},
    )
    df = to_pandas(dp)
    df.to_parquet(tmp_path / "b.parquet")
    assert_dataproto_equal(dp, from_pandas(pd.read_parquet(tmp_path / "b.parquet")))


# ---------------------------------------------------------------- errors


def test_to_pandas_errors():
    with pytest.raises(EncodeError, match="expected a DataProto"):
        to_pandas([1, 2])
    dp = sample_dataproto()
    dp.non_tensor_batch["input_ids"] = np.zeros(len(dp))
    with pytest.raises(EncodeError, match="input_ids.*duplicate"):
        to_pandas(dp)
    flat_and_nested = TensorDict({"a.b": torch.zeros(2), "a": {"b": torch.ones(2)}}, batch_size=[2])
    with pytest.raises(EncodeError, match="duplicate"):
        to_pandas(flat_and_nested)


def test_from_pandas_value_errors():
    with pytest.raises(EncodeError, match="DataFrame"):
        from_pandas({"a": [1]})
    df = to_pandas(sample_dataproto())
    bad = df.copy()
    bad.at[2, "input_ids"] = np.zeros(5, dtype=np.int64)
    with pytest.raises(EncodeError, match=r"'input_ids'.*row 2 has shape \(5,\), expected \(12,\)"):
        from_pandas(bad)
    bad = df.copy()
    bad.at[0, "input_ids"] = np.full(12, 0.5)
    with pytest.raises(EncodeError, match="'input_ids'.*float64.*int64"):
        from_pandas(bad)
    bad = df.copy()
    bad.at[1, "position_ids_mrope"] = np.zeros((2, 4), dtype=np.int64)
    with pytest.raises(EncodeError, match=r"'position_ids_mrope'.*row 1 has shape \(2, 4\), expected \(3, \?\)"):
        from_pandas(bad)
    plain = to_pandas(one_column("x", torch.arange(3)))
    plain["x"] = pd.array([1, None, 3], dtype="Int64")
    with pytest.raises(EncodeError, match="'x'.*missing values"):
        from_pandas(plain)
    clash = df.copy()
    clash["extra"] = np.arange(len(df))
    with pytest.raises(EncodeError, match="'extra'.*clashes"):
        from_pandas(clash)
    with pytest.raises(EncodeError, match="duplicate column names"):
        from_pandas(pd.DataFrame({1: [1], "1": [2]}))
    meta = df.copy()
    meta.attrs[META_INFO] = [1, 2]
    with pytest.raises(EncodeError, match="meta_info"):
        from_pandas(meta)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda r: r.update(version=99),
        lambda r: r.update(batch_size="6"),
        lambda r: r.update(tree=[["extra"]]),
        lambda r: r["columns"]["input_ids"].update(kind="sparse"),
        lambda r: r["columns"]["input_ids"].update(dtype="float128"),
        lambda r: r["columns"]["responses_jagged"].update(ragged_idx=3),
        lambda r: r["columns"]["uid"].update(dtype="not a dtype"),
    ],
)
def test_malformed_record_is_a_decode_error(corrupt):
    df = to_pandas(sample_dataproto())
    corrupt(df.attrs[RECORD])
    with pytest.raises(DecodeError):
        from_pandas(df)


def test_strings_use_the_default_string_dtype_of_this_pandas():
    dp = sample_dataproto()
    df = to_pandas(dp)
    default = pd.Series(["a"]).dtype  # "str" in pandas 3, object before
    assert df["uid"].dtype == default and df["data_source"].dtype == default
    assert df["reward_model"].dtype == object  # dicts stay objects
    back = from_pandas(df)
    assert back.non_tensor_batch["uid"].dtype == object
    assert all(type(v) is str for v in back.non_tensor_batch["uid"])
    assert_dataproto_equal(dp, back)


def test_method_takes_copy_like_the_function():
    dp = sample_dataproto()
    cell = dp.to_pandas(copy=True)["input_ids"][0]
    assert cell.flags.writeable and not np.shares_memory(cell, dp.batch["input_ids"].numpy())
    assert not dp.to_pandas()["input_ids"][0].flags.writeable
