"""The benchmark's rival serialization paths are exact: every one round-trips bit for bit.

Each tiny batch goes through ``encode`` -> ``pickle.dumps(protocol=5)`` -> ``pickle.loads`` ->
``decode``, once with buffers in band and once out of band as Ray does it (protocol 5 with a
``buffer_callback``, the buffers handed back as read-only copies).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from arrow_dataproto.testing.samples import jagged_batch, ppo_batch, seed_batch
from benchmarks.rivals import VerlDataProto, all_rivals, verl_unavailable_reason  # the repository root is on pythonpath


def _mixed_batch():
    """Dtypes and shapes beyond the PPO keys: bf16, fp16, bool, int16, a 3-D mRoPE position_ids."""
    g = torch.Generator().manual_seed(1)
    B, L = 5, 7
    td = TensorDict(
        {
            "entropys": torch.randn(B, L, generator=g).bfloat16(),
            "half": torch.randn(B, L, generator=g).half(),
            "flags": torch.rand(B, L, generator=g) > 0.5,
            "routed_experts": torch.randint(-300, 300, (B, L, 2), generator=g, dtype=torch.int16),
            "position_ids": torch.randint(0, 100, (B, 3, L), generator=g),
            "nan_inf": torch.tensor([float("nan"), float("inf"), -0.0, 1.0, -float("inf")]),
        },
        batch_size=[B],
    )
    raw_prompt = np.empty(B, dtype=object)
    for i in range(B):
        raw_prompt[i] = [{"role": "user", "content": f"q{i}"}]
    non_tensor = {"raw_prompt": raw_prompt}
    return td, non_tensor, {"metrics": [{"loss": 0.5}]}


BATCHES = {
    "ppo": lambda: ppo_batch(rows=6, prompt=5, response=4, seed=3),
    "jagged": lambda: (jagged_batch(rows=5, max_len=9, seed=2), {}, {}),
    "seed": lambda: (seed_batch(rows=3, cols=8), {}, {"global_steps": 1}),
    "mixed": _mixed_batch,
}

VERL_REASON = verl_unavailable_reason()
RIVALS = all_rivals(include_verl=False)
if VERL_REASON is None:
    RIVALS += [VerlDataProto("default"), VerlDataProto("numpy")]
    RIVAL_PARAMS = [pytest.param(r, id=r.name) for r in RIVALS]
else:
    RIVAL_PARAMS = [pytest.param(r, id=r.name) for r in RIVALS] + [
        pytest.param(None, id=name, marks=pytest.mark.skip(reason=VERL_REASON))
        for name in ("verl_dataproto", "verl_dataproto_numpy")
    ]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same_tensor(a: torch.Tensor, b: torch.Tensor, key) -> None:
    assert a.dtype == b.dtype, key
    assert a.is_nested == b.is_nested, key
    if a.is_nested:
        assert a.layout == b.layout == torch.jagged, key
        assert a._ragged_idx == b._ragged_idx, key
        rows_a, rows_b = a.unbind(), b.unbind()
        assert len(rows_a) == len(rows_b), key
        for ra, rb in zip(rows_a, rows_b):
            assert ra.shape == rb.shape and torch.equal(_bits(ra), _bits(rb)), key
    else:
        assert a.shape == b.shape, key
        assert torch.equal(_bits(a), _bits(b)), key


def assert_same_batch(expected, got) -> None:
    td, non_tensor, meta = expected
    td2, non_tensor2, meta2 = got
    assert isinstance(td2, TensorDict)
    assert td2.batch_size == td.batch_size
    keys = sorted(td.keys(include_nested=True, leaves_only=True), key=str)
    assert sorted(td2.keys(include_nested=True, leaves_only=True), key=str) == keys
    for key in keys:
        assert_same_tensor(td.get(key), td2.get(key), key)
    assert non_tensor2.keys() == non_tensor.keys()
    for key, arr in non_tensor.items():
        arr2 = non_tensor2[key]
        assert isinstance(arr2, np.ndarray) and arr2.dtype == arr.dtype and arr2.shape == arr.shape, key
        assert arr2.tolist() == arr.tolist(), key
    assert meta2 == meta


def _roundtrip(payload, out_of_band: bool):
    if not out_of_band:
        return pickle.loads(pickle.dumps(payload, protocol=5))
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    # Ray hands buffers back as read-only views of a separate copy; bytes are read-only copies.
    return pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers])


@pytest.mark.parametrize("out_of_band", [False, True], ids=["inband", "oob"])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("rival", RIVAL_PARAMS)
def test_rival_roundtrip_is_exact(rival, batch, out_of_band):
    expected = BATCHES[batch]()
    keep = BATCHES[batch]()  # an untouched copy: encode may consolidate or view the original
    got = rival.decode(_roundtrip(rival.encode(*expected), out_of_band))
    assert_same_batch(keep, got)


def test_builders_sizes():
    td, non_tensor, meta = ppo_batch(rows=4, prompt=3, response=2)
    assert td.batch_size == torch.Size([4])
    assert td["input_ids"].shape == (4, 5) and td["input_ids"].dtype == torch.int64
    assert td["old_log_probs"].shape == (4, 2) and td["old_log_probs"].dtype == torch.float32
    assert torch.equal(td["input_ids"], torch.cat([td["prompts"], td["responses"]], dim=1))
    assert len(set(non_tensor["uid"].tolist())) == 4 and non_tensor["uid"].dtype == object
    assert isinstance(non_tensor["reward_model"][0], dict)
    assert meta["global_token_num"] == td["attention_mask"].sum(1).tolist()
    nt = jagged_batch(rows=50, max_len=4)["input_ids"]
    lengths = nt.offsets().diff()
    assert nt.layout == torch.jagged and lengths.min() >= 1 and lengths.max() <= 4
    assert seed_batch(rows=2, cols=3)["input_ids"].count_nonzero() == 5
