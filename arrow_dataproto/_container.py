"""``DataProto``: the batch container RL trainers pass between workers.

The same three fields and the same methods as verl's ``DataProto``, so code
written against verl keeps working; pickling goes through the Arrow codec
(see :mod:`arrow_dataproto.pickling`).
"""

from __future__ import annotations

import copy as _copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from . import _rows as rows


def _object_array(values: Any) -> np.ndarray:
    """A numpy array of ``values``; a list becomes a 1-D object array (lists inside stay lists)."""
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, (list, tuple)):
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
    raise TypeError(f"non-tensor values must be numpy arrays or lists, got {type(values).__name__}")


def _index_tensor(index: Any, length: int) -> torch.Tensor:
    """A 1-D int64 index tensor from a list, numpy array or tensor of ints or bools."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu()
    else:  # np.array copies: a read-only index (a pandas mask, say) would make torch warn
        index = torch.as_tensor(np.array(index))
    if index.dtype == torch.bool:
        if index.shape != (length,):
            raise IndexError(f"boolean mask of shape {tuple(index.shape)} for {length} rows")
        return index.nonzero().flatten()
    if index.dim() != 1 or (index.numel() and (index.is_floating_point() or index.is_complex())):
        raise IndexError(f"row index must be 1-D integers or a boolean mask, got {index.dtype} {tuple(index.shape)}")
    index = index.to(torch.int64)
    if index.numel() and not (-length <= int(index.min()) and int(index.max()) < length):
        raise IndexError(f"row index out of range for {length} rows")
    return torch.where(index < 0, index + length, index)


@dataclass
class DataProtoItem:
    """One row of a DataProto: ``batch`` is a TensorDict without the batch dimension."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


class DataProto:
    """A batch of samples: tensors in ``batch``, other per-sample values in
    ``non_tensor_batch`` (numpy arrays, rows on dim 0), and ``meta_info``.

    Row operations (``dp[idx]``, ``chunk``, ``split``, ``concat``, ``repeat``)
    work on dense tensors, jagged and strided ``torch.nested`` tensors and
    nested TensorDicts alike. ``meta_info`` is shared by the pieces, as in verl.
    """

    def __init__(self, batch: TensorDict | None = None, non_tensor_batch: dict | None = None, meta_info: dict | None = None):
        if batch is not None and not is_tensor_collection(batch):
            raise TypeError(f"batch must be a TensorDict or None, got {type(batch).__name__}")
        if batch is not None and batch.batch_dims < 1:
            raise ValueError("batch needs at least one batch dimension")
        self.batch = batch
        self.non_tensor_batch = {k: _object_array(v) for k, v in (non_tensor_batch or {}).items()}
        self.meta_info = dict(meta_info or {})
        self.check_consistency()

    # -------------------------------------------------------- construction

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
    ) -> "DataProto":
        """Build from dicts; the batch size is the first ``num_batch_dims`` dims of the first tensor."""
        tensors = dict(tensors or {})
        batch = None
        if tensors:
            first = next(iter(tensors.values()))
            batch = TensorDict(tensors, batch_size=list(first.shape[:num_batch_dims]))
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict | None = None) -> "DataProto":
        """Build from one dict: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise TypeError(f"{key!r}: expected a torch.Tensor or numpy array, got {type(value).__name__}")
        return cls.from_dict(tensors, non_tensors, meta_info)

    def check_consistency(self) -> None:
        """Raise ``ValueError`` unless every non-tensor array has as many rows as the batch."""
        lengths = {k: len(v) for k, v in self.non_tensor_batch.items() if v.ndim >= 1}
        if any(v.ndim == 0 for v in self.non_tensor_batch.values()):
            raise ValueError("non-tensor values must have a row dimension (ndim >= 1)")
        expected = self.batch.batch_size[0] if self.batch is not None else next(iter(lengths.values()), 0)
        wrong = {k: n for k, n in lengths.items() if n != expected}
        if wrong:
            raise ValueError(f"non_tensor_batch rows {wrong} differ from the batch's {expected} rows")

    # -------------------------------------------------------- rows

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        return len(next(iter(self.non_tensor_batch.values()))) if self.non_tensor_batch else 0

    def _take(self, index: torch.Tensor) -> "DataProto":
        shared: rows.Shared = {}  # jagged leaves sharing offsets keep sharing them
        batch = None if self.batch is None else rows.map_rows(self.batch, lambda t: rows.take(t, index, shared), len(index))
        np_index = index.numpy()
        return DataProto(batch, {k: v[np_index] for k, v in self.non_tensor_batch.items()}, self.meta_info)

    def _slice(self, start: int, stop: int) -> "DataProto":
        stop = max(start, stop)
        batch = None
        if self.batch is not None:
            shared: rows.Shared = {}  # jagged leaves sharing offsets keep sharing them
            batch = rows.map_rows(self.batch, lambda t: rows.slice_rows(t, start, stop, shared), stop - start)
        return DataProto(batch, {k: v[start:stop] for k, v in self.non_tensor_batch.items()}, self.meta_info)

    def __getitem__(self, item: Any) -> "DataProto | DataProtoItem":
        """``int`` -> :class:`DataProtoItem`; ``slice`` -> a view; index list/array/tensor or bool mask -> a copy."""
        length = len(self)
        if isinstance(item, (int, np.integer)) or (isinstance(item, torch.Tensor) and item.dim() == 0 and not item.is_floating_point()):
            i = int(item)
            if not -length <= i < length:
                raise IndexError(f"row {i} out of range for {length} rows")
            i %= length
            batch = None if self.batch is None else rows.map_rows(self.batch, lambda t: rows.row(t, i), None)
            return DataProtoItem(batch, {k: v[i] for k, v in self.non_tensor_batch.items()}, self.meta_info)
        if isinstance(item, slice):
            start, stop, step = item.indices(length)
            if step == 1:
                return self._slice(start, stop)
            return self._take(torch.arange(start, stop, step))
        return self._take(_index_tensor(item, length))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> "DataProto":
        """Rows ``start:end:step`` (as ``dp[start:end:step]``)."""
        return self[slice(start, end, step)]

    def select_idxs(self, idxs: Any) -> "DataProto":
        """Rows picked by an index list/array/tensor or a boolean mask (a copy)."""
        return self._take(_index_tensor(idxs, len(self)))

    def chunk(self, chunks: int) -> list["DataProto"]:
        """Exactly ``chunks`` pieces in order, sizes differing by at most one (like ``numpy.array_split``).

        Each piece views its rows of this batch (no copy); pickled or sent to Ray,
        a piece carries only its own rows.
        """
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}")
        bounds = _bounds(len(self), chunks)
        return [self._slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def split(self, split_size: int) -> list["DataProto"]:
        """Pieces of ``split_size`` rows (the last may be shorter), each a view."""
        if split_size < 1:
            raise ValueError(f"split_size must be >= 1, got {split_size}")
        return [self._slice(a, min(a + split_size, len(self))) for a in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence["DataProto"]) -> "DataProto":
        """Concatenate along rows (one copy). ``meta_info`` is the first piece's, updated by later ones."""
        data = list(data)
        if not data:
            raise ValueError("concat needs at least one DataProto")
        batches = [d.batch for d in data]
        if any((b is None) != (batches[0] is None) for b in batches):
            raise ValueError("cannot concatenate DataProtos with and without a batch")
        batch = None if batches[0] is None else rows.cat_rows(batches)
        keys = list(data[0].non_tensor_batch)
        if any(list(d.non_tensor_batch) != keys for d in data):
            raise ValueError("cannot concatenate DataProtos with different non_tensor_batch keys")
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in keys}
        meta_info: dict = {}
        for d in data:
            meta_info.update(d.meta_info)
        return DataProto(batch, non_tensor, meta_info)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: ``aabb`` when ``interleave`` else ``abab`` (a copy)."""
        base = torch.arange(len(self))
        index = base.repeat_interleave(repeat_times) if interleave else base.repeat(repeat_times)
        return self._take(index)

    # -------------------------------------------------------- keys

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> "DataProto":
        """A DataProto with only the named keys (all of a kind when its argument is ``None``)."""
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch = batch.select(*batch_keys)
        non_tensor = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            non_tensor = {k: non_tensor[k] for k in non_tensor_batch_keys}
        meta_info = self.meta_info
        if meta_info_keys is not None:
            meta_info = {k: meta_info[k] for k in meta_info_keys}
        result = DataProto(batch, non_tensor, meta_info)
        return _copy.deepcopy(result) if deepcopy else result

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> "DataProto":
        """Remove the named keys from this DataProto and return them as a new one."""
        batch = None
        if batch_keys:
            batch = TensorDict({k: self.batch.pop(k) for k in batch_keys}, batch_size=self.batch.batch_size, device=self.batch.device)
        non_tensor = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys or ()}
        meta_info = {k: self.meta_info.pop(k) for k in meta_info_keys or ()}
        return DataProto(batch, non_tensor, meta_info)

    def union(self, other: "DataProto") -> "DataProto":
        """Add ``other``'s keys to this DataProto (in place, returned). A key in both must hold equal values."""
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch
            else:
                if self.batch.batch_size != other.batch.batch_size:
                    raise ValueError(f"batch sizes differ: {self.batch.batch_size} and {other.batch.batch_size}")
                for key, value in other.batch.items():
                    if key in self.batch.keys() and not _same_tensor(self.batch[key], value):
                        raise ValueError(f"batch key {key!r} differs between the two DataProtos")
                    self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not np.array_equal(self.non_tensor_batch[key], value):
                raise ValueError(f"non_tensor_batch key {key!r} differs between the two DataProtos")
            self.non_tensor_batch[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and self.meta_info[key] != value:
                raise ValueError(f"meta_info key {key!r} differs between the two DataProtos")
            self.meta_info[key] = value
        self.check_consistency()
        return self

    # -------------------------------------------------------- devices, copies, pickling

    def to(self, device: str | torch.device) -> "DataProto":
        """Move the batch to ``device`` (in place, returned, as in verl)."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def to_pandas(self, *, copy: bool = False):
        """One DataFrame row per sample: :func:`arrow_dataproto.pandas.to_pandas` (needs pandas)."""
        from .pandas import to_pandas

        return to_pandas(self, copy=copy)

    def __copy__(self) -> "DataProto":
        return DataProto(self.batch, dict(self.non_tensor_batch), dict(self.meta_info))

    def __deepcopy__(self, memo: dict) -> "DataProto":
        batch = None if self.batch is None else self.batch.clone()
        return DataProto(batch, _copy.deepcopy(self.non_tensor_batch, memo), _copy.deepcopy(self.meta_info, memo))

    def __reduce_ex__(self, protocol: int):
        from .pickling import reduce_dataproto

        return reduce_dataproto(self)

    def __repr__(self) -> str:
        keys = [] if self.batch is None else list(self.batch.keys(include_nested=True, leaves_only=True))
        return (
            f"DataProto(rows={len(self)}, batch_keys={keys}, "
            f"non_tensor_keys={list(self.non_tensor_batch)}, meta_info_keys={list(self.meta_info)})"
        )


def _bounds(length: int, chunks: int) -> list[int]:
    size, extra = divmod(length, chunks)
    bounds = [0]
    for i in range(chunks):
        bounds.append(bounds[-1] + size + (i < extra))
    return bounds


def _same_tensor(a: torch.Tensor | TensorDict, b: torch.Tensor | TensorDict) -> bool:
    if a is b:
        return True
    if is_tensor_collection(a) or is_tensor_collection(b):  # a nested TensorDict: same keys, same leaves
        return (
            is_tensor_collection(a)
            and is_tensor_collection(b)
            and list(a.keys()) == list(b.keys())
            and all(_same_tensor(a[k], b[k]) for k in a.keys())
        )
    if a.is_nested or b.is_nested:
        ra, rb = a.unbind(), b.unbind()
        return len(ra) == len(rb) and all(torch.equal(x, y) for x, y in zip(ra, rb))
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)

