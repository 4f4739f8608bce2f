"""Pickling a DataProto: protocol 5 with out-of-band buffers, protocols 2-4, and ReceiveOptions."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import _wire, pickling
from test_codec import PROPERTY_SETTINGS, absent_device, leaves, with_field_metadata, with_schema_metadata
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto
from arrow_dataproto.testing.strategies import dataprotos

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")


def dumps5(obj) -> tuple[bytes, list[pickle.PickleBuffer]]:
    buffers: list[pickle.PickleBuffer] = []
    return pickle.dumps(obj, protocol=5, buffer_callback=buffers.append), buffers


def out_of_band_bytes(buffers) -> int:
    return sum(memoryview(b).nbytes for b in buffers)


def address_ranges(buffers) -> list[tuple[int, int]]:
    return [(pa.py_buffer(b).address, pa.py_buffer(b).size) for b in buffers]


def points_into(pointer: int, ranges) -> bool:
    return any(start <= pointer < start + size for start, size in ranges)


def data_pointers(dp) -> dict:
    """Where the values of each non-empty leaf live."""
    pointers = {}
    for key, tensor in leaves(dp).items():
        values = tensor.values() if tensor.is_nested else tensor
        if values.numel():
            pointers[key] = values.data_ptr()
    return pointers


@pytest.fixture
def restore_receive_options(monkeypatch):
    """Undo whatever a test does to the process-wide default."""
    monkeypatch.setattr(pickling, "_process_default", pickling._process_default)


# ---------------------------------------------------------------- round trips


@PROPERTY_SETTINGS
@given(dataprotos())
def test_round_trip_every_protocol(dp):
    data, buffers = dumps5(dp)
    assert_dataproto_equal(dp, pickle.loads(data, buffers=buffers))
    with adp.receive_options(copy=False):
        assert_dataproto_equal(dp, pickle.loads(data, buffers=buffers))
    assert_dataproto_equal(dp, pickle.loads(pickle.dumps(dp, protocol=5)))  # no callback: in band
    for protocol in (2, 3, 4):
        assert_dataproto_equal(dp, pickle.loads(pickle.dumps(dp, protocol=protocol)))


def test_sample_batch_and_its_pieces_round_trip():
    dp = sample_dataproto(rows=9)
    pieces = [dp, *dp.array_split(4), dp[[5, 1, 1]], dp[::-2], dp[3]]
    for piece in pieces[:-1]:
        data, buffers = dumps5(piece)
        assert_dataproto_equal(piece, pickle.loads(data, buffers=buffers))
        assert_dataproto_equal(piece, pickle.loads(pickle.dumps(piece, protocol=2)))


def test_non_json_meta_info_and_pickled_columns_round_trip():
    """Unpickling trusts the sender, so pickled meta_info and non-tensor columns are allowed back."""
    dp = sample_dataproto()
    dp.meta_info["shape"] = (3, 4)  # a tuple: not JSON
    dp.non_tensor_batch["mixed"] = np.array([1, "a", None, 2.5, (1,), {1, 2}], dtype=object)
    for protocol in (2, 4, 5):
        assert_dataproto_equal(dp, pickle.loads(pickle.dumps(dp, protocol=protocol)))
    with pytest.raises(adp.PickleNotAllowedError):
        adp.from_ipc(adp.to_ipc(dp))


def test_pickle_inside_other_objects():
    dp = sample_dataproto()
    data, buffers = dumps5({"a": [dp, dp.chunk(2)[1]], "b": 3})
    out = pickle.loads(data, buffers=buffers)
    assert_dataproto_equal(dp, out["a"][0])
    assert_dataproto_equal(dp.chunk(2)[1], out["a"][1])


# ---------------------------------------------------------------- out of band


def test_protocol_5_keeps_the_in_band_part_small():
    rows, width = 1024, 8192  # 64 MiB of int64
    dense = TensorDict(
        {
            "ids": torch.arange(rows * width, dtype=torch.int64).view(rows, width),
            "mask": torch.ones(rows, 16, dtype=torch.bool),
        },
        batch_size=[rows],
    )
    dp = adp.DataProto(dense, meta_info={"step": 1})
    data, buffers = dumps5(dp)
    assert len(data) < 16 * 1024
    assert out_of_band_bytes(buffers) == sum(t.numel() * t.element_size() for t in dense.values())
    assert_dataproto_equal(dp, pickle.loads(data, buffers=buffers))


def test_protocol_5_hands_nested_values_out_of_band_without_splitting_rows():
    lengths = torch.randint(0, 50, (200,), generator=torch.Generator().manual_seed(0))
    nt = torch.nested.nested_tensor([torch.ones(int(n)) for n in lengths], layout=torch.jagged)
    dp = adp.DataProto(TensorDict({"nt": nt}, batch_size=[200]))
    data, buffers = dumps5(dp)
    assert len(buffers) < 10  # one values buffer and one offsets buffer, not one per row
    assert out_of_band_bytes(buffers) == nt.values().numel() * 4 + nt.offsets().numel() * 8
    assert len(data) < 4096


def test_lower_protocols_carry_the_bytes_in_band():
    t = torch.arange(1 << 16, dtype=torch.int64)
    dp = adp.DataProto(TensorDict({"t": t}, batch_size=[len(t)]))
    for protocol in (2, 3, 4):
        assert len(pickle.dumps(dp, protocol=protocol)) > t.numel() * 8


def test_chunk_of_a_batch_ships_only_its_rows():
    dp = sample_dataproto(rows=400, prompt=64, response=64)
    whole = out_of_band_bytes(dumps5(dp)[1])
    first = dp.chunk(4)[0]
    quarter = out_of_band_bytes(dumps5(first)[1])
    assert 0.2 * whole < quarter < 0.3 * whole
    own = sum(
        (
            (t.values().numel() * t.element_size() + t.offsets().numel() * 8)
            if t.is_nested
            else t.numel() * t.element_size()
        )
        for t in leaves(first).values()
    )
    numeric = sum(v.nbytes for v in first.non_tensor_batch.values() if v.dtype != object)
    assert own <= quarter <= own + numeric + 200 * 1024  # plus the string/dict columns' bytes
    for protocol in (2, 4):
        assert len(pickle.dumps(first, protocol=protocol)) < 0.3 * len(pickle.dumps(dp, protocol=protocol))


# ---------------------------------------------------------------- receive options


def test_default_receive_copies_out_of_the_buffers():
    """Buffers in ordinary memory (here: not Ray's shared memory) are copied by the
    copy-on-write default; ``tests/test_cow.py`` covers shared memory."""
    assert adp.get_receive_options() == adp.ReceiveOptions(copy="on_write", device=None)
    dp = sample_dataproto()
    data, buffers = dumps5(dp)
    ranges = address_ranges(buffers)
    out = pickle.loads(data, buffers=buffers)
    assert not any(points_into(p, ranges) for p in data_pointers(out).values())
    out.batch["input_ids"].add_(1)  # the receiver owns its memory: the sender's bytes are untouched
    assert_dataproto_equal(dp, pickle.loads(data, buffers=buffers))


def test_receive_options_copy_false_views_the_buffers():
    dp = sample_dataproto()
    data, buffers = dumps5(dp)
    ranges = address_ranges(buffers)
    with adp.receive_options(copy=False):
        assert adp.get_receive_options().copy is False
        out = pickle.loads(data, buffers=buffers)
    assert adp.get_receive_options().copy == "on_write"
    pointers = data_pointers(out)
    assert pointers and all(points_into(p, ranges) for p in pointers.values())
    assert_dataproto_equal(dp, out)


def test_receive_options_nest_and_restore():
    with adp.receive_options(copy=False):
        with adp.receive_options(device="cpu"):
            assert adp.get_receive_options() == adp.ReceiveOptions(copy=False, device="cpu")
        assert adp.get_receive_options() == adp.ReceiveOptions(copy=False, device=None)
    assert adp.get_receive_options() == adp.ReceiveOptions()
    with pytest.raises(RuntimeError):
        with adp.receive_options(copy=False):
            raise RuntimeError("inside")
    assert adp.get_receive_options().copy == "on_write"


def test_receive_options_are_per_thread():
    seen = {}
    with adp.receive_options(copy=False):
        thread = threading.Thread(target=lambda: seen.update(options=adp.get_receive_options()))
        thread.start()
        thread.join()
    assert seen["options"].copy == "on_write"


def test_set_receive_options_changes_the_process_default(restore_receive_options):
    assert adp.set_receive_options(copy=False) == adp.ReceiveOptions(copy=False, device=None)
    assert adp.set_receive_options(device="cpu") == adp.ReceiveOptions(copy=False, device="cpu")
    assert adp.get_receive_options() == adp.ReceiveOptions(copy=False, device="cpu")
    with adp.receive_options(copy=True):
        assert adp.get_receive_options() == adp.ReceiveOptions(copy=True, device="cpu")
    dp = sample_dataproto()
    data, buffers = dumps5(dp)
    out = pickle.loads(data, buffers=buffers)
    assert all(points_into(p, address_ranges(buffers)) for p in data_pointers(out).values())
    assert out.batch.device == torch.device("cpu")


@pytest.mark.parametrize(
    "copy, device, expected",
    [
        (None, None, adp.ReceiveOptions(copy="on_write", device=None)),
        ("on_write", None, adp.ReceiveOptions(copy="on_write")),
        ("On-Write", None, adp.ReceiveOptions(copy="on_write")),
        ("sometimes", None, adp.ReceiveOptions(copy="on_write")),  # unknown: the default, with a warning
        ("0", None, adp.ReceiveOptions(copy=False)),
        ("false", None, adp.ReceiveOptions(copy=False)),
        (" OFF ", None, adp.ReceiveOptions(copy=False)),
        ("no", None, adp.ReceiveOptions(copy=False)),
        ("1", "cpu", adp.ReceiveOptions(copy=True, device="cpu")),
        ("true", "", adp.ReceiveOptions(copy=True, device=None)),
    ],
)
def test_environment_variables_are_parsed(monkeypatch, copy, device, expected):
    for name, value in (("ARROW_DATAPROTO_COPY", copy), ("ARROW_DATAPROTO_DEVICE", device)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert pickling._from_environment() == expected


def test_environment_sets_the_default_of_a_new_process():
    script = "import arrow_dataproto as a; o = a.get_receive_options(); print(o.copy, o.device)"
    env = {**os.environ, "ARROW_DATAPROTO_COPY": "0", "ARROW_DATAPROTO_DEVICE": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == ["False", "cpu"]


class _Rebuild:
    """Pickles as a call of ``rebuild_dataproto`` on a given state (what DataProto.__reduce_ex__ produces)."""

    def __init__(self, state):
        self.state = state

    def __reduce__(self):
        return pickling.rebuild_dataproto, self.state


def test_recorded_device_missing_here_lands_on_cpu_with_one_warning():
    td = TensorDict(
        {"x": torch.arange(4), "j": torch.nested.nested_tensor([torch.ones(2)] * 4, layout=torch.jagged)},
        [4],
        device="cpu",
    )
    record_batch = with_field_metadata(adp.to_arrow(td), "adp.device", absent_device())
    record_batch = with_schema_metadata(record_batch, "adp.device", json.dumps(absent_device()))
    data = pickle.dumps(_Rebuild(pickling.batch_state(record_batch)), protocol=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = pickle.loads(data)
    assert [w.category for w in caught] == [RuntimeWarning]
    assert all(t.device.type == "cpu" for t in leaves(out).values()) and out.batch.device == torch.device("cpu")
    assert_dataproto_equal(adp.DataProto(td), out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with adp.receive_options(device="cpu"):
            assert_dataproto_equal(adp.DataProto(td), pickle.loads(data))


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda s: (s[0], s[1], s[2][:-1]),  # a column missing
        lambda s: (b"not a schema", s[1], s[2]),
        lambda s: (s[0], s[1], [(c[0], c[1], c[2], c[3], c[4][:0]) for c in s[2]]),  # children dropped
        lambda s: (s[0], s[1], [(c[0] + 100, *c[1:]) for c in s[2]]),  # longer than the buffers
        lambda s: (s[0], s[1], [(c[0], c[1], -5, *c[3:]) for c in s[2]]),  # negative offset
    ],
    ids=["missing_column", "bad_schema", "no_children", "too_long", "negative_offset"],
)
def test_corrupt_pickled_state_is_a_decode_error(corrupt):
    state = pickling.batch_state(adp.to_arrow(sample_dataproto()))
    with pytest.raises(adp.DecodeError):
        pickle.loads(pickle.dumps(_Rebuild(corrupt(state))))


def test_schemas_are_parsed_once_but_large_ones_are_not_kept():
    """A training loop's few schemas are parsed once; a schema made large by its meta_info
    (which rides in the schema metadata) is parsed each time and not kept in memory."""
    _wire._read_schema.cache_clear()
    _wire._plan.cache_clear()
    small = adp.DataProto.from_dict({"a": torch.arange(4)}, meta_info={"step": 1})
    for _ in range(3):
        assert pickle.loads(pickle.dumps(small, protocol=5)).meta_info == {"step": 1}
    info = _wire._read_schema.cache_info()
    assert (info.misses, info.currsize) == (1, 1)  # parsed once: the decode plan of the schema is kept
    plans = _wire._plan.cache_info()
    assert (plans.misses, plans.hits, plans.currsize) == (1, 2, 1)
    large = adp.DataProto.from_dict({"a": torch.arange(4)}, meta_info={"notes": "x" * 200_000})
    assert pickle.loads(pickle.dumps(large, protocol=5)).meta_info == {"notes": "x" * 200_000}
    assert _wire._read_schema.cache_info().currsize == 1
    assert _wire._plan.cache_info().currsize == 1
