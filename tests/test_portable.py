"""The portable view (``to_arrow(data, portable=True)``, ``write_file(portable=True)``): plain
Arrow types, and every DataProto back bit for bit from it (tensors, non-tensor columns,
every dtype and every bit pattern of the widened ones)."""

from __future__ import annotations

import importlib.util
import io
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

from arrow_dataproto import DataProto, from_arrow, from_ipc, to_arrow
from arrow_dataproto._dtypes import STORAGE
from arrow_dataproto._portable import time_unit, widening_table
from arrow_dataproto.errors import DecodeError, EncodeError
from arrow_dataproto.files import FileWriter, copy_file, open_file, read_file, write_file
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

WIDENED = ["bfloat16", "float16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]
WIDENED = [name for name in WIDENED if hasattr(torch, name)]


def all_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of ``dtype`` once, as a 1-D tensor of that dtype."""
    bits = dtype.itemsize * 8
    return torch.arange(2**bits, dtype=torch.int32).to(torch.uint8 if bits == 8 else torch.uint16).view(dtype)


def random_of(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bits of ``dtype`` (NaNs and infinities included for float dtypes)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    n = max(1, int(np.prod(shape)))
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype)[: int(np.prod(shape))].reshape(shape)


def jagged(dtype: torch.dtype, lengths: list[int], inner: tuple[int, ...] = (), seed: int = 0) -> torch.Tensor:
    return torch.nested.nested_tensor(
        [random_of(dtype, (n, *inner), seed + i) for i, n in enumerate(lengths)], layout=torch.jagged
    )


def roundtrips(dp: DataProto) -> None:
    """``dp`` comes back bit-exact from its portable RecordBatch, IPC stream, pickle and files."""
    rb = to_arrow(dp, portable=True)
    assert rb.schema.metadata[b"adp.portable"] == b"true"
    assert_dataproto_equal(dp, from_arrow(rb, allow_pickle=True))
    assert_dataproto_equal(dp, from_arrow(pickle.loads(pickle.dumps(rb)), allow_pickle=True))
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, rb.schema) as writer:
        writer.write_batch(rb)
    assert_dataproto_equal(dp, from_ipc(sink.getvalue(), allow_pickle=True))


# ---------------------------------------------------------------- the widening tables


@pytest.mark.parametrize("name", WIDENED)
def test_widening_is_exact_and_injective_for_every_bit_pattern(name):
    dtype = getattr(torch, name)
    table = widening_table(name)
    patterns = all_patterns(dtype)
    assert len(np.unique(table.widened)) == len(patterns)  # no two patterns widen alike
    values = patterns.float()
    widened = torch.from_numpy(table.widened.view(np.float32))
    number = ~values.isnan()
    assert torch.equal(widened[number].view(torch.int32), values[number].view(torch.int32))  # same value, -0.0 too
    assert bool(widened[~number].isnan().all())
    sign = patterns.view(torch.uint8 if dtype.itemsize == 1 else torch.int16)
    if name != "float8_e8m0fnu":  # the only unsigned format
        negative = sign < 0 if dtype.itemsize == 2 else sign >= 128
        assert torch.equal((widened.view(torch.int32) < 0)[~number], negative[~number])  # NaNs keep their sign


@pytest.mark.parametrize("name", WIDENED)
def test_every_bit_pattern_comes_back(name):
    dtype = getattr(torch, name)
    patterns = all_patterns(dtype)
    grid = patterns.view(-1, 2, 4)  # 256 and 65536 patterns: whole rows of 8
    dp = DataProto(TensorDict({"x": patterns[: len(grid)], "grid": grid}, batch_size=[len(grid)]))
    rb = to_arrow(dp, portable=True)
    assert rb.schema.field("x").type == pa.float32()
    roundtrips(dp)


@pytest.mark.parametrize("name", WIDENED)
def test_the_table_without_nan_payloads_is_torchs_conversion(name):
    dtype = getattr(torch, name)
    patterns = all_patterns(dtype)
    table = widening_table(name, nan_payloads=False)  # what pandas shows
    assert np.array_equal(table.widened, patterns.float().numpy().view(np.uint32))
    rounded = torch.from_numpy(table.widened.view(np.float32)).to(dtype).view(table.bits).numpy()
    back, _ = table.narrow(table.widened, rounded)
    images, counts = np.unique(table.widened, return_counts=True)
    alone = np.isin(table.widened, images[counts == 1])
    assert np.array_equal(back[alone], np.flatnonzero(alone))  # each pattern with an image of its own comes back
    assert np.isnan(table.widened[back[~alone]].view(np.float32)).all()  # the others share a NaN: a NaN


def test_time_units_are_those_of_arrow():
    units = ["s", "ms", "us", "ns", "D", "m", "ps", "as"]
    assert [time_unit(np.dtype(f"M8[{u}]")) for u in units] == ["s", "ms", "us", "ns", None, None, None, None]
    assert time_unit(np.dtype("m8[us]")) == "us"
    assert time_unit(np.dtype("m8[10ms]")) is None and time_unit(np.dtype("M8")) is None
    assert time_unit(np.dtype("int64")) is None


# ---------------------------------------------------------------- every dtype, every kind


def every_dtype_batch(rows: int = 5) -> DataProto:
    lengths = [2, 0, 3, 1, 4][:rows]
    leaves = {}
    for dtype in STORAGE:
        name = str(dtype).removeprefix("torch.")
        leaves[f"{name}.vector"] = random_of(dtype, (rows,), 1)
        leaves[f"{name}.grid"] = random_of(dtype, (rows, 2, 3), 2)
        leaves[f"{name}.jagged"] = jagged(dtype, lengths, seed=3)
        leaves[f"{name}.jagged3"] = jagged(dtype, lengths, (2, 3), seed=4)
        try:
            leaves[f"{name}.strided"] = torch.nested.nested_tensor([random_of(dtype, (n % 3 + 1, 2), 5 + n) for n in lengths])
        except (NotImplementedError, RuntimeError):  # torch builds strided nested tensors of some dtypes only
            pass
    return DataProto(TensorDict(leaves, batch_size=[rows]))


def test_every_dtype_and_tensor_kind_round_trips():
    dp = every_dtype_batch()
    roundtrips(dp)
    types = {f.name: f.type for f in to_arrow(dp, portable=True).schema}
    for name, value_type in {"bfloat16": pa.float32(), "float16": pa.float32(), "float8_e5m2": pa.float32(),
                             "bool": pa.bool_(), "int8": pa.int8(), "float64": pa.float64(),
                             "bits8": pa.uint8(), "bits16": pa.uint16(), "float4_e2m1fn_x2": pa.uint8()}.items():
        if hasattr(torch, name):  # packed bits stay their unsigned storage: they have no float value
            assert types[f"{name}.vector"] == value_type, name
            assert types[f"{name}.grid"] == pa.list_(pa.list_(value_type, 3), 2), name
            assert types[f"{name}.jagged3"] == pa.list_(pa.list_(pa.list_(value_type, 3), 2)), name
    assert types["complex32.vector"] == pa.list_(pa.float32(), 2)  # (real, imag) pairs, widened
    assert types["complex128.jagged"] == pa.list_(pa.list_(pa.float64(), 2))


def test_mrope_and_shared_offsets_round_trip():
    dp = sample_dataproto(rows=6)
    responses = dp.batch["responses_jagged"]
    dp.batch["logp_jagged"] = torch.nested.nested_tensor_from_jagged(
        torch.randn(responses.values().shape[0]).bfloat16(), responses.offsets()
    )
    roundtrips(dp)
    back = from_arrow(to_arrow(dp, portable=True))
    assert back.batch["logp_jagged"].offsets() is back.batch["responses_jagged"].offsets()


def non_tensor_columns(rows: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    times = np.array(["2024-01-01T00:00:00.123456789", "NaT", "1970-01-01", "2262-04-11"], dtype="M8[ns]")[:rows]
    return {
        "flag": rng.random(rows) > 0.5,
        "flags2d": rng.random((rows, 2, 3)) > 0.5,
        "half": rng.standard_normal(rows).astype(np.float16),
        "half2d": rng.standard_normal((rows, 3)).astype(np.float16),
        "big_endian": np.arange(rows, dtype=">i4"),
        "c64": (rng.standard_normal(rows) + 1j).astype(np.complex64),
        "c128_2d": rng.standard_normal((rows, 2)) * 1j,
        "when": times,
        "when_us_2d": np.stack([times.astype("M8[us]")] * 2, axis=1),
        "days": times.astype("M8[D]"),
        "took": times - np.datetime64("2024-01-01", "ns"),
        "text": np.array(["a", "bé", "", "ccc"][:rows]),
        "text2d": np.array([["a", "b"]] * rows),
        "raw": np.array([b"\x00x", b"", b"y", b"zz"][:rows]),
        "objects": np.array([{"a": 1}, {"a": None}, {"a": 3}, {"a": 4}][:rows], dtype=object),
        "pickled": np.array([{1, 2}, None, 3, "x"][:rows], dtype=object),
    }


def test_non_tensor_columns_round_trip():
    dp = sample_dataproto(rows=4)
    dp.non_tensor_batch.update(non_tensor_columns())
    roundtrips(dp)
    rb = to_arrow(dp, portable=True)
    types = {f.name: f.type for f in rb.schema}
    assert types["flag"] == pa.bool_() and types["flags2d"] == pa.list_(pa.list_(pa.bool_(), 3), 2)
    assert types["half"] == pa.float32() and types["half2d"] == pa.list_(pa.float32(), 3)
    assert types["when"] == pa.timestamp("ns") and types["took"] == pa.duration("ns")
    assert types["when_us_2d"] == pa.list_(pa.timestamp("us"), 2)
    assert types["days"] == pa.int64()  # numpy's day unit has no Arrow timestamp: its int64 as stored
    assert types["c64"] == pa.list_(pa.float32(), 2)
    assert types["text2d"] == pa.list_(pa.string(), 2)
    assert types["pickled"] == pa.large_binary()
    assert rb.column("when").null_count == 1  # NaT is a null in the portable view


def test_portable_types_of_tensor_columns():
    dp = sample_dataproto(rows=4)
    types = {f.name: f.type for f in to_arrow(dp, portable=True).schema}
    assert types["ref_log_prob"] == pa.list_(pa.float32(), 7)  # bf16 [B, 7]
    assert types["response_mask"] == pa.list_(pa.bool_(), 7)
    assert types["input_ids"] == pa.list_(pa.int64(), 12)
    assert types["responses_jagged"] == pa.list_(pa.int64())
    assert types["position_ids_mrope"] == pa.list_(pa.list_(pa.int64(), 3))
    grid = to_arrow(DataProto(TensorDict({"g": torch.zeros(2, 3, 4, 5).bfloat16()}, batch_size=[2])), portable=True)
    assert grid.schema.field("g").type == pa.list_(pa.list_(pa.list_(pa.float32(), 5), 4), 3)
    stored = to_arrow(dp)
    for name in ("input_ids", "ref_log_prob", "responses_jagged"):  # field metadata kept as it was
        assert to_arrow(dp, portable=True).schema.field(name).metadata == stored.schema.field(name).metadata


def test_what_is_not_copied():
    """Columns whose values do not change view the tensors' memory: int64 grids and float32."""
    ids = torch.arange(12).view(3, 4)
    logp = torch.randn(3, 4)
    rb = to_arrow(DataProto(TensorDict({"ids": ids, "logp": logp}, batch_size=[3])), portable=True)
    assert rb.column("ids").flatten().buffers()[1].address == ids.data_ptr()
    assert rb.column("logp").flatten().buffers()[1].address == logp.data_ptr()


def test_slices_and_views_round_trip():
    dp = every_dtype_batch(rows=5)
    part = dp[1:4]
    roundtrips(part)
    rb = to_arrow(dp, portable=True).slice(1, 3)  # an Arrow slice of a portable batch
    assert_dataproto_equal(part, from_arrow(rb))


def test_large_offsets_keep_large_list(monkeypatch):
    import arrow_dataproto._portable as portable

    dp = DataProto(TensorDict({"j": jagged(torch.bfloat16, [2, 3, 1])}, batch_size=[3]))
    assert to_arrow(dp, portable=True).schema.field("j").type == pa.list_(pa.float32())
    monkeypatch.setattr(portable, "_INT32_MAX", 5)  # as if the offsets did not fit int32
    rb = to_arrow(dp, portable=True)
    assert rb.schema.field("j").type == pa.large_list(pa.float32())
    assert_dataproto_equal(dp, from_arrow(rb))


def test_empty_and_no_batch():
    for dp in (DataProto(), every_dtype_batch()[:0], DataProto(non_tensor_batch=non_tensor_columns(0))):
        roundtrips(dp)


def test_a_stored_batch_passes_through_and_portable_is_idempotent():
    dp = sample_dataproto()
    from arrow_dataproto._portable import from_portable, to_portable

    stored = to_arrow(dp)
    assert from_portable(stored) is stored
    portable = to_portable(stored)
    assert to_portable(portable) is portable
    assert from_portable(portable).equals(stored)


# ---------------------------------------------------------------- errors


def replaced(rb: pa.RecordBatch, name: str, array: pa.Array) -> pa.RecordBatch:
    i = rb.schema.get_field_index(name)
    return rb.set_column(i, rb.schema.field(i).with_type(array.type), array)


def test_a_float_that_is_not_a_bfloat16_is_refused():
    rb = to_arrow(DataProto(TensorDict({"logp": torch.tensor([1.5, 2.0]).bfloat16()}, batch_size=[2])), portable=True)
    changed = replaced(rb, "logp", pa.array([1.5, 2.0001], pa.float32()))
    with pytest.raises(DecodeError, match=r"'logp'.*not bfloat16 values.*2\.0001"):
        from_arrow(changed)


def test_a_float_that_is_not_a_float8_is_refused():
    rb = to_arrow(DataProto(TensorDict({"q": torch.zeros(2).to(torch.float8_e4m3fn)}, batch_size=[2])), portable=True)
    with pytest.raises(DecodeError, match="'q'.*not float8_e4m3fn values"):
        from_arrow(replaced(rb, "q", pa.array([0.0, 1000.0], pa.float32())))  # past e4m3fn's 448


def test_nulls_in_a_portable_tensor_column_are_refused():
    rb = to_arrow(DataProto(TensorDict({"g": torch.zeros(2, 3).bfloat16()}, batch_size=[2])), portable=True)
    with pytest.raises(DecodeError, match="'g'"):
        from_arrow(replaced(rb, "g", pa.array([[0.0, 0.0, 0.0], None], pa.list_(pa.float32(), 3))))
    with pytest.raises(DecodeError, match="'g'"):
        from_arrow(replaced(rb, "g", pa.array([[0.0, None, 0.0], [0.0] * 3], pa.list_(pa.float32(), 3))))


def test_bool_bytes_other_than_0_and_1_are_refused_portably():
    odd = torch.tensor([0, 1, 2], dtype=torch.uint8).view(torch.bool)
    dp = DataProto(TensorDict({"mask": odd}, batch_size=[3]))
    assert_dataproto_equal(dp, from_arrow(to_arrow(dp)))  # the stored form keeps the byte
    with pytest.raises(EncodeError, match="'mask'"):
        to_arrow(dp, portable=True)


def test_a_column_of_another_type_reaches_the_decoder_unchanged():
    rb = to_arrow(DataProto(TensorDict({"g": torch.zeros(2, 3).bfloat16()}, batch_size=[2])), portable=True)
    with pytest.raises(DecodeError, match="'g'"):
        from_arrow(replaced(rb, "g", pa.array([[0.0] * 3] * 2, pa.list_(pa.float64(), 3))))


# ---------------------------------------------------------------- files


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_portable_files_read_back_exactly(tmp_path, stream, compression):
    batches = [every_dtype_batch(rows=5), every_dtype_batch(rows=3)]
    path = tmp_path / "portable.arrow"
    write_file(path, batches, portable=True, stream=stream, compression=compression)
    head = path.read_bytes()[:6]
    assert (head != b"ARROW1") == stream
    reader = pa.ipc.open_stream(pa.memory_map(str(path))) if stream else pa.ipc.open_file(pa.memory_map(str(path)))
    assert reader.schema.field("bfloat16.grid").type == pa.list_(pa.list_(pa.float32(), 3), 2)
    with open_file(path) as opened:
        assert opened.num_batches == 2
        for i, dp in enumerate(batches):
            assert_dataproto_equal(dp, opened.read_batch(i))
        assert opened.column_info()[0].dtype == "bool"  # column info names the original dtype


@pytest.mark.parametrize("options", [{"stream": True}, {"portable": True}, {"portable": True, "stream": True}])
def test_schema_evolution_in_portable_files_and_streams(tmp_path, options):
    """A later batch whose dicts have other keys turns the file's column into JSON, rewriting the
    batches written so far: in the writer's own form (portable: strings), streams included."""
    def batch(rows: int, same_keys: bool) -> DataProto:
        dp = sample_dataproto(rows=rows)
        extra = np.empty(rows, dtype=object)
        for i in range(rows):
            extra[i] = {"a": i} if same_keys or i % 2 else {"b": str(i)}
        dp.non_tensor_batch["extra_info"] = extra
        return dp

    batches = [batch(4, True), batch(3, False)]
    path = tmp_path / "evolved.arrow"
    write_file(path, batches, checksums=importlib.util.find_spec("xxhash") is not None, **options)
    with open_file(path) as reader:
        assert reader.stream == options.get("stream", False)
        stored = reader.schema.field("extra_info")
        assert stored.metadata[b"adp.kind"] == b"json"
        assert stored.type == (pa.string() if options.get("portable") else pa.json_(pa.string()))
        for i, dp in enumerate(batches):
            assert_dataproto_equal(dp, reader.read_batch(i))
        if importlib.util.find_spec("xxhash") is not None:
            assert reader.verify() > 0  # the rewritten batches' checksums are of what was written


def test_copy_file_converts_between_forms(tmp_path):
    dp = sample_dataproto()
    write_file(tmp_path / "stored.arrow", dp)
    copy_file(tmp_path / "stored.arrow", tmp_path / "portable.arrow", portable=True)
    copy_file(tmp_path / "portable.arrow", tmp_path / "back.arrow")
    assert pa.ipc.open_file(str(tmp_path / "portable.arrow")).schema.field("ref_log_prob").type == pa.list_(pa.float32(), 7)
    stored = pa.ipc.open_file(str(tmp_path / "stored.arrow")).read_all()
    assert pa.ipc.open_file(str(tmp_path / "back.arrow")).read_all().equals(stored, check_metadata=True)
    assert_dataproto_equal(dp, read_file(tmp_path / "portable.arrow"))


def test_file_writer_portable_with_checksums(tmp_path):
    pytest.importorskip("xxhash", reason="checksums need xxhash (pip install arrow-dataproto[integrity])")
    path = tmp_path / "p.arrow"
    with FileWriter(path, portable=True, checksums=True) as writer:
        writer.write(sample_dataproto())
    with open_file(path, verify=True) as reader:
        assert reader.verify() > 0
        assert_dataproto_equal(sample_dataproto(), reader.read_all())


# ---------------------------------------------------------------- the command line


def test_convert_portable_and_stream(tmp_path, capsys):
    from arrow_dataproto.cli import main

    dp = sample_dataproto()
    pickle_path, stored = tmp_path / "dp.pkl", tmp_path / "stored.arrow"
    pickle_path.write_bytes(pickle.dumps(dp, protocol=5))
    assert main(["convert", str(pickle_path), str(tmp_path / "p.arrows"), "--allow-pickle", "--portable", "--stream"]) == 0
    assert main(["convert", str(tmp_path / "p.arrows"), str(stored)]) == 0  # a stream file in, stored types out
    assert main(["convert", str(stored), str(tmp_path / "p.arrow"), "--portable", "--compression", "zstd"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "compression zstd" in out
    with pa.memory_map(str(tmp_path / "p.arrows")) as source:
        assert pa.ipc.open_stream(source).schema.field("ref_log_prob").type == pa.list_(pa.float32(), 7)
    assert pa.ipc.open_file(str(stored)).schema.field("ref_log_prob").type.extension_name == "arrow.fixed_shape_tensor"
    assert pa.ipc.open_file(str(tmp_path / "p.arrow")).schema.field("response_mask").type == pa.list_(pa.bool_(), 7)
    for name in ("p.arrows", "stored.arrow", "p.arrow"):
        assert_dataproto_equal(dp, read_file(tmp_path / name))


# ---------------------------------------------------------------- other tools read values


import interop_table  # noqa: E402 (tests/interop_table.py: the realistic batch and the docs/files.md table)

TOOL_BATCHES = [interop_table.realistic_batch(), interop_table.realistic_batch(rows=5, seed=1)]


def tool_rows(column: str) -> list:
    """Every row of ``column`` over TOOL_BATCHES: numpy arrays (bf16 as float32 values) or Python values."""
    out: list = []
    for dp in TOOL_BATCHES:
        if column in dp.non_tensor_batch:
            out += list(dp.non_tensor_batch[column])
            continue
        t = dp.batch[column]
        rows = t.unbind() if t.is_nested else t
        out += [(r.float() if r.dtype == torch.bfloat16 else r).numpy() for r in rows]
    return out


@pytest.fixture(scope="module")
def portable_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("portable")
    return interop_table.write_files(folder, TOOL_BATCHES)["portable"]


@pytest.fixture(scope="module")
def portable_table(portable_files):
    with pa.memory_map(str(portable_files["file"])) as source:
        return pa.ipc.open_file(source).read_all()


def test_the_portable_files_read_back_exactly(portable_files):
    for path in portable_files.values():
        with open_file(path, allow_pickle=True) as reader:  # extra_info is pickled until the JSON tier stores it
            for i, dp in enumerate(TOOL_BATCHES):
                assert_dataproto_equal(dp, reader.read_batch(i))


def extra_info_cells_are(cells: list, table: pa.Table) -> None:
    """``extra_info`` as the tool shows it: JSON text once the JSON tier stores it, else pickled bytes."""
    kind = table.schema.field("extra_info").metadata[b"adp.kind"]
    if kind == b"json":
        import json

        assert [json.loads(c) for c in cells] == tool_rows("extra_info")
    else:
        assert kind == b"pickle" and all(isinstance(c, bytes) for c in cells)


def test_pandas_shows_values(portable_files, portable_table):
    pd = pytest.importorskip("pandas", reason="pandas is not installed (pip install arrow-dataproto[interop])")
    df = pd.read_feather(portable_files["file"])
    assert len(df) == 13
    for cell, row in zip(df["ref_log_prob"], tool_rows("ref_log_prob")):  # bf16 as float32 values
        assert cell.dtype == np.float32
        np.testing.assert_array_equal(cell, row)
    for cell, row in zip(df["response_mask"], tool_rows("response_mask")):
        assert cell.dtype == np.bool_ and cell.tolist() == row.tolist()
    for cell, row in zip(df["responses_jagged"], tool_rows("responses_jagged")):
        np.testing.assert_array_equal(cell, row)
    assert df["data_source"].tolist() == tool_rows("data_source")
    assert df["raw_prompt"].map(lambda cell: [dict(m) for m in cell]).tolist() == tool_rows("raw_prompt")
    extra_info_cells_are(df["extra_info"].tolist(), portable_table)


def test_polars_list_operations_without_unwrapping(portable_files, portable_table):
    pl = pytest.importorskip("polars", reason="polars is not installed (pip install arrow-dataproto[interop])")
    frame = pl.read_ipc(portable_files["file"])
    assert frame.schema["ref_log_prob"] == pl.Array(pl.Float32, 5)
    assert frame.schema["response_mask"] == pl.Array(pl.Boolean, 5)
    assert frame.schema["responses_jagged"] == pl.List(pl.Int64)
    sums = frame.select(pl.col("advantages").arr.sum())["advantages"].to_list()
    np.testing.assert_allclose(sums, [row.sum() for row in tool_rows("advantages")], rtol=1e-6)
    masked = frame.select(pl.col("response_mask").arr.sum())["response_mask"].to_list()
    assert masked == [int(row.sum()) for row in tool_rows("response_mask")]
    lengths = frame.select(pl.col("responses_jagged").list.len())["responses_jagged"].to_list()
    assert lengths == [len(row) for row in tool_rows("responses_jagged")] == masked
    bf16 = frame.select(pl.col("ref_log_prob").arr.first())["ref_log_prob"].to_list()
    assert bf16 == [float(row[0]) for row in tool_rows("ref_log_prob")]
    by_source = frame.group_by("data_source").agg(pl.col("responses_jagged").list.len().sum()).sort("data_source")
    sources = tool_rows("data_source")
    assert by_source.rows() == [
        (s, sum(len(r) for r, src in zip(tool_rows("responses_jagged"), sources) if src == s)) for s in sorted(set(sources))
    ]
    extra_info_cells_are(frame["extra_info"].to_list(), portable_table)


def test_duckdb_sql_group_by_over_tensor_columns(portable_table):
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install arrow-dataproto[interop])")
    con = duckdb.connect()
    con.register("rollout", portable_table)  # the whole table: no float16 column to project away
    relation = con.sql(
        "select data_source, count(*) as n, sum(list_sum(advantages)) as adv, max(list_max(ref_log_prob)) as ref, "
        "sum(len(responses_jagged)) as tokens, sum(list_count(list_filter(response_mask, lambda x: x))) as masked "
        "from rollout group by data_source order by data_source"
    )
    got = relation.fetchall()
    sources, adv, ref = tool_rows("data_source"), tool_rows("advantages"), tool_rows("ref_log_prob")
    jag, mask = tool_rows("responses_jagged"), tool_rows("response_mask")
    want = []
    for s in sorted(set(sources)):
        rows = [i for i, src in enumerate(sources) if src == s]
        want.append((s, len(rows), sum(float(adv[i].astype(np.float64).sum()) for i in rows),
                     max(float(ref[i].max()) for i in rows), sum(len(jag[i]) for i in rows),
                     sum(int(mask[i].sum()) for i in rows)))
    assert [g[:2] + g[3:] for g in got] == [w[:2] + w[3:] for w in want]
    np.testing.assert_allclose([g[2] for g in got], [w[2] for w in want], rtol=1e-6)
    types = dict(zip(con.sql("select * from rollout").columns, map(str, con.sql("select * from rollout").types)))
    assert types["ref_log_prob"] == "FLOAT[5]" and types["response_mask"] == "BOOLEAN[5]"
    assert types["position_ids"] == "BIGINT[11]" and types["responses_jagged"] == "BIGINT[]"
    cells = [r[0] for r in con.sql("select extra_info from rollout").fetchall()]
    extra_info_cells_are(cells, portable_table)
    con.close()


@pytest.mark.parametrize("how", ["Dataset(table)", "Dataset.from_file(stream)"])
def test_hf_datasets_shows_floats(how, portable_files, portable_table):
    datasets = pytest.importorskip("datasets", reason="HF datasets is not installed (pip install arrow-dataproto[interop])")
    ds = datasets.Dataset(portable_table) if how == "Dataset(table)" else datasets.Dataset.from_file(str(portable_files["stream"]))
    assert len(ds) == 13
    assert ds.features["ref_log_prob"] == datasets.List(datasets.Value("float32"), length=5)
    assert ds.features["response_mask"] == datasets.List(datasets.Value("bool"), length=5)
    assert ds.features["responses_jagged"] == datasets.List(datasets.Value("int64"))
    assert ds.features["data_source"] == datasets.Value("string")
    assert ds["ref_log_prob"] == [row.tolist() for row in tool_rows("ref_log_prob")]
    assert ds["response_mask"] == [row.tolist() for row in tool_rows("response_mask")]
    assert ds["responses_jagged"] == [row.tolist() for row in tool_rows("responses_jagged")]
    assert ds["raw_prompt"] == tool_rows("raw_prompt")
    numpy_rows = ds.with_format("numpy")["advantages"]
    np.testing.assert_array_equal(np.stack(list(numpy_rows)), np.stack(tool_rows("advantages")))


def test_readme_interop_table_is_current(tmp_path):
    for module in ("pandas", "polars", "duckdb", "datasets"):
        pytest.importorskip(module, reason=f"{module} is not installed: the table needs every tool (pip install arrow-dataproto[interop])")
    measured = interop_table.render(interop_table.measure(tmp_path))
    in_page = interop_table.page_section(interop_table.PAGE.read_text())
    assert in_page == measured, "the interop table of docs/files.md differs from what the tools report: run python tests/interop_table.py"


def test_hostile_portable_metadata_is_a_decode_error():
    rb = to_arrow(DataProto(TensorDict({"g": torch.zeros(2, 3).bfloat16()}, batch_size=[2])), portable=True)
    field = rb.schema.field("g")
    for shape in ("[4294967296]", "[" + ", ".join(["1"] * 5000) + "]", '"x"'):
        hostile = field.with_metadata({**field.metadata, b"adp.shape": shape.encode()})
        with pytest.raises(DecodeError, match="'g'"):
            from_arrow(pa.RecordBatch.from_arrays([rb.column(0)], schema=rb.schema.set(0, hostile)))


def test_deeply_nested_row_shape_is_a_decode_error():
    """Found by the fuzzer (ipc-portable): JSON nested past the recursion limit in adp.row_shape."""
    dp = DataProto(non_tensor_batch={"n": np.arange(3.0).astype(np.float16)})
    rb = to_arrow(dp, portable=True)
    field = rb.schema.field("n")
    hostile = field.with_metadata({**field.metadata, b"adp.row_shape": b"[" * 100_000 + b"]" * 100_000})
    with pytest.raises(DecodeError, match="'n'"):
        from_arrow(pa.RecordBatch.from_arrays([rb.column(0)], schema=rb.schema.set(0, hostile)))


def test_tensors_of_many_dimensions_stay_as_stored():
    from arrow_dataproto._portable import MAX_NESTING

    deep = torch.zeros((2,) + (1,) * (MAX_NESTING + 1)).bfloat16()
    dp = DataProto(TensorDict({"deep": deep, "ok": deep.view(2, -1)}, batch_size=[2]))
    rb = to_arrow(dp, portable=True)
    assert rb.schema.field("deep").type == to_arrow(dp).schema.field("deep").type  # fixed_shape_tensor of uint16
    assert rb.schema.field("ok").type == pa.list_(pa.float32(), 1)
    roundtrips(dp)
