"""verl 0.9.1's DataProto API on our container.

Two parts:

* everywhere: each verl method and module helper on every leaf kind we hold (dense,
  jagged with ragged_idx 1 and 2, strided nested, a nested TensorDict, object and
  numeric non-tensor columns), checked row by row against torch's own ``unbind``;
  the errors' classes; files written by verl's ``save_to_disk`` (built here without verl);
* with verl installed (the compat environment, marker ``verl``): differential tests. The
  real ``verl.protocol.DataProto`` and ours run the same operations on the same
  hypothesis-drawn inputs (row counts, chunk counts, masks, index lists, meta_info
  merges, padding) and must give the same values, or both raise (ours an exception
  that is also an instance of verl's). Where verl fails or changes its input, the
  documented difference is checked on its own (``DIFFERENCES``).
"""

from __future__ import annotations

import copy
import os
import pickle
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import DataProto, DataProtoItem
from arrow_dataproto import verl_api
from arrow_dataproto.errors import (
    ArgumentTypeError,
    BatchError,
    DataProtoError,
    KeyNotFoundError,
    PickleNotAllowedError,
    RowIndexError,
)
from arrow_dataproto.testing import assert_dataproto_equal, assert_tensor_equal, sample_dataproto, strict_equal


def every_kind(rows: int = 6, seed: int = 0) -> DataProto:
    """sample_dataproto (dense, jagged ragged_idx 1 and 2, nested TensorDict, objects) plus strided nested and numbers."""
    dp = sample_dataproto(rows=rows, seed=seed)
    g = torch.Generator().manual_seed(seed)
    dp.batch["strided"] = torch.nested.nested_tensor([torch.randn(1 + i % 3, 2, generator=g) for i in range(rows)])
    dp.non_tensor_batch["score"] = np.arange(rows, dtype=np.float32)
    return dp


def assert_rows(result: DataProto, source: DataProto, index: list[int], meta_info: dict | None = None) -> None:
    """``result`` holds rows ``index`` of ``source`` (every column, bit for bit, same kinds), and ``meta_info``."""
    assert len(result) == len(index)
    want_keys = list(source.batch.keys(include_nested=True, leaves_only=True))
    assert list(result.batch.keys(include_nested=True, leaves_only=True)) == want_keys
    for key in want_keys:
        got, want = result.batch[key], source.batch[key]
        assert got.layout == want.layout and getattr(got, "_ragged_idx", None) == getattr(want, "_ragged_idx", None), key
        rows_got, rows_want = got.unbind(0), want.unbind(0)
        assert len(rows_got) == len(index), key
        for i, j in enumerate(index):
            assert_tensor_equal(rows_want[j], rows_got[i], f"{key}[{i}]")
    assert list(result.non_tensor_batch) == list(source.non_tensor_batch)
    for key, values in source.non_tensor_batch.items():
        assert strict_equal(values[index] if len(index) else values[:0], result.non_tensor_batch[key]), key
    assert strict_equal(result.meta_info, source.meta_info if meta_info is None else meta_info)


# ---------------------------------------------------------------- errors


def test_errors_are_the_librarys_and_what_verl_raises():
    assert issubclass(BatchError, (DataProtoError)) and issubclass(BatchError, AssertionError)
    assert issubclass(BatchError, ValueError)
    assert issubclass(KeyNotFoundError, KeyError) and issubclass(KeyNotFoundError, AssertionError)
    assert issubclass(KeyNotFoundError, adp.ColumnNotFoundError)
    assert issubclass(RowIndexError, IndexError) and issubclass(RowIndexError, DataProtoError)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)
    dp = every_kind(6)
    cases = [
        (lambda: dp.chunk(4), BatchError),
        (lambda: dp.chunk(0), BatchError),
        (lambda: dp[6], RowIndexError),
        (lambda: dp["input_ids"], ArgumentTypeError),
        (lambda: dp.pop(batch_keys=["missing"]), KeyNotFoundError),
        (lambda: dp.rename(("a",), ("b",)), ArgumentTypeError),
        (lambda: dp.make_iterator(4, 1), BatchError),
        (lambda: DataProto.from_single_dict({"x": [1, 2]}), ArgumentTypeError),
        (lambda: DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)}), BatchError),
        (lambda: DataProto.concat([]), BatchError),
        (lambda: DataProto.concat([dp], meta_info="last"), ArgumentTypeError),
        (lambda: dp.sample_level_repeat([1] * 5), BatchError),
        (lambda: dp.unfold_column_chunks(2, ["responses_jagged"]), BatchError),
    ]
    for call, error in cases:
        with pytest.raises(error):
            call()
    assert len(dp) == 6 and "input_ids" in dp.batch.keys()  # nothing popped by the failed pop


# ---------------------------------------------------------------- construction


def test_from_dict_follows_verl():
    with pytest.raises(BatchError, match="num_batch_dims"):
        DataProto.from_dict({"a": torch.zeros(4, 3)}, num_batch_dims=2)
    dp = DataProto.from_dict({"a": torch.zeros(3)}, {"pair": [[1, 2], [3, 4], [5, 6]], "ragged": [[1], [], [2, 3]]})
    assert dp.non_tensor_batch["pair"].shape == (3, 2) and dp.non_tensor_batch["pair"].dtype == object
    assert dp.non_tensor_batch["ragged"].shape == (3,) and dp.non_tensor_batch["ragged"][2] == [2, 3]
    meta = {"k": 1}
    padded = DataProto.from_single_dict({"a": torch.zeros(3)}, meta_info=meta, auto_padding=True)
    assert padded.is_padding_enabled() and meta == {"k": 1}
    assert not DataProto.from_dict({"a": torch.zeros(3)}).is_padding_enabled()

    class Sub(DataProto):
        pass

    sub = Sub.from_single_dict({"a": torch.arange(4)})
    assert type(sub) is Sub and all(type(p) is Sub for p in [sub[1:], sub[[0]], *sub.chunk(2), sub.repeat(2)])
    assert type(Sub.concat([sub, sub])) is Sub


def test_a_batch_of_several_dimensions_through_the_constructor():
    td = TensorDict({"a": torch.arange(24).view(4, 3, 2)}, batch_size=[4, 3])
    dp = DataProto(td)
    assert len(dp) == 4 and dp.batch.batch_size == (4, 3)
    assert dp.chunk(2)[1].batch.batch_size == (2, 3)


# ---------------------------------------------------------------- rows


@pytest.mark.parametrize("rows, chunks", [(6, 1), (6, 2), (6, 3), (6, 6), (0, 3)])
def test_chunk_gives_equal_views(rows, chunks):
    dp = every_kind(rows) if rows else every_kind(3)[0:0]
    pieces = dp.chunk(chunks)
    assert [len(p) for p in pieces] == [rows // chunks] * chunks
    for i, piece in enumerate(pieces):
        size = rows // chunks
        assert_rows(piece, dp, list(range(i * size, (i + 1) * size)))
    if rows:
        assert pieces[-1].batch["input_ids"].data_ptr() == dp.batch["input_ids"][rows - rows // chunks].data_ptr()


@pytest.mark.parametrize(
    "rows, chunks, sizes", [(7, 3, [3, 3, 1]), (10, 4, [3, 3, 3, 1]), (5, 5, [1] * 5), (9, 2, [5, 4])]
)
def test_chunk_with_padding_enabled_sizes_as_torch_chunk(rows, chunks, sizes, monkeypatch):
    dp = every_kind(rows)
    dp.meta_info[verl_api.AUTO_PADDING_KEY] = True
    assert [len(p) for p in dp.chunk(chunks)] == sizes
    assert_dataproto_equal(dp, DataProto.concat(dp.chunk(chunks)))
    no_batch = DataProto(None, dp.non_tensor_batch, dp.meta_info)
    assert [len(p) for p in no_batch.chunk(chunks)] == [len(p) for p in np.array_split(np.arange(rows), chunks)]
    plain = every_kind(rows)
    for enable in (lambda: setattr(adp.DataProtoConfig, "auto_padding", True), lambda: monkeypatch.setenv("VERL_AUTO_PADDING", "1")):
        monkeypatch.setattr(adp.DataProtoConfig, "_config", {})
        enable()
        assert plain.is_padding_enabled() and [len(p) for p in plain.chunk(chunks)] == sizes
        monkeypatch.delenv("VERL_AUTO_PADDING", raising=False)
    monkeypatch.setattr(adp.DataProtoConfig, "_config", {})
    with pytest.raises(BatchError):
        adp.DataProtoConfig.auto_padding = "yes"


def test_chunk_with_padding_that_torch_chunk_cannot_cut_raises():
    dp = every_kind(6)
    dp.meta_info[verl_api.AUTO_PADDING_KEY] = True
    with pytest.raises(BatchError, match="pad_dataproto_to_divisor"):
        dp.chunk(4)  # torch.chunk: 2 + 2 + 2


def test_reorder_in_place():
    dp = every_kind(5)
    reference = copy.deepcopy(dp)
    meta = dp.meta_info
    assert dp.reorder(torch.tensor([3, 4, 2, 0, 1])) is None
    assert_rows(dp, reference, [3, 4, 2, 0, 1])
    assert dp.meta_info is meta
    dp.reorder([0, 0, 1])
    assert_rows(dp, reference, [3, 3, 4])


@pytest.mark.parametrize("counts", [[3, 0, 1, 2], (1, 1, 1, 1), torch.tensor([0, 0, 0, 2]), np.array([2, 1, 0, 0])])
def test_sample_level_repeat(counts):
    dp = every_kind(4)
    listed = counts.tolist() if hasattr(counts, "tolist") else list(counts)
    assert_rows(dp.sample_level_repeat(counts), dp, [i for i, c in enumerate(listed) for _ in range(c)])


def test_unfold_column_chunks_splits_dense_and_repeats_every_other_kind():
    dp = every_kind(3)
    dp.non_tensor_batch["pair"] = np.array([["a1", "a2"], ["b1", "b2"], ["c1", "c2"]], dtype=object)
    out = dp.unfold_column_chunks(2, split_keys=["attention_mask", "pair"])
    repeated = [0, 0, 1, 1, 2, 2]
    width = dp.batch["attention_mask"].shape[1]
    assert width % 2 == 0
    assert torch.equal(out.batch["attention_mask"], dp.batch["attention_mask"].reshape(6, width // 2))
    assert out.non_tensor_batch["pair"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]
    rest = out.select(batch_keys=[k for k in dp.batch.keys() if k != "attention_mask"],
                      non_tensor_batch_keys=[k for k in dp.non_tensor_batch if k != "pair"])
    source = dp.select(batch_keys=[k for k in dp.batch.keys() if k != "attention_mask"],
                       non_tensor_batch_keys=[k for k in dp.non_tensor_batch if k != "pair"])
    assert_rows(rest, source, repeated)
    assert_rows(dp.unfold_column_chunks(3), dp, [0, 0, 0, 1, 1, 1, 2, 2, 2])


def test_padding_in_place():
    dp = every_kind(4)
    reference = copy.deepcopy(dp)
    dp.padding(0)
    assert_rows(dp, reference, [0, 1, 2, 3])
    dp.padding(2, "first")
    assert_rows(dp, reference, [0, 1, 2, 3, 0, 0])
    dp.padding(1)
    assert_rows(dp, reference, [0, 1, 2, 3, 0, 0, 0])
    with pytest.raises(RowIndexError):
        every_kind(2)[0:0].padding(1)


@pytest.mark.parametrize("size, pad", [(1, 0), (2, 1), (3, 0), (4, 1), (7, 4), (11, 8)])
def test_pad_and_unpad(size, pad):
    dp = every_kind(3)
    padded, pad_size = verl_api.pad_dataproto_to_divisor(dp, size)
    assert pad_size == pad and len(padded) % size == 0
    assert_rows(padded, dp, [i % 3 for i in range(3 + pad)])
    assert_dataproto_equal(dp, verl_api.unpad_dataproto(padded, pad_size))


def test_make_iterator_yields_copies_of_every_kind():
    dp = every_kind(8)
    pieces = list(dp.make_iterator(mini_batch_size=2, epochs=2))
    assert len(pieces) == 8 and all(p.meta_info is dp.meta_info for p in pieces)
    for i, piece in enumerate(pieces):
        assert_rows(piece, dp, [2 * (i % 4), 2 * (i % 4) + 1])
    shuffled = [p.non_tensor_batch["uid"].tolist() for p in dp.make_iterator(4, 1, seed=3, dataloader_kwargs={"shuffle": True})]
    again = [p.non_tensor_batch["uid"].tolist() for p in dp.make_iterator(4, 1, seed=3, dataloader_kwargs={"shuffle": True})]
    assert shuffled == again and sorted(sum(shuffled, [])) == sorted(dp.non_tensor_batch["uid"].tolist())
    assert all(p.non_tensor_batch["score"].dtype == np.float32 for p in dp.make_iterator(4, 1))


# ---------------------------------------------------------------- keys


def test_deepcopy_of_a_batch_with_a_device_and_a_strided_column():
    dp = every_kind(3).to("cpu")
    for copied in (copy.deepcopy(dp), dp.select(deepcopy=True)):
        assert copied.batch.device == torch.device("cpu")
        assert_dataproto_equal(dp, copied)
        assert copied.batch["input_ids"].data_ptr() != dp.batch["input_ids"].data_ptr()


def test_select_keeps_this_order_and_refuses_missing_keys():
    dp = every_kind(3)
    picked = dp.select(non_tensor_batch_keys=["score", "uid"], meta_info_keys=["global_steps", "temperature"])
    assert list(picked.non_tensor_batch) == ["uid", "score"] and list(picked.meta_info) == ["temperature", "global_steps"]
    with pytest.raises(KeyNotFoundError):
        dp.select(meta_info_keys=["missing"])
    with pytest.raises(KeyNotFoundError):
        DataProto(None, {"s": np.arange(2)}).select(batch_keys=["a"])


def test_rename_pairs_of_keys():
    dp = every_kind(3)
    jagged = dp.batch["position_ids_mrope"]
    assert dp.rename("input_ids", "ids") is dp
    dp.rename(["ids", "position_ids_mrope"], ["input_ids", "mrope"])
    assert list(dp.batch.keys())[-2:] == ["input_ids", "mrope"] and dp.batch["mrope"] is jagged
    with pytest.raises(BatchError):
        dp.rename(["a", "b"], ["c"])
    with pytest.raises(KeyNotFoundError):
        dp.rename("missing", "other")


def test_union_changes_nothing_when_it_raises():
    dp = every_kind(3)
    left = dp.select(batch_keys=["input_ids"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    other = dp.select(batch_keys=["input_ids", "strided"], non_tensor_batch_keys=["score"], meta_info_keys=["temperature"])
    other.meta_info["global_steps"] = -1
    left.meta_info["global_steps"] = 3
    with pytest.raises(BatchError, match="global_steps"):
        left.union(other)
    assert list(left.batch.keys()) == ["input_ids"] and list(left.non_tensor_batch) == ["uid"]


def test_union_helpers_follow_verls_equality():
    verl_api.union_numpy_dict({"a": np.array([1.0, np.nan])}, {"a": np.array([1.0, np.nan])})
    verl_api.union_numpy_dict({"s": np.array(["x", "y"])}, {"s": np.array(["x", "y"])})
    circular_a, circular_b = np.array([None], dtype=object), np.array([None], dtype=object)
    circular_a[0], circular_b[0] = circular_a, circular_b
    verl_api.union_numpy_dict({"c": circular_a}, {"c": circular_b})
    for left, right in [
        (np.array([1.0, np.nan]), np.array([np.nan, 1.0])),
        (np.array([1, 2]), np.array([1.0, 2.0])),  # dtypes differ
        (np.array([float("nan"), "nan"], dtype=object), np.array(["nan", "nan"], dtype=object)),
        (circular_a, np.array([None], dtype=object)),
    ]:
        with pytest.raises(BatchError):
            verl_api.union_numpy_dict({"a": left}, {"a": right})
    td = TensorDict({"x": torch.arange(3)}, [3])
    assert verl_api.union_tensor_dict(td, TensorDict({"x": torch.arange(3.0), "y": torch.ones(3)}, [3])) is td
    assert td["x"].dtype == torch.int64 and list(td.keys()) == ["x", "y"]
    with pytest.raises(BatchError):
        verl_api.union_tensor_dict(td, TensorDict({"x": torch.arange(3) + 1}, [3]))


# ---------------------------------------------------------------- concat's meta_info


@pytest.mark.parametrize(
    "metas, merged",
    [
        ([{"m": 1}, {"m": 1, "n": 2}, {"o": 3}], {"m": 1, "n": 2, "o": 3}),
        ([{"metrics": [{"loss": 1}]}, {"metrics": {"loss": 2}}, {"metrics": None}], {"metrics": {"loss": [1, 2]}}),
        ([{}, {"metrics": [{"a": 1, "b": 2}, {"a": 3}]}], {"metrics": {"a": [1, 3], "b": [2]}}),
        ([{"metrics": []}, {"k": np.array([1, 2])}, {"k": np.array([1, 2])}], {"k": np.array([1, 2])}),
    ],
)
def test_concat_merges_meta_info_as_verl(metas, merged):
    pieces = [every_kind(2, seed=i) for i in range(len(metas))]
    for piece, meta in zip(pieces, metas):
        piece.meta_info = meta
    assert strict_equal(DataProto.concat(pieces).meta_info, merged)


@pytest.mark.parametrize("metas", [[{"k": 1}, {"k": 2}], [{"metrics": {"a": 1}}, {"metrics": {"b": 1}}], [{"k": np.arange(2)}, {"k": np.arange(3)}]])
def test_concat_conflicts_raise_unless_later_wins_is_asked_for(metas):
    pieces = [every_kind(2, seed=i) for i in range(len(metas))]
    for piece, meta in zip(pieces, metas):
        piece.meta_info = meta
    with pytest.raises(BatchError):
        DataProto.concat(pieces)
    assert strict_equal(DataProto.concat(pieces, meta_info="update").meta_info, {**metas[0], **metas[1]})


def test_concat_takes_keys_in_any_order():
    a, b = every_kind(2), every_kind(3, seed=1)
    b.non_tensor_batch = dict(reversed(list(b.non_tensor_batch.items())))
    b.batch = b.batch.select(*reversed(list(b.batch.keys())))
    b.meta_info = a.meta_info
    joined = DataProto.concat([a, b])
    assert list(joined.batch.keys()) == list(a.batch.keys()) and list(joined.non_tensor_batch) == list(a.non_tensor_batch)
    assert_rows(joined[2:], every_kind(3, seed=1), [0, 1, 2], a.meta_info)


# ---------------------------------------------------------------- conversions, files, text


def test_tensordict_round_trip_keeps_every_kind():
    dp = every_kind(4)
    td = dp.to_tensordict()
    assert td.batch_size == (4,) and td["temperature"] == dp.meta_info["temperature"]
    assert td["responses_jagged"] is dp.batch["responses_jagged"]
    back = DataProto.from_tensordict(td)
    assert back.non_tensor_batch["score"].dtype == object  # as verl: every non-tensor column comes back as objects
    assert back.non_tensor_batch["score"].tolist() == dp.non_tensor_batch["score"].tolist()
    back.non_tensor_batch["score"] = dp.non_tensor_batch["score"]
    assert_dataproto_equal(dp, back)
    meta = {"given": 1}
    assert DataProto.from_tensordict(td, meta_info=meta).meta_info["given"] == 1 and meta == {"given": 1}
    only_values = DataProto(None, {"s": np.array(["a", "b"], dtype=object)}, {"k": 1})
    assert_dataproto_equal(only_values, DataProto.from_tensordict(only_values.to_tensordict()))
    with pytest.raises(BatchError):
        DataProto(dp.batch, {"input_ids": np.arange(4)}).to_tensordict()


def test_save_and_load_an_arrow_file(tmp_path):
    dp = every_kind(5)
    dp.save_to_disk(tmp_path / "dp.arrow")
    assert (tmp_path / "dp.arrow").read_bytes()[:6] == b"ARROW1"
    assert_dataproto_equal(dp, DataProto.load_from_disk(tmp_path / "dp.arrow"))
    dp.meta_info["shape"] = (1, 2)  # a tuple: stored pickled
    dp.save_to_disk(str(tmp_path / "pickled.arrow"))
    with pytest.raises(PickleNotAllowedError):
        DataProto.load_from_disk(tmp_path / "pickled.arrow")
    assert_dataproto_equal(dp, DataProto.load_from_disk(tmp_path / "pickled.arrow", allow_pickle=True))


@pytest.fixture
def fake_verl(monkeypatch):
    """A stand-in ``verl.protocol.DataProto`` whose pickles have verl's shape (both modes), built without verl."""
    from arrow_dataproto.verl_api import serialize_tensordict

    class VerlLike:
        mode = "default"

        def __init__(self, batch, non_tensor_batch, meta_info):
            self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

        def __getstate__(self):
            if self.mode == "numpy":
                return serialize_tensordict(self.batch), self.non_tensor_batch, self.meta_info
            buffer = __import__("io").BytesIO()
            torch.save(self.batch.contiguous().consolidate(), buffer)
            return buffer.getvalue(), self.non_tensor_batch, self.meta_info

    VerlLike.__qualname__ = VerlLike.__name__ = "DataProto"
    VerlLike.__module__ = "verl.protocol"
    module = types.ModuleType("verl.protocol")
    module.DataProto = VerlLike
    monkeypatch.setitem(sys.modules, "verl", types.ModuleType("verl"))
    monkeypatch.setitem(sys.modules, "verl.protocol", module)
    yield VerlLike


@pytest.mark.parametrize("mode", ["default", "numpy"])
def test_load_a_file_verls_save_to_disk_wrote(tmp_path, fake_verl, monkeypatch, mode):
    dp = sample_dataproto(4)
    dp.batch.pop("extra")  # verl's numpy mode has no nested TensorDicts,
    dp.batch.pop("position_ids_mrope")  # nor ragged_idx 2 (lost by consolidate before tensordict 0.13 too)
    fake_verl.mode = mode
    path = tmp_path / "verl.pt"
    path.write_bytes(pickle.dumps(fake_verl(dp.batch, dp.non_tensor_batch, dp.meta_info)))
    monkeypatch.delitem(sys.modules, "verl.protocol")  # loading needs no verl
    monkeypatch.delitem(sys.modules, "verl")
    with pytest.raises(PickleNotAllowedError, match="allow_pickle=True"):
        DataProto.load_from_disk(path)
    loaded = DataProto.load_from_disk(path, allow_pickle=True)
    assert type(loaded) is DataProto
    assert_dataproto_equal(dp, loaded)
    path.write_bytes(pickle.dumps({"not": "a DataProto"}))
    with pytest.raises(adp.DecodeError):
        DataProto.load_from_disk(path, allow_pickle=True)
    path.write_bytes(b"garbage that is no pickle")
    with pytest.raises(adp.DecodeError):
        DataProto.load_from_disk(path, allow_pickle=True)


def test_get_data_info_and_print_size(capsys):
    dp = DataProto.from_dict({"a": torch.zeros(4, 2)}, {"s": ["w", "x", "y", "z"]}, {"steps": [1, 2], "cfg": {"lr": 0.1}, "t": (1, "a")})
    assert dp.get_data_info() == "\n".join([
        "batch", "  a: (4, 2) (torch.float32) cpu",
        "non_tensor_batch", "  s: ndarray(4,) (object)",
        "meta_info", "  steps: list[int]", "  cfg: dict[str: float]", "  t: tuple(int, str)",
    ])
    every_kind(3).print_size("step 1")
    out = capsys.readouterr().out
    assert out.startswith("step 1, Size of tensordict: ") and out.rstrip().endswith(" GB")
    assert "size of non_tensor_batch:" in out


# ---------------------------------------------------------------- module helpers


def test_fold_and_unfold_leave_the_input_alone():
    dp = DataProto.from_dict({"a": torch.arange(12).view(6, 2)}, {"s": list("abcdef")}, {"k": 1})
    dp.batch["sub"] = TensorDict({"b": torch.arange(6)}, [6])
    folded = verl_api.fold_batch_dim(dp, 3)
    assert folded.batch.batch_size == (3,) and folded.batch["a"].shape == (3, 2, 2) and folded.batch["sub"].batch_size == (3, 2)
    assert folded.non_tensor_batch["s"].tolist() == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert dp.non_tensor_batch["s"].shape == (6,) and dp.batch["a"].shape == (6, 2)
    folded.reorder(torch.tensor([2, 0, 1]))
    unfolded = verl_api.unfold_batch_dim(folded, 2)
    assert folded.batch.batch_size == (3,)
    assert_rows(unfolded, dp, [4, 5, 0, 1, 2, 3])
    with pytest.raises(BatchError):
        verl_api.fold_batch_dim(dp, 4)
    with pytest.raises(BatchError):
        verl_api.fold_batch_dim(every_kind(4), 2)  # jagged columns


def test_collate_fn_stacks_rows_and_makes_jagged_ones():
    dp = every_kind(4).select(batch_keys=["input_ids", "responses_jagged", "extra"])
    out = verl_api.collate_fn([dp[i] for i in (2, 0, 3)])
    assert out.non_tensor_batch["score"].dtype == object  # as verl: np.array(values, dtype=object)
    out.non_tensor_batch["score"] = out.non_tensor_batch["score"].astype(np.float32)
    assert_rows(out, dp, [2, 0, 3], {})
    assert out.batch["responses_jagged"].layout == torch.jagged
    with pytest.raises(BatchError):
        verl_api.collate_fn([])


def test_verls_numpy_format_round_trips():
    dp = every_kind(3).select(batch_keys=["input_ids", "ref_log_prob", "responses_jagged", "strided"])
    encoded = verl_api.serialize_tensordict(dp.batch)
    assert encoded[0] == (3,) and encoded[1] is None and encoded[2]["responses_jagged"][0] == "jagged"
    back = verl_api.deserialize_tensordict(encoded)
    assert_dataproto_equal(dp, DataProto(back, dp.non_tensor_batch, dp.meta_info))
    t = torch.randn(2, 3).bfloat16()
    assert_tensor_equal(t, verl_api.deserialize_single_tensor(verl_api.serialize_single_tensor(t)))
    with pytest.raises(adp.DecodeError):
        verl_api.deserialize_single_tensor(("float32", (2, 3), np.zeros(5, dtype=np.uint8)))
    with pytest.raises(ArgumentTypeError):
        verl_api.serialize_tensordict(every_kind(2).batch)  # a nested TensorDict


# ================================================================ differential: the real verl class

VERL_ERRORS = (AssertionError, ValueError, TypeError, IndexError, KeyError)
"""What verl raises on purpose; anything else from verl (RuntimeError, AttributeError...) is a crash,
and inputs that crash verl are checked in DIFFERENCES instead."""


@pytest.fixture(scope="module")
def verl():
    """``verl.protocol`` in its default pickling and padding settings (skipped without verl)."""
    module = pytest.importorskip("verl.protocol", reason="verl is not installed (pip install --no-deps verl)")
    if os.environ.get("VERL_AUTO_PADDING") or module.DataProtoConfig.auto_padding:
        pytest.skip("verl's auto_padding is switched on in this process")
    return module


differential = settings(
    max_examples=int(os.environ.get("ADP_PARITY_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

META_VALUES = st.sampled_from([0, 1, 2.5, "a", "b", True, None, [1, 2]])
METRICS = st.dictionaries(st.sampled_from(["loss", "acc"]), st.floats(-1, 1), min_size=1)
META_INFOS = st.fixed_dictionaries(
    {},
    optional={
        "temperature": META_VALUES,
        "global_steps": META_VALUES,
        "name": META_VALUES,
        "metrics": st.one_of(st.none(), METRICS, st.lists(METRICS, max_size=3)),
    },
)


@st.composite
def inputs(draw, min_rows: int = 0, max_rows: int = 9) -> tuple:
    """``(tensors, non_tensors, meta_info)`` for ``from_dict``: dense columns of several dtypes
    (float32 with NaNs), object columns (strings, dicts, a 2-D list column) and a float column."""
    n = draw(st.integers(min_rows, max_rows))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    logp = torch.randn(n, 4, generator=g)
    logp[torch.rand(n, 4, generator=g) < 0.1] = float("nan")
    tensors = {
        "ids": torch.randint(0, 100, (n, 3), generator=g),
        "logp": logp,
        "mask": torch.rand(n, 4, generator=g) > 0.5,
        "bf16": torch.randn(n, 2, generator=g).bfloat16(),
    }
    non_tensors = {
        "uid": [f"u{int(i)}" for i in torch.randint(0, 4, (n,), generator=g)],
        "reward_model": [{"ground_truth": str(i)} for i in range(n)],
        "pair": [[f"a{i}", f"b{i}"] for i in range(n)],
        "score": torch.randn(n, generator=g).double().numpy(),
    }
    return tensors, non_tensors, draw(META_INFOS)


def both(verl, data: tuple, **kwargs) -> tuple:
    """The same input as verl's DataProto and as ours (each with its own copies)."""
    made = []
    for cls in (verl.DataProto, DataProto):
        tensors, non_tensors, meta_info = copy.deepcopy(data)
        made.append(cls.from_dict(tensors, non_tensors, meta_info, **kwargs))
    return tuple(made)


def run(call, *args):
    try:
        return call(*args), None
    except Exception as e:  # noqa: BLE001 - the outcome is what we compare
        return None, e


def same_outcome(theirs_call, ours_call):
    """Both calls return (the results, to compare), or both raise and ours is a library error
    that is also an instance of verl's exception's class."""
    theirs, their_error = run(theirs_call)
    ours, our_error = run(ours_call)
    if their_error is not None:
        assert isinstance(their_error, VERL_ERRORS), f"verl crashed: {their_error!r} (a documented difference?)"
        assert our_error is not None, f"verl raised {their_error!r}, ours returned {ours!r}"
        assert isinstance(our_error, DataProtoError) and isinstance(our_error, type(their_error)), (their_error, our_error)
        return None
    assert our_error is None, f"verl returned, ours raised {our_error!r}"
    return theirs, ours


def assert_same(theirs, ours) -> None:
    """Same values: keys in order, batch size, every tensor's dtype, shape and bits, the
    non-tensor arrays (dtype, shape, values) and meta_info. Not compared: the
    TensorDict's own ``device`` attribute (verl drops it in several operations, ours keeps it)."""
    if isinstance(theirs, (list, tuple)):
        assert len(theirs) == len(ours)
        for a, b in zip(theirs, ours):
            assert_same(a, b)
        return
    assert (theirs.batch is None) == (ours.batch is None)
    if theirs.batch is not None:
        keys = list(theirs.batch.keys(include_nested=True, leaves_only=True))
        assert list(ours.batch.keys(include_nested=True, leaves_only=True)) == keys
        assert theirs.batch.batch_size == ours.batch.batch_size
        for key in keys:
            assert_tensor_equal(theirs.batch[key], ours.batch[key], str(key))
    assert list(theirs.non_tensor_batch) == list(ours.non_tensor_batch)
    for key, values in theirs.non_tensor_batch.items():
        assert strict_equal(values, ours.non_tensor_batch[key]), key
    assert strict_equal(theirs.meta_info, ours.meta_info)


@pytest.mark.verl
@differential
@given(data=inputs(), picks=st.data())
def test_indexing_matches_verl(verl, data, picks):
    theirs, ours = both(verl, data)
    assert_same(theirs, ours)
    n = len(ours)
    index = picks.draw(st.lists(st.integers(-n - 2, n + 1), max_size=8))
    mask = picks.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    start, stop = picks.draw(st.integers(-n - 2, n + 2) | st.none()), picks.draw(st.integers(-n - 2, n + 2) | st.none())
    step = picks.draw(st.integers(1, 3) | st.none())
    for item in (
        slice(start, stop, step), index, np.array(index, dtype=np.int64), torch.tensor(index, dtype=torch.int64),
        mask, np.array(mask, dtype=bool), torch.tensor(mask, dtype=torch.bool),
    ):
        for get in (lambda dp: dp[item], lambda dp: dp.select_idxs(item) if not isinstance(item, slice) else dp.slice(start, stop, step)):
            outcome = same_outcome(lambda: get(theirs), lambda: get(ours))
            if outcome:
                assert_same(*outcome)
    row = picks.draw(st.integers(-n - 1, n))
    outcome = same_outcome(lambda: theirs[row], lambda: ours[row])
    if outcome:
        their_item, our_item = outcome
        assert isinstance(our_item, DataProtoItem) and their_item.batch.batch_size == our_item.batch.batch_size
        for key in their_item.batch.keys():
            assert_tensor_equal(their_item.batch[key], our_item.batch[key], key)
        assert strict_equal({k: v for k, v in their_item.non_tensor_batch.items() if k != "pair"},
                            {k: v for k, v in our_item.non_tensor_batch.items() if k != "pair"})
        assert strict_equal(their_item.non_tensor_batch["pair"], our_item.non_tensor_batch["pair"])
        assert strict_equal(their_item.meta_info, our_item.meta_info)


@pytest.mark.verl
@differential
@given(data=inputs(min_rows=1), chunks=st.integers(1, 10), split_size=st.integers(1, 10), padding=st.booleans(), jagged=st.booleans())
def test_chunk_and_split_match_verl(verl, data, chunks, split_size, padding, jagged):
    theirs, ours = both(verl, data, auto_padding=padding)
    assert_same(theirs.split(split_size), ours.split(split_size))
    if jagged:  # the one row operation verl's class does on a jagged column, besides dp[int]
        lengths = torch.randint(0, 5, (len(ours),), generator=torch.Generator().manual_seed(len(ours)))
        for dp in (theirs, ours):
            dp.batch["jagged"] = torch.nested.nested_tensor([torch.arange(int(n)) for n in lengths], layout=torch.jagged)
    outcome = same_outcome(lambda: theirs.chunk(chunks), lambda: ours.chunk(chunks))
    if outcome:
        assert_same(*outcome)


@pytest.mark.verl
@differential
@given(data=inputs(), cuts=st.lists(st.integers(0, 9), max_size=3), metas=st.lists(META_INFOS, min_size=4, max_size=4))
def test_concat_matches_verl(verl, data, cuts, metas):
    """Pieces of one batch, each with its own drawn meta_info, concatenated back."""
    theirs, ours = both(verl, data)
    bounds = [0, *sorted(min(c, len(ours)) for c in cuts), len(ours)]
    pieces = []
    for dp in (theirs, ours):
        parts = [dp[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        for part, meta in zip(parts, copy.deepcopy(metas)):
            part.meta_info = meta
        pieces.append(parts)
    outcome = same_outcome(lambda: verl.DataProto.concat(pieces[0]), lambda: DataProto.concat(pieces[1]))
    if outcome:
        assert_same(*outcome)


@pytest.mark.verl
@differential
@given(data=inputs(), times=st.integers(0, 3), interleave=st.booleans(), picks=st.data())
def test_repeats_match_verl(verl, data, times, interleave, picks):
    theirs, ours = both(verl, data)
    assert_same(theirs.repeat(times, interleave), ours.repeat(times, interleave))
    counts = picks.draw(st.lists(st.integers(0, 3), min_size=len(ours), max_size=len(ours)))
    for kind in (list, tuple, torch.tensor, np.array) if counts else ():  # zero rows: DIFFERENCES
        assert_same(theirs.sample_level_repeat(kind(counts)), ours.sample_level_repeat(kind(counts)))
    n_split = picks.draw(st.sampled_from([1, 2]))
    # keys verl can split (an odd width or a 1-D column crash verl: DIFFERENCES), and keys it repeats
    splittable = ["logp", "pair", "mask"] if len(ours) else ["logp", "mask"]  # no rows: "pair" is 1-D
    split_keys = picks.draw(st.lists(st.sampled_from(splittable), unique=True))
    outcome = same_outcome(
        lambda: theirs.unfold_column_chunks(n_split, split_keys), lambda: ours.unfold_column_chunks(n_split, split_keys)
    )
    if outcome:
        assert_same(*outcome)


@pytest.mark.verl
@differential
@given(data=inputs(), picks=st.data())
def test_keys_match_verl(verl, data, picks):
    theirs, ours = both(verl, data)
    batch_keys = picks.draw(st.lists(st.sampled_from(["ids", "logp", "mask", "bf16"]), unique=True))
    non_tensor_keys = picks.draw(st.lists(st.sampled_from(["uid", "reward_model", "pair", "score"]), unique=True))
    meta_keys = picks.draw(st.lists(st.sampled_from(list(ours.meta_info)), unique=True)) if ours.meta_info else []
    assert_same(theirs.select(batch_keys, non_tensor_keys, meta_keys), ours.select(batch_keys, non_tensor_keys, meta_keys))
    assert_same(theirs.select(batch_keys, deepcopy=True), ours.select(batch_keys, deepcopy=True))
    left = [dp.select(batch_keys, non_tensor_keys, meta_keys) for dp in (theirs, ours)]
    other_keys = picks.draw(st.lists(st.sampled_from(["ids", "logp", "mask", "bf16"]), min_size=1, unique=True))
    right = [dp.select(other_keys, ["uid"], []) for dp in (theirs, ours)]
    if picks.draw(st.booleans()) and len(ours):  # a conflicting value
        for r in right:
            r.batch[other_keys[0]] = r.batch[other_keys[0]].clone()
            r.batch[other_keys[0]][0] = 1
    if picks.draw(st.booleans()):
        for r in right:
            r.meta_info["temperature"] = 0.5
    shared = set(left[1].batch.keys()) & set(right[1].batch.keys()) if left[1].batch is not None else set()
    nan_in_same_tensor = any(  # verl refuses the very same tensor when it holds a NaN: DIFFERENCES
        left[1].batch[k] is right[1].batch[k] and left[1].batch[k].isnan().any() for k in shared
    )
    if left[0].batch is not None and len(left[0].batch.keys()) and len(right[0].batch.keys()) and not nan_in_same_tensor:
        outcome = same_outcome(lambda: left[0].union(right[0]), lambda: left[1].union(right[1]))
        if outcome:
            assert_same(*outcome)
    popped = same_outcome(lambda: theirs.pop(batch_keys, non_tensor_keys, meta_keys), lambda: ours.pop(batch_keys, non_tensor_keys, meta_keys))
    assert_same(*popped)
    assert_same(theirs, ours)
    remaining = list(ours.batch.keys())
    if remaining:
        theirs.rename(remaining[0], "renamed")
        ours.rename(remaining[0], "renamed")
        assert_same(theirs, ours)


@pytest.mark.verl
@differential
@given(data=inputs(), divisor=st.integers(1, 12), padding=st.integers(0, 4), first=st.booleans())
def test_padding_matches_verl(verl, data, divisor, padding, first):
    theirs, ours = both(verl, data)
    outcome = same_outcome(
        lambda: verl.pad_dataproto_to_divisor(theirs, divisor), lambda: verl_api.pad_dataproto_to_divisor(ours, divisor)
    )
    if outcome:  # the padding is a concat: it may find conflicting metrics, as verl's does
        (their_padded, their_size), (our_padded, our_size) = outcome
        assert their_size == our_size
        assert_same(their_padded, our_padded)
        assert_same(verl.unpad_dataproto(their_padded, their_size), verl_api.unpad_dataproto(our_padded, our_size))
    for dp in (theirs, ours):  # verl's in-place padding concatenates meta_info it then drops: DIFFERENCES
        dp.meta_info.pop("metrics", None)
    candidate = "first" if first else "last"
    outcome = same_outcome(lambda: theirs.padding(padding, candidate), lambda: ours.padding(padding, candidate))
    if outcome:
        assert_same(theirs, ours)


@pytest.mark.verl
@differential
@given(data=inputs(min_rows=1), picks=st.data())
def test_fold_reorder_unfold_match_verl(verl, data, picks):
    theirs, ours = both(verl, data)
    n = len(ours)
    groups = picks.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    folded = (verl.fold_batch_dim(theirs, groups), verl_api.fold_batch_dim(ours, groups))
    assert_same(*folded)
    order = picks.draw(st.permutations(range(groups)))
    for dp in folded:
        dp.reorder(torch.tensor(order))
    assert_same(*folded)
    assert_same(verl.unfold_batch_dim(folded[0], 2), verl_api.unfold_batch_dim(folded[1], 2))


@pytest.mark.verl
@differential
@given(data=inputs(min_rows=1), picks=st.data())
def test_iteration_and_collation_match_verl(verl, data, picks):
    theirs, ours = both(verl, data)
    n = len(ours)
    size = picks.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    seed, shuffle, epochs = picks.draw(st.integers(0, 100)), picks.draw(st.booleans()), picks.draw(st.integers(1, 2))
    kwargs = {"shuffle": shuffle}
    their_batches = list(theirs.make_iterator(size, epochs, seed, kwargs))
    our_batches = list(ours.make_iterator(size, epochs, seed, kwargs))
    assert len(their_batches) == len(our_batches) == epochs * n // size
    for a, b in zip(their_batches, our_batches):
        # verl's collate turns every non-tensor column into objects; ours keeps dtypes (DIFFERENCES)
        assert_same(a.select(non_tensor_batch_keys=[]), b.select(non_tensor_batch_keys=[]))
        for key, values in a.non_tensor_batch.items():
            assert values.tolist() == b.non_tensor_batch[key].tolist(), key
    index = picks.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=5))
    assert_same(verl.collate_fn([theirs[i] for i in index]), verl_api.collate_fn([ours[i] for i in index]))


@pytest.mark.verl
@differential
@given(data=inputs(min_rows=1))
def test_tensordicts_text_and_numpy_format_match_verl(verl, data, capsys):
    theirs, ours = both(verl, data)
    their_td, our_td = theirs.to_tensordict(), ours.to_tensordict()
    assert list(their_td.keys()) == list(our_td.keys()) and their_td.batch_size == our_td.batch_size
    for key in their_td.keys():
        a, b = their_td[key], our_td[key]
        if isinstance(a, torch.Tensor):
            assert_tensor_equal(a, b, key)
        else:
            assert strict_equal(a, b) or (isinstance(a, list) and strict_equal(np.array(a, dtype=object), np.array(b, dtype=object))), key
    assert_same(verl.DataProto.from_tensordict(their_td), DataProto.from_tensordict(their_td))
    assert_same(verl.DataProto.from_tensordict(our_td), DataProto.from_tensordict(our_td))
    assert theirs.get_data_info() == ours.get_data_info()
    theirs.print_size("p")
    their_print = capsys.readouterr().out
    ours.print_size("p")
    assert capsys.readouterr().out == their_print
    encoded = verl.serialize_tensordict(theirs.batch)
    mine = verl_api.serialize_tensordict(ours.batch)
    assert encoded[0] == mine[0] and encoded[1] == mine[1] and list(encoded[2]) == list(mine[2])
    for key, (dtype, shape, raw) in encoded[2].items():
        assert (dtype, tuple(shape), raw.tobytes()) == (mine[2][key][0], tuple(mine[2][key][1]), mine[2][key][2].tobytes())
    for decode in (verl.deserialize_tensordict, verl_api.deserialize_tensordict):
        for payload in (encoded, mine):
            assert_same(DataProto(decode(payload)), ours.select(non_tensor_batch_keys=[], meta_info_keys=[]))


@pytest.mark.verl
@differential
@given(
    left=st.lists(st.one_of(st.floats(allow_nan=True), st.text(max_size=2), st.none()), max_size=4),
    change=st.booleans(),
    numeric=st.booleans(),
)
def test_union_numpy_dict_matches_verl(verl, left, change, numeric):
    floats = [x for x in left if isinstance(x, float)]
    make = (lambda values: np.array(values, dtype=np.float64)) if numeric else (lambda values: np.array(values, dtype=object))
    values = floats if numeric else left
    right = list(values)
    if change and right:
        right[0] = "other" if not numeric else 7.0
    outcome = same_outcome(
        lambda: verl.union_numpy_dict({"a": make(values)}, {"a": make(right)}),
        lambda: verl_api.union_numpy_dict({"a": make(values)}, {"a": make(right)}),
    )
    if outcome:
        assert strict_equal(*outcome)


@pytest.mark.verl
@pytest.mark.parametrize("mode", ["default", "numpy"])
def test_files_verls_save_to_disk_wrote_load(verl, tmp_path, monkeypatch, mode):
    tensors, non_tensors, meta_info = _rows(3)
    non_tensors["objects"] = [{"a": [1]}, None, (2, "b")]
    meta_info["metrics"] = [{"loss": 0.5}]
    theirs = verl.DataProto.from_dict(tensors, non_tensors, meta_info)
    theirs.batch["jagged"] = torch.nested.nested_tensor([torch.arange(i + 1) for i in range(len(theirs))], layout=torch.jagged)
    if mode == "numpy":
        monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", "numpy")
    theirs.save_to_disk(tmp_path / "verl.pt")
    with pytest.raises(PickleNotAllowedError):
        DataProto.load_from_disk(tmp_path / "verl.pt")
    assert_same(theirs, DataProto.load_from_disk(tmp_path / "verl.pt", allow_pickle=True))


# ---------------------------------------------------------------- documented differences


def _rows(n: int = 4, non_tensors: bool = True) -> tuple:
    return ({"x": torch.arange(n * 2).view(n, 2).float()}, {"s": [f"s{i}" for i in range(n)]} if non_tensors else {}, {"k": 1})


DIFFERENCES = {
    # name: (what to run on a DataProto class and its module, verl's failure, what ours gives)
    "chunk of zero rows": (
        lambda cls, m: cls.from_dict(*_rows(0)).chunk(2),
        RuntimeError,
        lambda out: [len(p) for p in out] == [0, 0],
    ),
    "chunk with padding that torch.chunk cannot cut, no non-tensors": (
        lambda cls, m: cls.from_dict(*_rows(6, non_tensors=False), auto_padding=True).chunk(4),
        IndexError,
        BatchError,
    ),
    "slice with a negative step": (
        lambda cls, m: cls.from_dict(*_rows(4))[::-1],
        ValueError,
        lambda out: out.non_tensor_batch["s"].tolist() == ["s3", "s2", "s1", "s0"],
    ),
    "union with a side without a batch": (
        lambda cls, m: cls(None, {"s": np.array(list("ab"), dtype=object)}).union(cls.from_dict({"x": torch.zeros(2)})),
        AttributeError,
        lambda out: list(out.batch.keys()) == ["x"] and len(out) == 2,
    ),
    "concat with numpy arrays in meta_info": (
        lambda cls, m: cls.concat([cls.from_dict({"x": torch.zeros(1)}, meta_info={"a": np.arange(2)})] * 2),
        ValueError,
        lambda out: np.array_equal(out.meta_info["a"], np.arange(2)),
    ),
    "select of a missing non-tensor key": (
        lambda cls, m: cls.from_dict(*_rows()).select(non_tensor_batch_keys=["missing"]),
        None,  # verl skips the key
        KeyNotFoundError,
    ),
    "select(deepcopy=True) copies the tensors": (
        lambda cls, m: (lambda dp: dp.select(deepcopy=True).batch["x"].data_ptr() != dp.batch["x"].data_ptr())(cls.from_dict(*_rows())),
        None,  # verl shares them
        lambda out: out is True,
    ),
    "rename of several keys": (
        lambda cls, m: cls.from_dict({"a": torch.zeros(2), "b": torch.ones(2)}).rename(["a", "b"], ["c", "d"]),
        ValueError,
        lambda out: list(out.batch.keys()) == ["c", "d"],
    ),
    "unfold_column_chunks without split_keys, with non-tensors": (
        lambda cls, m: cls.from_dict(*_rows(2)).unfold_column_chunks(2),
        TypeError,
        lambda out: out.non_tensor_batch["s"].tolist() == ["s0", "s0", "s1", "s1"],
    ),
    "fold_batch_dim leaves its input alone": (
        lambda cls, m: (lambda dp: (m.fold_batch_dim(dp, 2), dp.non_tensor_batch["s"].shape)[1])(cls.from_dict(*_rows(4))),
        None,  # verl reshapes the input's non-tensor arrays: (2, 2)
        lambda out: out == (4,),
    ),
    "make_iterator keeps non-tensor dtypes": (
        lambda cls, m: next(cls.from_dict({"x": torch.zeros(2)}, {"f": np.arange(2.0)}).make_iterator(2, 1)).non_tensor_batch["f"].dtype,
        None,  # verl gives object arrays
        lambda out: out == np.float64,
    ),
    "from_tensordict without tensors": (
        lambda cls, m: cls.from_tensordict(DataProto(None, {"s": np.array(list("ab"), dtype=object)}).to_tensordict()),
        AssertionError,
        lambda out: out.batch is None and out.non_tensor_batch["s"].tolist() == ["a", "b"],
    ),
    "to_tensordict with a nested TensorDict": (
        lambda cls, m: cls(TensorDict({"sub": TensorDict({"y": torch.zeros(2)}, [2])}, [2])).to_tensordict(),
        AssertionError,
        lambda out: out["sub", "y"].shape == (2,),
    ),
    "a batch with two batch dimensions": (
        lambda cls, m: cls(TensorDict({"x": torch.zeros(2, 3)}, [2, 3])),
        AssertionError,
        lambda out: len(out) == 2,
    ),
    "union_numpy_dict of unicode arrays": (
        lambda cls, m: m.union_numpy_dict({"a": np.array(["x"])}, {"a": np.array(["x"])}),
        TypeError,
        lambda out: out["a"].tolist() == ["x"],
    ),
    "sample_level_repeat of zero rows": (
        lambda cls, m: cls.from_dict(*_rows(0)).sample_level_repeat([]),
        NotImplementedError,
        lambda out: len(out) == 0,
    ),
    "unfold_column_chunks of a width not divisible by n_split": (
        lambda cls, m: cls.from_dict({"x": torch.zeros(2, 3)}).unfold_column_chunks(2, ["x"]),
        RuntimeError,
        BatchError,
    ),
    "unfold_column_chunks of a 1-D column": (
        lambda cls, m: cls.from_dict(*_rows(2)).unfold_column_chunks(2, ["s"]),
        IndexError,
        BatchError,
    ),
    "union where both sides hold the same tensor, with a NaN": (
        lambda cls, m: (lambda dp: dp.select(["x"]).union(dp.select(["x"])))(cls.from_dict({"x": torch.tensor([float("nan"), 1.0])})),
        AssertionError,
        lambda out: out.batch["x"][1] == 1,
    ),
    "padding of rows whose meta_info does not concat": (
        lambda cls, m: cls.from_dict(*_rows(2)[:2], {"metrics": [{"a": 1}, {"b": 2}]}).padding(1),
        AssertionError,  # verl's padding concatenates, merging meta_info, then drops the merged meta_info
        lambda out: out is None,
    ),
    "row operations on a jagged column": (
        lambda cls, m: cls.from_dict({"j": torch.nested.nested_tensor([torch.arange(i + 1) for i in range(4)], layout=torch.jagged)})[1:3],
        RuntimeError,  # and index lists, masks, concat, repeat: verl's DataProto handles only chunk and [int] there
        lambda out: [r.tolist() for r in out.batch["j"].unbind()] == [[0, 1], [0, 1, 2]],
    ),
    "chunk count of zero": (
        lambda cls, m: cls.from_dict(*_rows(4)).chunk(0),
        ZeroDivisionError,
        BatchError,
    ),
}


def _ours(name):
    call, _, expected = DIFFERENCES[name]
    if isinstance(expected, type):
        with pytest.raises(expected):
            call(DataProto, verl_api)
    else:
        assert expected(call(DataProto, verl_api)), name


@pytest.mark.parametrize("name", list(DIFFERENCES))
def test_documented_difference_ours(name):
    _ours(name)


@pytest.mark.verl
@pytest.mark.parametrize("name", list(DIFFERENCES))
def test_documented_difference_verl(verl, name):
    """verl does differently what DIFFERENCES lists (fails with that error, or returns what ours does not)."""
    call, failure, expected = DIFFERENCES[name]
    if failure is None:
        out = call(verl.DataProto, verl)
        assert isinstance(expected, type) or not expected(out), name
    else:
        with pytest.raises(failure):
            call(verl.DataProto, verl)


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_row_operations_on_cuda_match_the_cpu():
    cpu = every_kind(6).to("cpu")  # a TensorDict device of "cpu", as .to("cpu") of the CUDA results gives
    cuda = copy.deepcopy(cpu).to("cuda")
    operations = [
        lambda dp: dp.chunk(3),
        lambda dp: dp.array_split(4),
        lambda dp: [DataProto.concat(dp.chunk(2))],
        lambda dp: [dp.sample_level_repeat([2, 0, 1, 1, 0, 3])],
        lambda dp: [dp.unfold_column_chunks(2, ["old_log_probs"]) if dp.batch["old_log_probs"].shape[1] % 2 == 0 else dp.repeat(2)],
        lambda dp: list(dp.make_iterator(3, 1, seed=0, dataloader_kwargs={"shuffle": True})),
        lambda dp: [verl_api.pad_dataproto_to_divisor(dp, 4)[0]],
        lambda dp: [verl_api.collate_fn([dp[i] for i in (5, 1)])],
    ]
    for operation in operations:
        for on_cpu, on_cuda in zip(operation(cpu), operation(cuda)):
            assert all(t.is_cuda for t in on_cuda.batch.values(include_nested=True, leaves_only=True))
            assert_dataproto_equal(on_cpu, on_cuda.to("cpu"))
    reordered = copy.deepcopy(cuda)
    reordered.reorder(torch.tensor([5, 4, 3, 2, 1, 0], device="cuda"))
    assert_rows(reordered.to("cpu"), cpu, [5, 4, 3, 2, 1, 0])


# ---------------------------------------------------------------- every row operation on jagged and nested batches


def _nested_batches(n: int = 6) -> dict:
    g = torch.Generator().manual_seed(n)
    lengths = [1 + i % 4 for i in range(n)]
    return {
        "jagged": {"j": torch.nested.nested_tensor([torch.arange(k) + 10 * i for i, k in enumerate(lengths)], layout=torch.jagged)},
        "jagged with features": {"j": torch.nested.nested_tensor([torch.randn(k, 2, generator=g) for k in lengths], layout=torch.jagged)},
        "jagged, ragged_idx 2": {"j": torch.nested.nested_tensor([torch.randn(k, 3, generator=g) for k in lengths], layout=torch.jagged).transpose(1, 2)},
        "jagged with empty rows": {"j": torch.nested.nested_tensor([torch.arange(i % 3 * (i % 2)) for i in range(n)], layout=torch.jagged)},
        "strided": {"s": torch.nested.nested_tensor([torch.randn(k, 2, generator=g) for k in lengths])},
        "nested TensorDict": {"sub": TensorDict({"x": torch.arange(2 * n).view(n, 2), "y": torch.randn(n, 3, generator=g)}, [n])},
        "jagged in a nested TensorDict": {"sub": TensorDict({"j": torch.nested.nested_tensor([torch.arange(k) for k in lengths], layout=torch.jagged)}, [n])},
    }


ROW_OPERATIONS = {  # name -> (operation(dp, verl module or None for ours), the source rows it should hold, or None)
    "chunk(2)": (lambda dp, m: dp.chunk(2), None),
    "chunk(3)": (lambda dp, m: dp.chunk(3), None),
    "split(4)": (lambda dp, m: dp.split(4), None),
    "concat of pieces": (lambda dp, m: type(dp).concat([dp[0:2], dp[2:6]]), list(range(6))),
    "select_idxs(list)": (lambda dp, m: dp.select_idxs([3, 0, 5]), [3, 0, 5]),
    "dp[mask]": (lambda dp, m: dp[np.array([True, False, True, True, False, False])], [0, 2, 3]),
    "dp[tensor]": (lambda dp, m: dp[torch.tensor([2, 2])], [2, 2]),
    "slice(0, 6, 2)": (lambda dp, m: dp.slice(0, 6, 2), [0, 2, 4]),
    "dp[-3:]": (lambda dp, m: dp[-3:], [3, 4, 5]),
    "repeat(2, interleave)": (lambda dp, m: dp.repeat(2, interleave=True), [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
    "repeat(2)": (lambda dp, m: dp.repeat(2, interleave=False), [0, 1, 2, 3, 4, 5] * 2),
    "sample_level_repeat": (lambda dp, m: dp.sample_level_repeat([1, 0, 2, 1, 3, 1]), [0, 2, 2, 3, 4, 4, 4, 5]),
    "pad to 4": (lambda dp, m: (m or verl_api).pad_dataproto_to_divisor(dp, 4)[0], [0, 1, 2, 3, 4, 5, 0, 1]),
    "unpad": (lambda dp, m: (m or verl_api).unpad_dataproto((m or verl_api).pad_dataproto_to_divisor(dp, 4)[0], 2), list(range(6))),
    "reorder": (lambda dp, m: (dp.reorder(torch.tensor([5, 4, 3, 2, 1, 0])), dp)[1], [5, 4, 3, 2, 1, 0]),
    "union": (lambda dp, m: dp.union(type(dp)(batch=TensorDict({"dense": torch.arange(12).view(6, 2)}, [6]))), list(range(6))),
    "dp[int] batch": (lambda dp, m: dp[4].batch, None),
}


@pytest.mark.verl
@pytest.mark.parametrize("kind", list(_nested_batches()))
@pytest.mark.parametrize("operation", list(ROW_OPERATIONS))
def test_row_operations_on_jagged_and_nested_batches_match_verl(verl, kind, operation):
    """Where verl's class gives a result, ours gives the same; where verl fails on the layout, ours gives the rows."""
    call, rows = ROW_OPERATIONS[operation]

    def make(cls):
        leaves = _nested_batches()[kind]  # built afresh (seeded): the same values for each class
        leaves["dense"] = torch.arange(12).view(6, 2)
        return cls(batch=TensorDict(leaves, batch_size=[6]), non_tensor_batch={"uid": np.array(list("abcdef"), dtype=object)}, meta_info={"k": 1})

    theirs, their_error = run(lambda: call(make(verl.DataProto), verl))
    source = make(DataProto)
    ours = call(make(DataProto), None)
    if their_error is None:
        if isinstance(theirs, TensorDict):
            assert list(theirs.keys(include_nested=True, leaves_only=True)) == list(ours.keys(include_nested=True, leaves_only=True))
            for key in theirs.keys(include_nested=True, leaves_only=True):
                assert_tensor_equal(theirs[key], ours[key], str(key))
        else:
            assert_same(theirs, ours)
    elif rows is not None:
        assert_rows(ours, source, rows)
    assert isinstance(ours, (DataProto, TensorDict, list))
