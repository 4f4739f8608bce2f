"""Arrow IPC files: writing, reading rows and columns, zero-copy and copy-on-write, safety, recovery."""

from __future__ import annotations

import gc
import json
import os
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

from arrow_dataproto import DataProto, to_arrow, to_ipc
from arrow_dataproto.errors import (
    ColumnNotFoundError,
    DataProtoError,
    DecodeError,
    FormatVersionError,
    PickleNotAllowedError,
    SchemaMismatchError,
)
from arrow_dataproto.files import (
    FileWriter,
    copy_file,
    open_dataset,
    open_file,
    read_file,
    recover_file,
    write_file,
)


def _batches(sizes=(6, 4, 5)) -> list[DataProto]:
    """Batches with the same columns, different rows and different meta_info."""
    batches = []
    for seed, rows in enumerate(sizes):
        dp = sample_dataproto(rows=rows, seed=seed)
        dp.meta_info["step"] = seed
        batches.append(dp)
    return batches


def _pickled() -> DataProto:
    """A batch with a pickled non-tensor column (sets) and pickled meta_info (a tuple)."""
    dp = sample_dataproto(rows=3)
    tags = np.empty(3, dtype=object)
    tags[:] = [{"a"}, {"b"}, set()]
    dp.non_tensor_batch["tags"] = tags
    dp.meta_info["shape"] = (1, 2)
    return dp


def _mapped_from(path: Path, tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory lies in a mapping of ``path`` (Linux /proc/self/maps)."""
    address, target = tensor.data_ptr(), str(path.resolve())
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == target:
                low, high = (int(x, 16) for x in parts[0].split("-"))
                if low <= address < high:
                    return True
    return False


needs_proc_maps = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc/self/maps")


# ---------------------------------------------------------------- round trips


def test_batches_read_back_exactly(tmp_path):
    batches = _batches()
    write_file(tmp_path / "f.arrow", batches)
    with open_file(tmp_path / "f.arrow") as reader:
        assert reader.num_batches == 3
        assert reader.batch_rows == [6, 4, 5]
        assert reader.num_rows == 15
        assert reader.compression is None
        for i, original in enumerate(batches):
            assert_dataproto_equal(reader.read_batch(i), original)
        assert_dataproto_equal(reader.read_batch(-1), batches[-1])
        for read, original in zip(reader, batches):
            assert_dataproto_equal(read, original)
        assert_dataproto_equal(reader.read_all(), DataProto.concat(batches, meta_info="update"))
        with pytest.raises(IndexError):
            reader.read_batch(3)
    assert_dataproto_equal(read_file(tmp_path / "f.arrow"), DataProto.concat(batches, meta_info="update"))


def test_single_dataproto_and_generators_and_writer(tmp_path):
    one = sample_dataproto(rows=4)
    write_file(tmp_path / "one.arrow", one)
    assert_dataproto_equal(read_file(tmp_path / "one.arrow"), one)

    batches = _batches()
    write_file(tmp_path / "gen.arrow", (b for b in batches))
    assert open_file(tmp_path / "gen.arrow").num_batches == 3

    with FileWriter(tmp_path / "w.arrow") as writer:
        for b in batches:
            writer.write(b)
        assert (writer.num_batches, writer.num_rows) == (3, 15)
        assert not (tmp_path / "w.arrow").exists()  # only the partial file until close
    assert_dataproto_equal(read_file(tmp_path / "w.arrow"), DataProto.concat(batches, meta_info="update"))
    assert list(tmp_path.glob("*.partial")) == []


def test_a_bare_tensordict_and_a_batch_without_tensors(tmp_path):
    td = TensorDict({"x": torch.arange(6).view(3, 2)}, batch_size=[3])
    write_file(tmp_path / "td.arrow", td)
    assert torch.equal(read_file(tmp_path / "td.arrow").batch["x"], td["x"])

    only_objects = DataProto(non_tensor_batch={"s": np.array(["a", "b"], dtype=object)}, meta_info={"k": 1})
    write_file(tmp_path / "obj.arrow", [only_objects, only_objects])
    assert_dataproto_equal(read_file(tmp_path / "obj.arrow"), DataProto.concat([only_objects] * 2, meta_info="update"))


@pytest.mark.parametrize(
    "start, stop",
    [(0, 15), (0, 6), (4, 8), (1, 3), (5, 11), (6, 10), (2, 14), (-3, None), (10, 100), (7, 7), (15, 30), (-15, 2)],
)
def test_row_ranges_across_batches(tmp_path, start, stop):
    batches = _batches()
    write_file(tmp_path / "f.arrow", batches)
    expected = DataProto.concat(batches, meta_info="update")[start:stop]
    got = open_file(tmp_path / "f.arrow").read_rows(start, stop)
    assert len(got) == len(expected)
    assert_dataproto_equal(got.select(meta_info_keys=[]), expected.select(meta_info_keys=[]))


def test_meta_info_of_a_range_is_merged_in_batch_order(tmp_path):
    write_file(tmp_path / "f.arrow", _batches())
    reader = open_file(tmp_path / "f.arrow")
    assert reader.read_rows(0, 3).meta_info["step"] == 0
    assert reader.read_rows(5, 11).meta_info["step"] == 2
    assert reader.read_rows(7, 8).meta_info["step"] == 1
    assert reader.read_meta_info(2)["step"] == 2


def test_an_empty_batch_in_the_middle(tmp_path):
    batches = _batches((3, 2, 2))
    batches[1] = batches[1][0:0]
    write_file(tmp_path / "f.arrow", batches)
    reader = open_file(tmp_path / "f.arrow")
    assert reader.batch_rows == [3, 0, 2]
    assert len(reader.read_batch(1)) == 0
    assert_dataproto_equal(reader.read_rows(2, 4).select(meta_info_keys=[]),
                           DataProto.concat([batches[0][2:], batches[2][:1]], meta_info="update").select(meta_info_keys=[]))


def test_column_projection(tmp_path):
    batches = _batches()
    write_file(tmp_path / "f.arrow", batches)
    reader = open_file(tmp_path / "f.arrow")
    got = reader.read_batch(1, ["input_ids", "extra", "uid"])
    expected = batches[1].select(batch_keys=["input_ids", "extra"], non_tensor_batch_keys=["uid"])
    assert_dataproto_equal(got, expected)
    assert list(got.batch.keys(include_nested=True, leaves_only=True)) == ["input_ids", ("extra", "values")]

    only_objects = reader.read_rows(2, 9, columns="data_source")
    assert list(only_objects.batch.keys()) == [] and only_objects.batch.batch_size == (7,)
    assert list(only_objects.non_tensor_batch) == ["data_source"]

    with pytest.raises(ColumnNotFoundError, match="nope"):
        reader.read_all(["input_ids", "nope"])


def test_column_info_from_the_schema(tmp_path):
    write_file(tmp_path / "f.arrow", sample_dataproto(rows=2))
    info = {c.name: c for c in open_file(tmp_path / "f.arrow").column_info()}
    assert (info["ref_log_prob"].kind, info["ref_log_prob"].dtype, info["ref_log_prob"].shape) == ("tensor", "bfloat16", [7])
    assert (info["position_ids_mrope"].kind, info["position_ids_mrope"].shape) == ("jagged", [3, None])
    assert info["input_ids"].device == "cpu" and info["input_ids"].is_tensor
    assert (info["uid"].kind, info["uid"].dtype, info["uid"].device, info["uid"].is_tensor) == ("object", "object", None, False)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compression(tmp_path, compression):
    batches = [sample_dataproto(rows=64, prompt=200, response=200, seed=s) for s in range(2)]
    for dp in batches:  # something compressible
        dp.batch["attention_mask"].zero_()
    write_file(tmp_path / "plain.arrow", batches)
    write_file(tmp_path / "packed.arrow", batches, compression=compression)
    assert (tmp_path / "packed.arrow").stat().st_size < (tmp_path / "plain.arrow").stat().st_size
    reader = open_file(tmp_path / "packed.arrow")
    assert reader.compression == compression
    assert reader.batch_rows == [64, 64]
    assert_dataproto_equal(reader.read_all(), DataProto.concat(batches, meta_info="update"))
    assert_dataproto_equal(reader.read_batch(1, ["uid", "old_log_probs"]),
                           batches[1].select(batch_keys=["old_log_probs"], non_tensor_batch_keys=["uid"]))
    plain_bytes = open_file(tmp_path / "plain.arrow").column_nbytes()
    assert reader.column_nbytes() == plain_bytes  # in-memory sizes, whatever the compression
    write_file(tmp_path / "one.arrow", batches[0], compression=compression)
    one = open_file(tmp_path / "one.arrow")
    assert one.batch_rows == [64]
    assert_dataproto_equal(one.read_rows(10, 20), batches[0][10:20])


@pytest.mark.parametrize("options", [{}, {"compression": "zstd"}, {"stream": True}, {"stream": True, "compression": "lz4"}])
def test_row_counts_come_from_the_message_headers_alone(tmp_path, monkeypatch, options):
    """num_rows / batch_rows of a file of several batches read no batch (what ray_data asks on the driver)."""
    write_file(tmp_path / "f.arrow", _batches(), **options)
    reads = []

    def counting(name, original):
        def read(*args, **kwargs):
            reads.append(name)
            return original(*args, **kwargs)
        return read

    for name in ("get_batch", "get_record_batch", "get_batch_with_custom_metadata"):
        monkeypatch.setattr(pa.ipc.RecordBatchFileReader, name, counting(name, getattr(pa.ipc.RecordBatchFileReader, name)))
    for name in ("read_record_batch", "open_stream"):
        monkeypatch.setattr(pa.ipc, name, counting(name, getattr(pa.ipc, name)))
    reader = open_file(tmp_path / "f.arrow")
    assert (reader.batch_rows, reader.num_rows) == ([6, 4, 5], 15)
    assert reads == []
    reader.read_batch(1)  # (the counting sees reads)
    assert reads


def test_copy_file_changes_the_compression(tmp_path):
    write_file(tmp_path / "a.arrow", _batches())
    assert copy_file(tmp_path / "a.arrow", tmp_path / "b.arrow", compression="zstd") == 3
    assert open_file(tmp_path / "b.arrow").compression == "zstd"
    for x, y in zip(open_file(tmp_path / "a.arrow"), open_file(tmp_path / "b.arrow")):
        assert_dataproto_equal(x, y)


def test_device_option(tmp_path):
    dp = sample_dataproto(rows=3)
    write_file(tmp_path / "f.arrow", dp)
    got = read_file(tmp_path / "f.arrow", device="cpu")
    assert got.batch.device == torch.device("cpu")
    assert_dataproto_equal(got, DataProto(dp.batch.to("cpu"), dp.non_tensor_batch, dp.meta_info))


def test_all_none_object_columns_adopt_the_file_type(tmp_path):
    first = sample_dataproto(rows=3)
    second = sample_dataproto(rows=2, seed=1)
    second.non_tensor_batch["reward_model"] = np.array([None, None], dtype=object)
    write_file(tmp_path / "f.arrow", [first, second])
    assert_dataproto_equal(open_file(tmp_path / "f.arrow").read_batch(1), second)


def test_progress_bars(tmp_path, capsys):
    pytest.importorskip("tqdm", reason="progress bars need tqdm")
    write_file(tmp_path / "f.arrow", _batches(), progress=True)
    with open_file(tmp_path / "f.arrow", progress=True) as reader:
        reader.read_all()
        list(reader)
    assert "writing f.arrow" in capsys.readouterr().err


# ---------------------------------------------------------------- memory: zero-copy, copy-on-write


@needs_proc_maps
def test_reads_are_zero_copy_views_of_the_file(tmp_path):
    dp = DataProto(TensorDict({"x": torch.arange(1 << 18).view(256, 1024)}, batch_size=[256]))
    path = tmp_path / "f.arrow"
    write_file(path, dp)
    reader = open_file(path)
    assert _mapped_from(path, reader.read_batch(0).batch["x"])
    assert _mapped_from(path, reader.read_rows(10, 20).batch["x"])
    assert not _mapped_from(path, open_file(path, copy=True).read_batch(0).batch["x"])
    write_file(tmp_path / "z.arrow", dp, compression="zstd")
    assert not _mapped_from(tmp_path / "z.arrow", read_file(tmp_path / "z.arrow").batch["x"])


def test_writing_into_a_read_tensor_never_changes_the_file(tmp_path):
    dp = sample_dataproto(rows=4)
    path = tmp_path / "f.arrow"
    write_file(path, dp)
    before = path.read_bytes()
    reader = open_file(path)
    first = reader.read_batch(0)
    first.batch["input_ids"].add_(1)
    first.batch["extra", "values"].zero_()
    assert torch.equal(first.batch["input_ids"], dp.batch["input_ids"] + 1)  # the write took effect...
    assert path.read_bytes() == before  # ...in private pages only
    assert_dataproto_equal(reader.read_batch(0), dp)  # a later read through the same reader is untouched
    assert_dataproto_equal(read_file(path), dp)


def test_tensors_outlive_the_reader(tmp_path):
    dp = sample_dataproto(rows=4)
    write_file(tmp_path / "f.arrow", dp)
    with open_file(tmp_path / "f.arrow") as reader:
        got = reader.read_batch(0)
    del reader
    gc.collect()
    assert_dataproto_equal(got, dp)


def test_a_closed_reader_refuses_reads(tmp_path):
    write_file(tmp_path / "f.arrow", sample_dataproto(rows=2))
    reader = open_file(tmp_path / "f.arrow")
    reader.close()
    with pytest.raises(DataProtoError, match="closed"):
        reader.read_batch(0)


def test_replacing_a_file_leaves_open_readers_on_the_old_one(tmp_path):
    old, new = sample_dataproto(rows=3, seed=0), sample_dataproto(rows=5, seed=1)
    path = tmp_path / "f.arrow"
    write_file(path, old)
    reader = open_file(path)
    view = reader.read_batch(0)
    write_file(path, new)
    assert_dataproto_equal(view, old)
    assert_dataproto_equal(reader.read_batch(0), old)
    assert_dataproto_equal(read_file(path), new)


# ---------------------------------------------------------------- writer errors and atomicity


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda dp: dp.batch.set("input_ids", dp.batch["input_ids"].float()), "'input_ids': adp.dtype float32, expected int64"),
        (lambda dp: dp.batch.set("old_log_probs", torch.zeros(len(dp), 9)), "'old_log_probs': adp.shape [9], expected [7]"),
        (lambda dp: dp.batch.del_("response_mask"), "missing column(s) ['response_mask']"),
        (lambda dp: dp.non_tensor_batch.__setitem__("new", np.arange(len(dp))), "added column(s) ['new']"),
        (lambda dp: dp.non_tensor_batch.__setitem__("uid", np.arange(len(dp))), "'uid': adp.dtype <i8, expected |O"),
    ],
)
def test_a_batch_with_other_columns_is_refused(tmp_path, change, message):
    first, second = _batches((3, 4))[:2]
    change(second)
    path = tmp_path / "f.arrow"
    with FileWriter(path) as writer:
        writer.write(first)
        with pytest.raises(SchemaMismatchError) as error:
            writer.write(second)
        writer.write(first)  # the writer goes on after a refused batch
    assert message in str(error.value)
    assert open_file(path).num_batches == 2


def test_rows_and_meta_info_may_change_between_batches(tmp_path):
    a, b = sample_dataproto(rows=2), sample_dataproto(rows=9)
    b.meta_info = {"other": [1, 2]}
    write_file(tmp_path / "f.arrow", [a, b])
    assert open_file(tmp_path / "f.arrow").read_batch(1).meta_info == {"other": [1, 2]}


def test_an_exception_leaves_the_old_file_and_no_partial(tmp_path):
    path = tmp_path / "f.arrow"
    write_file(path, sample_dataproto(rows=2))
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with FileWriter(path) as writer:
            writer.write(sample_dataproto(rows=5))
            raise RuntimeError("boom")
    assert path.read_bytes() == before
    assert list(tmp_path.glob("*.partial")) == []


def test_a_writer_without_batches_writes_an_empty_file(tmp_path):
    write_file(tmp_path / "e.arrow", [])
    reader = open_file(tmp_path / "e.arrow")
    assert (reader.num_batches, reader.num_rows, reader.columns) == (0, 0, [])
    assert len(reader.read_all()) == 0


def test_bad_compression_is_refused(tmp_path):
    with pytest.raises(Exception, match="compression"):
        FileWriter(tmp_path / "f.arrow", compression="gzip")


# ---------------------------------------------------------------- pickles


def test_pickled_columns_and_meta_info_need_allow_pickle(tmp_path):
    dp = _pickled()
    path = tmp_path / "p.arrow"
    write_file(path, dp)
    reader = open_file(path)  # opening and describing never unpickles
    assert reader.pickled_columns == ["tags"]
    assert reader.meta_info_encoding() == "pickle"
    assert reader.column_nbytes()["tags"] > 0
    with pytest.raises(PickleNotAllowedError, match="'tags'.*allow_pickle=True"):
        reader.read_all()
    with pytest.raises(PickleNotAllowedError, match="meta_info.*allow_pickle=True"):
        reader.read_batch(0, ["input_ids", "uid"])
    with pytest.raises(PickleNotAllowedError):
        reader.read_meta_info()
    safe = reader.read_batch(0, ["input_ids", "uid"], meta_info=False)
    assert torch.equal(safe.batch["input_ids"], dp.batch["input_ids"]) and safe.meta_info == {}
    assert_dataproto_equal(read_file(path, allow_pickle=True), dp)
    copy_file(path, tmp_path / "q.arrow", compression="lz4")  # copies pickles without unpickling them
    assert_dataproto_equal(read_file(tmp_path / "q.arrow", allow_pickle=True), dp)


# ---------------------------------------------------------------- damaged and foreign files


def _small_file(tmp_path, compression=None) -> bytes:
    path = tmp_path / "small.arrow"
    write_file(path, [sample_dataproto(rows=2, seed=0), sample_dataproto(rows=3, seed=1)], compression=compression)
    return path.read_bytes()


def _read_everything(path) -> None:
    with open_file(path) as reader:
        reader.read_all()
        reader.column_nbytes()
        for i in range(reader.num_batches):
            reader.read_batch(i)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_truncated_files_raise_decode_error(tmp_path, compression):
    blob = _small_file(tmp_path, compression)
    damaged = tmp_path / "cut.arrow"
    cuts = sorted(set(range(0, len(blob), max(1, len(blob) // 150))) | set(range(len(blob) - 64, len(blob))))
    for cut in cuts:
        damaged.write_bytes(blob[:cut])
        with pytest.raises(DecodeError) as error:
            _read_everything(damaged)
        assert cut < 8 or "no Arrow footer" in str(error.value), cut


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_bit_flips_raise_decode_error_or_read(tmp_path, compression):
    """A flipped bit either reads (Arrow files carry no checksum: a flip in the values
    goes unnoticed) or raises DecodeError; never another error, a crash or a hang."""
    blob = _small_file(tmp_path, compression)
    damaged = tmp_path / "flip.arrow"
    rng = random.Random(1234)
    outcomes = {"read": 0, "DecodeError": 0}
    for _ in range(200):
        flipped = bytearray(blob)
        flipped[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        damaged.write_bytes(bytes(flipped))
        try:
            _read_everything(damaged)
            outcomes["read"] += 1
        except DecodeError:
            outcomes["DecodeError"] += 1
    assert outcomes["read"] and outcomes["DecodeError"], outcomes


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty file"),
        (b"\x80\x05\x95 pickled", "a Python pickle"),
        (b"garbage" * 10, "not an Arrow IPC file"),
        (b"ARROW1\x00\x00" + b"\x00" * 40 + b"ARROW1", "corrupt Arrow file footer"),
    ],
)
def test_files_that_are_not_ours(tmp_path, content, message):
    path = tmp_path / "x.arrow"
    path.write_bytes(content)
    with pytest.raises(DecodeError, match=message):
        open_file(path)


def test_an_ipc_stream_or_a_foreign_arrow_file_is_read(tmp_path):
    # Issue 10: these were refused ("stream", "not an arrow-dataproto payload"); now they read.
    (tmp_path / "s.arrow").write_bytes(to_ipc(sample_dataproto(rows=2)).to_pybytes())
    assert_dataproto_equal(open_file(tmp_path / "s.arrow").read_all(), sample_dataproto(rows=2))
    table = pa.table({"a": [1, 2]})
    with pa.ipc.new_file(str(tmp_path / "foreign.arrow"), table.schema) as writer:
        writer.write_table(table)
    assert open_file(tmp_path / "foreign.arrow").read_all().batch["a"].tolist() == [1, 2]


def test_a_schema_naming_another_format_is_refused(tmp_path):
    table = pa.table({"a": [1, 2]}).replace_schema_metadata({"adp.format": "parquet"})
    with pa.ipc.new_file(str(tmp_path / "other.arrow"), table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(DecodeError, match="not an arrow-dataproto payload"):
        open_file(tmp_path / "other.arrow")


def test_a_newer_major_format_version_is_refused(tmp_path):
    batch = to_arrow(sample_dataproto(rows=2))
    newer = batch.replace_schema_metadata({**batch.schema.metadata, b"adp.version": b"2.0"})
    with pa.ipc.new_file(str(tmp_path / "v2.arrow"), newer.schema) as writer:
        writer.write_batch(newer)
    with pytest.raises(FormatVersionError):
        open_file(tmp_path / "v2.arrow")


# ---------------------------------------------------------------- recovery


def _unfinished(tmp_path, batches) -> bytes:
    """The bytes a writer killed after writing ``batches`` leaves behind (no footer)."""
    writer = FileWriter(tmp_path / "target.arrow")
    for b in batches:
        writer.write(b)
    (partial,) = tmp_path.glob("target.arrow.*.partial")
    blob = partial.read_bytes()
    writer.abort()
    return blob


def test_recover_an_unfinished_file(tmp_path):
    batches = _batches()
    blob = _unfinished(tmp_path, batches)
    partial = tmp_path / "target.arrow.1234.partial"
    partial.write_bytes(blob)
    with pytest.raises(DecodeError, match="recover_file"):
        open_file(partial)
    assert recover_file(partial, tmp_path / "fixed.arrow") == 3
    for got, original in zip(open_file(tmp_path / "fixed.arrow"), batches):
        assert_dataproto_equal(got, original)
    assert recover_file(partial, partial) == 3  # in place
    assert open_file(partial).num_rows == 15


def test_recovery_keeps_the_complete_batches_before_a_cut(tmp_path):
    batches = _batches()
    blob = _unfinished(tmp_path, batches)
    source = tmp_path / "cut.partial"
    counts = []
    for cut in [*range(0, len(blob), max(1, len(blob) // 60)), len(blob)]:
        source.write_bytes(blob[:cut])
        try:
            counts.append(recover_file(source, tmp_path / "out.arrow"))
        except DecodeError:
            counts.append(0)
            continue
        for got, original in zip(open_file(tmp_path / "out.arrow"), batches):
            assert_dataproto_equal(got, original)
    assert counts == sorted(counts)  # more bytes never recover fewer batches
    assert set(counts) == {0, 1, 2, 3}


# ---------------------------------------------------------------- datasets


def test_open_dataset_reads_files_as_one(tmp_path):
    batches = _batches((2, 3, 4))
    write_file(tmp_path / "a.arrow", batches[:2])
    write_file(tmp_path / "b.arrow", batches[2:])
    (tmp_path / "notes.txt").write_text("not a batch")
    for source in (tmp_path, [tmp_path / "a.arrow", tmp_path / "b.arrow"]):
        with open_dataset(source) as dataset:
            assert (dataset.num_batches, dataset.batch_rows) == (3, [2, 3, 4])
            assert dataset.read_meta_info(2)["step"] == 2 and dataset.meta_info_encoding(1) == "json"
            assert_dataproto_equal(dataset.read_batch(2), batches[2])
            assert_dataproto_equal(dataset.read_all(), DataProto.concat(batches, meta_info="update"))
            assert_dataproto_equal(dataset.read_rows(4, 7, ["uid"]).select(meta_info_keys=[]),
                                   DataProto.concat(batches, meta_info="update")[4:7].select(batch_keys=[], non_tensor_batch_keys=["uid"], meta_info_keys=[]))


def test_open_dataset_refuses_files_with_other_columns(tmp_path):
    write_file(tmp_path / "a.arrow", sample_dataproto(rows=2))
    other = sample_dataproto(rows=2)
    other.non_tensor_batch.pop("uid")
    write_file(tmp_path / "b.arrow", other)
    with pytest.raises(SchemaMismatchError, match=r"b\.arrow.*missing column\(s\) \['uid'\]"):
        open_dataset(tmp_path)
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "empty_dir_that_is_missing")


def test_pyarrow_dataset_reads_our_files(tmp_path):
    batches = _batches((2, 3))
    write_file(tmp_path / "a.arrow", batches[0])
    write_file(tmp_path / "b.arrow", batches[1])
    table = open_dataset(tmp_path).arrow_dataset().to_table(columns=["uid", "input_ids"])
    expected = DataProto.concat(batches, meta_info="update")
    assert table.column("uid").to_pylist() == list(expected.non_tensor_batch["uid"])
    ids = table.column("input_ids").combine_chunks().to_numpy_ndarray()
    assert np.array_equal(ids, expected.batch["input_ids"].numpy())
    assert json.loads(table.schema.field("input_ids").metadata[b"adp.shape"]) == [12]



@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_read_arrow_gives_the_stored_batch_that_decodes_like_read_batch(tmp_path, compression, stream):
    """``read_arrow`` decodes nothing: pickled columns stay bytes (no allow_pickle needed),
    and ``from_arrow`` of what it returns is what ``read_batch`` gives, column subsets included
    (the tree in its metadata is trimmed to them). A compressed stream file once returned
    every column for a subset."""
    from arrow_dataproto import from_arrow

    path = tmp_path / "p.arrow"
    batches = [_pickled(), _pickled()]
    batches[1].meta_info["step"] = 1
    write_file(path, batches, compression=compression, stream=stream)
    with open_file(path, allow_pickle=True) as reader:
        stored = reader.read_arrow(1)
        assert stored.schema.field("tags").type == pa.large_binary()
        assert_dataproto_equal(from_arrow(stored, allow_pickle=True), reader.read_batch(1))
        subset = reader.read_arrow(-1, columns=["extra", "uid"])
        assert subset.schema.names == ["extra.values", "uid"]
        assert json.loads(subset.schema.metadata[b"adp.tree"]) == [["extra", [3], None, ["values"]]]
        assert_dataproto_equal(from_arrow(subset, allow_pickle=True), reader.read_batch(1, columns=["extra", "uid"]))
        with pytest.raises(ColumnNotFoundError):
            reader.read_arrow(0, columns=["nope"])
        with pytest.raises(IndexError):
            reader.read_arrow(2)
