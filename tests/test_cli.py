"""The ``arrow-dataproto`` command: through the real entry point (a subprocess running
``python -m arrow_dataproto``) for each command once, the rest in-process through ``main``."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

from arrow_dataproto import FORMAT_VERSION, DataProto
from arrow_dataproto._preview import decoded_rows as numpy_rows  # the original: tests patch the module's
from arrow_dataproto.cli import main
from arrow_dataproto.files import FileWriter, open_file, read_file, write_file

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m arrow_dataproto ARGS`` in a fresh process (verl is not importable there)."""
    return subprocess.run(
        [sys.executable, "-m", "arrow_dataproto", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=300,
    )


def call(capsys, *args) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def _pickled_file(path: Path) -> DataProto:
    dp = sample_dataproto(rows=4)
    tags = np.empty(4, dtype=object)
    tags[:] = [{"x"}, {"y"}, set(), {"z"}]
    dp.non_tensor_batch["tags"] = tags
    write_file(path, dp)
    return dp


# ---------------------------------------------------------------- entry points


def test_console_script_is_declared():
    assert 'arrow-dataproto = "arrow_dataproto.cli:main"' in (ROOT / "pyproject.toml").read_text()


def test_installed_console_script_runs():
    try:
        dist = distribution("arrow-dataproto")
    except PackageNotFoundError:
        pytest.skip("arrow-dataproto is not installed (pip install -e .): no console script to run")
    scripts = [e.value for e in dist.entry_points if e.group == "console_scripts"]
    assert scripts == ["arrow_dataproto.cli:main"]
    script = Path(sys.executable).parent / "arrow-dataproto"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("arrow-dataproto ")


@pytest.mark.parametrize("command", [[], ["inspect"], ["head"], ["convert"], ["recover"], ["bench"]])
def test_help(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(" ".join(["usage: arrow-dataproto", *command]))
    if not command:
        assert all(name in out for name in ("inspect", "head", "convert", "recover", "bench"))


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["inspect"])
    assert exit_.value.code == 2


# ---------------------------------------------------------------- inspect


def test_inspect_through_the_real_entry_point(tmp_path):
    dp = sample_dataproto(rows=6)
    write_file(tmp_path / "f.arrow", [dp, dp[:2]], compression="zstd")
    result = run("inspect", tmp_path / "f.arrow")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "8 rows in 2 batches (6, 2)" in out and "compression zstd" in out
    assert "meta_info (batch 0): temperature, global_steps, global_token_num" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[3:]}
    assert lines["ref_log_prob"][:5] == ["ref_log_prob", "tensor", "bfloat16", "[7]", "cpu"]
    assert lines["position_ids_mrope"][:5] == ["position_ids_mrope", "jagged", "int64", "[3,", "*]"]
    assert lines["uid"][:5] == ["uid", "object", "object", "[]", "-"]


def test_inspect_json(tmp_path, capsys):
    dp = sample_dataproto(rows=6)
    write_file(tmp_path / "f.arrow", dp)
    status, out, _ = call(capsys, "inspect", tmp_path / "f.arrow", "--json")
    assert status == 0
    info = json.loads(out)
    assert (info["rows"], info["batches"], info["compression"], info["format_version"]) == (6, 1, "none", "%d.%d" % FORMAT_VERSION)
    columns = {c["name"]: c for c in info["columns"]}
    assert columns["input_ids"] == {
        "name": "input_ids", "kind": "tensor", "dtype": "int64", "shape": [12], "device": "cpu", "bytes": 6 * 12 * 8,
        "stored_bytes": 6 * 12 * 8, "row_lengths": None,
    }
    assert columns["responses_jagged"]["shape"] == [None]


def test_inspect_never_unpickles(tmp_path, capsys):
    _pickled_file(tmp_path / "p.arrow")
    status, out, _ = call(capsys, "inspect", tmp_path / "p.arrow")
    assert status == 0
    assert "pickled columns: tags" in out


# ---------------------------------------------------------------- head


def test_head_through_the_real_entry_point_hides_pickles(tmp_path):
    dp = _pickled_file(tmp_path / "p.arrow")
    result = run("head", tmp_path / "p.arrow", "-n", "2", "--columns", "uid", "tags", "data_source")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["uid", "tags", "data_source"]  # the order asked for
    assert lines[1].split() == ["0", dp.non_tensor_batch["uid"][0], "<pickled>", dp.non_tensor_batch["data_source"][0]]
    assert len(lines) == 3
    assert "--allow-pickle" in result.stderr


def test_head_with_allow_pickle_and_ranges(tmp_path, capsys):
    dp = _pickled_file(tmp_path / "p.arrow")
    status, out, _ = call(capsys, "head", tmp_path / "p.arrow", "--allow-pickle", "--columns", "tags", "--start", "-2")
    assert status == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["tags", "2", "3"] and "z" in lines[2]
    status, out, _ = call(capsys, "head", tmp_path / "p.arrow", "-n", "1", "--columns", "input_ids")
    row = dp.batch["input_ids"][0].tolist()
    assert out.splitlines()[1].startswith(f"0  i64[12] {row[0]} {row[1]} ")


def test_head_past_the_end(tmp_path, capsys):
    write_file(tmp_path / "f.arrow", sample_dataproto(rows=2))
    status, out, err = call(capsys, "head", tmp_path / "f.arrow", "--start", "5", "--columns", "uid")
    assert status == 0 and out.split() == ["uid"] and "no rows from row 5" in err


def test_head_of_an_unknown_column(tmp_path, capsys):
    write_file(tmp_path / "f.arrow", sample_dataproto(rows=2))
    status, _, err = call(capsys, "head", tmp_path / "f.arrow", "--columns", "nope")
    assert status == 1 and "no column ['nope']" in err


# ---------------------------------------------------------------- convert


@dataclass
class _FakeVerlDataProto:
    """Pickles like verl 0.9's DataProto (state: torch.save bytes, or numpy mode triples);
    pickles name it ``verl.protocol.DataProto`` (see the ``fake_verl`` fixture)."""

    batch: TensorDict = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)
    numpy_mode: bool = False

    def __getstate__(self):
        if self.numpy_mode:
            items = {
                k: (str(v.dtype).removeprefix("torch."), tuple(v.shape), v.contiguous().view(-1).view(torch.uint8).numpy())
                for k, v in self.batch.items()
            }
            encoded = (tuple(self.batch.batch_size), None, items)
        else:
            buffer = io.BytesIO()
            torch.save(self.batch.contiguous().consolidate(), buffer)
            encoded = buffer.getvalue()
        return encoded, self.non_tensor_batch, self.meta_info


_FakeVerlDataProto.__module__, _FakeVerlDataProto.__qualname__ = "verl.protocol", "DataProto"


@pytest.fixture
def fake_verl(monkeypatch):
    """Makes ``verl.protocol.DataProto`` importable in this process only, for pickling."""
    verl, protocol = types.ModuleType("verl"), types.ModuleType("verl.protocol")
    protocol.DataProto = _FakeVerlDataProto
    verl.protocol = protocol
    monkeypatch.setitem(sys.modules, "verl", verl)
    monkeypatch.setitem(sys.modules, "verl.protocol", protocol)
    return _FakeVerlDataProto


def _verl_pickle(path: Path, fake_verl, numpy_mode: bool) -> DataProto:
    td = TensorDict(
        {
            "input_ids": torch.arange(24).view(4, 6),
            "old_log_probs": torch.randn(4, 3),
            "ref_log_prob": torch.randn(4, 3).bfloat16(),
        },
        batch_size=[4],
    )
    non_tensor = {"uid": np.array(list("abcd"), dtype=object)}
    meta_info = {"global_steps": 3}
    with open(path, "wb") as f:  # what verl's save_to_disk does
        pickle.dump(fake_verl(td, non_tensor, meta_info, numpy_mode), f)
    return DataProto(td, non_tensor, meta_info)


def test_convert_a_verl_pickle_through_the_real_entry_point(tmp_path, fake_verl):
    expected = _verl_pickle(tmp_path / "step.pkl", fake_verl, numpy_mode=False)
    result = run("convert", tmp_path / "step.pkl", tmp_path / "out.arrow", "--allow-pickle")
    assert result.returncode == 0, result.stderr  # verl is not importable in that process
    assert_dataproto_equal(read_file(tmp_path / "out.arrow"), expected)


def test_convert_a_verl_numpy_mode_pickle(tmp_path, fake_verl, capsys, monkeypatch):
    expected = _verl_pickle(tmp_path / "step.pkl", fake_verl, numpy_mode=True)
    monkeypatch.delitem(sys.modules, "verl")
    monkeypatch.delitem(sys.modules, "verl.protocol")
    status, _, err = call(capsys, "convert", tmp_path / "step.pkl", tmp_path / "out.arrow")
    assert status == 1 and "--allow-pickle" in err
    assert not (tmp_path / "out.arrow").exists()
    status, out, _ = call(capsys, "convert", tmp_path / "step.pkl", tmp_path / "out.arrow", "--allow-pickle",
                          "--compression", "lz4")
    assert status == 0 and "4 rows" in out
    assert open_file(tmp_path / "out.arrow").compression == "lz4"
    assert_dataproto_equal(read_file(tmp_path / "out.arrow"), expected)


def test_convert_our_own_pickle_and_arrow_files(tmp_path, capsys):
    dp = sample_dataproto(rows=3)
    with open(tmp_path / "ours.pkl", "wb") as f:
        pickle.dump(dp, f)
    assert call(capsys, "convert", tmp_path / "ours.pkl", tmp_path / "a.arrow", "--allow-pickle")[0] == 0
    assert_dataproto_equal(read_file(tmp_path / "a.arrow"), dp)
    status, out, _ = call(capsys, "convert", tmp_path / "a.arrow", tmp_path / "b.arrow", "--compression", "zstd")
    assert status == 0 and f"wrote {tmp_path / 'b.arrow'}: 3 rows in 1 batch, compression zstd" in out
    assert_dataproto_equal(read_file(tmp_path / "b.arrow"), dp)


def test_convert_refuses_other_files(tmp_path, capsys):
    (tmp_path / "x.txt").write_text("hello")
    status, _, err = call(capsys, "convert", tmp_path / "x.txt", tmp_path / "y.arrow")
    assert status == 1 and "neither an Arrow file nor a pickle" in err
    with open(tmp_path / "list.pkl", "wb") as f:
        pickle.dump([1, 2], f)
    status, _, err = call(capsys, "convert", tmp_path / "list.pkl", tmp_path / "y.arrow", "--allow-pickle")
    assert status == 1 and "holds a list, not a DataProto" in err


# ---------------------------------------------------------------- recover, errors


def test_recover(tmp_path, capsys):
    batches = [sample_dataproto(rows=3, seed=s) for s in range(2)]
    writer = FileWriter(tmp_path / "t.arrow")
    for b in batches:
        writer.write(b)
    (partial,) = tmp_path.glob("t.arrow.*.partial")
    blob = partial.read_bytes()  # what a killed writer leaves
    writer.abort()
    (tmp_path / "left.partial").write_bytes(blob)
    status, _, err = call(capsys, "inspect", tmp_path / "left.partial")
    assert status == 1 and "recover" in err
    status, out, _ = call(capsys, "recover", tmp_path / "left.partial", tmp_path / "fixed.arrow")
    assert status == 0 and "recovered 2 complete batches (6 rows)" in out
    assert_dataproto_equal(read_file(tmp_path / "fixed.arrow"), DataProto.concat(batches, meta_info="update"))


def test_errors_are_one_line(tmp_path, capsys):
    status, _, err = call(capsys, "inspect", tmp_path / "missing.arrow")
    assert status == 1 and err.startswith("arrow-dataproto: error:") and err.count("\n") == 1
    (tmp_path / "bad.arrow").write_bytes(b"ARROW1\x00\x00garbage")
    status, _, err = call(capsys, "head", tmp_path / "bad.arrow")
    assert status == 1 and "no Arrow footer" in err


# ---------------------------------------------------------------- bench


def _bench_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "bench_alpha.py").write_text(textwrap.dedent("""
        import sys
        print("alpha ran", sys.argv[1:])
    """))
    (folder / "bench_beta.py").write_text("import sys\nprint('beta ran')\nsys.exit(3)\n")
    (folder / "helper.py").write_text("raise SystemExit('not a benchmark')\n")
    return folder


def test_bench_runs_each_script_with_a_progress_bar(tmp_path, capsys):
    folder = _bench_dir(tmp_path)
    status, out, err = call(capsys, "bench", "--dir", folder, "--quick")
    assert status == 1  # bench_beta failed
    assert "alpha ran ['--quick']" in out and "beta ran" in out and "not a benchmark" not in out
    assert "bench_beta.py (exit 3)" in err
    status, out, _ = call(capsys, "bench", "alpha", "--dir", folder)
    assert status == 0 and "alpha ran []" in out and "beta" not in out
    status, out, _ = call(capsys, "bench", "--list", "--dir", folder)
    assert out.split() == ["alpha", "beta"]


def test_bench_without_a_benchmarks_folder(tmp_path, capsys):
    status, _, err = call(capsys, "bench", "--dir", tmp_path / "nowhere")
    assert status == 1 and "no benchmarks folder" in err
    status, _, err = call(capsys, "bench", "nope", "--dir", _bench_dir(tmp_path))
    assert status == 1 and "no benchmark ['nope']" in err


def test_bench_default_folder_is_the_checkout(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./benchmarks here: the checkout's folder is used
    status, out, _ = call(capsys, "bench", "--list")
    assert status == 0 and "files" in out.split()


# ---------------------------------------------------------------- start-up, inspect details, head layout


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["inspect", "--help"], ["inspect"], ["nope"], ["--version"],
     ["inspect", "/no/such/file.arrow"], ["convert", "/no/such/in.arrow", "out.arrow"]],
)
def test_help_and_usage_errors_import_neither_torch_nor_pyarrow(argv):
    code = (
        "import sys\n"
        "from arrow_dataproto.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'pyarrow', 'numpy', 'tensordict', 'pandas') if m in sys.modules)\n"
        "print('imported:', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.stdout.splitlines()[-1] == "imported: []", result.stdout + result.stderr


def _steps(tmp_path: Path, compression: str | None) -> tuple[Path, list[DataProto]]:
    batches = []
    for step in range(3):
        dp = sample_dataproto(rows=4 + step, seed=step)
        dp.meta_info["global_steps"] = step
        batches.append(dp)
    path = tmp_path / f"steps-{compression}.arrow"
    write_file(path, batches, compression=compression)
    return path, batches


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_inspect_sizes_come_from_the_metadata_without_decoding(tmp_path, capsys, monkeypatch, compression):
    from arrow_dataproto.files import FileReader

    plain, _ = _steps(tmp_path, None)
    packed, batches = _steps(tmp_path, compression)
    plain_info = json.loads(call(capsys, "inspect", plain, "--json")[1])

    def refuse(*_):
        raise AssertionError("inspect read a batch")

    monkeypatch.setattr(FileReader, "_read", refuse)
    status, out, _ = call(capsys, "inspect", packed, "--json")
    assert status == 0
    info = json.loads(out)
    assert info["batch_rows"] == [4, 5, 6] and info["compression"] == compression
    for packed_column, plain_column in zip(info["columns"], plain_info["columns"]):
        # the raw size of a compressed column is what the same column takes uncompressed
        assert packed_column["bytes"] == plain_column["bytes"] == plain_column["stored_bytes"]
    columns = {c["name"]: c for c in info["columns"]}
    assert columns["attention_mask"]["stored_bytes"] < columns["attention_mask"]["bytes"]  # all ones
    lengths = torch.cat([torch.tensor([len(r) for r in b.batch["responses_jagged"].unbind()]) for b in batches])
    expected = {"min": int(lengths.min()), "median": float(lengths.double().median()), "max": int(lengths.max())}
    expected["median"] = float(np.median(lengths.numpy()))
    assert columns["responses_jagged"]["row_lengths"] == expected
    assert columns["position_ids_mrope"]["row_lengths"] == expected  # [3, *]: the ragged dimension
    assert [m["global_steps"] for m in info["meta_info"]["batches"]] == [0, 1, 2]
    assert info["meta_info"]["batches"][2] == batches[2].meta_info


def test_inspect_text_shows_sizes_lengths_and_meta_info_per_batch(tmp_path, capsys):
    path, _ = _steps(tmp_path, "zstd")
    status, out, _ = call(capsys, "inspect", path)
    assert status == 0
    header = out.splitlines()[3].split()
    assert header[:7] == ["column", "kind", "dtype", "row", "shape", "device", "stored"]
    assert "uncompressed)" in out.splitlines()[1]
    assert "meta_info per batch:" in out
    assert "batch 2 (6 rows): temperature=0.7, global_steps=2" in out


def test_inspect_stats(tmp_path, capsys):
    dp = sample_dataproto(rows=6)
    dp.batch["old_log_probs"][0, 0] = float("nan")
    write_file(tmp_path / "f.arrow", [dp[:3], dp[3:]], compression="lz4")
    status, out, _ = call(capsys, "inspect", tmp_path / "f.arrow", "--json", "--stats")
    assert status == 0
    columns = {c["name"]: c for c in json.loads(out)["columns"]}
    values = dp.batch["old_log_probs"].double()
    finite = values[~values.isnan()]
    stats = columns["old_log_probs"]["stats"]
    assert stats["nan"] == 1 and stats["min"] == finite.min().item() and stats["max"] == finite.max().item()
    assert stats["mean"] == pytest.approx(finite.mean().item())
    jagged = torch.cat(dp.batch["responses_jagged"].unbind()).double()
    assert columns["responses_jagged"]["stats"]["max"] == jagged.max().item()
    assert columns["ref_log_prob"]["stats"]["min"] == dp.batch["ref_log_prob"].double().min().item()
    assert columns["uid"]["stats"] is None
    assert "stats" not in json.loads(call(capsys, "inspect", tmp_path / "f.arrow", "--json")[1])["columns"][0]


def test_inspect_never_unpickles_meta_info(tmp_path, capsys):
    dp = sample_dataproto(rows=2)
    dp.meta_info["when"] = {1, 2}  # a set: not JSON, stored pickled
    write_file(tmp_path / "f.arrow", dp)
    status, out, _ = call(capsys, "inspect", tmp_path / "f.arrow")
    assert status == 0 and "meta_info (batch 0): pickled, not shown" in out
    assert "batch 0 (2 rows): pickled, not shown" in out


def test_layout_of_corrupt_files_raises_decode_error(tmp_path):
    """Flipped bytes anywhere in the metadata, lying lengths or a cut file: DecodeError or a
    consistent answer, never another exception (read_layout bounds-checks every offset)."""
    from arrow_dataproto.errors import DecodeError
    from arrow_dataproto.files import read_layout

    path, _ = _steps(tmp_path, "zstd")
    blob = bytearray(path.read_bytes())
    rng = np.random.default_rng(0)
    bad = tmp_path / "bad.arrow"
    outcomes = {"ok": 0, "DecodeError": 0}
    for case in range(300):
        mutated = bytearray(blob)
        if case % 10 == 0:
            mutated = mutated[: int(rng.integers(8, len(blob)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                at = int(rng.integers(0, len(blob)))
                mutated[at] = int(rng.integers(0, 256))
        bad.write_bytes(bytes(mutated))
        try:
            read_layout(bad)
            outcomes["ok"] += 1
        except DecodeError:
            outcomes["DecodeError"] += 1
    assert outcomes["DecodeError"] > 0


def test_head_formats_tensor_cells_and_fits_the_terminal(tmp_path, capsys, monkeypatch):
    dp = sample_dataproto(rows=3)
    write_file(tmp_path / "f.arrow", dp)
    monkeypatch.setenv("COLUMNS", "200")
    status, out, _ = call(capsys, "head", tmp_path / "f.arrow", "--columns", "position_ids_mrope", "responses_jagged",
                          "old_log_probs", "extra")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["position_ids_mrope", "responses_jagged", "old_log_probs", "extra.values"]
    n = len(dp.batch["responses_jagged"][0])
    first = dp.batch["responses_jagged"][0].tolist()
    assert f"i64[3,*{n}] 0 1" in lines[1]
    assert f"i64[*{n}] {first[0]}" in lines[1]
    assert f"f32[7] {dp.batch['old_log_probs'][0, 0].item():.3g} " in lines[1]

    monkeypatch.setenv("COLUMNS", "70")
    status, out, err = call(capsys, "head", tmp_path / "f.arrow")
    lines = out.splitlines()
    assert status == 0 and len(lines) == 4
    assert all(len(line) <= 70 for line in lines)
    assert lines[0].split()[0] == "input_ids" and lines[0].endswith("…")
    assert "more columns not shown" in err and "reward_model" in err


def test_convert_keeps_the_source_compression(tmp_path, capsys):
    path, batches = _steps(tmp_path, "zstd")
    status, out, _ = call(capsys, "convert", path, tmp_path / "same.arrow")
    assert status == 0 and "15 rows in 3 batches, compression zstd" in out
    assert open_file(tmp_path / "same.arrow").compression == "zstd"
    status, out, _ = call(capsys, "convert", path, tmp_path / "plain.arrow", "--compression", "none")
    assert status == 0 and "15 rows in 3 batches, compression none" in out
    assert_dataproto_equal(read_file(tmp_path / "plain.arrow"), DataProto.concat(batches, meta_info="update"))


def test_allow_pickle_hint_is_printed_once(tmp_path, capsys):
    with open(tmp_path / "ours.pkl", "wb") as f:
        pickle.dump(sample_dataproto(rows=2), f)
    status, _, err = call(capsys, "convert", tmp_path / "ours.pkl", tmp_path / "a.arrow")
    assert status == 1 and err.count("--allow-pickle") == 1


def test_inspect_and_head_read_every_column_kind(capsys, monkeypatch):
    """The golden file holding every kind (strided, complex, fp16, bool, N-D numpy, pickles...)."""
    golden = ROOT / "tests" / "data" / "golden-v1.0-kinds.arrow"
    status, out, _ = call(capsys, "inspect", golden, "--stats", "--json")
    assert status == 0
    info = json.loads(out)
    with open_file(golden) as reader:
        assert [c["name"] for c in info["columns"]] == reader.columns
        strided = [c.name for c in reader.column_info() if c.kind == "strided"]
        data = reader.read_all(strided, meta_info=False)
    columns = {c["name"]: c for c in info["columns"]}
    for name in strided:
        rows = data.batch[name].unbind()
        assert columns[name]["row_lengths"]["max"] == max(r.numel() for r in rows)
        assert columns[name]["stats"]["max"] == max(r.double().max().item() for r in rows)
    monkeypatch.setenv("COLUMNS", "400")
    status, out, _ = call(capsys, "head", golden, "-n", "2")
    assert status == 0 and len(out.splitlines()) == 3


def test_inspect_shortens_meta_info_of_many_batches(tmp_path, capsys):
    batches = []
    for step in range(20):
        dp = sample_dataproto(rows=2)
        dp.meta_info["global_steps"] = step
        batches.append(dp)
    write_file(tmp_path / "f.arrow", batches)
    status, out, _ = call(capsys, "inspect", tmp_path / "f.arrow")
    lines = out.splitlines()
    start = lines.index("  meta_info per batch:")
    assert status == 0 and len(lines) - start - 1 == 9
    assert "    ... 12 more (--json shows every batch)" in lines and "global_steps=19" in lines[-1]


# ---------------------------------------------------------------- head without torch: the same cells


def _every_numpy_dtype(rows: int, seed: int) -> DataProto:
    """A column of each dtype numpy shows exactly, dense (1-D, 2-D, 3-D) and jagged (the
    ragged dimension first and second), with the values that format oddly."""
    g = torch.Generator().manual_seed(seed)
    floats = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, 3.3895e38, -1.5])
    ints = {
        torch.int8: [-128, 127], torch.int16: [-(2**15), 2**15 - 1], torch.int32: [-(2**31), 2**31 - 1],
        torch.int64: [-(2**63), 2**63 - 1], torch.uint8: [0, 255], torch.uint16: [0, 2**16 - 1],
        torch.uint32: [0, 2**32 - 1], torch.uint64: [0, 2**63 + 5],
    }
    leaves: dict[str, torch.Tensor] = {}
    for dtype in (torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.complex64, torch.complex128):
        real = floats[torch.randint(len(floats), (rows * 6,), generator=g)].to(dtype.to_real() if dtype.is_complex else dtype)
        values = torch.complex(real, real.flip(0)) if dtype.is_complex else real
        name = str(dtype).removeprefix("torch.")
        leaves[name] = values[:rows]
        leaves[name + "_2d"] = values.view(rows, 6)
        leaves[name + "_3d"] = values.view(rows, 2, 3)
    for dtype, (low, high) in ints.items():
        name = str(dtype).removeprefix("torch.")
        pick = torch.tensor([low, high, 0, 1], dtype=torch.float64)[torch.randint(4, (rows * 4,), generator=g)]
        values = torch.tensor([int(v) for v in pick.tolist()], dtype=dtype) if dtype == torch.uint64 else pick.to(dtype)
        leaves[name] = values[:rows]
        leaves[name + "_2d"] = values.view(rows, 4)
    leaves["bool"] = torch.rand(rows, generator=g) > 0.5
    leaves["bool_2d"] = torch.rand(rows, 5, generator=g) > 0.5
    lengths = [int(n) for n in torch.randint(0, 5, (rows,), generator=g)]
    leaves["jagged"] = torch.nested.nested_tensor(
        [torch.randn(n, generator=g).to(torch.bfloat16) for n in lengths], layout=torch.jagged)
    leaves["jagged_rows"] = torch.nested.nested_tensor(
        [torch.arange(n * 2, dtype=torch.int32).view(n, 2) for n in lengths], layout=torch.jagged)
    leaves["mrope"] = torch.nested.nested_tensor(
        [torch.arange(n * 3).view(n, 3) for n in lengths], layout=torch.jagged).transpose(1, 2)
    batch = TensorDict({**leaves, "nested": TensorDict({"x": torch.arange(rows)}, batch_size=[rows])}, batch_size=[rows])
    non_tensor = {
        "uid": np.array([f"u{seed}-{i}" for i in range(rows)], dtype=object),
        "info": np.array([{"k": i, "v": [1.5, None]} if i % 2 else {"k": [i]} for i in range(rows)], dtype=object),
        "score": np.array([0.25 * i for i in range(rows)]),
        "maybe": np.array([None if i % 3 == 0 else f"x{i}" for i in range(rows)], dtype=object),
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info={"step": seed})


def _head_both_ways(path, monkeypatch, **options):
    """``head_table`` as the command line runs it (numpy where it can) and decoded with torch,
    and whether the numpy path read the rows."""
    from arrow_dataproto import _preview, cli

    used = []

    def spy(*args, **kwargs):
        result = numpy_rows(*args, **kwargs)
        used.append(result is not None)
        return result

    monkeypatch.setattr(_preview, "decoded_rows", spy)
    fast = cli.head_table(path, **options)
    monkeypatch.setattr(_preview, "decoded_rows", lambda *args, **kwargs: None)
    return fast, cli.head_table(path, **options), used == [True]


@pytest.mark.parametrize("options", [{}, {"compression": "zstd"}, {"stream": True}], ids=["plain", "zstd", "stream"])
def test_head_shows_the_same_cells_with_numpy_as_decoded_with_torch(tmp_path, monkeypatch, options):
    """The numpy path of ``head`` (no torch import) against the torch decode, cell for cell:
    every dtype numpy shows, dense and jagged, rows spanning two batches, object columns."""
    path = tmp_path / "every.arrow"
    write_file(path, [_every_numpy_dtype(5, 0), _every_numpy_dtype(4, 1)], **options)
    for window in ({"n": 9}, {"n": 3, "start": 3}, {"n": 2, "start": -1}, {"n": 4, "columns": ["mrope", "info", "nested"]}):
        fast, slow, numpy_used = _head_both_ways(path, monkeypatch, most=64, **window)
        assert numpy_used, window
        assert fast == slow, window
    names, index, cells, _ = fast
    assert index == [0, 1, 2, 3] and names == ["mrope", "info", "nested.x"]


@pytest.mark.parametrize("leaf", ["fp8", "complex32", "strided", "shared_offsets", "batch_2d", "portable", "foreign"])
def test_head_decodes_with_torch_what_numpy_cannot_show(tmp_path, monkeypatch, leaf):
    rows = 3
    batch_size = [rows]
    lengths = [1, 3, 2]
    if leaf == "fp8":
        leaves = {"x": torch.randn(rows, 4).to(torch.float8_e4m3fn)}
    elif leaf == "complex32":
        leaves = {"x": torch.randn(rows, 2, dtype=torch.complex64).to(torch.complex32)}
    elif leaf == "strided":
        leaves = {"x": torch.nested.nested_tensor([torch.ones(n, 2) for n in lengths])}
    elif leaf == "shared_offsets":
        first = torch.nested.nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)
        leaves = {"a": first, "b": torch.nested.nested_tensor_from_jagged(first.values() * 2, first.offsets())}
    elif leaf == "batch_2d":
        leaves, batch_size = {"x": torch.arange(rows * 2 * 3).view(rows, 2, 3)}, [rows, 2]
    else:
        leaves = {"x": torch.randn(rows, 2).to(torch.bfloat16)}
    dp = DataProto(batch=TensorDict(leaves, batch_size=batch_size), non_tensor_batch={"s": np.array(["a", "b", "c"], dtype=object)})
    path = tmp_path / "f.arrow"
    if leaf == "foreign":
        import pyarrow as pa

        with pa.ipc.new_file(path, pa.schema([("x", pa.list_(pa.float32(), 2)), ("s", pa.string())])) as writer:
            writer.write_table(pa.table({"x": pa.array([[1.5, 2.0]] * rows, pa.list_(pa.float32(), 2)), "s": ["a", "b", "c"]}))
    else:
        write_file(path, dp, portable=leaf == "portable")
    fast, slow, numpy_used = _head_both_ways(path, monkeypatch)
    assert not numpy_used
    assert fast == slow and fast[1] == [0, 1, 2]
