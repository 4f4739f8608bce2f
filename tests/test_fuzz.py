"""Hostile bytes: a short deterministic fuzz run, and regression tests for what the fuzzer found.

The fuzzer is ``tests/fuzz.py`` (its docstring defines the targets, the mutations and
the allowed outcomes); its long run (>= 100,000 cases) writes ``benchmarks/results/fuzz.md``.
Every input that once crashed or escaped with a foreign exception is decoded here in the
fuzzer's worker subprocess, so that a regression shows as a failed test, not a dead pytest.
"""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import fuzz  # tests/fuzz.py

import arrow_dataproto as adp
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

SHORT_RUN = 1000  # cases (about 40 a target): seconds once the worker is up


@pytest.fixture(scope="module")
def corpus():
    return fuzz.Corpus()


@pytest.fixture(scope="module")
def worker():
    w = fuzz.Worker()
    yield w
    w.close()


def test_every_seed_decodes_exactly(corpus):
    for target in corpus.targets:
        for seed in target.seeds:
            outcome, detail = fuzz.check_case(target, corpus.seeds[seed], corpus.payloads[target.name, seed])
            expected = "error:PickleNotAllowedError" if seed == "pickled" else "exact"
            assert outcome == expected, (target.name, seed, detail)


def test_cases_are_reproducible(corpus):
    for number in (0, 1, 7, 123):
        a, b = fuzz.make_case(number, 5, corpus), fuzz.make_case(number, 5, corpus)
        assert (a.target, a.seed, a.mutation) == (b.target, b.seed, b.mutation)
        assert pickle.dumps(a.payload) == pickle.dumps(b.payload)


def test_harness_reports_crashes_and_hangs():
    assert fuzz.selftest(timeout=3) == {"error": "unexpected:ValueError", "crash": "crash:SIGSEGV", "hang": "hang"}


def test_short_fuzz_run_has_no_findings(worker, tmp_path):
    summary = fuzz.fuzz(range(SHORT_RUN), base_seed=2024, out_dir=tmp_path, worker=worker)
    assert summary.cases == SHORT_RUN
    assert summary.findings == [], summary.findings
    assert not list(tmp_path.iterdir())
    # every target was exercised both ways: some mutants decoded, most were refused
    for name in fuzz.targets():
        outcomes = {o: n for (t, o), n in summary.outcomes.items() if t == name}
        assert outcomes.get("exact", 0) + outcomes.get("valid", 0) > 0, (name, outcomes)
        refused = "error:CommandFailed" if name == "cli" else "error:DecodeError"  # the CLI's exit status 1
        assert outcomes.get(refused, 0) > 0, (name, outcomes)


# ---------------------------------------------------------------- regressions


def _state(corpus, seed="ppo"):
    return copy.deepcopy(corpus.payloads["state", seed])


def _node(state, *path):
    """The array state at ``path`` (column index, then child indices)."""
    node = state[2][path[0]]
    for i in path[1:]:
        node = node[4][i]
    return node


def _column(state, name):
    schema = pa.ipc.read_schema(pa.py_buffer(state[0]))
    return schema.names.index(name)


@pytest.mark.parametrize(
    "edit",
    [
        # a negative offset passes Arrow's validation; torch would have viewed memory before the buffer (SIGSEGV)
        pytest.param(lambda s: _node(s, _column(s, "response_mask"), 0).__setitem__(2, -(2**63)), id="negative-offset"),
        # a fixed_size_list whose offset runs past its values passes Arrow's validation; flatten() aborted (SIGABRT)
        pytest.param(lambda s: _node(s, _column(s, "input_ids")).__setitem__(2, 10**6), id="fixed-size-list-offset"),
        pytest.param(lambda s: _node(s, _column(s, "input_ids")).__setitem__(2, 3), id="fixed-size-list-short"),
        # ints beyond int64 raised OverflowError
        pytest.param(lambda s: _node(s, 0).__setitem__(0, 2**64), id="length-overflow"),
        pytest.param(lambda s: _node(s, 0).__setitem__(1, 2**64), id="null-count-overflow"),
        # corrupt schema bytes raised OSError
        pytest.param(lambda s: s.__setitem__(0, b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\x01" * 16), id="schema-corrupt"),
    ],
)
def test_lying_pickle_states_raise_decode_error(corpus, worker, edit):
    state = _state(corpus)
    edit(state)
    outcome, detail = worker.run("state", "ppo", state)
    assert outcome == "error:DecodeError", detail


def _stream(batch: pa.RecordBatch, schema: pa.Schema) -> bytes:
    batch = pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _with_meta(schema: pa.Schema, key: str, value: str, field: str | None = None) -> pa.Schema:
    if field is None:
        return schema.with_metadata({**schema.metadata, key.encode(): value.encode()})
    i = schema.get_field_index(field)
    f = schema.field(i)
    return schema.set(i, f.with_metadata({**f.metadata, key.encode(): value.encode()}))


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "edit",
    [
        # JSON nested deeper than the recursion limit raised RecursionError
        pytest.param(lambda s: _with_meta(s, "adp.batch_size", DEEP), id="deep-batch-size"),
        pytest.param(lambda s: _with_meta(s, "adp.shape", DEEP, field="input_ids"), id="deep-shape"),
        # duplicate names decoded to a batch key that is also a non-tensor key (re-encoding refused it)
        pytest.param(lambda s: s.set(8, s.field(8).with_name("input_ids")), id="duplicate-name"),
        pytest.param(lambda s: s.set(9, s.field(9).with_name("uid")), id="duplicate-non-tensor-name"),
        # a tensor column whose name is not its tree path
        pytest.param(lambda s: s.set(0, s.field(0).with_name("renamed")), id="name-not-in-tree"),
    ],
)
def test_lying_ipc_metadata_raises_decode_error(worker, edit):
    batch = adp.to_arrow(sample_dataproto())
    outcome, detail = worker.run("ipc", "ppo", _stream(batch, edit(batch.schema)))
    assert outcome == "error:DecodeError", detail


def test_a_dimension_beyond_int64_raises_decode_error(worker):
    # beside a zero-size dimension a huge one still matched the (empty) values; torch's view() raised TypeError
    batch = adp.to_arrow(fuzz.SEEDS["edge-shapes"]())
    schema = _with_meta(batch.schema, "adp.shape", json.dumps([0, None, 2**64]), field="hollow")
    outcome, detail = worker.run("ipc", "edge-shapes", _stream(batch, schema))
    assert outcome == "error:DecodeError", detail


def test_strided_row_shapes_that_overflow_int64_raise_decode_error():
    # rows of 2**32 x 2**32 values: the int64 product wraps to 0, which matched an empty row
    nested = torch.nested.nested_tensor([torch.zeros(2, 3), torch.ones(1, 4)])
    batch = adp.to_arrow(adp.DataProto(TensorDict({"s": nested}, batch_size=[2])))
    sizes = pa.FixedSizeListArray.from_arrays(pa.array([2**32, 2**32, 1, 4], pa.int64()), 2)
    data = pa.LargeListArray.from_arrays(pa.array([0, 0, 4], pa.int64()), pa.array([1.0] * 4, pa.float32()))
    lying = pa.StructArray.from_arrays([data, sizes], names=["data", "shape"])
    with pytest.raises(adp.DecodeError, match="'s'.*row shapes"):
        adp.from_arrow(pa.RecordBatch.from_arrays([lying], schema=batch.schema))


def test_meta_device_is_not_honoured():
    """A payload recording the meta device (no data) decodes onto the CPU, with a warning."""
    dp = sample_dataproto()
    batch = adp.to_arrow(dp)
    schema = _with_meta(batch.schema, "adp.device", "meta", field="input_ids")
    with pytest.warns(RuntimeWarning, match="meta"):
        decoded = adp.from_ipc(_stream(batch, schema))
    assert_dataproto_equal(dp, decoded)



def test_invalid_utf8_in_a_nested_field_name_raises_decode_error(worker):
    # the strided column's struct child "shape" renamed b"\xffhape": reading its name raised UnicodeDecodeError
    payload = adp.to_ipc(fuzz.SEEDS["kinds"]()).to_pybytes()
    name = b"\x05\x00\x00\x00shape\x00"  # a flatbuffer string: length, bytes, NUL
    assert payload.count(name) == 1
    outcome, detail = worker.run("ipc", "kinds", payload.replace(name, b"\x05\x00\x00\x00\xffhape\x00"))
    assert outcome == "error:DecodeError", detail


def test_from_arrow_refuses_offsets_arrow_validation_misses():
    """A negative offset, or a fixed_size_list offset past its values, passes
    ``validate(full=True)``; only hand-built arrays have them (small ones here: safe in-process)."""
    batch = adp.to_arrow(sample_dataproto())
    column = batch.column(0)  # input_ids: fixed_shape_tensor over fixed_size_list<int64>[12]
    storage, values = column.storage, column.storage.values
    shifted = pa.Array.from_buffers(values.type, len(values), values.buffers(), 0, -1)
    bad_columns = [
        pa.Array.from_buffers(storage.type, len(storage), [None], 0, 3, [values]),
        pa.Array.from_buffers(storage.type, len(storage), [None], 0, 0, [shifted]),
    ]
    for bad in bad_columns:
        bad.validate(full=True)  # Arrow sees nothing wrong
        lying = pa.ExtensionArray.from_storage(column.type, bad)
        with pytest.raises(adp.DecodeError, match="'input_ids'.*offset"):
            adp.from_arrow(pa.RecordBatch.from_arrays([lying, *batch.columns[1:]], schema=batch.schema))


def _beyond_unicode(dtype: str = "<U2") -> np.ndarray:
    """A numpy text array built from bytes, one of whose code points is 0x8000000 (numpy holds any 32 bits)."""
    return np.frombuffer(np.array([0x61, 0x8000000, 0x62, 0x63], dtype=f"{dtype[0]}u4").tobytes(), dtype=dtype)


def test_a_verl_pickle_with_text_beyond_unicode_raises_decode_error(worker):
    # a flipped bit in a numpy <U4 array: tolist() raised SystemError, and pyarrow wrote the value as bytes
    # that are not UTF-8, so the decoded DataProto could not be sent on (fuzz cases 10234 and 63226, verl-pickle)
    payload = fuzz._encode_verl_pickle(adp.DataProto(non_tensor_batch={"name": _beyond_unicode()}))
    outcome, detail = worker.run("verl-pickle", "no-batch", payload)
    assert outcome == "error:DecodeError" and "beyond Unicode" in detail, detail


@pytest.mark.parametrize("dtype", ["<U2", ">U2"])
def test_text_beyond_unicode_is_an_encode_error(dtype):
    with pytest.raises(adp.EncodeError, match="'name'.*0x8000000"):
        adp.to_arrow(adp.DataProto(non_tensor_batch={"name": _beyond_unicode(dtype)}))


def test_an_extension_type_deserializer_that_raises_is_a_decode_error(tmp_path):
    # a registered extension type's __arrow_ext_deserialize__ runs on the stream's bytes; its KeyError
    # escaped from_ipc (fuzz case 55496, foreign-types), and the file readers
    class Fragile(pa.ExtensionType):
        def __init__(self):
            super().__init__(pa.int32(), "adp-test.fragile")

        def __arrow_ext_serialize__(self) -> bytes:
            return b"{}"

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return {}["scale"]

    pa.register_extension_type(Fragile())
    try:
        table = pa.table({"x": pa.ExtensionArray.from_storage(Fragile(), pa.array([1, 2], pa.int32()))})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        with pytest.raises(adp.DecodeError, match="KeyError"):
            adp.from_ipc(sink.getvalue())
        (tmp_path / "stream.arrow").write_bytes(sink.getvalue().to_pybytes())
        with pa.ipc.new_file(str(tmp_path / "file.arrow"), table.schema) as writer:
            writer.write_table(table)
        (tmp_path / "partial.arrow").write_bytes((tmp_path / "file.arrow").read_bytes()[:-20])
        for name in ("stream.arrow", "file.arrow"):
            with pytest.raises(adp.DecodeError, match="KeyError"):
                adp.files.read_file(tmp_path / name)
            with pytest.raises(adp.DecodeError, match="KeyError"):  # the way back reads the original schema
                adp.from_arrow(pa.table({"y": [1]}), schema=str(tmp_path / name))
        for name in ("file.arrow", "partial.arrow"):
            with pytest.raises(adp.DecodeError, match="KeyError"):
                adp.files.recover_file(tmp_path / name, tmp_path / f"{name}.recovered")
    finally:
        pa.unregister_extension_type("adp-test.fragile")
