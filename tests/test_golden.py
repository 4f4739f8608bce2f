"""Compatibility: payloads written by every format version so far keep decoding.

``tests/data/golden-v<MAJOR>.<MINOR>-<name>.{arrows,pkl,arrow}`` are written once per format
version by ``tests/golden.py`` (an IPC stream, a protocol-5 pickle with its buffers
inline, an Arrow file) and never regenerated. Each is decoded here and compared bit for bit
with the DataProto rebuilt by the same deterministic builder (golden payloads of another
major version must raise ``FormatVersionError`` instead). The versioning rule (a reader
accepts every minor of its major, refuses other majors) is also checked on edited copies.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import warnings
from pathlib import Path

import golden
import pyarrow as pa
import pytest

import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.testing import assert_dataproto_equal

DATA = Path(__file__).parent / "data"
MANIFESTS = sorted(DATA.glob("golden-v*.json"))
PAYLOADS = sorted(p for p in DATA.glob("golden-v*-*") if p.suffix in (".arrows", ".pkl", ".arrow"))


def _decode(path: Path) -> adp.DataProto:
    if path.suffix == ".arrows":
        return adp.from_ipc(path.read_bytes(), allow_pickle=True)
    if path.suffix == ".pkl":
        return pickle.loads(path.read_bytes())
    return files.read_file(path, allow_pickle=True)


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: p.name)
def test_golden_payload_decodes_exactly(path):
    """Payloads of this reader's major version decode bit for bit; other majors are refused."""
    _, version, name = path.stem.split("-", 2)  # golden-v1.0-sample
    if int(version[1:].split(".")[0]) != adp.FORMAT_VERSION[0]:
        with pytest.raises(adp.FormatVersionError):
            _decode(path)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "device not available" fallback on the way
        decoded = _decode(path)
    assert_dataproto_equal(golden.GOLDEN[name](), decoded)


def test_current_version_has_golden_payloads():
    """Bumping FORMAT_VERSION without running scripts/golden.py fails here."""
    current = DATA / f"{golden.prefix()}.json"
    assert current in MANIFESTS, f"run scripts/golden.py to write {current.name}"


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.name)
def test_golden_payloads_are_the_committed_bytes(manifest):
    """Every payload a manifest lists is present, unchanged (not regenerated), and small."""
    entries = json.loads(manifest.read_text())["files"]
    builders = {name.split("-", 2)[2].rsplit(".", 1)[0] for name in entries}  # golden-v1.0-sample.pkl
    assert builders <= set(golden.GOLDEN) and len(entries) == 3 * len(builders)
    if manifest.name == f"{golden.prefix()}.json":  # the current version has every builder
        assert builders == set(golden.GOLDEN)
    for name, entry in entries.items():
        data = (DATA / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert len(data) < 200 * 1024, name


def test_pickled_payloads_are_refused_without_allow_pickle():
    stem = golden.prefix()
    with pytest.raises(adp.PickleNotAllowedError):
        adp.from_ipc((DATA / f"{stem}-pickled.arrows").read_bytes())
    with pytest.raises(adp.PickleNotAllowedError):
        files.read_file(DATA / f"{stem}-pickled.arrow")


# ---------------------------------------------------------------- the versioning rule


def _versioned(metadata: dict[bytes, bytes] | None, version: str) -> dict[bytes, bytes]:
    return {**(metadata or {}), b"adp.version": version.encode()}


def _stream_with_version(path: Path, version: str) -> bytes:
    batch = pa.ipc.open_stream(path.read_bytes()).read_next_batch()
    batch = batch.replace_schema_metadata(_versioned(batch.schema.metadata, version))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _file_with_version(path: Path, out: Path, version: str) -> Path:
    """A copy of the Arrow file at ``path`` whose footer schema and batches all claim ``version``."""
    reader = pa.ipc.open_file(path.read_bytes())
    schema = reader.schema.with_metadata(_versioned(reader.schema.metadata, version))
    with pa.ipc.new_file(str(out), schema, metadata=reader.metadata) as writer:
        for i in range(reader.num_record_batches):
            batch, custom = reader.get_batch_with_custom_metadata(i)
            writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=schema), custom_metadata=_versioned(custom, version))
    return out


def test_a_newer_minor_version_decodes(tmp_path):
    stem = golden.prefix()
    expected = golden.GOLDEN["sample"]()
    minor = "%d.99" % adp.FORMAT_VERSION[0]
    assert_dataproto_equal(expected, adp.from_ipc(_stream_with_version(DATA / f"{stem}-sample.arrows", minor)))
    copy = _file_with_version(DATA / f"{stem}-sample.arrow", tmp_path / "minor.arrow", minor)
    assert_dataproto_equal(expected, files.read_file(copy))


@pytest.mark.parametrize("major", [adp.FORMAT_VERSION[0] + 1, adp.FORMAT_VERSION[0] - 1])
def test_another_major_version_is_refused(tmp_path, major):
    stem = golden.prefix()
    version = f"{major}.0"
    with pytest.raises(adp.FormatVersionError, match=version):
        adp.from_ipc(_stream_with_version(DATA / f"{stem}-sample.arrows", version))
    copy = _file_with_version(DATA / f"{stem}-sample.arrow", tmp_path / "major.arrow", version)
    with pytest.raises(adp.FormatVersionError, match=version):
        files.read_file(copy)


@pytest.mark.parametrize("version", ["1", "1.x", "", "v1.0"])
def test_a_malformed_version_is_refused(version):
    with pytest.raises(adp.DecodeError, match="version"):
        adp.from_ipc(_stream_with_version(DATA / f"{golden.prefix()}-sample.arrows", version))
