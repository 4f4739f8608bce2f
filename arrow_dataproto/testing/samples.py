"""Synthetic RL batches for the demo, the benchmarks and their tests.

Every builder is deterministic for a given ``seed`` and returns plain objects (a
``TensorDict``, a dict of numpy object arrays, a dict of meta values), so that
rival codecs can be fed the same data. Defaults are the benchmark sizes; pass
small sizes for tests.

- ``seed_batch(rows, cols)``: one int64 tensor ``input_ids`` [rows, cols]
  (default 6400 x 20480 = 1 GiB).
- ``ppo_batch(rows, prompt, response, seed)``: ``(batch, non_tensor, meta_info)`` shaped like
  a PPO step of an RL trainer (default 2560 x (1024 + 1024), about 280 MB of tensors).
- ``verl_rollout(rows, prompt, response, seed)``: ``ppo_batch`` plus the object columns of a
  real verl rollout (``extra_info``, ``tools_kwargs``, ``raw_prompt``, ``scores``,
  ``ground_truth``, multi-turn ``messages``, ``multi_modal_data``): every one JSON but none
  native Arrow (keys vary by row, types mix), so they exercise the JSON tier.
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

__all__ = ["seed_batch", "ppo_batch", "verl_rollout", "jagged_batch", "nbytes"]

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


_SYSTEM = "You are a helpful assistant. Think step by step and put the final answer in \\boxed{}."
_TOOL = "calc_gsm8k_reward"


def _tool_call(i: int, answer: int) -> dict:
    arguments = '{"answer": "%d"}' % answer
    return {"id": f"call_{i}", "type": "function", "function": {"name": _TOOL, "arguments": arguments}}


def verl_rollout(
    rows: int = 2560, prompt: int = 1024, response: int = 1024, seed: int = 0
) -> tuple[TensorDict, dict[str, np.ndarray], dict]:
    """:func:`ppo_batch` plus the object columns a real verl rollout carries, shaped as verl
    and its recipes fill them: ``(batch, non_tensor_batch, meta_info)``.

    Added ``non_tensor_batch`` columns (1-D object arrays), each one JSON but none of them
    native Arrow (:mod:`arrow_dataproto._objects`: pyarrow would add missing keys or change
    types):

    - ``extra_info``: dicts whose keys vary by row (``index``, ``split``, ``question``,
      sometimes ``answer``, ``tools_kwargs``, ``interaction_kwargs``);
    - ``tools_kwargs``: ``{}`` in some rows, nested dicts in others;
    - ``raw_prompt``: chat messages (system + user), some with an extra ``tool_calls: None``;
    - ``scores``: ``1.0``, ``0`` and ``None`` mixed; ``ground_truth``: ``"7"`` and ``7`` mixed;
    - ``messages``: multi-turn conversations with tool calls and tool results;
    - ``multi_modal_data``: ``None``, ``{"image": [urls]}`` or ``{"image": [urls], "video": None}``
      (image URLs, not image bytes: a column holding raw bytes is pickled).

    ``meta_info`` gains ``metrics`` (a list of dicts). Deterministic for a given ``seed``.
    """
    batch, non_tensor, meta_info = ppo_batch(rows, prompt, response, seed)
    rng = np.random.default_rng(seed + 1)
    B = rows
    answers = rng.integers(0, 10_000, B)
    kind = rng.integers(0, 4, B)  # varies what each row carries
    words = ["apples", "trains", "marbles", "pages", "coins", "cookies", "miles", "hours"]

    def question(i: int) -> str:
        a, b = (int(x) for x in rng.integers(1, 500, 2))
        return f"Natalia sold {a} {words[i % len(words)]} in April and {b} in May. How many in total? 问题 {i}"

    questions = [question(i) for i in range(B)]
    extra_info, tools_kwargs, raw_prompt, messages, scores, truths, media = [], [], [], [], [], [], []
    for i in range(B):
        k, answer, q = int(kind[i]), int(answers[i]), questions[i]
        tools = {} if k % 2 == 0 else {_TOOL: {"create_kwargs": {"ground_truth": str(answer)}}}
        info: dict[str, Any] = {"index": i, "split": "train", "question": q}
        if k != 3:
            info["answer"] = f"#### {answer}"
        if tools:
            info["need_tools_kwargs"] = True
            info["tools_kwargs"] = tools
        if k == 2:
            info["interaction_kwargs"] = {"name": "gsm8k", "query": q, "ground_truth": str(answer)}
        extra_info.append(info)
        tools_kwargs.append(tools)
        user: dict[str, Any] = {"role": "user", "content": q}
        if k == 1:
            user["tool_calls"] = None
        raw_prompt.append([{"role": "system", "content": _SYSTEM}, user])
        turns: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": q}]
        for t in range(k):
            turns.append({"role": "assistant", "content": f"Let me compute step {t}.", "tool_calls": [_tool_call(t, answer)]})
            turns.append({"role": "tool", "content": f"Current parsed answer={answer} result=0.{t}", "tool_call_id": f"call_{t}"})
        turns.append({"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}.", "tool_calls": None})
        messages.append(turns)
        scores.append((1.0, 0, None, 0.5)[k])
        truths.append(str(answer) if k % 2 else answer)
        images = [f"https://example.com/images/{i}-{j}.jpg" for j in range(k)]
        media.append(None if k == 0 else {"image": images} if k == 1 else {"image": images, "video": None})
    non_tensor.update(
        {
            "extra_info": _object_array(extra_info),
            "tools_kwargs": _object_array(tools_kwargs),
            "raw_prompt": _object_array(raw_prompt),
            "messages": _object_array(messages),
            "scores": _object_array(scores),
            "ground_truth": _object_array(truths),
            "multi_modal_data": _object_array(media),
        }
    )
    meta_info["metrics"] = [{"reward/mean": 0.5, "response_length/mean": float(response) / 2}]
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
