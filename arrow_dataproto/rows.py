"""Row selection and concatenation for every leaf kind a DataProto holds.

TensorDict indexes its leaves with plain torch indexing, which jagged and
strided ``torch.nested`` tensors do not support on the batch dimension. These
helpers select rows of dense tensors, nested tensors and nested TensorDicts
alike, on whatever device they live. Dense results follow torch: a slice is a
view, an index list a copy. A jagged result of a slice views the same values.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, is_tensor_collection


def _is_jagged(t: torch.Tensor) -> bool:
    return t.is_nested and t.layout == torch.jagged


def _jagged_parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Values (ragged dimension first) and offsets of a jagged tensor without holes."""
    if t.lengths() is not None:
        t = t.contiguous()
    return t.values().movedim(t._ragged_idx - 1, 0), t.offsets()


def _jagged(values: torch.Tensor, offsets: torch.Tensor, ragged_idx: int) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(values.movedim(0, ragged_idx - 1), offsets, jagged_dim=ragged_idx)


def take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` (a 1-D int64 tensor) of ``t``, as a new tensor."""
    if _is_jagged(t):
        values, offsets = _jagged_parts(t)
        index = index.to(offsets.device)
        starts, lengths = offsets[:-1][index], (offsets[1:] - offsets[:-1])[index]
        new_offsets = torch.zeros(len(index) + 1, dtype=offsets.dtype, device=offsets.device)
        torch.cumsum(lengths, 0, out=new_offsets[1:])
        gather = torch.repeat_interleave(starts - new_offsets[:-1], lengths) + torch.arange(
            int(new_offsets[-1]), device=offsets.device
        )
        return _jagged(values[gather.to(values.device)], new_offsets, t._ragged_idx)
    if t.is_nested:
        rows = t.unbind()
        return torch.nested.nested_tensor([rows[i] for i in index.tolist()], dtype=t.dtype, device=t.device)
    return t[index.to(t.device)]


def slice_rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of ``t`` as a view (dense and jagged) or a copy (strided nested)."""
    if _is_jagged(t):
        values, offsets = _jagged_parts(t)
        first, last = int(offsets[start]), int(offsets[stop])
        return _jagged(values[first:last], offsets[start : stop + 1] - first, t._ragged_idx)
    if t.is_nested:
        return take(t, torch.arange(start, stop))
    return t[start:stop]


def row(t: torch.Tensor, i: int) -> torch.Tensor:
    """Row ``i`` of ``t`` as a dense tensor."""
    if _is_jagged(t):
        values, offsets = _jagged_parts(t)
        return values[int(offsets[i]) : int(offsets[i + 1])].movedim(0, t._ragged_idx - 1)
    if t.is_nested:
        return t.unbind()[i]
    return t[i]


def cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along the batch dimension (one copy)."""
    first = tensors[0]
    if _is_jagged(first):
        parts = [_jagged_parts(t) for t in tensors]
        shifts = torch.tensor([0] + [int(o[-1]) for _, o in parts[:-1]], device=first.offsets().device).cumsum(0)
        offsets = torch.cat([parts[0][1][:1]] + [o[1:] + s for (_, o), s in zip(parts, shifts)])
        return _jagged(torch.cat([v for v, _ in parts]), offsets - offsets[0], first._ragged_idx)
    if first.is_nested:
        return torch.nested.nested_tensor([r for t in tensors for r in t.unbind()], dtype=first.dtype, device=first.device)
    return torch.cat(tensors)


def map_rows(td: TensorDict, fn, rows: int | None) -> TensorDict:
    """A TensorDict whose every leaf is ``fn(leaf)``, keeping keys, nesting and device.

    Its first batch dimension becomes ``rows``, or is dropped when ``rows`` is None (``fn`` picked one row).
    """
    content = {k: map_rows(v, fn, rows) if is_tensor_collection(v) else fn(v) for k, v in td.items()}
    batch_size = td.batch_size[1:] if rows is None else [rows, *td.batch_size[1:]]
    return TensorDict(content, batch_size=batch_size, device=td.device)


def cat_rows(tds: list[TensorDict]) -> TensorDict:
    """Concatenate TensorDicts with the same keys (in any order; the first's order is kept) along the batch dimension."""
    first = tds[0]
    keys = list(first.keys())
    for other in tds[1:]:
        if set(other.keys()) != set(keys):
            raise ValueError(f"cannot concatenate batches with keys {keys} and {list(other.keys())}")
    content = {
        k: cat_rows([td[k] for td in tds]) if is_tensor_collection(first[k]) else cat([td[k] for td in tds])
        for k in keys
    }
    rows = sum(td.batch_size[0] for td in tds)
    return TensorDict(content, batch_size=[rows, *first.batch_size[1:]], device=first.device)
