"""Helpers for testing code that uses arrow-dataproto: sample batches and exact equality.

- :func:`sample_dataproto`: a small PPO-like batch holding every column kind;
- :func:`assert_dataproto_equal`, :func:`assert_td_equal`, :func:`assert_tensor_equal`:
  bit-exact comparisons (dtype, layout, device type, shape, ragged dimension, NaN
  payloads, key order); :func:`strict_equal` for non-tensor values and ``meta_info``;
- :mod:`arrow_dataproto.testing.samples`: benchmark-sized synthetic batches;
- :mod:`arrow_dataproto.testing.strategies`: hypothesis strategies (needs ``hypothesis``).

The library itself never imports this package.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from .._container import DataProto
from .._compat import ragged_idx

__all__ = [
    "assert_dataproto_equal",
    "assert_td_equal",
    "assert_tensor_equal",
    "sample_dataproto",
    "strict_equal",
]


def sample_dataproto(rows: int = 6, prompt: int = 5, response: int = 7, seed: int = 0) -> DataProto:
    """A small PPO-like batch with every column kind: dense int64/float32/bf16, a jagged
    tensor, an mRoPE-style ragged_idx=2 jagged tensor, a nested TensorDict, strings,
    dicts, and JSON meta_info."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    lengths = torch.randint(1, response + 1, (rows,), generator=g)
    seqs = [torch.randint(0, 1000, (int(n),), generator=g) for n in lengths]
    total = prompt + response
    td = TensorDict(
        {
            "input_ids": torch.randint(0, 32000, (rows, total), generator=g),
            "attention_mask": torch.ones(rows, total, dtype=torch.int64),
            "old_log_probs": torch.randn(rows, response, generator=g),
            "ref_log_prob": torch.randn(rows, response, generator=g).bfloat16(),
            "response_mask": torch.rand(rows, response, generator=g) > 0.3,
            "responses_jagged": torch.nested.nested_tensor(seqs, layout=torch.jagged),
            "position_ids_mrope": torch.nested.nested_tensor(
                [torch.arange(3 * int(n)).view(3, int(n)) for n in lengths], layout=torch.jagged
            ),
            "extra": TensorDict({"values": torch.randn(rows, response, generator=g)}, batch_size=[rows]),
        },
        batch_size=[rows],
    )
    non_tensor = {
        "uid": np.array([str(uuid.UUID(int=int(rng.integers(1 << 62)))) for _ in range(rows)], dtype=object),
        "data_source": np.array(["gsm8k" if i % 2 else "math" for i in range(rows)], dtype=object),
        "reward_model": np.array([{"ground_truth": str(i), "style": "rule"} for i in range(rows)], dtype=object),
    }
    meta_info = {"temperature": 0.7, "global_steps": 3, "global_token_num": [int(n) for n in lengths]}
    return DataProto(td, non_tensor, meta_info)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(_bytes(a), _bytes(b))


def _bytes(x: torch.Tensor) -> torch.Tensor:
    flat = x.detach().cpu().contiguous().reshape(-1)
    if flat.stride(0) != 1:  # a single element keeps whatever stride it had
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def assert_tensor_equal(a: torch.Tensor, b: torch.Tensor, name: str = "") -> None:
    """Same dtype, layout, device type, shape, ragged dimension and bits (NaN payloads included)."""
    assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
    assert a.is_nested == b.is_nested and a.layout == b.layout, (name, a.layout, b.layout)
    assert a.device.type == b.device.type, (name, a.device, b.device)
    if a.is_nested:
        if a.layout == torch.jagged:
            assert ragged_idx(a) == ragged_idx(b), (name, ragged_idx(a), ragged_idx(b))
        rows_a, rows_b = a.unbind(), b.unbind()
        assert len(rows_a) == len(rows_b), name
        for i, (x, y) in enumerate(zip(rows_a, rows_b)):
            assert x.shape == y.shape and _same_bits(x, y), (name, i)
        return
    assert a.shape == b.shape, (name, a.shape, b.shape)
    assert _same_bits(a, b), name


def assert_td_equal(a: TensorDict, b: TensorDict, prefix: str = "") -> None:
    """Same keys in the same order, batch size, device type and bit-equal leaves, recursively."""
    assert list(a.keys()) == list(b.keys()), (prefix, list(a.keys()), list(b.keys()))
    assert a.batch_size == b.batch_size, (prefix, a.batch_size, b.batch_size)
    device_types = [None if td.device is None else td.device.type for td in (a, b)]
    assert device_types[0] == device_types[1], (prefix, a.device, b.device)
    for key in a.keys():
        if is_tensor_collection(a[key]):
            assert_td_equal(a[key], b[key], f"{prefix}{key}.")
        else:
            assert_tensor_equal(a[key], b[key], f"{prefix}{key}")


def strict_equal(a, b) -> bool:
    """Equal values with identical Python types, recursively; NaN equals NaN; dict key order counts."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(strict_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):  # tensors in meta_info: dtype, shape, device and bits
        return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and _same_bits(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and (
            all(strict_equal(x, y) for x, y in zip(a.ravel(), b.ravel())) if a.dtype == object
            else a.tobytes() == b.tobytes()
        )
    return a == b


def assert_dataproto_equal(a, b) -> None:
    """Bit-exact equality of two DataProtos (ours or anything with the same three fields)."""
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        assert_td_equal(a.batch, b.batch)
    assert list(a.non_tensor_batch) == list(b.non_tensor_batch)
    for key in a.non_tensor_batch:
        assert strict_equal(a.non_tensor_batch[key], b.non_tensor_batch[key]), key
    assert strict_equal(a.meta_info, b.meta_info)
