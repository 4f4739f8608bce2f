"""Synthetic RL batches for the demo, the benchmarks and their tests.

Every builder is deterministic for a given ``seed`` and returns plain objects (a
``TensorDict``, a dict of numpy object arrays, a dict of meta values), so that
rival codecs can be fed the same data. Defaults are the benchmark sizes; pass
small sizes for tests.

- ``seed_batch(rows, cols)``: one int64 tensor ``input_ids`` [rows, cols]
  (default 6400 x 20480 = 1 GiB).
- ``ppo_batch(rows, prompt, response, seed)``: ``(batch, non_tensor, meta_info)`` shaped like
  a PPO step of an RL trainer (default 2560 x (1024 + 1024), about 280 MB of tensors).
- ``jagged_batch(rows, max_len, seed)``: one int64 jagged ``torch.nested`` tensor ``input_ids``
  (layout=torch.jagged) whose row lengths are uniform in 1..max_len
  (default 6400 rows x up to 20480: about 0.5 GiB of values).
- ``nbytes(td)``: bytes held by a TensorDict's leaves (jagged values and offsets included).
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["seed_batch", "ppo_batch", "jagged_batch", "nbytes"]

VOCAB = 151_936  # token ids stay below a typical LLM vocabulary size
PAD = 0


def seed_batch(rows: int = 6400, cols: int = 20480) -> TensorDict:
    """One int64 ``input_ids`` tensor [rows, cols] filled with ``arange`` (never zeros)."""
    ids = torch.arange(rows * cols, dtype=torch.int64).reshape(rows, cols)
    return TensorDict({"input_ids": ids}, batch_size=[rows])


def _object_array(items) -> np.ndarray:
    """A 1-D numpy object array holding ``items`` as they are (dicts stay dicts)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def ppo_batch(
    rows: int = 2560, prompt: int = 1024, response: int = 1024, seed: int = 0
) -> tuple[TensorDict, dict[str, np.ndarray], dict]:
    """A PPO-style batch: ``(batch, non_tensor_batch, meta_info)``.

    Prompts are left-padded and responses right-padded with ``PAD`` (each row has a random
    length of at least 1), so masks, position ids and the masked float tensors look like a
    real rollout. Tensors: ``prompts`` [B, P], ``responses``/``response_mask`` [B, R],
    ``input_ids``/``attention_mask``/``position_ids`` [B, P + R] (all int64) and
    ``old_log_probs``, ``ref_log_prob``, ``values``, ``advantages``, ``returns``,
    ``token_level_rewards`` [B, R] (float32). Non-tensor: ``uid`` (uuid4 strings),
    ``data_source`` (strings), ``reward_model`` (dicts). Meta: ``temperature``,
    ``global_steps``, ``global_token_num`` (one int per row).
    """
    g = torch.Generator().manual_seed(seed)
    B, P, R = rows, prompt, response

    prompt_len = torch.randint(1, P + 1, (B, 1), generator=g)
    response_len = torch.randint(1, R + 1, (B, 1), generator=g)
    prompt_mask = (torch.arange(P) >= P - prompt_len).long()  # left padding
    response_mask = (torch.arange(R) < response_len).long()  # right padding

    prompts = torch.randint(1, VOCAB, (B, P), generator=g) * prompt_mask
    responses = torch.randint(1, VOCAB, (B, R), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)

    fmask = response_mask.float()

    def masked(t: torch.Tensor) -> torch.Tensor:
        return t * fmask

    old_log_probs = masked(-torch.rand(B, R, generator=g) * 5)
    ref_log_prob = masked(old_log_probs + 0.01 * torch.randn(B, R, generator=g))
    values = masked(torch.randn(B, R, generator=g))
    token_level_rewards = torch.zeros(B, R)
    last = (response_len - 1).clamp(min=0)
    token_level_rewards.scatter_(1, last, torch.randint(0, 2, (B, 1), generator=g).float())
    returns = masked(token_level_rewards.flip(1).cumsum(1).flip(1))
    advantages = masked(returns - values)

    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "old_log_probs": old_log_probs,
            "ref_log_prob": ref_log_prob,
            "values": values,
            "advantages": advantages,
            "returns": returns,
            "token_level_rewards": token_level_rewards,
        },
        batch_size=[B],
    )

    rng = np.random.default_rng(seed)
    sources = ["openai/gsm8k", "lighteval/MATH", "codecontests"]
    non_tensor = {
        "uid": _object_array([str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(B)]),
        "data_source": _object_array([sources[i] for i in rng.integers(0, len(sources), B)]),
        "reward_model": _object_array(
            [{"ground_truth": str(int(v)), "style": "rule"} for v in rng.integers(0, 10_000, B)]
        ),
    }
    meta_info = {
        "temperature": 1.0,
        "global_steps": 7,
        "global_token_num": attention_mask.sum(dim=1).tolist(),
    }
    return batch, non_tensor, meta_info


def jagged_batch(rows: int = 6400, max_len: int = 20480, seed: int = 0) -> TensorDict:
    """One int64 jagged nested tensor ``input_ids`` [rows, j], row lengths uniform in 1..max_len."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (rows,), generator=g)
    offsets = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    values = torch.arange(int(offsets[-1]), dtype=torch.int64) % VOCAB
    nt = torch.nested.nested_tensor_from_jagged(values, offsets)
    return TensorDict({"input_ids": nt}, batch_size=[rows])


def nbytes(td: TensorDict) -> int:
    """Bytes held by the leaves of ``td`` (a jagged leaf counts its values and offsets)."""
    total = 0
    leaf: Any
    for leaf in td.values(include_nested=True, leaves_only=True):
        if leaf.is_nested:
            total += leaf.values().nbytes + leaf.offsets().nbytes
        else:
            total += leaf.nbytes
    return total
