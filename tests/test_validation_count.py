"""Each record batch passes ``validate_arrow`` once per read, on every read path (issue 22)."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import _codec, _validate, _wire
from arrow_dataproto.files import reader as file_reader


@pytest.fixture
def calls(monkeypatch):
    """The number of validate_arrow calls since the last reset (``calls.clear()``)."""
    seen: list = []

    def counted(*args, **kwargs):
        seen.append(args[0])
        return _validate.validate_arrow(*args, **kwargs)

    monkeypatch.setattr(_codec, "validate_arrow", counted)
    monkeypatch.setattr(_wire, "validate_arrow", counted)  # the pickled state's planned read path
    monkeypatch.setattr(file_reader, "validate_arrow", counted)
    return seen


def _data():
    batch = TensorDict({"a": torch.arange(8.0).reshape(4, 2)}, batch_size=[4])
    return adp.DataProto(batch=batch, non_tensor_batch={"s": np.array(list("wxyz"), dtype=object)})


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "two.arrow"
    with adp.files.FileWriter(path) as writer:
        writer.write(_data())
        writer.write(_data())
    return path


@pytest.fixture
def foreign_path(tmp_path):
    path = tmp_path / "foreign.arrow"
    table = pa.Table.from_batches([pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [3, 4]})])
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    return path


READS = [
    ("read_batch", lambda r: r.read_batch(0), 1),
    ("read_batch columns", lambda r: r.read_batch(1, ["a"]), 1),
    ("read_arrow", lambda r: r.read_arrow(0), 1),
    ("read_rows one batch", lambda r: r.read_rows(1, 3), 1),
    ("read_rows two batches", lambda r: r.read_rows(2, 6), 2),
    ("read_all", lambda r: r.read_all(), None),  # None: every batch of the reader
    ("iter_batches", lambda r: list(r.iter_batches()), None),
]


@pytest.mark.parametrize("read, batches", [(r, n) for _, r, n in READS], ids=[name for name, _, _ in READS])
def test_file_reader_validates_each_batch_once(path, calls, read, batches):
    with adp.files.open_file(path) as reader:
        calls.clear()
        read(reader)
    assert len(calls) == (reader.num_batches if batches is None else batches)


@pytest.mark.parametrize("read, batches", [(r, n) for _, r, n in READS], ids=[name for name, _, _ in READS])
def test_dataset_reader_validates_each_batch_once(path, calls, read, batches):
    with adp.files.open_dataset([path, path]) as reader:
        calls.clear()
        read(reader)
    assert len(calls) == (reader.num_batches if batches is None else batches)


def test_foreign_file_validates_each_batch_once(foreign_path, calls):
    with adp.files.open_file(foreign_path) as reader:
        calls.clear()
        reader.read_batch(0)
        assert len(calls) == 1
        calls.clear()
        reader.read_all()
        assert len(calls) == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: adp.to_arrow(_data()),
        lambda: adp.to_arrow(_data(), portable=True),
        lambda: pa.record_batch({"x": [1, 2, 3]}),
    ],
    ids=["stored", "portable", "foreign"],
)
def test_from_arrow_validates_once(calls, make):
    record_batch = make()
    adp.from_arrow(record_batch)
    assert len(calls) == 1


def test_from_ipc_validates_once(calls):
    adp.from_ipc(adp.to_ipc(_data()))
    assert len(calls) == 1


def test_unpickling_validates_once(calls):
    import pickle

    pickle.loads(pickle.dumps(_data()))
    assert len(calls) == 1
