"""The messages a first user meets: each names what was wrong, in the library's own error type."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.errors import (
    ArgumentTypeError,
    ColumnNotFoundError,
    DecodeError,
    FormatVersionError,
    KeyNotFoundError,
    OptionError,
    RowIndexError,
    UnknownContentError,
)
from arrow_dataproto.testing.samples import ppo_batch


@pytest.fixture
def dp() -> adp.DataProto:
    return adp.DataProto(*ppo_batch(rows=8, prompt=4, response=4))


@pytest.fixture
def path(tmp_path, dp):
    path = tmp_path / "f.arrow"
    files.write_file(path, dp)
    return path


def test_a_missing_key_is_named_once_without_nested_quotes(dp):
    with pytest.raises(KeyNotFoundError) as info:
        dp.select(["nokey"])
    assert str(info.value) == f"no batch key ['nokey'] in this DataProto; batch keys: {list(dp.batch.keys())}"
    with pytest.raises(KeyNotFoundError, match=r"^no non_tensor_batch key \['zz'\] in this DataProto; non_tensor_batch keys: \['uid'"):
        dp.select(non_tensor_batch_keys=["zz"])
    with pytest.raises(KeyNotFoundError, match=r"^no meta_info key \['m'\] in this DataProto; meta_info keys: \['temperature'"):
        dp.pop(meta_info_keys=["m"])
    with pytest.raises(KeyNotFoundError, match=r"^no batch key \['q'\] in this DataProto"):
        dp.rename("q", "r")
    assert dp.select(["responses"]).batch["responses"] is dp.batch["responses"]  # present keys: as before


def test_a_missing_column_is_named_once(path):
    with files.open_file(path) as reader:
        with pytest.raises(ColumnNotFoundError) as info:
            reader.read_batch(0, columns=["nosuch"])
        assert str(info.value).startswith(f"no column ['nosuch'] in {reader}; columns: ['prompts',")
    assert '"' not in str(info.value)
    cli = subprocess.run([sys.executable, "-m", "arrow_dataproto", "head", str(path), "--columns", "nosuch"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1
    assert cli.stderr.startswith("arrow-dataproto: error: no column ['nosuch'] in <FileReader"), cli.stderr


@pytest.mark.parametrize("data, given", [({"x": torch.zeros(2)}, "dict"), ("abc", "str"), (3, "int")])
def test_write_file_names_the_type_given(tmp_path, data, given):
    with pytest.raises(ArgumentTypeError) as info:
        files.write_file(tmp_path / "f.arrow", data)
    assert str(info.value).startswith(f"write_file takes a DataProto, a TensorDict or an iterable of them, got {given}")
    assert ("DataProto.from_dict" in str(info.value)) == (given == "dict")
    assert not (tmp_path / "f.arrow").exists()


def test_from_ipc_of_a_file_points_to_the_file_reader(path):
    with pytest.raises(DecodeError) as info:
        adp.from_ipc(path.read_bytes())
    assert str(info.value) == (
        "not an Arrow IPC stream but an Arrow IPC file (it starts with the file magic ARROW1): "
        "read it with arrow_dataproto.files.read_file(path) or files.open_file(path)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a device this machine lacks")
def test_a_missing_device_is_an_option_error_as_in_receive_options(dp):
    with pytest.raises(OptionError) as in_options:
        adp.receive_options(device="cuda").__enter__()
    for decode in (lambda: adp.from_ipc(adp.to_ipc(dp), device="cuda"), lambda: adp.from_arrow(adp.to_arrow(dp), device="cuda")):
        with pytest.raises(OptionError) as info:
            decode()
        assert str(info.value) == str(in_options.value) == "device 'cuda': this process has no cuda device"
    with pytest.raises(OptionError, match="^device 'nonsense' is not a torch device"):
        adp.from_arrow(adp.to_arrow(dp), device="nonsense")
    assert adp.from_arrow(adp.to_arrow(dp), device="cpu").batch["responses"].device.type == "cpu"


def test_out_of_range_batches_and_rows_are_library_errors(path):
    with files.open_file(path) as reader:
        with pytest.raises(RowIndexError) as info:
            reader.read_batch(99)
        assert isinstance(info.value, IndexError)
        assert str(info.value) == f"batch 99 out of range: {reader} has 1 batches (0 to 0, or -1 to -1)"
        for start, stop in ((100, 300), (9, None), (-9, 2)):
            with pytest.raises(RowIndexError, match=rf"^read_rows\({start}, {stop}\): start {start} is outside .* which has 8 rows"):
                reader.read_rows(start, stop)
        assert len(reader.read_rows(5, 300)) == 3  # a stop past the end stops at the end
        assert len(reader.read_rows(8)) == 0 and len(reader.read_rows(-8)) == 8


def _edited(rb: pa.RecordBatch, version: str, column: int | None = None, **meta: str) -> pa.RecordBatch:
    """``rb`` with its format version set to ``version`` and metadata entries replaced
    (of column ``column``, else of the schema)."""
    schema_meta = {**rb.schema.metadata, b"adp.version": version.encode()}
    fields = list(rb.schema)
    edits = {k.encode(): v.encode() for k, v in meta.items()}
    if column is None:
        schema_meta.update(edits)
    else:
        fields[column] = fields[column].with_metadata({**fields[column].metadata, **edits})
    return pa.RecordBatch.from_arrays(rb.columns, schema=pa.schema(fields, metadata=schema_meta))


NEWER = "1.%d" % (adp.FORMAT_VERSION[1] + 1)
OURS = "%d.%d" % adp.FORMAT_VERSION


@pytest.mark.parametrize("column, meta, what", [
    (0, {"adp.kind": "hyper"}, "column 'x': unknown column kind 'hyper'"),
    (0, {"adp.dtype": "float99"}, "column 'x': unknown or unsupported torch dtype 'float99'"),
    (1, {"adp.kind": "hyper"}, "column 's': missing or unknown adp.kind: 'hyper'"),
    (None, {"adp.meta_info.encoding": "cbor"}, "meta_info: unknown encoding adp.meta_info.encoding='cbor'"),
], ids=["tensor kind", "dtype", "object kind", "meta_info encoding"])
def test_what_a_newer_minor_version_wrote_names_both_versions(tmp_path, column, meta, what):
    dp = adp.DataProto(TensorDict({"x": torch.arange(4)}, batch_size=[4]),
                       {"s": np.array(["a", "b", "c", "d"], dtype=object)}, {"t": 1})
    newer = _edited(adp.to_arrow(dp), NEWER, column, **meta)
    expected = (f"{what}: the payload was written by format version {NEWER}, newer than {OURS}, "
                f"the newest this version of arrow-dataproto reads; upgrade arrow-dataproto to read it")
    with pytest.raises(FormatVersionError) as info:
        adp.from_arrow(newer)
    assert str(info.value) == expected
    path = tmp_path / "newer.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, newer.schema) as writer:
        writer.write_batch(newer)
    with pytest.raises(FormatVersionError, match=f"newer than {OURS}"):
        files.read_file(path)
    # the same content under this reader's own version: damaged, not newer
    with pytest.raises(UnknownContentError) as info:
        adp.from_arrow(_edited(adp.to_arrow(dp), OURS, column, **meta))
    assert str(info.value) == what and not isinstance(info.value, FormatVersionError)
