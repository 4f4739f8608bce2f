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
from utils import assert_dataproto_equal, assert_tensor_equal, sample_dataproto, strict_equal


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
    dp.meta_info[adp.protocol.AUTO_PADDING_KEY] = True
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
    dp.meta_info[adp.protocol.AUTO_PADDING_KEY] = True
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
