"""The DataProto container: the verl API, checked row by row against torch's own ``unbind``.

Every batch here holds dense (int64, float32, bf16, bool, float8), jagged (ragged_idx 1
and 2) and strided nested tensors, a nested TensorDict, and object and numeric
non-tensor columns, so each operation is exercised on every leaf kind.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import DataProto, DataProtoItem
from utils import assert_dataproto_equal, assert_tensor_equal, sample_dataproto, strict_equal


def rich(rows: int = 7, seed: int = 0) -> DataProto:
    """sample_dataproto plus a strided nested column, a float8 column and a numeric non-tensor column."""
    dp = sample_dataproto(rows=rows, seed=seed)
    g = torch.Generator().manual_seed(seed)
    dp.batch["strided"] = torch.nested.nested_tensor([torch.randn(i % 3, 1 + i % 2, generator=g) for i in range(rows)])
    dp.batch["fp8"] = torch.randint(0, 256, (rows, 3), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    dp.non_tensor_batch["score"] = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    return dp


def rows_of(dp: DataProto) -> dict:
    """Each column as the list of its rows, by torch's and numpy's own indexing (independent of rows.py)."""
    columns = {}
    if dp.batch is not None:
        for key, t in dp.batch.items(include_nested=True, leaves_only=True):
            columns[key] = list(t.unbind(0))
    for key, values in dp.non_tensor_batch.items():
        columns[key] = list(values)
    return columns


def column_kinds(dp: DataProto) -> dict:
    if dp.batch is None:
        return {}
    return {
        k: (t.dtype, t.layout, t.is_nested, getattr(t, "_ragged_idx", None) if t.layout == torch.jagged else None)
        for k, t in dp.batch.items(include_nested=True, leaves_only=True)
    }


def assert_rows(result: DataProto, source: DataProto, index: list[int]) -> None:
    """``result`` holds rows ``index`` of ``source``: same keys in the same order, kinds, bits, meta_info."""
    assert isinstance(result, DataProto)
    assert len(result) == len(index)
    assert column_kinds(result) == column_kinds(source)
    got, want = rows_of(result), rows_of(source)
    assert list(got) == list(want)
    for key in want:
        assert len(got[key]) == len(index), key
        for i, j in enumerate(index):
            if isinstance(want[key][j], torch.Tensor):
                assert_tensor_equal(want[key][j], got[key][i], f"{key}[{i}]")
            else:
                assert strict_equal(want[key][j], got[key][i]), (key, i)
    if result.batch is not None:
        assert result.batch.batch_size[1:] == source.batch.batch_size[1:]
    assert strict_equal(result.meta_info, source.meta_info)


# ---------------------------------------------------------------- construction


def test_from_dict():
    tensors = {"a": torch.arange(8).view(4, 2), "b": torch.ones(4, dtype=torch.bfloat16)}
    dp = DataProto.from_dict(tensors, {"s": ["w", "x", "y", "z"], "n": np.arange(4)}, {"step": 2})
    assert dp.batch.batch_size == (4,) and list(dp.batch.keys()) == ["a", "b"]
    assert dp.batch["a"] is tensors["a"]
    assert dp.non_tensor_batch["s"].dtype == object and dp.non_tensor_batch["s"].tolist() == ["w", "x", "y", "z"]
    assert dp.non_tensor_batch["n"].dtype == np.arange(4).dtype
    assert dp.meta_info == {"step": 2} and len(dp) == 4
    two = DataProto(TensorDict({"a": torch.zeros(4, 3, 2)}, batch_size=[4, 3]))  # from_dict refuses, as verl
    assert two.batch.batch_size == (4, 3) and len(two) == 4
    only = DataProto.from_dict(non_tensors={"s": ["a", "b"]})
    assert only.batch is None and len(only) == 2
    with pytest.raises(ValueError):
        DataProto.from_dict({"a": torch.zeros(4)}, {"s": ["too", "short"]})


def test_from_dict_list_of_lists_stays_one_object_per_row():
    dp = DataProto.from_dict({"a": torch.zeros(2)}, {"msgs": [[{"role": "user"}], [{"role": "user"}, {"role": "bot"}]]})
    assert dp.non_tensor_batch["msgs"].shape == (2,)
    assert dp.non_tensor_batch["msgs"][1] == [{"role": "user"}, {"role": "bot"}]


def test_from_single_dict():
    dp = DataProto.from_single_dict(
        {"a": torch.zeros(3, 2), "s": np.array(["x", "y", "z"], dtype=object)}, meta_info={"k": 1}
    )
    assert list(dp.batch.keys()) == ["a"] and list(dp.non_tensor_batch) == ["s"] and dp.meta_info == {"k": 1}
    with pytest.raises(TypeError, match="'bad'"):
        DataProto.from_single_dict({"a": torch.zeros(3), "bad": [1, 2, 3]})


def test_constructor_checks():
    with pytest.raises(TypeError):
        DataProto(batch={"a": torch.zeros(2)})
    with pytest.raises(ValueError):
        DataProto(TensorDict({"a": torch.zeros(2)}, batch_size=[]))
    with pytest.raises(ValueError):
        DataProto(TensorDict({"a": torch.zeros(2)}, [2]), {"s": np.array("scalar", dtype=object)})


def test_len():
    assert len(rich(5)) == 5
    assert len(DataProto(None, {"s": np.arange(3)})) == 3
    assert len(DataProto()) == 0
    assert len(DataProto(TensorDict({}, batch_size=[4]))) == 4


# ---------------------------------------------------------------- indexing


@pytest.mark.parametrize("i", [0, 3, 6, -1, -7, np.int64(2), torch.tensor(4)])
def test_int_index_gives_an_item(i):
    dp = rich(7)
    item = dp[i]
    j = int(i) % 7
    assert isinstance(item, DataProtoItem)
    assert item.batch.batch_size == ()
    assert list(item.batch.keys(include_nested=True, leaves_only=True)) == list(
        dp.batch.keys(include_nested=True, leaves_only=True)
    )
    for key, column in rows_of(dp).items():
        value = (
            item.batch[key]
            if key in item.batch.keys(include_nested=True, leaves_only=True)
            else item.non_tensor_batch[key]
        )
        if isinstance(column[j], torch.Tensor):
            assert not value.is_nested
            assert_tensor_equal(column[j], value, str(key))
        else:
            assert strict_equal(column[j], value), key
    assert item.batch["position_ids_mrope"].shape[0] == 3  # ragged_idx 2: a [3, n] row
    assert item.meta_info == dp.meta_info


@pytest.mark.parametrize("i", [7, -8, 100])
def test_int_index_out_of_range(i):
    with pytest.raises(IndexError):
        rich(7)[i]


@pytest.mark.parametrize(
    "item",
    [
        slice(2, 5),
        slice(None),
        slice(0, 0),
        slice(5, 2),
        slice(-3, None),
        slice(1, 7, 2),
        slice(None, None, -1),
        slice(6, 0, -3),
        slice(0, 100),
    ],
    ids=str,
)
def test_slice(item):
    dp = rich(7)
    assert_rows(dp[item], dp, list(range(7))[item])


def test_slice_method():
    dp = rich(7)
    assert_rows(dp.slice(1, 6, 2), dp, [1, 3, 5])
    assert_rows(dp.slice(), dp, list(range(7)))


def test_step_one_slice_is_a_view():
    dp = rich(7)
    piece = dp[2:5]
    assert piece.batch["input_ids"].data_ptr() == dp.batch["input_ids"][2].data_ptr()
    assert piece.batch["responses_jagged"].values().data_ptr() >= dp.batch["responses_jagged"].values().data_ptr()


@pytest.mark.parametrize(
    "make_index, expected",
    [
        (lambda: [4, 0, 0, 6], [4, 0, 0, 6]),
        (lambda: [-1, -7], [6, 0]),
        (lambda: [], []),
        (lambda: np.array([3, 1], dtype=np.int32), [3, 1]),
        (lambda: torch.tensor([5, 2, 5]), [5, 2, 5]),
        (lambda: np.array([True, False, True, False, False, False, True]), [0, 2, 6]),
        (lambda: torch.tensor([False] * 6 + [True]), [6]),
        (lambda: np.zeros(7, dtype=bool), []),
    ],
    ids=["list", "negative", "empty", "numpy", "tensor", "numpy_mask", "tensor_mask", "empty_mask"],
)
def test_index_arrays_and_masks(make_index, expected):
    dp = rich(7)
    assert_rows(dp[make_index()], dp, expected)
    assert_rows(dp.select_idxs(make_index()), dp, expected)


@pytest.mark.parametrize(
    "index",
    [
        [0, 7],
        [-8],
        np.array([True, False]),
        torch.ones(8, dtype=torch.bool),
        np.array([0.5, 1.0]),
        torch.zeros(2, 2, dtype=torch.int64),
    ],
    ids=["too_big", "too_negative", "short_mask", "long_mask", "floats", "two_dimensional"],
)
def test_bad_index_raises_index_error(index):
    with pytest.raises(IndexError):
        rich(7)[index]


def test_index_results_round_trip_through_the_codec():
    dp = rich(7)
    for piece in (dp[1:4], dp[[6, 0, 3]], dp[::-2], dp[5:5]):
        assert_dataproto_equal(piece, adp.from_ipc(adp.to_ipc(piece)))


# ---------------------------------------------------------------- keys


def test_select():
    dp = rich(5)
    picked = dp.select(
        batch_keys=["input_ids", "position_ids_mrope", "extra"],
        non_tensor_batch_keys=["uid"],
        meta_info_keys=["temperature"],
    )
    assert set(picked.batch.keys()) == {"input_ids", "position_ids_mrope", "extra"}
    assert list(picked.non_tensor_batch) == ["uid"] and picked.meta_info == {"temperature": 0.7}
    assert picked.batch["input_ids"].data_ptr() == dp.batch["input_ids"].data_ptr()
    assert picked.batch["position_ids_mrope"]._ragged_idx == 2
    everything = dp.select()
    assert_dataproto_equal(dp, everything)
    deep = dp.select(batch_keys=["input_ids", "responses_jagged"], deepcopy=True)
    assert deep.batch["input_ids"].data_ptr() != dp.batch["input_ids"].data_ptr()
    assert deep.batch["responses_jagged"].values().data_ptr() != dp.batch["responses_jagged"].values().data_ptr()
    assert_tensor_equal(dp.batch["responses_jagged"], deep.batch["responses_jagged"])
    with pytest.raises(KeyError):
        dp.select(non_tensor_batch_keys=["missing"])


def test_pop():
    dp = rich(5)
    original = copy.deepcopy(dp)
    popped = dp.pop(
        batch_keys=["position_ids_mrope", "strided"], non_tensor_batch_keys=["uid"], meta_info_keys=["global_steps"]
    )
    assert list(popped.batch.keys()) == ["position_ids_mrope", "strided"]
    assert_tensor_equal(original.batch["position_ids_mrope"], popped.batch["position_ids_mrope"])
    assert_tensor_equal(original.batch["strided"], popped.batch["strided"])
    assert popped.batch.batch_size == (5,)
    assert list(popped.non_tensor_batch) == ["uid"] and popped.meta_info == {"global_steps": 3}
    assert "position_ids_mrope" not in dp.batch.keys() and "uid" not in dp.non_tensor_batch
    assert "global_steps" not in dp.meta_info


def test_union_adds_keys_and_accepts_equal_overlap():
    dp = rich(5)
    left = dp.select(
        batch_keys=["input_ids", "responses_jagged"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"]
    )
    right = copy.deepcopy(
        dp.select(
            batch_keys=["responses_jagged", "position_ids_mrope", "strided"], non_tensor_batch_keys=["uid", "score"]
        )
    )
    result = left.union(right)
    assert result is left
    assert list(result.batch.keys()) == ["input_ids", "responses_jagged", "position_ids_mrope", "strided"]
    assert list(result.non_tensor_batch) == ["uid", "score"]
    assert result.meta_info == dp.meta_info
    assert_tensor_equal(dp.batch["position_ids_mrope"], result.batch["position_ids_mrope"])
    no_batch = DataProto(None, {"uid": dp.non_tensor_batch["uid"]}).union(
        dp.select(batch_keys=["input_ids"], non_tensor_batch_keys=[])
    )
    assert list(no_batch.batch.keys()) == ["input_ids"]


def test_union_with_itself_is_unchanged():
    dp = rich(5)
    assert_dataproto_equal(rich(5), dp.union(copy.deepcopy(dp)))


@pytest.mark.parametrize("conflict", ["dense", "jagged", "nested_td", "non_tensor", "meta_info", "batch_size"])
def test_union_conflicts_raise(conflict):
    dp = rich(5)
    other = copy.deepcopy(dp)
    if conflict == "dense":
        other.batch["input_ids"][0, 0] += 1
    elif conflict == "jagged":
        other.batch["responses_jagged"].values()[0] += 1
    elif conflict == "nested_td":
        other.batch["extra", "values"][0, 0] += 1
    elif conflict == "non_tensor":
        other.non_tensor_batch["uid"][0] = "other"
    elif conflict == "meta_info":
        other.meta_info["temperature"] = 1.0
    else:
        other = DataProto(TensorDict({"input_ids": torch.zeros(4, 12)}, batch_size=[4]))
    with pytest.raises(ValueError):
        dp.union(other)


# ---------------------------------------------------------------- chunk, split, concat, repeat


@pytest.mark.parametrize("rows, chunks", [(7, 1), (7, 2), (7, 3), (7, 7), (8, 4), (3, 5), (0, 2)])
def test_array_split_gives_exactly_n_balanced_pieces(rows, chunks):
    dp = rich(rows) if rows else rich(4)[0:0]
    pieces = dp.array_split(chunks)
    assert len(pieces) == chunks
    sizes = [len(p) for p in pieces]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    start = 0
    for piece, size in zip(pieces, sizes):
        assert_rows(piece, dp, list(range(start, start + size)))
        start += size


def test_chunk_refuses_zero():
    with pytest.raises(ValueError):
        rich(3).chunk(0)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 10])
def test_split(size):
    dp = rich(7)
    pieces = dp.split(size)
    bounds = list(range(0, 7, size)) + [7]
    assert [len(p) for p in pieces] == [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    for piece, (a, b) in zip(pieces, zip(bounds[:-1], bounds[1:])):
        assert_rows(piece, dp, list(range(a, b)))
    with pytest.raises(ValueError):
        dp.split(0)


def test_concat_of_chunks_is_the_original():
    dp = rich(7)
    for chunks in (1, 2, 3, 9):
        assert_dataproto_equal(dp, DataProto.concat(dp.array_split(chunks)))


def test_concat_of_arbitrary_pieces():
    dp = rich(7)
    result = DataProto.concat([dp[[5, 1]], dp[0:0], dp[[6]], dp[2:4]])
    assert_rows(result, dp, [5, 1, 6, 2, 3])
    assert result.batch["position_ids_mrope"]._ragged_idx == 2


def test_concat_merges_meta_info_later_pieces_win():
    a, b = rich(2), rich(3, seed=1)
    a.meta_info = {"x": 1, "y": 2}
    b.meta_info = {"y": 3, "z": 4}
    assert DataProto.concat([a, b], meta_info="update").meta_info == {"x": 1, "y": 3, "z": 4}


def test_concat_with_a_two_dimensional_batch():
    td = TensorDict(
        {"a": torch.arange(30).view(5, 3, 2), "sub": TensorDict({"b": torch.ones(5, 3)}, [5, 3])}, batch_size=[5, 3]
    )
    dp = DataProto(td, {"s": np.array(list("abcde"), dtype=object)})
    result = DataProto.concat([dp[3:], dp[:3]])
    assert result.batch.batch_size == (5, 3)
    assert_rows(result, dp, [3, 4, 0, 1, 2])
    assert_rows(dp.repeat(2), dp, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])


@pytest.mark.parametrize(
    "mismatch",
    ["batch_key", "nested_key", "non_tensor_key", "batch_and_none", "empty"],
)
def test_concat_mismatches_raise(mismatch):
    a, b = rich(3), rich(2, seed=1)
    if mismatch == "batch_key":
        b.batch.rename_key_("input_ids", "other")
    elif mismatch == "nested_key":
        b.batch["extra"].rename_key_("values", "other")
    elif mismatch == "non_tensor_key":
        b.non_tensor_batch.pop("uid")
    elif mismatch == "batch_and_none":
        b = DataProto(None, b.non_tensor_batch)
    pieces = [] if mismatch == "empty" else [a, b]
    with pytest.raises(ValueError):
        DataProto.concat(pieces)


@pytest.mark.parametrize("times", [1, 2, 3])
@pytest.mark.parametrize("interleave", [True, False])
def test_repeat(times, interleave):
    dp = rich(4)
    expected = (
        [i for i in range(4) for _ in range(times)] if interleave else [i for _ in range(times) for i in range(4)]
    )
    assert_rows(dp.repeat(times, interleave=interleave), dp, expected)


# ---------------------------------------------------------------- devices and copies


def test_to_cpu_moves_in_place():
    dp = rich(4)
    assert dp.to("cpu") is dp
    assert dp.batch.device == torch.device("cpu")
    assert all(t.device.type == "cpu" for t in dp.batch.values(include_nested=True, leaves_only=True))
    assert DataProto(None, {"s": np.arange(2)}).to("cpu").batch is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_cuda_and_back():
    dp = rich(5)
    reference = copy.deepcopy(dp)
    dp.to("cuda")
    assert dp.batch.device.type == "cuda"
    assert dp.batch["position_ids_mrope"].is_cuda and dp.batch["position_ids_mrope"]._ragged_idx == 2
    assert_rows(dp[[4, 0]].to("cpu"), reference, [4, 0])
    assert_dataproto_equal(reference, dp.to("cpu"))


def test_copy_shares_tensors_but_not_dicts():
    dp = rich(4)
    shallow = copy.copy(dp)
    assert shallow.batch["input_ids"].data_ptr() == dp.batch["input_ids"].data_ptr()
    shallow.non_tensor_batch["new"] = np.zeros(4)
    shallow.meta_info["new"] = 1
    assert "new" not in dp.non_tensor_batch and "new" not in dp.meta_info


def test_deepcopy_owns_everything():
    dp = rich(4)
    deep = copy.deepcopy(dp)
    assert_dataproto_equal(dp, deep)
    for key, t in dp.batch.items(include_nested=True, leaves_only=True):
        other = deep.batch[key]
        if t.layout == torch.jagged:
            assert other.values().data_ptr() != t.values().data_ptr(), key
        elif not t.is_nested:
            assert other.data_ptr() != t.data_ptr(), key
    deep.meta_info["global_token_num"].append(0)
    deep.non_tensor_batch["reward_model"][0]["style"] = "changed"
    assert dp.meta_info["global_token_num"] != deep.meta_info["global_token_num"]
    assert dp.non_tensor_batch["reward_model"][0]["style"] == "rule"


def test_operations_without_a_batch():
    dp = DataProto(None, {"uid": np.array(list("abcde"), dtype=object), "n": np.arange(10).reshape(5, 2)}, {"k": 1})
    assert_rows(dp[1:4], dp, [1, 2, 3])
    assert_rows(dp[[4, 0]], dp, [4, 0])
    assert dp[2].batch is None and dp[2].non_tensor_batch["uid"] == "c"
    assert_rows(dp.repeat(2, interleave=False), dp, [0, 1, 2, 3, 4] * 2)
    assert [len(p) for p in dp.array_split(2)] == [3, 2]
    assert_dataproto_equal(dp, DataProto.concat(dp.array_split(3)))


def test_read_only_numpy_index_selects_rows_without_warnings():
    """A read-only mask (what pandas hands out) indexes rows like a writable one, silently."""
    import warnings

    dp = DataProto(TensorDict({"x": torch.arange(5)}, batch_size=[5]))
    mask = np.array([True, False, True, False, True])
    mask.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dp[mask].batch["x"].tolist() == [0, 2, 4]
        assert dp.select_idxs(np.flatnonzero(mask)).batch["x"].tolist() == [0, 2, 4]
