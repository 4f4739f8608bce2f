"""FileWriter modes: "a" appends to a file of ours (across processes, and safely when the
appending process is killed), "x" refuses an existing path; verify without checksums."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.errors import EncodeError, OptionError, SchemaMismatchError
from arrow_dataproto.testing import assert_dataproto_equal
from arrow_dataproto.testing.samples import ppo_batch

ROOT = Path(__file__).resolve().parent.parent
FORMS = {"file": {}, "stream": {"stream": True}, "zstd+checksums": {"compression": "zstd", "checksums": True}}


def batch(seed: int) -> adp.DataProto:
    """The batch of step ``seed`` (4 + seed rows), the same in every process."""
    return adp.DataProto(*ppo_batch(rows=4 + seed, prompt=3, response=5, seed=seed))


def _python(code: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True, **kwargs)


BATCH = """
import sys
import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.testing.samples import ppo_batch

def batch(seed):
    return adp.DataProto(*ppo_batch(rows=4 + seed, prompt=3, response=5, seed=seed))
"""
"""What a child process starts with: :func:`batch` as this module's."""


def _read_all(path: Path) -> list[adp.DataProto]:
    with files.open_file(path) as reader:
        return [reader.read_batch(i) for i in range(reader.num_batches)]


@pytest.mark.parametrize("form", FORMS, ids=FORMS)
def test_appends_across_processes_keep_every_batch_and_the_form(tmp_path, form):
    path = tmp_path / "steps.arrow"
    files.write_file(path, [batch(0), batch(1)], **FORMS[form])
    if form != "zstd+checksums":  # another process appends (compressed: this one, the same code)
        child = _python(BATCH + f"files.write_file({str(path)!r}, [batch(2), batch(3)], mode='a')")
        assert child.wait(timeout=120) == 0
    else:
        files.write_file(path, [batch(2), batch(3)], mode="a")
    with files.FileWriter(path, "a") as writer:  # and this one, after it
        writer.write(batch(4))
    got = _read_all(path)
    assert len(got) == 5
    for seed, dp in enumerate(got):
        assert_dataproto_equal(dp, batch(seed))
    with files.open_file(path) as reader:
        assert reader.stream == bool(FORMS[form].get("stream"))
        assert reader.compression == FORMS[form].get("compression")
        if FORMS[form].get("checksums"):
            assert reader.verify() > 0  # every batch, appended ones included, has its checksums
    assert [p.name for p in tmp_path.iterdir()] == ["steps.arrow"]  # no partial file left


@pytest.mark.parametrize("form", ["file", "stream"])
def test_a_writer_killed_mid_append_leaves_the_file_as_it_was(tmp_path, form):
    path = tmp_path / "steps.arrow"
    files.write_file(path, [batch(0), batch(1)], **FORMS[form])
    before = path.read_bytes()
    child = _python(
        BATCH +
        f"writer = files.FileWriter({str(path)!r}, 'a')\n"
        "seed = 2\n"
        "while True:\n"
        "    writer.write(batch(seed))\n"
        "    print(seed, flush=True)\n"
        "    seed = 2 + (seed - 1) % 3\n",
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    for _ in range(4):  # the copy of the file's batches, then 4 appended batches: killed while writing more
        assert child.stdout.readline().strip()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert path.read_bytes() == before  # untouched: readable as it was
    for seed, dp in enumerate(_read_all(path)):
        assert_dataproto_equal(dp, batch(seed))
    partial = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert len(partial) == 1
    if form == "file":  # the partial file keeps every batch written before the kill
        recovered = tmp_path / "recovered.arrow"
        count = files.recover_file(partial[0], recovered)
        assert count >= 6
        got = _read_all(recovered)
        for seed, dp in enumerate(got[:6]):
            assert_dataproto_equal(dp, batch(seed if seed < 2 else 2 + (seed - 2) % 3))


def test_append_follows_the_schema_rules_of_a_new_batch(tmp_path):
    path = tmp_path / "steps.arrow"
    files.write_file(path, batch(0))
    before = path.read_bytes()
    other = batch(1)
    other.batch["extra"] = other.batch["responses"].float()
    with pytest.raises(SchemaMismatchError, match="batch 1 does not match the columns"):
        with files.FileWriter(path, "a") as writer:
            writer.write(other)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["steps.arrow"]


def test_append_to_a_missing_path_writes_a_new_file(tmp_path):
    files.write_file(tmp_path / "new.arrow", batch(0), mode="a")
    assert_dataproto_equal(files.read_file(tmp_path / "new.arrow"), batch(0))


def test_append_refuses_another_tools_file(tmp_path):
    path = tmp_path / "other.arrow"
    table = pa.table({"x": [1, 2, 3]})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(SchemaMismatchError, match="is not a file of arrow-dataproto: mode='a' appends only to one"):
        files.FileWriter(path, "a")


def test_mode_x_refuses_an_existing_path_and_never_replaces_one(tmp_path):
    path = tmp_path / "once.arrow"
    files.write_file(path, batch(0), mode="x")
    with pytest.raises(OptionError, match="exists: mode='x' writes only a new file"):
        files.write_file(path, batch(1), mode="x")
    assert_dataproto_equal(files.read_file(path), batch(0))
    late = tmp_path / "late.arrow"
    writer = files.FileWriter(late, "x")
    writer.write(batch(1))
    late.write_bytes(b"another writer's")
    with pytest.raises(EncodeError, match="File exists"):
        writer.close()
    assert late.read_bytes() == b"another writer's"
    with pytest.raises(OptionError, match=r"mode must be one of \('w', 'a', 'x'\), got 'r'"):
        files.FileWriter(path, "r")


def test_verify_without_checksums_checks_the_structure_and_says_so(tmp_path):
    path = tmp_path / "plain.arrow"
    files.write_file(path, [batch(0), batch(1)])
    files.write_file(path, batch(2), mode="a", checksums=True)  # the whole file now has checksums
    run = [sys.executable, "-m", "arrow_dataproto", "verify", str(path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "3 batches, structure valid" in out.stdout and "buffers match their checksums" in out.stdout
    files.write_file(path, [batch(0), batch(1)])
    out = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "2 batches, structure valid" in out.stdout and "no checksums (written without checksums=True)" in out.stdout
    path.write_bytes(path.read_bytes()[:-100])  # no footer: the structure is broken
    out = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1 and out.stderr.startswith("arrow-dataproto: error:")
