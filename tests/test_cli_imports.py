"""The command line's light commands import neither torch nor tensordict: ``inspect`` and
``verify`` of IPC files and stream files (plain and compressed) read them with pyarrow alone,
and ``--help`` of every command answers from argparse. Each runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arrow_dataproto import files
from arrow_dataproto.testing import sample_dataproto

CHECK = """
import contextlib, io, json, sys
from arrow_dataproto.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        status = main(sys.argv[1:])
    except SystemExit as e:  # --help
        status = e.code
heavy = sorted(m for m in ("torch", "tensordict") if m in sys.modules)
print(json.dumps({"status": status, "heavy": heavy, "out": out.getvalue()}))
"""


def _run(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cli")
    dp = sample_dataproto(rows=4)
    out = {}
    for name, options in {"plain.arrow": {}, "zstd.arrow": {"compression": "zstd"},
                          "plain.arrows": {"stream": True}, "lz4.arrows": {"stream": True, "compression": "lz4"}}.items():
        out[name] = folder / name
        files.write_file(out[name], [dp, dp], **options)
    return out


@pytest.mark.parametrize("name", ["plain.arrow", "zstd.arrow", "plain.arrows", "lz4.arrows"])
def test_inspect_imports_no_torch(written, name):
    result = _run("inspect", str(written[name]), "--json")
    assert result["status"] == 0
    assert result["heavy"] == []
    info = json.loads(result["out"])
    assert info["rows"] == 8 and info["batches"] == 2
    assert info["meta_info"]["batches"][0] == sample_dataproto(rows=4).meta_info  # streams too
    assert sum(c["bytes"] for c in info["columns"]) > 0
    if "zstd" in name or "lz4" in name:
        assert any(c["stored_bytes"] != c["bytes"] for c in info["columns"])  # stored vs raw, streams too
    jagged = [c for c in info["columns"] if c["kind"] == "jagged"]
    assert jagged and all(c["row_lengths"] is not None for c in jagged)


@pytest.mark.parametrize("command", ["inspect", "head", "convert", "verify", "recover", "bench"])
def test_help_imports_no_torch(command):
    result = _run(command, "--help")
    assert result["status"] == 0
    assert result["heavy"] == []
    assert "usage" in result["out"]


@pytest.mark.parametrize("stream", [False, True])
def test_verify_imports_no_torch(tmp_path, stream):
    pytest.importorskip("xxhash", reason="xxhash is not installed (pip install arrow-dataproto[integrity])")
    path = tmp_path / ("x.arrows" if stream else "x.arrow")
    dp = sample_dataproto(rows=4)
    files.write_file(path, [dp, dp], checksums=True, stream=stream, compression="zstd")
    result = _run("verify", str(path))
    assert result["status"] == 0 and result["heavy"] == []
    assert "2 batches" in result["out"] and "match their checksums" in result["out"]
    files.write_file(path, dp, stream=stream)  # no checksums: the structure alone, and it says so
    result = _run("verify", str(path))
    assert result["status"] == 0 and result["heavy"] == []
    assert "1 batches, structure valid" in result["out"] and "no checksums (written without checksums=True)" in result["out"]


@pytest.mark.parametrize("name", ["plain.arrow", "zstd.arrow", "plain.arrows", "lz4.arrows"])
def test_head_imports_no_torch(written, name):
    """Every column of the sample (bf16, bool, jagged, mrope-style jagged, a nested TensorDict,
    strings, structs) is shown with numpy; rows 3 and 4 come from two batches."""
    shown = {"ref_log_prob": "bf16[7]", "response_mask": "bool[7]", "position_ids_mrope": "i64[3,*",
             "responses_jagged": "i64[*", "extra": "f32[7]", "uid": "-", "reward_model": "{"}
    for column, cell in shown.items():  # one column a call: the terminal's width is unknown here
        result = _run("head", str(written[name]), "--start", "3", "-n", "2", "--columns", column)
        assert result["status"] == 0
        assert result["heavy"] == []
        lines = result["out"].splitlines()
        assert len(lines) == 3 and lines[1].startswith("3 ") and lines[2].startswith("4 ")
        assert lines[0].split() == [column if column != "extra" else "extra.values"] and cell in lines[1], lines


def test_head_of_a_verl_rollout_imports_no_torch(tmp_path):
    from arrow_dataproto import DataProto
    from arrow_dataproto.testing import samples

    batch, non_tensor_batch, meta_info = samples.verl_rollout(rows=8, prompt=16, response=16)
    path = tmp_path / "rollout.arrow"
    files.write_file(path, DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta_info))
    every = [*batch.keys(), *non_tensor_batch]
    result = _run("head", str(path), "--columns", *every)
    assert result["status"] == 0 and result["heavy"] == []
    assert len(result["out"].splitlines()) == 6
