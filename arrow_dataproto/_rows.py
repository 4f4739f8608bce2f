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
    """Concatenate along the batch dimension (one copy). Pieces of different layouts join as
    the most general one: with any jagged piece the result is jagged (ragged where the first
    jagged piece is; the rows of every other piece become its rows), else with any strided
    nested piece it is strided nested. Rows that do not fit (another rank, other fixed sizes,
    dtype or device) raise ``ValueError`` or torch's ``RuntimeError``."""
    jagged = next((t for t in tensors if _jagged.is_jagged(t)), None)
    if jagged is not None:
        dim = ragged_idx(jagged)
        same = [_jagged.is_jagged(t) and ragged_idx(t) == dim for t in tensors]
        parts = [_jagged.parts(t) if alike else _as_jagged_parts(t, jagged) for t, alike in zip(tensors, same)]
        sources = tuple(o for _, o in parts)

        def joined() -> torch.Tensor:
            shifts = torch.tensor([0] + [int(o[-1]) for o in sources[:-1]], device=sources[0].device).cumsum(0)
            offsets = torch.cat([sources[0][:1]] + [o[1:].to(sources[0].device) + s for o, s in zip(sources, shifts)])
            return offsets - offsets[0]

        # other pieces' offsets are new: they are keyed by their values
        key = tuple(id(o) if alike else o.cpu().numpy().tobytes() for o, alike in zip(sources, same))
        offsets = _once(shared, ("cat", *key), tuple(o for o, alike in zip(sources, same) if alike), joined)
        return _jagged.build(torch.cat([v for v, _ in parts]), offsets, dim)
    if any(t.is_nested for t in tensors):
        first = tensors[0]
        return torch.nested.nested_tensor([r for t in tensors for r in t.unbind()], dtype=first.dtype, device=first.device)
    return torch.cat(tensors)


def _as_jagged_parts(t: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, offsets)`` of the rows of ``t`` (dense, strided nested, or jagged elsewhere)
    as rows of the jagged tensor ``like`` (values with its ragged dimension first). A copy."""
    dim = ragged_idx(like) - 1  # the ragged dimension of a row
    rows = list(t.unbind()) if t.is_nested else None
    rank = (rows[0].dim() if rows else like.dim() - 1) if rows is not None else t.dim() - 1
    if rank != like.dim() - 1:
        raise ValueError(f"cannot concatenate rows of {rank} dimensions with jagged rows of {like.dim() - 1}")
    if rows is None:  # dense: every row has the same length
        length = t.shape[dim + 1]
        values = t.movedim(dim + 1, 1).reshape(t.shape[0] * length, *[n for i, n in enumerate(t.shape[1:]) if i != dim])
        lengths = torch.full((t.shape[0],), length, dtype=torch.int64)
    else:
        values = torch.cat([r.movedim(dim, 0) for r in rows]) if rows else t.new_empty(0)
        lengths = torch.tensor([r.shape[dim] for r in rows], dtype=torch.int64)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return values, offsets.to(_jagged.parts(like)[1].device)


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
