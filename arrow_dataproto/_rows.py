"""Row selection and concatenation for every leaf kind a DataProto holds.

TensorDict indexes its leaves with plain torch indexing, which jagged and
strided ``torch.nested`` tensors do not support on the batch dimension. These
helpers select rows of dense tensors, nested tensors and nested TensorDicts
alike, on whatever device they live. Dense results follow torch: a slice is a
view, an index list a copy. A jagged result of a slice views the same values.
Jagged leaves that share one ragged structure (one offsets tensor) still share one
in the result when the caller passes one ``shared`` memo to every leaf of the operation
and selects the same rows of each (the same ``start, stop``, the same ``index`` tensor).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDict, is_tensor_collection

from . import _jagged
from ._compat import ragged_idx


Shared = dict
"""A memo handed to every leaf of one row operation: jagged leaves that share a ragged
structure (one offsets tensor) get one new offsets tensor, so that they still combine."""


def _once(shared: Shared | None, key: tuple, sources: tuple, compute):
    """``compute()``, computed once per ``key`` within one row operation (``sources`` are kept
    alive with the result so that the ids in ``key`` stay theirs)."""
    if shared is None:
        return compute()
    entry = shared.get(key)
    if entry is None or any(a is not b for a, b in zip(entry[0], sources)):
        entry = shared[key] = (sources, compute())
    return entry[1]


def take(t: torch.Tensor, index: torch.Tensor, shared: Shared | None = None) -> torch.Tensor:
    """Rows ``index`` (a 1-D int64 tensor) of ``t``, as a new tensor."""
    if _jagged.is_jagged(t):
        values, offsets = _jagged.parts(t)

        def plan() -> tuple[torch.Tensor, torch.Tensor]:
            at = index.to(offsets.device)
            starts, lengths = offsets[:-1][at], (offsets[1:] - offsets[:-1])[at]
            new_offsets = torch.zeros(len(at) + 1, dtype=offsets.dtype, device=offsets.device)
            torch.cumsum(lengths, 0, out=new_offsets[1:])
            gather = torch.repeat_interleave(starts - new_offsets[:-1], lengths) + torch.arange(
                int(new_offsets[-1]), device=offsets.device
            )
            return new_offsets, gather

        new_offsets, gather = _once(shared, ("take", id(offsets), id(index)), (offsets, index), plan)
        return _jagged.build(values[gather.to(values.device)], new_offsets, ragged_idx(t))
    if t.is_nested:
        rows = t.unbind()
        return torch.nested.nested_tensor([rows[i] for i in index.tolist()], dtype=t.dtype, device=t.device)
    return t[index.to(t.device)]


def slice_rows(t: torch.Tensor, start: int, stop: int, shared: Shared | None = None) -> torch.Tensor:
    """Rows ``start:stop`` of ``t`` as a view (dense and jagged) or a copy (strided nested)."""
    if _jagged.is_jagged(t):
        values, offsets = _jagged.parts(t)
        first, last = int(offsets[start]), int(offsets[stop])
        new_offsets = _once(shared, ("slice", id(offsets), start, stop), (offsets,), lambda: offsets[start : stop + 1] - first)
        return _jagged.build(values[first:last], new_offsets, ragged_idx(t))
    if t.is_nested:
        return take(t, torch.arange(start, stop))
    return t[start:stop]


def row(t: torch.Tensor, i: int) -> torch.Tensor:
    """Row ``i`` of ``t`` as a dense tensor."""
    if _jagged.is_jagged(t):
        values, offsets = _jagged.parts(t)
        return values[int(offsets[i]) : int(offsets[i + 1])].movedim(0, ragged_idx(t) - 1)
    if t.is_nested:
        return t.unbind()[i]
    return t[i]


def cat(tensors: list[torch.Tensor], shared: Shared | None = None) -> torch.Tensor:
    """Concatenate along the batch dimension (one copy)."""
    first = tensors[0]
    if _jagged.is_jagged(first):
        parts = [_jagged.parts(t) for t in tensors]
        sources = tuple(o for _, o in parts)

        def joined() -> torch.Tensor:
            shifts = torch.tensor([0] + [int(o[-1]) for o in sources[:-1]], device=sources[0].device).cumsum(0)
            offsets = torch.cat([sources[0][:1]] + [o[1:] + s for o, s in zip(sources, shifts)])
            return offsets - offsets[0]

        offsets = _once(shared, ("cat", *map(id, sources)), sources, joined)
        return _jagged.build(torch.cat([v for v, _ in parts]), offsets, ragged_idx(first))
    if first.is_nested:
        return torch.nested.nested_tensor([r for t in tensors for r in t.unbind()], dtype=first.dtype, device=first.device)
    return torch.cat(tensors)


def map_rows(td: Any, fn: Callable[[torch.Tensor], torch.Tensor], rows: int | None) -> TensorDict:
    """A TensorDict whose every leaf is ``fn(leaf)``, keeping keys, nesting and device.

    Its first batch dimension becomes ``rows``, or is dropped when ``rows`` is None (``fn`` picked one row).
    """
    content = {k: map_rows(v, fn, rows) if is_tensor_collection(v) else fn(v) for k, v in td.items()}
    batch_size = td.batch_size[1:] if rows is None else [rows, *td.batch_size[1:]]
    return TensorDict(content, batch_size=batch_size, device=td.device)


def cat_rows(tds: list[TensorDict], shared: Shared | None = None) -> TensorDict:
    """Concatenate TensorDicts with the same keys (in any order; the first's order is kept) along
    the batch dimension (jagged leaves that share a ragged structure in every input share one
    in the result)."""
    shared = {} if shared is None else shared
    first = tds[0]
    keys = list(first.keys())
    for other in tds[1:]:
        if set(other.keys()) != set(keys):
            raise ValueError(f"cannot concatenate batches with keys {keys} and {list(other.keys())}")
    content = {
        k: cat_rows([td[k] for td in tds], shared) if is_tensor_collection(first[k]) else cat([td[k] for td in tds], shared)
        for k in keys
    }
    rows = sum(td.batch_size[0] for td in tds)
    return TensorDict(content, batch_size=[rows, *first.batch_size[1:]], device=first.device)


def nbytes(t: torch.Tensor) -> int:
    """The bytes of a tensor's values, dense or nested (jagged: its values; strided: its rows)."""
    if t.is_nested:
        count = t.values().numel() if t.layout == torch.jagged else sum(r.numel() for r in t.unbind())
        return count * t.element_size()
    return t.numel() * t.element_size()
