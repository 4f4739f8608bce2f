"""Hostile input, round two (issue 13): one test per defect class, through public entry points only.

Cases that once crashed the process (SIGSEGV/SIGABRT) or hung it run in a subprocess, so a
regression fails the test instead of killing pytest. Each test asserts the library's own
error (a ``DataProtoError`` subclass) or an exact result.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto import pandas as adp_pandas
from arrow_dataproto.errors import DataProtoError, DecodeError, EncodeError
from arrow_dataproto.testing import assert_dataproto_equal

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120


def run_python(code: str, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (this checkout first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )


def run_cli(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "arrow_dataproto", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )


def assert_refused(result: subprocess.CompletedProcess, error: str = "DecodeError") -> None:
    """The subprocess ended normally (no signal) after printing the library's ``error``."""
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.strip().splitlines()[-1] == error, result.stdout


def _objects(*rows) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    out[:] = list(rows) if not any(isinstance(r, list) for r in rows) else [None] * len(rows)
    for i, r in enumerate(rows):
        out[i] = r
    return out


def _jagged(*lengths: int, dtype=torch.float32) -> torch.Tensor:
    return torch.nested.nested_tensor([torch.arange(n, dtype=dtype) for n in lengths], layout=torch.jagged)


def _file_with_offsets(path: Path) -> bytes:
    """A file with a jagged column (int64 offsets 0,3,5,9) and a list-of-lists object column
    (outer int32 offsets 0,2,3,6); returns its bytes."""
    dp = adp.DataProto(
        batch=TensorDict({"j": _jagged(3, 2, 4)}, batch_size=[3]),
        non_tensor_batch={"o": _objects([[1, 2], [3]], [[4]], [[5, 6, 7], [8], [9]])},
    )
    files.write_file(path, dp)
    return path.read_bytes()


def _patch(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1
    return data.replace(old, new)


@pytest.fixture
def bad_jagged(tmp_path) -> Path:
    """A file whose jagged column's first offset is 900 (values end at 9)."""
    data = _file_with_offsets(tmp_path / "good.arrow")
    path = tmp_path / "bad_jagged.arrow"
    path.write_bytes(_patch(data, struct.pack("<4q", 0, 3, 5, 9), struct.pack("<4q", 900, 3, 5, 9)))
    return path


@pytest.fixture
def bad_lists(tmp_path) -> Path:
    """A file whose list-of-lists column's last outer offset is 2e9 (the child has 6 lists)."""
    data = _file_with_offsets(tmp_path / "good.arrow")
    path = tmp_path / "bad_lists.arrow"
    path.write_bytes(_patch(data, struct.pack("<4i", 0, 2, 3, 6), struct.pack("<4i", 0, 2, 3, 2_000_000_000)))
    return path


# ---------------------------------------------------------------- 1. crashes: every path validates first

_EVERY_PATH = """
import sys
import arrow_dataproto as adp
from arrow_dataproto import files
path, out = sys.argv[1], sys.argv[2]
paths = {
    "copy": lambda: files.copy_file(path, out),
    "copy-zstd": lambda: files.copy_file(path, out, compression="zstd"),
    "nbytes": lambda: files.open_file(path).column_nbytes(),
    "dataset-nbytes": lambda: files.open_dataset([path]).column_nbytes(),
    "recover": lambda: files.recover_file(path, out),
    "read": lambda: files.open_file(path).read_all(),
}
for what, call in paths.items():
    print(what, end=" ", flush=True)
    try:
        call()
        print("no error", flush=True)
    except adp.DataProtoError as e:
        print(type(e).__name__, flush=True)
"""


@pytest.mark.parametrize("damage", ["bad_jagged", "bad_lists"])
def test_every_path_validates_before_touching_a_batch(damage, request, tmp_path):
    path = request.getfixturevalue(damage)
    result = run_python(_EVERY_PATH, str(path), str(tmp_path / "out.arrow"))
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])
    outcomes = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert outcomes == dict.fromkeys(["copy", "copy-zstd", "nbytes", "dataset-nbytes", "recover", "read"], "DecodeError")


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_cli_refuses_damaged_offsets(command, bad_jagged, bad_lists, tmp_path):
    for path in (bad_jagged, bad_lists):
        args = [command, path] + ([tmp_path / "out.arrow"] if command == "convert" else [])
        result = run_cli(*args)
        assert result.returncode == 1, (args, result.returncode, result.stderr[-2000:])
        assert result.stderr.startswith("arrow-dataproto: error:"), result.stderr


# ---------------------------------------------------------------- 2, 3. allocations and bombs


def _stream_with(dp, *, field_meta: dict[str, dict[str, str]] | None = None, schema_meta=None, compression=None) -> bytes:
    """``to_ipc(dp)`` with some metadata values replaced."""
    batch = adp.to_arrow(dp)
    fields = []
    for field in batch.schema:
        meta = {**(field.metadata or {}), **{k.encode(): v.encode() for k, v in (field_meta or {}).get(field.name, {}).items()}}
        fields.append(field.with_metadata(meta))
    meta = {**batch.schema.metadata, **{k.encode(): v.encode() for k, v in (schema_meta or {}).items()}}
    batch = pa.RecordBatch.from_arrays(batch.columns, schema=pa.schema(fields, metadata=meta))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _strings(*values: str) -> adp.DataProto:
    return adp.DataProto(non_tensor_batch={"s": np.array(values)})


_PEAK = """
import resource, sys, pickle
import arrow_dataproto as adp
from arrow_dataproto import pandas as adp_pandas
payload = pickle.load(open(sys.argv[1], "rb"))
kind = sys.argv[2]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    if kind == "ipc":
        adp.from_ipc(payload)
    else:
        adp_pandas.from_pandas(payload)
    print("decoded")
except adp.DataProtoError as e:
    print(type(e).__name__)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def _peak(tmp_path: Path, payload, kind: str) -> tuple[str, int]:
    (tmp_path / "payload.pkl").write_bytes(pickle.dumps(payload))
    result = run_python(_PEAK, str(tmp_path / "payload.pkl"), kind)
    assert result.returncode == 0, result.stderr[-2000:]
    outcome, mib = result.stdout.split()[-2:]
    return outcome, int(mib)


def test_recorded_string_width_cannot_steer_an_allocation(tmp_path):
    payload = _stream_with(_strings("a", "b"), field_meta={"s": {"adp.dtype": "<U100000000"}})
    assert len(payload) < 2000
    outcome, mib = _peak(tmp_path, payload, "ipc")
    assert outcome == "DecodeError" and mib < 64, (outcome, mib)


def test_recorded_string_width_in_dataframe_attrs_is_bounded(tmp_path):
    frame = adp_pandas.to_pandas(_strings("a", "b"))
    frame.attrs["arrow_dataproto"]["columns"]["s"]["dtype"] = "<U100000000"
    outcome, mib = _peak(tmp_path, frame, "pandas")
    assert outcome in ("DecodeError", "EncodeError") and mib < 64, (outcome, mib)


def test_a_padded_string_width_still_round_trips():
    dp = adp.DataProto(non_tensor_batch={"s": np.array(["a", "bc"], dtype="<U40")})
    assert_dataproto_equal(adp.from_ipc(adp.to_ipc(dp)), dp)
    assert adp.from_ipc(adp.to_ipc(dp)).non_tensor_batch["s"].dtype == np.dtype("<U40")


def _bomb() -> adp.DataProto:
    return adp.DataProto(batch=TensorDict({"z": torch.zeros(64, 1 << 20, dtype=torch.int64)}, batch_size=[64]))


def test_compression_bomb_is_refused_by_default_and_allowed_on_request(tmp_path):
    payload = adp.to_ipc(_bomb(), compression="zstd")
    assert payload.size < 1 << 20  # 512 MiB of zeros
    with pytest.raises(DecodeError, match="max_decoded_bytes"):
        adp.from_ipc(payload)
    with pytest.raises(DecodeError, match="max_decoded_bytes"):
        adp.from_ipc(adp.to_ipc(adp.DataProto(batch=TensorDict({"z": torch.zeros(8, 1024)}, [8])), compression="lz4"),
                     max_decoded_bytes=1000)
    path = tmp_path / "bomb.arrow"
    files.write_file(path, _bomb(), compression="zstd")
    assert path.stat().st_size < 1 << 20
    with files.open_file(path) as reader:
        with pytest.raises(DecodeError, match="max_decoded_bytes"):
            reader.read_batch(0)
    small = adp.DataProto(batch=TensorDict({"z": torch.zeros(4, 1 << 16, dtype=torch.int64)}, batch_size=[4]))
    assert_dataproto_equal(adp.from_ipc(adp.to_ipc(small, compression="zstd"), max_decoded_bytes=None), small)
    with files.open_file(path, max_decoded_bytes=None) as reader:
        assert reader.read_batch(0, ["z"]).batch["z"].shape == (64, 1 << 20)


# ---------------------------------------------------------------- 4. cost in the column count


class _CountingSchema:
    """A schema that counts how often its attributes are looked up or it is iterated."""

    def __init__(self, schema: pa.Schema):
        self._schema, self.lookups = schema, 0

    def __getattr__(self, name):
        self.lookups += 1
        return getattr(self._schema, name)

    def __iter__(self):
        self.lookups += 1
        return iter(self._schema)


def test_schema_comparison_is_linear_in_the_columns():
    """A quadratic comparison looked columns up by name in a list (``name in got.names``,
    ``got.field(name)``) once per column: 6,000 columns took 7.4 s. Linear: the number of
    lookups on each schema does not grow with the columns (timings are in benchmarks/)."""

    def lookups(n: int, last: str) -> tuple[int, list[str]]:
        def schema(last_name: str) -> pa.Schema:
            names = [f"c{i}" for i in range(n - 1)] + [last_name]
            return pa.schema([pa.field(c, pa.int64(), metadata={"adp.kind": "tensor"}) for c in names],
                             metadata={"adp.format": "arrow-dataproto", "adp.version": "1.1", "adp.batch_size": "null",
                                       "adp.device": "null", "adp.tree": "[]"})

        a, b = _CountingSchema(schema("z")), _CountingSchema(schema(last))
        differences = files.schema_difference(a, b)
        return a.lookups + b.lookups, differences

    small, same = lookups(10, "z")
    large, differ = lookups(10_000, "y")
    assert same == [] and differ == ["missing column(s) ['z']", "added column(s) ['y']"]
    assert large <= small + 2, (small, large)


# ---------------------------------------------------------------- 5. hangs: non-regular files


_FIFO = """
import os, sys
import arrow_dataproto as adp
from arrow_dataproto import files
path = sys.argv[1]
paths = {
    "open": lambda: files.open_file(path),
    "dataset": lambda: files.open_dataset(os.path.dirname(path)),
    "recover": lambda: files.recover_file(path, path + ".out"),
    "copy": lambda: files.copy_file(path, path + ".out"),
    "load_from_disk": lambda: adp.DataProto.load_from_disk(path),
}
for what, call in paths.items():
    print(what, end=" ", flush=True)
    try:
        call()
        print("no error", flush=True)
    except adp.DataProtoError as e:
        print(type(e).__name__, flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "data" / "x.arrow"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    result = run_python(_FIFO, str(fifo), timeout=60)
    outcomes = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert outcomes == dict.fromkeys(["open", "dataset", "recover", "copy", "load_from_disk"], "DecodeError"), result.stdout
    for command in (["inspect", fifo], ["head", fifo], ["convert", fifo, fifo.parent / "out.arrow"],
                    ["recover", fifo, fifo.parent / "out.arrow"]):
        result = run_cli(*command, timeout=60)
        assert result.returncode == 1 and "not a regular file" in result.stderr, (command, result.stderr)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(DecodeError, match="not a regular file"):
        files.open_file(tmp_path)


# ---------------------------------------------------------------- 6. a writer after a failed write

_FAILED_WRITE = """
import resource, signal, sys
import torch
from tensordict import TensorDict
import arrow_dataproto as adp
from arrow_dataproto import files
path = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
def batch(v):
    return adp.DataProto(batch=TensorDict({"x": torch.full((64, 1024), v, dtype=torch.int64)}, batch_size=[64]))
writer = files.FileWriter(path)
writer.write(batch(1))
resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.RLIM_INFINITY))
try:
    writer.write(batch(2))   # 512 KiB more: crosses the 1 MB limit half-way
    print("no error")
except adp.EncodeError:
    print("EncodeError")
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
for action in ("write", "close"):
    try:
        writer.write(batch(3)) if action == "write" else writer.close()
        print(action, "accepted")
    except adp.DataProtoError as e:
        print(action, type(e).__name__)
print(writer._partial)
"""


def test_a_writer_refuses_further_use_after_a_failed_write(tmp_path):
    path = tmp_path / "x.arrow"
    result = run_python(_FAILED_WRITE, str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")
    assert lines[:3] == ["EncodeError", "write EncodeError", "close EncodeError"], result.stdout
    assert not path.exists()  # nothing half-written under the final name
    partial = Path(lines[3])
    assert partial.exists()  # the complete batches stay recoverable
    assert files.recover_file(partial, tmp_path / "fixed.arrow") == 1
    recovered = files.read_file(tmp_path / "fixed.arrow")
    assert bool((recovered.batch["x"] == 1).all()) and recovered.batch["x"].shape == (64, 1024)


def test_recover_never_returns_a_half_written_batch(tmp_path):
    """A batch whose body was cut short and then followed by another batch (what an old
    writer left after a failed write) is not a complete batch."""
    batch = lambda v: adp.DataProto(batch=TensorDict({"x": torch.full((16, 256), v, dtype=torch.int64)}, [16]))
    stream = bytearray()
    sink = pa.BufferOutputStream()
    first = adp.to_arrow(batch(1))
    with pa.ipc.new_stream(sink, first.schema) as w:
        w.write_batch(first, custom_metadata=first.schema.metadata)
        size_one = sink.tell()
        w.write_batch(adp.to_arrow(batch(2)), custom_metadata=first.schema.metadata)
        size_two = sink.tell()
        w.write_batch(adp.to_arrow(batch(3)), custom_metadata=first.schema.metadata)
    data = sink.getvalue().to_pybytes()
    cut = size_one + (size_two - size_one) * 3 // 4  # batch 2 loses its last quarter...
    stream = b"ARROW1\x00\x00" + data[:cut] + data[size_two:]  # ...and batch 3 follows right after
    path = tmp_path / "x.arrow.partial"
    path.write_bytes(stream)
    assert files.recover_file(path, tmp_path / "fixed.arrow") == 1
    assert bool((files.read_file(tmp_path / "fixed.arrow").batch["x"] == 1).all())


@pytest.mark.parametrize("kept", [0, 1, 2, 3, 4, 7])
def test_recover_keeps_the_last_batch_when_the_end_marker_was_cut(kept, tmp_path):
    """A writer killed while closing leaves every batch complete and part of the end-of-stream
    marker (or of the footer after it): every batch is recovered."""
    batch = lambda v: adp.DataProto(batch=TensorDict({"x": torch.full((4, 8), v, dtype=torch.int64)}, [4]))
    first = adp.to_arrow(batch(1))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, first.schema) as w:
        for v in (1, 2, 3):
            w.write_batch(adp.to_arrow(batch(v)), custom_metadata=first.schema.metadata)
        batches_end = sink.tell()
    data = sink.getvalue().to_pybytes()
    path = tmp_path / "x.arrow.partial"
    path.write_bytes(b"ARROW1\x00\x00" + data[: batches_end + kept])
    assert files.recover_file(path, tmp_path / "fixed.arrow") == 3
    assert files.read_file(tmp_path / "fixed.arrow").batch["x"][:, 0].tolist() == [1] * 4 + [2] * 4 + [3] * 4


# ---------------------------------------------------------------- 7. metadata that lies


def test_a_duplicate_tree_key_is_refused():
    dp = adp.DataProto(batch=TensorDict({"a": torch.zeros(2), "b": TensorDict({"c": torch.ones(2)}, [2])}, [2]))
    batch = adp.to_arrow(dp)
    tree = json.dumps(["a", ["a", [2], None, ["c"]]])
    meta = {**batch.schema.metadata, b"adp.tree": tree.encode()}
    fields = [batch.schema.field(0), batch.schema.field(1).with_name("a.c")]
    lying = pa.RecordBatch.from_arrays(batch.columns, schema=pa.schema(fields, metadata=meta))
    with pytest.raises(DecodeError, match="duplicate"):
        adp.from_arrow(lying)


def test_colliding_tree_keys_are_refused():
    # a leaf named "b.c" and a nested "b" holding "c": both are column "b.c"
    dp = adp.DataProto(batch=TensorDict({"x": torch.zeros(2), "y": torch.ones(2)}, [2]))
    batch = adp.to_arrow(dp)
    tree = json.dumps(["b.c", ["b", [2], None, ["c"]]])
    meta = {**batch.schema.metadata, b"adp.tree": tree.encode()}
    fields = [batch.schema.field(0).with_name("b.c"), batch.schema.field(1).with_name("b.c")]
    lying = pa.RecordBatch.from_arrays(batch.columns, schema=pa.schema(fields, metadata=meta))
    with pytest.raises(DecodeError):
        adp.from_arrow(lying)


def test_a_string_dtype_narrower_than_the_data_is_refused_not_truncated():
    payload = _stream_with(_strings("hello world", "x"), field_meta={"s": {"adp.dtype": "<U2"}})
    with pytest.raises(DecodeError, match="longer"):
        adp.from_ipc(payload)
    payload = _stream_with(adp.DataProto(non_tensor_batch={"b": np.array([b"hello", b"x"])}),
                           field_meta={"b": {"adp.dtype": "|S2"}})
    with pytest.raises(DecodeError, match="longer"):
        adp.from_ipc(payload)


# ---------------------------------------------------------------- 8. precision through pandas


@pytest.mark.parametrize("dtype", ["M8[ps]", "M8[fs]", "M8[as]", "m8[ps]", "m8[fs]", "m8[as]", "M8", "m8"])
def test_fine_datetimes_are_exact_through_pandas(dtype):
    values = np.array([1, 2, 3], dtype=np.int64).view(dtype) if dtype not in ("M8", "m8") else np.array(
        ["NaT", "NaT", "NaT"], dtype=dtype)
    dp = adp.DataProto(non_tensor_batch={"t": values})
    try:
        frame = adp_pandas.to_pandas(dp)
    except DataProtoError:
        return  # refused is allowed; silently truncated is not
    back = adp_pandas.from_pandas(frame)
    got = back.non_tensor_batch["t"]
    assert got.dtype == values.dtype and got.view(np.int64).tolist() == values.view(np.int64).tolist()


# ---------------------------------------------------------------- 9. shared jagged offsets


def _shared() -> adp.DataProto:
    logp = _jagged(3, 1, 4, 2)
    mask = torch.nested.nested_tensor_from_jagged(torch.ones(10), logp.offsets())
    return adp.DataProto(batch=TensorDict({"logp": logp, "mask": mask}, batch_size=[4]))


@pytest.mark.parametrize("how", ["ipc", "pickle", "file", "slice", "index", "concat"])
def test_shared_jagged_offsets_stay_shared(how, tmp_path):
    dp = _shared()
    if how == "ipc":
        out = adp.from_ipc(adp.to_ipc(dp))
    elif how == "pickle":
        out = pickle.loads(pickle.dumps(dp, protocol=5))
    elif how == "file":
        files.write_file(tmp_path / "x.arrow", dp)
        out = files.read_file(tmp_path / "x.arrow")
    elif how == "slice":
        out = dp[0:4]
    elif how == "index":
        out = dp[torch.tensor([0, 2, 3])]
    else:
        out = adp.DataProto.concat([dp[0:2], dp[2:4]])
    product = out.batch["logp"] * out.batch["mask"]  # raises if the ragged structures differ
    assert product.offsets().tolist() == out.batch["logp"].offsets().tolist()


# ---------------------------------------------------------------- 10. foreign exceptions


@pytest.mark.parametrize("version", ["1.²", "².0", "1." + "0" * 5000, "1" * 5000 + ".0", "1.0 ", "+1.0", "1.-1", "١.٠"])
def test_malformed_versions_are_decode_errors(version):
    payload = _stream_with(_strings("a"), schema_meta={"adp.version": version})
    with pytest.raises(DecodeError):
        adp.from_ipc(payload)


@pytest.mark.parametrize("ragged_idx", ["²", "1" * 5000, " 1", "01x", "-1", "١"])
def test_malformed_ragged_idx_is_a_decode_error_naming_the_column(ragged_idx):
    dp = adp.DataProto(batch=TensorDict({"j": _jagged(2, 3)}, batch_size=[2]))
    payload = _stream_with(dp, field_meta={"j": {"adp.ragged_idx": ragged_idx}})
    with pytest.raises(DecodeError, match="'j'"):
        adp.from_ipc(payload)


@pytest.mark.parametrize("device", ["privateuseone", "privateuseone:0", "cuda:99999999999999999999", "nope", "cpu:-1", "é"])
def test_unknown_recorded_devices_are_refused_or_placed_on_the_cpu(device):
    dp = adp.DataProto(batch=TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    payload = _stream_with(dp, field_meta={"x": {"adp.device": device}})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = adp.from_ipc(payload)
    except DecodeError as e:
        assert "'x'" in str(e)
        return
    assert [w.category for w in caught] == [RuntimeWarning]
    assert out.batch["x"].device.type == "cpu" and out.batch["x"].tolist() == [0, 1, 2]


def test_a_recorded_tree_device_that_torch_cannot_load_is_handled():
    dp = adp.DataProto(batch=TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    payload = _stream_with(dp, schema_meta={"adp.device": json.dumps("privateuseone")})
    with pytest.warns(RuntimeWarning):
        out = adp.from_ipc(payload)
    assert out.batch["x"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("rows", [2**63, 2**64, -1, -(2**63), "3", 3.0, None])
def test_a_pickled_state_with_a_lying_row_count(rows):
    reduce, state = adp.DataProto(non_tensor_batch={}).__reduce_ex__(5)
    schema, _, columns = state
    with pytest.raises(DecodeError):
        reduce(schema, rows, columns)


@pytest.mark.parametrize("where", ["string", "key", "nested key", "object", "meta_info"])
def test_lone_surrogates_are_encode_errors_or_round_trip(where, tmp_path):
    s = "a\ud800b"
    if where == "string":
        dp = adp.DataProto(non_tensor_batch={"s": np.array([s, "x"])})
    elif where == "key":
        dp = adp.DataProto(batch=TensorDict({s: torch.zeros(2)}, [2]))
    elif where == "nested key":
        dp = adp.DataProto(batch=TensorDict({"t": TensorDict({s: torch.zeros(2)}, [2])}, [2]))
    elif where == "object":
        dp = adp.DataProto(non_tensor_batch={"o": _objects(s, "x")})
    else:
        dp = adp.DataProto(meta_info={s: 1})
    for encode in (adp.to_ipc, lambda d: files.write_file(tmp_path / "x.arrow", d),
                   lambda d: pickle.loads(pickle.dumps(d, protocol=5))):
        try:
            out = encode(dp)
        except EncodeError as e:
            assert "surrogate" in str(e) or "UTF-8" in str(e)
            continue
        if isinstance(out, adp.DataProto):
            assert_dataproto_equal(out, dp)


def test_a_non_contiguous_memoryview_is_a_decode_error_or_reads():
    payload = adp.to_ipc(_strings("a", "b")).to_pybytes()
    strided = memoryview(np.frombuffer(bytes(b for pair in zip(payload, payload) for b in pair), np.uint8)[::2])
    assert not strided.contiguous
    for buffer in (strided,):
        try:
            out = adp.from_ipc(buffer)
        except DecodeError:
            continue
        assert out.non_tensor_batch["s"].tolist() == ["a", "b"]


def test_a_unitless_datetime_through_to_pandas():
    dp = adp.DataProto(non_tensor_batch={"t": np.array(["NaT", "NaT"], dtype="M8")})
    try:
        frame = adp_pandas.to_pandas(dp)
    except DataProtoError:
        return
    assert adp_pandas.from_pandas(frame).non_tensor_batch["t"].dtype == np.dtype("M8")


@pytest.mark.parametrize("shape", [[2**62, 2**62], [10**30], [2**40, 2**40, 2**40]])
def test_huge_shapes_in_dataframe_attrs_are_decode_errors(shape):
    dp = adp.DataProto(batch=TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]),
                       non_tensor_batch={"n": np.zeros((2, 3))})
    for column in ("x", "n"):
        frame = adp_pandas.to_pandas(dp)
        key = "shape" if column == "x" else "row_shape"
        frame.attrs["arrow_dataproto"]["columns"][column][key] = shape
        with pytest.raises(DataProtoError, match=repr(column)):
            adp_pandas.from_pandas(frame)


def test_head_columns_are_exact_names(tmp_path):
    dp = adp.DataProto(non_tensor_batch={"extra": np.array([1, 2]), "extra.p": _objects({1}, {2})})
    files.write_file(tmp_path / "x.arrow", dp)
    result = run_cli("head", tmp_path / "x.arrow", "--columns", "extra")
    assert result.returncode == 0, result.stderr
    assert "extra.p" not in result.stdout and "pickled" not in result.stdout
    with files.open_file(tmp_path / "x.arrow") as reader:
        assert list(reader.read_all(["extra"]).non_tensor_batch) == ["extra"]


# ---------------------------------------------------------------- 11. a valid write refused


def test_zero_rows_after_rows_adopt_the_files_types(tmp_path):
    pickled = _objects({1}, {2}, {3}, {4})
    strided = torch.nested.nested_tensor([torch.zeros(2, 3), torch.ones(1, 4), torch.zeros(3, 1), torch.ones(2, 2)])
    dp = adp.DataProto(batch=TensorDict({"s": strided}, batch_size=[4]), non_tensor_batch={"p": pickled})
    with files.FileWriter(tmp_path / "x.arrow") as writer:
        writer.write(dp)
        writer.write(dp[0:0])
    with files.open_file(tmp_path / "x.arrow", allow_pickle=True) as reader:
        assert reader.batch_rows == [4, 0]
        assert_dataproto_equal(reader.read_batch(0), dp)
        assert len(reader.read_batch(1)) == 0


def test_zero_rows_of_another_dtype_are_still_refused(tmp_path):
    with files.FileWriter(tmp_path / "x.arrow") as writer:
        writer.write(adp.DataProto(non_tensor_batch={"p": _objects({1}, {2})}))
        with pytest.raises(adp.SchemaMismatchError):
            writer.write(adp.DataProto(non_tensor_batch={"p": np.zeros(0, dtype=np.int64)}))


# ---------------------------------------------------------------- integrity: optional checksums


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_checksums_catch_a_flipped_bit_on_demand(tmp_path, compression):
    pytest.importorskip("xxhash")
    values = torch.arange(4096, dtype=torch.int64) * 1_000_003
    dp = adp.DataProto(batch=TensorDict({"x": values, "f": values.float()}, [4096]),
                       non_tensor_batch={"s": np.array([f"row {i}" for i in range(4096)], dtype=object)})
    path = tmp_path / "x.arrow"
    files.write_file(path, [dp[:2048], dp[2048:]], compression=compression, checksums=True)
    with files.open_file(path, verify=True) as reader:
        assert reader.verify() > 0
        assert_dataproto_equal(reader.read_all(), dp)
    result = run_cli("verify", path)
    assert result.returncode == 0 and "match their checksums" in result.stdout, result.stderr
    if compression is not None:
        return  # a flipped bit in a compressed buffer is a decompression error, not silent
    data = bytearray(path.read_bytes())
    target = struct.pack("<q", 3000 * 1_000_003)
    assert data.count(target) == 1
    data[data.index(target)] ^= 0x04
    path.write_bytes(bytes(data))
    with files.open_file(path) as reader:  # without verify: read back unnoticed (Arrow has no checksum)
        assert int(reader.read_all().batch["x"][3000]) != 3000 * 1_000_003
    with files.open_file(path, verify=True) as reader:
        reader.read_batch(0)  # the other batch is intact
        with pytest.raises(DecodeError, match="batch 1: column 'x': buffer 0 does not match"):
            reader.read_batch(1)
    result = run_cli("verify", path)
    assert result.returncode == 1 and "does not match its checksum" in result.stderr


def test_verify_refuses_a_file_without_checksums(tmp_path):
    files.write_file(tmp_path / "x.arrow", _strings("a", "b"))
    with files.open_file(tmp_path / "x.arrow") as reader:
        assert len(reader.read_all()) == 2
        with pytest.raises(DecodeError, match="no checksums"):
            reader.verify()


def test_recovering_a_compression_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.arrow"
    files.write_file(path, _bomb(), compression="zstd")
    with pytest.raises(DecodeError, match="max_decoded_bytes"):
        files.recover_file(path, tmp_path / "out.arrow")
    with pytest.raises(DecodeError, match="max_decoded_bytes"):
        files.copy_file(path, tmp_path / "out.arrow")
    assert not (tmp_path / "out.arrow").exists()
    assert files.recover_file(path, tmp_path / "out.arrow", max_decoded_bytes=None) == 1


def test_a_writer_that_cannot_finish_raises_encode_error(tmp_path):
    target = tmp_path / "x.arrow"
    (target / "occupied").mkdir(parents=True)  # a non-empty folder where the file should go
    writer = files.FileWriter(target)
    writer.write(_strings("a"))
    with pytest.raises(EncodeError, match="not written"):
        writer.close()
    # the batch whose write returned survives: the partial file is complete (issue 19)
    (partial,) = tmp_path.glob("*.partial")
    assert target.is_dir() and files.read_file(partial).non_tensor_batch["s"].tolist() == ["a"]


# ================================================================ round three (issue 19, issue 24)
#
# The writer's data-loss rule, integrity outside the checksummed buffers, head of a file without
# batches, tensors in meta_info, datasets mixing portable and stored files.

def _needs_xxhash() -> None:
    pytest.importorskip("xxhash", reason="checksums need the xxhash package")


_WRITER_SWEEP = """
import os, sys, tempfile
sys.path.insert(0, os.path.join({root!r}, "tests"))
import fuzz
from arrow_dataproto.testing import sample_dataproto
batches = fuzz._evolving(sample_dataproto(rows=4, seed=3))
options = {options!r}
full = fuzz._plan_size(batches, options)  # limits spread up to past the end hit every call of the writer
limits = sorted(set(range(0, full + 64, max(1, full // {steps}))) | {{0, 7, 8, full - 1, full, full + 1}})
for limit in limits:
    try:
        fuzz.{run}({{"batches": batches, "options": options, "limit": limit}})
    except fuzz._Cut:  # the writer failed or was killed, and every returned batch was recovered
        pass
print("ok", len(limits), full)
"""


@pytest.mark.parametrize("options", [{}, {"compression": "zstd", "checksums": True}, {"portable": True}],
                         ids=["plain", "zstd-checksums", "portable"])
def test_a_writer_under_a_file_size_limit_loses_no_returned_batch(options):
    """RLIMIT_FSIZE at every call (first write, write, promotion rewrite, close): each batch whose
    write returned is in the file, or recover_file reads it from the partial file; a refused
    batch leaves the partial files byte for byte as they were (tests/fuzz.py checks each case)."""
    if options.get("checksums"):
        _needs_xxhash()
    code = _WRITER_SWEEP.format(root=str(ROOT), options=options, steps=40, run="_run_writer_fsize")
    result = run_python(code, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-3000:]


def test_a_writer_killed_during_a_promotion_rewrite_loses_no_returned_batch():
    """kill -9 at byte budgets spread over the whole plan, the promotion rewrite included: a
    partial file recovers every batch whose write returned."""
    code = _WRITER_SWEEP.format(root=str(ROOT), options={}, steps=24, run="_run_writer_kill")
    result = run_python(code, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-3000:]


def test_a_refused_batch_does_not_rewrite_the_file(tmp_path):
    """A batch that would promote a column but is refused for another difference changes nothing."""
    path = tmp_path / "f.arrow"
    writer = files.FileWriter(path)
    writer.write(adp.DataProto(non_tensor_batch={"o": _objects(1, 2), "n": np.arange(2)}))
    (partial,) = tmp_path.glob("*.partial")
    before = partial.read_bytes()
    promoting_but_wrong = adp.DataProto(non_tensor_batch={"o": _objects({"k": 1}, {"k": 2}), "n": np.arange(2.0)})
    with pytest.raises(adp.SchemaMismatchError, match="'n'"):
        writer.write(promoting_but_wrong)
    assert list(tmp_path.glob("*.partial")) == [partial] and partial.read_bytes() == before
    writer.write(adp.DataProto(non_tensor_batch={"o": _objects({"k": 3}), "n": np.arange(1)}))  # still usable
    writer.close()
    assert files.read_file(path).non_tensor_batch["o"].tolist() == [1, 2, {"k": 3}]


def test_a_writer_that_fails_inside_a_with_block_keeps_its_partial_file(tmp_path):
    """An I/O failure inside ``with FileWriter`` (or write_file) no longer deletes the batches
    written before it: the partial file stays for recover_file."""
    code = f"""
    import resource, numpy as np, arrow_dataproto as adp
    from arrow_dataproto import files
    dp = adp.DataProto(non_tensor_batch={{"s": np.array(["x" * 1000] * 4)}})
    resource.setrlimit(resource.RLIMIT_FSIZE, (12000, resource.RLIM_INFINITY))
    try:
        files.write_file({str(tmp_path / "f.arrow")!r}, [dp] * 20)
    except adp.EncodeError as e:
        print("refused", "recover_file" in str(e))
    """
    result = run_python(code)
    assert result.stdout.split() == ["refused", "True"], result.stderr[-2000:]
    (partial,) = tmp_path.glob("*.partial")
    assert not (tmp_path / "f.arrow").exists()
    assert files.recover_file(partial, tmp_path / "r.arrow") >= 1


_FLIP_SWEEP = """
import os, sys, tempfile, collections
import numpy as np, torch, arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.testing import assert_dataproto_equal
dp = adp.DataProto.from_dict({{"x": torch.arange(4, dtype=torch.int32)}}, non_tensors={{"o": np.array([1, None, 3, 4], dtype=object)}},
                             meta_info={{"k": 1}})
tmp = tempfile.mkdtemp()
path, case = os.path.join(tmp, "f.arrow"), os.path.join(tmp, "case.arrow")
files.write_file(path, [dp[:2], dp[2:]], checksums=True, **{options!r})
data = open(path, "rb").read()
def read(p):
    with files.open_file(p, verify=True) as reader:
        reader.verify()
        return [reader.read_batch(i) for i in range(reader.num_batches)]
want = read(path)
seen = collections.Counter()
for at in range(len(data)):
    flipped = bytearray(data)
    flipped[at] ^= 0xFF
    open(case, "wb").write(flipped)
    try:
        got = read(case)
    except adp.DataProtoError:
        seen["detected"] += 1
        continue
    assert len(got) == len(want), at
    for a, b in zip(want, got):
        try:
            assert_dataproto_equal(a, b)
        except AssertionError as e:
            raise SystemExit(f"byte {{at}}: read back differently, unnoticed: {{e}}")
    seen["harmless"] += 1
print(len(data), seen["detected"], seen["harmless"])
"""


@pytest.mark.parametrize("options", [{}, {"stream": True}], ids=["file", "stream"])
def test_every_flipped_byte_of_a_checksummed_file_is_detected_or_harmless(options):
    """The exhaustive sweep (issue 19): each byte of a small checksummed file of two batches,
    XORed with 0xFF, makes open_file(verify=True)/verify()/read fail with the library's error,
    or reads back bit-identical (padding, the stream's copy of the schema...). Footer, schema,
    message headers and batch metadata included; in a subprocess, so a crash fails the test."""
    _needs_xxhash()
    result = run_python(_FLIP_SWEEP.format(options=options), timeout=600)
    assert result.returncode == 0, (result.stdout[-500:], result.stderr[-3000:])
    size, detected, harmless = map(int, result.stdout.split())
    assert detected + harmless == size and detected > size // 2


def test_verify_catches_the_footer_dropping_a_batch(tmp_path):
    """Before 1.3 a footer listing one batch fewer read back as a shorter, 'verified' file."""
    _needs_xxhash()
    path = tmp_path / "f.arrow"
    files.write_file(path, [_strings("a"), _strings("b")], checksums=True)
    data = bytearray(path.read_bytes())
    footer_size = struct.unpack_from("<i", data, len(data) - 10)[0]
    footer = bytes(data[len(data) - 10 - footer_size : len(data) - 10])
    count_at = footer.find(struct.pack("<I", 2))  # the record batches vector's length
    assert count_at > 0
    data[len(data) - 10 - footer_size + count_at] = 1
    path.write_bytes(bytes(data))
    with files.open_file(path) as reader:  # unverified, it reads as a file of one batch
        assert reader.num_batches == 1
    with pytest.raises(DecodeError, match="footer"):
        files.open_file(path, verify=True)


def test_a_copy_of_a_checksummed_file_has_checksums_of_its_own_bytes(tmp_path):
    """convert --portable (and copy_file, recover_file) wrote the source's stale checksums."""
    _needs_xxhash()
    source = tmp_path / "a.arrow"
    dp = adp.DataProto.from_dict({"x": torch.arange(6, dtype=torch.bfloat16).view(3, 2)}, meta_info={"k": 1})
    files.write_file(source, [dp, dp], checksums=True)
    result = run_cli("convert", "--portable", source, tmp_path / "p.arrow")
    assert result.returncode == 0, result.stderr
    for out in ("p.arrow", "s.arrow", "r.arrow"):
        if out == "s.arrow":
            files.copy_file(tmp_path / "p.arrow", tmp_path / out, compression="zstd")
        if out == "r.arrow":
            files.recover_file(tmp_path / "s.arrow", tmp_path / out)
        with files.open_file(tmp_path / out, verify=True) as reader:
            assert reader.verify() > 0
            assert_dataproto_equal(adp.DataProto.concat([dp, dp]), reader.read_all())
    files.copy_file(source, tmp_path / "plain.arrow", checksums=False)
    with files.open_file(tmp_path / "plain.arrow") as reader, pytest.raises(DecodeError, match="no checksums"):
        reader.verify()


def test_golden_files_of_1_3_verify():
    """The 1.3 golden files were written with checksums: every reader from now on verifies them."""
    _needs_xxhash()
    goldens = sorted((ROOT / "tests" / "data").glob("golden-v1.3-*.arrow"))
    assert goldens
    for path in goldens:
        with files.open_file(path, verify=True) as reader:
            assert reader.verify() > 0


def test_head_of_a_file_without_batches(tmp_path):
    """A bare TypeError before: now the columns and no rows (ours, another tool's, none)."""
    ours = adp.to_arrow(adp.DataProto.from_dict({"x": torch.zeros(2, 3)}, non_tensors={"s": np.array(["a", "b"])}))
    for name, schema in (("ours", ours.schema), ("foreign", pa.schema([("a", pa.int64()), ("b", pa.string())]))):
        path = tmp_path / f"{name}.arrow"
        with pa.OSFile(str(path), "wb") as sink:
            pa.ipc.new_file(sink, schema).close()
        result = run_cli("head", path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == schema.names and "no rows" in result.stderr
        unknown = run_cli("head", path, "--columns", "nope")
        assert unknown.returncode == 1 and "nope" in unknown.stderr and "Traceback" not in unknown.stderr


def _meta_tensors() -> dict:
    return {
        "bf16": torch.tensor([1.5, float("nan"), -0.0], dtype=torch.bfloat16),
        "nested": {"mask": torch.tensor([[True], [False]]), "n": [torch.tensor(7), torch.zeros(0, 3)]},
        "fp8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
        "c": torch.tensor([1 + 2j], dtype=torch.complex128),
        "strided": torch.arange(12, dtype=torch.int16).view(3, 4).t(),
        "plain": 1.0,
    }


def test_tensors_in_meta_info_round_trip_without_pickle(tmp_path):
    """A meta_info of tensors was pickled (the file then needed allow_pickle); now it is
    ``json+tensors``: exact, and no allow_pickle anywhere."""
    dp = adp.DataProto.from_dict({"x": torch.arange(3)}, meta_info=_meta_tensors())
    assert adp.to_arrow(dp).schema.metadata[b"adp.meta_info.encoding"] == b"json+tensors"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pickling warning
        files.write_file(tmp_path / "f.arrow", dp)
    for got in (files.read_file(tmp_path / "f.arrow"), adp.from_ipc(adp.to_ipc(dp)), pickle.loads(pickle.dumps(dp))):
        assert_dataproto_equal(dp, got)
        assert got.meta_info["strided"].is_contiguous()


def test_meta_info_that_needs_pickle_is_named(tmp_path):
    """What still needs pickling is warned about at write time and named when refused at read time."""
    dp = adp.DataProto.from_dict({"x": torch.arange(3)}, meta_info={"ok": torch.ones(1), "arr": np.arange(3), "t": (1, 2)})
    with pytest.warns(UserWarning, match="'arr', 't'"):
        files.write_file(tmp_path / "f.arrow", dp)
    with pytest.raises(adp.PickleNotAllowedError, match=r"keys .*'arr', 't'"):  # the tensor is pickled too here
        files.read_file(tmp_path / "f.arrow")
    assert_dataproto_equal(dp, files.read_file(tmp_path / "f.arrow", allow_pickle=True))


def test_naming_refused_meta_info_keys_runs_nothing(tmp_path):
    """The keys of a refused pickle are read with every global replaced: nothing is imported or called."""
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    dp = adp.DataProto(non_tensor_batch={"s": np.array(["a"])}, meta_info={"evil": Boom()})
    payload = adp.to_ipc(dp)
    with pytest.raises(adp.PickleNotAllowedError, match="key 'evil'"):
        adp.from_ipc(payload)
    assert not (tmp_path / "ran").exists()


def test_malformed_tensor_tags_are_decode_errors():
    from arrow_dataproto._meta_info import decode_meta_info

    def meta(record) -> dict[str, str]:
        return {"adp.meta_info.encoding": "json+tensors", "adp.meta_info": json.dumps({"t": {"adp.tensor": record}})}

    good = {"dtype": "float32", "shape": [2], "device": "cpu", "data": "AAAAAAAAAAA="}
    assert decode_meta_info(meta(good), allow_pickle=False)["t"].tolist() == [0.0, 0.0]
    for bad in ({**good, "shape": [3]}, {**good, "shape": [2**62, 2**62]}, {**good, "shape": [-1]},
                {**good, "dtype": "qint8"}, {**good, "data": "***"}, {**good, "extra": 1}, [1]):
        with pytest.raises(DecodeError):
            decode_meta_info(meta(bad), allow_pickle=False)


def _forms(tmp_path: Path, dp: adp.DataProto) -> list[Path]:
    paths = []
    for i, options in enumerate(({}, {"portable": True}, {"portable": True, "compression": "zstd"},
                                 {"stream": True}, {"portable": True, "stream": True}, {"compression": "lz4"})):
        paths.append(tmp_path / f"{i}.arrow")
        files.write_file(paths[-1], dp, **options)
    return paths


def test_a_dataset_may_mix_portable_and_stored_files(tmp_path):
    """issue 24: open_dataset compared the files as written (SchemaMismatchError in 16 of 36 pairs)."""
    from arrow_dataproto.testing import sample_dataproto

    dp = sample_dataproto()
    paths = _forms(tmp_path, dp)
    for a in paths:
        for b in paths:
            with files.open_dataset([a, b]) as dataset:
                assert_dataproto_equal(adp.DataProto.concat([dp, dp]), dataset.read_all())


def test_ray_data_reads_a_mix_of_portable_and_stored_files(tmp_path, ray_session):
    """issue 24: ray_data.read_files refused the mix too; its blocks now take the first file's form."""
    import ray

    from arrow_dataproto.testing import sample_dataproto

    dp = sample_dataproto()
    paths = _forms(tmp_path, dp)
    for first in (paths[0], paths[1]):
        order = [first] + [p for p in paths if p != first]
        blocks = ray.get(adp.ray_data.read_files(order).to_arrow_refs())
        assert sum(len(b) for b in blocks) == len(dp) * len(paths)
        assert len({b.schema.remove_metadata() for b in blocks}) == 1  # one form
        for block in blocks:  # every file holds dp, one batch each
            assert_dataproto_equal(dp, adp.ray_data.to_dataproto(block))


# ================================================================ issue 19, round three: JSON
# values, other tools' tensors, nesting depth, allow_pickle of another tool's stream
# (branch json-foreign; others add their blocks elsewhere)

_JSON_META = {"adp.kind": "json", "adp.dtype": "|O", "adp.row_shape": "[]"}


def _json_texts_column(*texts) -> pa.Array:
    return pa.ExtensionArray.from_storage(pa.json_(pa.string()), pa.array(list(texts), pa.string()))


INEXACT_JSON = {
    "duplicate_key": '{"a":1,"a":2}',
    "duplicate_nested_key": '[{"k":{"b":1,"b":1}}]',
    "duplicate_key_with_whitespace": '{ "a" : 1 , "a" : 1 }',
    "overflow": "1e999",
    "negative_overflow": "[-1.8e308]",
    "underflow": '{"p":1e-400}',
}


@pytest.mark.parametrize("text", INEXACT_JSON.values(), ids=INEXACT_JSON.keys())
def test_json_text_that_no_value_is_exactly_is_refused_naming_column_and_row(text):
    column = _json_texts_column('{"ok":1}', None, text)
    with pytest.raises(DecodeError, match=r"'evil'.*row 2"):
        adp._objects.decode_column("evil", column, _JSON_META, allow_pickle=False)
    table = pa.table({"evil": column})  # another tool's arrow.json column reads the same way
    with pytest.raises(DecodeError, match=r"'evil'.*row 2"):
        adp.from_arrow(table)


EXACT_JSON = {
    "int_beyond_int64": ("18446744073709551616", 2**64),
    "escaped_pair": ('"\\ud83d\\ude00"', "\U0001f600"),
    "lone_escape": ('"\\ud800"', "\ud800"),
    "exponent": ("1E5", 100000.0),
    "zero_exponent": ("0e-999", 0.0),
    "minus_zero": ("-0.0", -0.0),
    "whitespace": (' {"a" : [1, 2.5]} \n', {"a": [1, 2.5]}),
}


@pytest.mark.parametrize("case", EXACT_JSON.values(), ids=EXACT_JSON.keys())
def test_json_text_of_other_writers_decodes_exactly(case):
    text, value = case
    decoded = adp._objects.decode_column("c", _json_texts_column(text, None), _JSON_META, allow_pickle=False)
    assert type(decoded[0]) is type(value) and decoded[0] == value and decoded[1] is None
    if value == 0.0:
        assert math.copysign(1, decoded[0]) == math.copysign(1, value)


def test_a_split_surrogate_pair_is_pickled_not_merged():
    for value in ("\ud83d\ude00", {"k": ["x\ud800\udc00y"]}):
        values = _objects(value, 1)
        array, metadata = adp._objects.encode_column("c", values)
        assert metadata["adp.kind"] == "pickle"  # JSON would read "\ud83d\ude00" back as one character
        assert adp._objects.decode_column("c", array, metadata, allow_pickle=True)[0] == value
    lone = _objects("\ud83d", "\ude00\ud83d", 1)  # not a pair: JSON, escaped
    array, metadata = adp._objects.encode_column("c", lone)
    assert metadata["adp.kind"] == "json"
    assert list(adp._objects.decode_column("c", array, metadata, allow_pickle=False)) == list(lone)


def test_meta_info_with_a_duplicate_key_is_a_decode_error():
    record_batch = adp.to_arrow(adp.DataProto(None, {"u": np.array(["a"], dtype=object)}, {"lr": 1}))
    metadata = {**record_batch.schema.metadata, b"adp.meta_info": b'{"lr":1,"lr":2}'}
    with pytest.raises(DecodeError, match="duplicate key 'lr'"):
        adp.from_arrow(record_batch.replace_schema_metadata(metadata))


def _permuted(shape, permutation, dim_names=None, rows=3):
    physical = np.arange(rows * math.prod(shape), dtype=np.float32).reshape(rows, *shape)
    kind = pa.fixed_shape_tensor(pa.float32(), list(shape), permutation=permutation, dim_names=dim_names)
    storage = pa.FixedSizeListArray.from_arrays(pa.array(physical.reshape(-1)), math.prod(shape))
    logical = physical if permutation is None else physical.transpose(0, *(p + 1 for p in permutation))
    return pa.ExtensionArray.from_storage(kind, storage), logical


@pytest.mark.parametrize("permutation", [[2, 0, 1], [1, 0, 2], [0, 2, 1], None])
@pytest.mark.parametrize("dim_names", [None, ["h", "w", "c"]])
def test_another_tools_permuted_tensor_decodes_in_its_logical_order(permutation, dim_names):
    array, logical = _permuted((2, 3, 4), permutation, dim_names)
    table = pa.table({"x": array})
    for decoded, expected in (
        (adp.from_arrow(table), logical),
        (adp.from_ipc(_ipc_stream(table)), logical),
        (adp.from_arrow(table.slice(1, 2)), logical[1:3]),
    ):
        x = decoded.batch["x"]
        assert tuple(x.shape) == expected.shape and x.is_contiguous()
        assert np.array_equal(x.numpy(), expected)


def test_a_permuted_tensor_in_a_column_of_this_format_is_refused():
    dp = adp.DataProto(TensorDict({"x": torch.arange(12.0).view(2, 2, 3)}, batch_size=[2]))
    record_batch = adp.to_arrow(dp)
    kind = pa.fixed_shape_tensor(pa.float32(), [2, 3], permutation=[1, 0])
    field = record_batch.schema.field(0).with_type(kind)
    swapped = pa.RecordBatch.from_arrays(
        [pa.ExtensionArray.from_storage(kind, record_batch.column(0).storage)],
        schema=pa.schema([field], metadata=record_batch.schema.metadata),
    )
    with pytest.raises(DecodeError, match="'x'.*permutation"):
        adp.from_arrow(swapped)


def _ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _deep_type(depth: int, kind: str, leaf: pa.DataType = pa.int64()) -> pa.DataType:
    t = leaf
    for _ in range(depth):
        t = {"list": pa.list_, "struct": lambda v: pa.struct([("a", v)]), "map": lambda v: pa.map_(pa.string(), v),
             "view": pa.large_list_view}[kind](t)
    return t


@pytest.mark.parametrize("kind", ["list", "struct", "map", "view"])
@pytest.mark.parametrize("depth", [64, 100, 3000])
def test_arrow_types_nested_deeper_than_ipc_carries_are_decode_errors(kind, depth):
    table = pa.table({"deep": pa.nulls(2, _deep_type(depth, kind)), "n": [1, 2]})
    with pytest.raises(DecodeError, match="'deep'.*nests more than 64"):
        adp.from_arrow(table)
    with pytest.raises(DecodeError, match="'deep'"):
        adp.from_arrow(table, columns=["n"])  # the whole schema is checked, not only what is read


def test_the_deepest_type_ipc_carries_still_reads(tmp_path):
    table = pa.table({"deep": pa.nulls(2, _deep_type(63, "list", pa.string())), "n": [1, 2]})
    assert adp.from_ipc(_ipc_stream(table)).non_tensor_batch["deep"].tolist() == [None, None]
    with pa.ipc.new_file(tmp_path / "deep.arrow", table.schema) as writer:
        writer.write_table(table)
    assert files.read_file(tmp_path / "deep.arrow").non_tensor_batch["deep"].tolist() == [None, None]


def test_deeply_nested_object_values_encode_or_raise_encode_error(tmp_path):
    """Values nested past Arrow's IPC depth go to JSON (then pickle); pyarrow's type inference,
    which crashes the process on 100,000 levels, is never reached with them."""
    result = run_python(
        """
        import sys, numpy as np, arrow_dataproto as adp
        from arrow_dataproto import files
        def nested(depth, kind):
            v = 1
            for _ in range(depth):
                v = [v] if kind == "list" else {"a": v}
            return v
        for depth in (63, 64, 150, 100_000):
            for kind in ("list", "dict"):
                values = np.empty(2, dtype=object)
                values[0] = values[1] = nested(depth, kind)
                dp = adp.DataProto(None, {"x": values}, {})
                try:
                    back = adp.from_ipc(adp.to_ipc(dp), allow_pickle=True)
                    assert back.non_tensor_batch["x"][0] == values[0]
                    files.write_file(sys.argv[1], dp)
                    outcome = "ok"
                except adp.EncodeError:
                    outcome = "EncodeError"
                print(depth, kind, outcome)
        print("done")
        """,
        str(tmp_path / "deep.arrow"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")
    assert "done" in lines
    assert all(line.endswith("ok") for line in lines if line.startswith(("63 ", "64 ", "150 ")))


def test_another_tools_multi_batch_stream_keeps_allow_pickle():
    """A tool kept this format's field metadata (a pickled column) but dropped the schema's."""
    pickled = adp.to_arrow(adp.DataProto(None, {"p": _objects((1, 2), (3,))}, {}))
    field = pickled.schema.field("p")
    batch = pa.RecordBatch.from_arrays([pickled.column(0)], schema=pa.schema([field]))  # no schema metadata
    stream = _ipc_stream(pa.Table.from_batches([batch.slice(0, 1), batch.slice(1, 1)]))
    assert pa.ipc.open_stream(stream).read_all().num_rows == 2
    with pytest.raises(adp.PickleNotAllowedError):
        adp.from_ipc(stream)
    assert adp.from_ipc(stream, allow_pickle=True).non_tensor_batch["p"].tolist() == [(1, 2), (3,)]


_DAMAGED_SECOND_CHUNK = """
import struct, sys
import pyarrow as pa, pyarrow.compute as pc
import arrow_dataproto as adp
from arrow_dataproto import files

def ree(values):
    return pc.run_end_encode(pa.array(values, pa.int64()))

first = pa.record_batch([ree([1, 2])], names=["r"])
second = pa.record_batch([ree([0] * 30 + [1] * 30 + [2] * 17)], names=["r"])  # 3 runs
sink = pa.BufferOutputStream()
with pa.ipc.new_stream(sink, first.schema) as writer:
    writer.write_batch(first)
    writer.write_batch(second)
stream = sink.getvalue().to_pybytes()
node = struct.pack("<qq", 3, 0)  # the FieldNode of the second batch's run ends: length 3, no nulls
at = stream.index(node)
stream = stream[:at] + struct.pack("<qq", 1 << 31, 0) + stream[at + 16:]
for name, read in (("from_ipc", lambda: adp.from_ipc(stream)),
                   ("from_arrow", lambda: adp.from_arrow(pa.ipc.open_stream(stream))),
                   ("read_file", lambda: (open(sys.argv[1], "wb").write(stream), files.read_file(sys.argv[1])))):
    try:
        read()
        print(name, "decoded")
    except adp.DecodeError as e:
        print(name, "DecodeError", "Run ends array invalid" in str(e))
"""


def test_a_damaged_later_chunk_of_another_tools_stream_is_refused_before_concatenation(tmp_path):
    """Fuzz case 67208 (foreign-types): the batches of another tool's stream become one table,
    and concatenating a run-end-encoded chunk whose run ends claim 2**31 entries read past its
    buffers (SIGSEGV) before the validation gate saw the batch. Every chunk is validated first."""
    result = run_python(_DAMAGED_SECOND_CHUNK, str(tmp_path / "damaged.arrows"))
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.split("\n")[:3] == [f"{name} DecodeError True" for name in ("from_ipc", "from_arrow", "read_file")]


def test_a_footer_naming_one_column_twice_is_refused_by_every_reader(tmp_path):
    """Fuzz case 45463 (cli, footer-field rename): the footer's schema renamed ``uid2`` to
    ``uid1``; ``convert`` then failed with a bare ``KeyError`` from pyarrow. Every column of this
    format has its own name, so a schema of ours naming one twice is damaged."""
    dp = adp.DataProto(None, {"uid1": _objects("a", "b"), "uid2": _objects("c", "d")}, {})
    path = tmp_path / "twice.arrow"
    files.write_file(path, dp)
    data = path.read_bytes()
    footer_at = data.rindex(b"uid2")  # the footer's schema comes last
    path.write_bytes(data[:footer_at] + b"uid1" + data[footer_at + 4 :])
    for read in (lambda: files.open_file(path), lambda: files.read_file(path),
                 lambda: files.copy_file(path, tmp_path / "copy.arrow")):
        with pytest.raises(DecodeError, match=r"\['uid1'\] appear more than once"):
            read()
    result = run_cli("convert", path, tmp_path / "converted.arrow")
    assert result.returncode == 1 and "appear more than once" in result.stderr
