"""The plans of the pickled state (arrow_dataproto._wire): the same state as the full encoder,
the same DataProto as the full decoder, and every state the plan cannot prove sent to the
full path (a lie is still a DecodeError)."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import _wire, pickling
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto

ROWS = 5


def _dense_batch() -> adp.DataProto:
    g = torch.Generator().manual_seed(0)
    nested = TensorDict({"x": torch.randn(ROWS, 2, 3, generator=g), "flag": torch.rand(ROWS, generator=g) > 0.5}, batch_size=[ROWS])
    return adp.DataProto(
        TensorDict(
            {
                "f32": torch.randn(ROWS, 4, generator=g),
                "bf16": torch.randn(ROWS, 3, generator=g).to(torch.bfloat16),
                "fp8": torch.randn(ROWS, 2, generator=g).to(torch.float8_e4m3fn),
                "u16": torch.arange(ROWS).to(torch.uint16),
                "bool": torch.rand(ROWS, 2, generator=g) > 0.5,
                "c64": torch.randn(ROWS, 2, dtype=torch.complex64, generator=g),
                "c128_1d": torch.randn(ROWS, dtype=torch.complex128, generator=g),
                "conj": torch.randn(ROWS, 2, dtype=torch.complex64, generator=g).conj(),
                "neg": torch.randn(ROWS, 2, generator=g)._neg_view(),
                "strided": torch.randn(4, ROWS, generator=g).t(),
                "empty_rows": torch.empty(ROWS, 0, 3),
                "nested": nested,
            },
            batch_size=[ROWS],
        ),
        {"uid": np.array([f"u{i}" for i in range(ROWS)], dtype=object), "score": np.arange(ROWS, dtype=np.float64),
         "rm": np.array([{"gt": str(i)} for i in range(ROWS)], dtype=object)},
        {"step": 3, "temperature": 0.7},
    )


def _resolved(data: adp.DataProto) -> adp.DataProto:
    """``data`` with lazy conj/neg bits resolved (what a decoder gives back; the helper's bit comparison needs it)."""
    return adp.DataProto(data.batch.apply(lambda t: t.resolve_conj().resolve_neg()), data.non_tensor_batch, data.meta_info)


def _flat(state) -> list:
    """A state with each buffer as its bytes, for comparison."""
    def column(c):
        length, nulls, offset, buffers, children = c
        return length, nulls, offset, [None if b is None else pa.py_buffer(b).to_pybytes() for b in buffers], [column(x) for x in children]

    return [state[0], state[1], [column(c) for c in state[2]]]


@pytest.mark.parametrize("make", [_dense_batch, lambda: _dense_batch()[:0], lambda: adp.DataProto(_dense_batch().batch)])
def test_fast_state_is_the_full_encoders_state(make):
    data = make()
    full = _flat(pickling.batch_state(adp.to_arrow(data)))
    for _ in range(2):  # the first builds the plan, the second uses it
        assert _flat(_wire.fast_state(data)) == full


def test_fast_state_leaves_other_batches_to_the_full_encoder():
    jagged = torch.nested.nested_tensor([torch.arange(n) for n in (1, 3)], layout=torch.jagged)
    assert _wire.fast_state(adp.DataProto(TensorDict({"j": jagged}, batch_size=[2]))) is None
    assert _wire.fast_state(adp.DataProto(None, {"a": np.arange(3)})) is None


@pytest.mark.parametrize("copy", [False, True, "on_write"])
def test_fast_decode_is_the_full_decoders_result(copy):
    data = _dense_batch()
    state = pickling.batch_state(adp.to_arrow(data))
    with adp.receive_options(copy=copy):
        fast = pickling.rebuild_dataproto(*state)
        full = adp.from_arrow(pickling.batch_from_state(*state), allow_pickle=True)
    assert _wire.fast_parts(*state, device=None, copy=False, private=False) is not None
    assert_dataproto_equal(fast, _resolved(data))
    assert_dataproto_equal(fast, full)
    assert list(fast.batch.keys(include_nested=True, leaves_only=True)) == list(data.batch.keys(include_nested=True, leaves_only=True))
    if copy is True:
        assert fast.batch["f32"].untyped_storage().data_ptr() != data.batch["f32"].untyped_storage().data_ptr()
    if copy is False:
        assert fast.batch["f32"].data_ptr() == data.batch["f32"].data_ptr()  # views the buffer


def test_misaligned_buffers_are_copied_not_misread():
    data = adp.DataProto(TensorDict({"c": torch.randn(3, dtype=torch.complex128)}, batch_size=[3]))
    state = pickling.batch_state(adp.to_arrow(data))
    raw = bytearray(b"\0" + pa.py_buffer(state[2][0][4][0][3][1]).to_pybytes())
    shifted = memoryview(raw)[1:]
    child = state[2][0][4][0]
    column = state[2][0]
    moved = (state[0], state[1], [(*column[:4], [(*child[:3], [None, shifted], [])])])
    assert_dataproto_equal(pickling.rebuild_dataproto(*moved), data)


def _with_column(state, i, column):
    columns = list(state[2])
    columns[i] = column
    return state[0], state[1], columns


@pytest.mark.parametrize(
    "lie",
    [
        lambda c: (c[0], c[1], c[2], c[3], [(c[4][0][0], 0, 0, [None, pa.py_buffer(b"\0" * 8)], [])]),  # short buffer
        lambda c: (c[0] + 1, *c[1:]),  # more rows than the batch
        lambda c: (c[0], 2, *c[2:]),  # nulls
        lambda c: (c[0], c[1], 1, *c[3:]),  # an offset
        lambda c: (c[0], c[1], c[2], c[3], []),  # no values
        lambda c: (c[0], c[1], c[2], c[3], [(c[4][0][0] - 1, *c[4][0][1:])]),  # too few values
        lambda c: "not a column",
    ],
)
def test_a_lie_in_a_dense_column_is_a_decode_error(lie):
    data = _dense_batch()
    state = pickling.batch_state(adp.to_arrow(data))
    corrupt = _with_column(state, 0, lie(state[2][0]))
    assert _wire.fast_parts(*corrupt, device=None, copy=False, private=False) is None
    with pytest.raises(adp.DecodeError):
        pickling.rebuild_dataproto(*corrupt)


def test_meta_info_changing_every_step_round_trips():
    data = sample_dataproto()
    for step in range(3):
        data.meta_info["global_steps"] = step
        back = pickle.loads(pickle.dumps(data, protocol=5))
        assert back.meta_info["global_steps"] == step
        assert_dataproto_equal(back, data)


def test_protocol_4_carries_the_bytes_in_band():
    data = _dense_batch()
    assert_dataproto_equal(pickle.loads(pickle.dumps(data, protocol=4)), _resolved(data))


def test_an_object_column_of_another_length_is_a_decode_error():
    """(A fuzz finding: the plan's object columns built as a batch of the wrong length was a ValueError.)"""
    data = _dense_batch()
    state = pickling.batch_state(adp.to_arrow(data))
    i = adp.to_arrow(data).schema.get_field_index("uid")
    column = state[2][i]
    sliced = adp.to_arrow(data).column(i).slice(0, ROWS - 1)
    corrupt = _with_column(state, i, _wire.array_state(sliced))
    assert column[0] == ROWS
    with pytest.raises(adp.DecodeError):
        pickling.rebuild_dataproto(*corrupt)


def test_a_state_with_tensors_for_buffers_is_left_to_the_full_path():
    """Ray Direct Transport hands buffers over as uint8 tensors: the plans never take them (the
    full path turns them back into buffers, and the tensors view them)."""
    data = _dense_batch()
    state = pickling.batch_state(adp.to_arrow(data))
    as_tensors = [pickling._map_buffers(c, pickling._as_tensor) for c in state[2]]
    for private in (False, True):
        assert _wire.fast_parts(state[0], state[1], as_tensors, device=None, copy=False, private=private) is None
    with adp.receive_options(copy="on_write"):
        assert_dataproto_equal(pickling.rebuild_dataproto(state[0], state[1], as_tensors), _resolved(data))
