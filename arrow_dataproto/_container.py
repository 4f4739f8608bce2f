"""``DataProto``: the batch container RL trainers pass between workers.

The same three fields, the same methods and the same semantics as verl 0.9.1's
``DataProto`` (checked against the real class by ``tests/test_verl_parity.py``),
so code written against verl keeps working; pickling goes through the Arrow codec
(see :mod:`arrow_dataproto.pickling`). Every row operation works on dense
tensors, jagged and strided ``torch.nested`` tensors and nested TensorDicts.

Where verl's behaviour is a bug or a crash, docs/verl.md's "verl API coverage"
table lists what this class does instead; where ours was more general, the
general behaviour stays available explicitly (:meth:`DataProto.array_split`,
``DataProto.concat(..., meta_info="update")``, a multi-dimensional batch through
the constructor). Errors are the library's own (:mod:`arrow_dataproto.errors`)
and also derive from what verl raises (mostly ``AssertionError``).
"""

from __future__ import annotations

import copy as _copy
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence, SupportsIndex, cast, overload

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from . import _rows as rows
from ._arguments import index_tensor, key_list, object_array, pick_keys, positive_int
from ._verl_rules import AUTO_PADDING_KEY, META_INFO_MERGES, DataProtoConfig, balanced_sizes, check_union, chunk_sizes, type_info
from .errors import ArgumentTypeError, BatchError, KeyNotFoundError, PickleNotAllowedError, RowIndexError, not_found

@dataclass
class DataProtoItem:
    """One row of a DataProto: ``batch`` is a TensorDict without the batch dimension."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


class DataProto:
    """A batch of samples: tensors in ``batch``, other per-sample values in
    ``non_tensor_batch`` (numpy arrays, rows on dim 0), and ``meta_info``.

    Results of row operations have the caller's class (``type(self)``), as in
    verl. Unlike verl, the constructor accepts a ``batch`` with more than one
    batch dimension (rows are its first); :meth:`from_dict` refuses one, as verl.
    """

    def __init__(self, batch: TensorDict | None = None, non_tensor_batch: dict | None = None, meta_info: dict | None = None):
        if batch is not None and not is_tensor_collection(batch):
            raise ArgumentTypeError(f"batch must be a TensorDict or None, got {type(batch).__name__}")
        if batch is not None and batch.batch_dims < 1:
            raise BatchError("batch needs at least one batch dimension")
        self.batch = batch
        self.non_tensor_batch = {k: object_array(v) for k, v in (non_tensor_batch or {}).items()}
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
        auto_padding: bool = False,
    ) -> "DataProto":
        """Build from dicts; every tensor's first dimension is the rows.

        A non-array non-tensor value becomes ``np.array(value, dtype=object)``, as in
        verl (so equal-length lists give a 2-D array, ragged ones a 1-D array of lists).
        ``auto_padding`` sets ``meta_info[AUTO_PADDING_KEY]``. ``num_batch_dims`` must be
        1 and the tensors' first dimensions equal (:class:`BatchError` otherwise); for a
        batch of several dimensions pass a TensorDict to the constructor.
        """
        if num_batch_dims != 1:
            raise BatchError(
                f"only num_batch_dims=1 is supported (got {num_batch_dims}), as in verl; "
                "for a batch of several dimensions use DataProto(TensorDict(..., batch_size=[...]))"
            )
        tensors = dict(tensors or {})
        batch = None
        if tensors:
            bad = [key for key, t in tensors.items() if not isinstance(t, torch.Tensor)]
            if bad:
                raise ArgumentTypeError(f"tensors {bad} are not torch.Tensors")
            sizes = {key: (t.size(0),) if t.dim() else () for key, t in tensors.items()}  # (a strided nested tensor has no .shape)
            if len(set(sizes.values())) > 1:
                raise BatchError(f"Not all the tensors in tensors have the same batch size: {sizes}")
            batch = TensorDict(tensors, batch_size=list(next(iter(sizes.values()))))
        non_tensors = {k: v if isinstance(v, np.ndarray) else np.array(v, dtype=object) for k, v in (non_tensors or {}).items()}
        meta_info = dict(meta_info or {})
        if auto_padding:
            meta_info[AUTO_PADDING_KEY] = True
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict | None = None, auto_padding: bool = False) -> "DataProto":
        """Build from one dict: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``
        (anything else: :class:`ArgumentTypeError`, a TypeError and ValueError)."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise ArgumentTypeError(f"{key!r}: expected a torch.Tensor or numpy array, got {type(value).__name__}")
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(cls, tensor_dict: TensorDict, meta_info: dict | None = None, num_batch_dims: int = 1) -> "DataProto":
        """The inverse of :meth:`to_tensordict`: tensors (and nested TensorDicts) go to
        ``batch``, ``NonTensorStack`` entries to ``non_tensor_batch`` (``np.array(values,
        dtype=object)``), ``NonTensorData`` entries to ``meta_info`` (added to a copy of
        ``meta_info``). A TensorDict without tensors gives ``batch=None``."""
        from tensordict import NonTensorData, NonTensorStack

        if num_batch_dims != 1:
            raise BatchError(f"only num_batch_dims=1 is supported, got {num_batch_dims}")
        meta_info = dict(meta_info or {})
        batch, non_tensor = {}, {}
        for key, value in tensor_dict.items():
            if isinstance(value, NonTensorStack):
                non_tensor[key] = np.array(value.tolist(), dtype=object)
            elif isinstance(value, NonTensorData):
                meta_info[key] = value.data
            else:
                batch[key] = value
        first = next(iter(batch.values()), None)
        td = None if first is None else TensorDict(batch, batch_size=list(first.shape[:1]))
        return cls(batch=td, non_tensor_batch=non_tensor, meta_info=meta_info)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding everything, as verl's: the batch's entries, each
        non-tensor column as a ``NonTensorStack`` of its rows, each ``meta_info`` value
        as ``NonTensorData``. Tensors are shared, not copied. A key present in two of
        the three parts raises :class:`BatchError`."""
        from tensordict import NonTensorData, NonTensorStack

        entries: dict[str, Any] = {} if self.batch is None else dict(self.batch.items())
        for part, values in (("non_tensor_batch", self.non_tensor_batch), ("meta_info", self.meta_info)):
            common = set(entries) & set(values)
            if common:
                raise BatchError(f"keys {sorted(common)} of {part} are already in the TensorDict")
            for key, value in values.items():
                entries[key] = (
                    NonTensorStack(*[NonTensorData(v) for v in value])
                    if part == "non_tensor_batch"
                    else NonTensorData(value)
                )
        return TensorDict(entries, batch_size=[len(self)])

    def check_consistency(self) -> None:
        """:class:`BatchError` unless every non-tensor value is a numpy array with as many rows as the batch."""
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                raise BatchError(f"non_tensor_batch[{key!r}] must be a numpy array with a row dimension (ndim >= 1)")
        lengths = {k: len(v) for k, v in self.non_tensor_batch.items()}
        expected = self.batch.batch_size[0] if self.batch is not None else next(iter(lengths.values()), 0)
        wrong = {k: n for k, n in lengths.items() if n != expected}
        if wrong:
            raise BatchError(f"non_tensor_batch rows {wrong} differ from the batch's {expected} rows")

    # -------------------------------------------------------- rows

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        return len(next(iter(self.non_tensor_batch.values()))) if self.non_tensor_batch else 0

    def _new(self, batch: TensorDict | None, non_tensor_batch: dict, meta_info: dict | None = None) -> "DataProto":
        return type(self)(batch, non_tensor_batch, self.meta_info if meta_info is None else meta_info)

    def _take(self, index: torch.Tensor) -> "DataProto":
        shared: rows.Shared = {}  # jagged leaves sharing offsets keep sharing them
        batch = None if self.batch is None else rows.map_rows(self.batch, lambda t: rows.take(t, index, shared), len(index))
        np_index = index.numpy()
        return self._new(batch, {k: v[np_index] for k, v in self.non_tensor_batch.items()})

    def _slice(self, start: int, stop: int) -> "DataProto":
        stop = max(start, stop)
        batch = None
        if self.batch is not None:
            shared: rows.Shared = {}  # jagged leaves sharing offsets keep sharing them
            batch = rows.map_rows(self.batch, lambda t: rows.slice_rows(t, start, stop, shared), stop - start)
        return self._new(batch, {k: v[start:stop] for k, v in self.non_tensor_batch.items()})

    @overload
    def __getitem__(self, item: int | np.integer) -> "DataProtoItem": ...
    @overload
    def __getitem__(self, item: slice | list | range | np.ndarray) -> "DataProto": ...
    @overload
    def __getitem__(self, item: Any) -> "DataProto | DataProtoItem": ...
    def __getitem__(self, item: Any) -> "DataProto | DataProtoItem":
        """``int`` -> :class:`DataProtoItem`; ``slice`` -> a view; index list/array/tensor or bool mask -> a copy.

        Out-of-range rows and masks of the wrong length raise :class:`RowIndexError`
        (an IndexError); other index types :class:`ArgumentTypeError` (a TypeError).
        """
        length = len(self)
        if isinstance(item, (int, np.integer)) or (isinstance(item, torch.Tensor) and item.dim() == 0 and not item.is_floating_point()):
            i = int(item)
            if not -length <= i < length:
                raise RowIndexError(f"row {i} out of range for {length} rows")
            i %= length
            batch = None if self.batch is None else rows.map_rows(self.batch, lambda t: rows.row(t, i), None)
            return DataProtoItem(batch, {k: v[i] for k, v in self.non_tensor_batch.items()}, self.meta_info)
        if isinstance(item, slice):
            start, stop, step = item.indices(length)
            if step == 1:
                return self._slice(start, stop)
            return self._take(torch.arange(len(range(start, stop, step))) * step + start)
        if isinstance(item, (list, tuple, range, np.ndarray, torch.Tensor)):
            return self._take(index_tensor(item, length))
        raise ArgumentTypeError(f"Indexing with {type(item).__name__} is not supported")

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> "DataProto":
        """Rows ``start:end:step`` (as ``dp[start:end:step]``; a negative step works too)."""
        return self[slice(start, end, step)]

    def select_idxs(self, idxs: Any) -> "DataProto":
        """Rows picked by an index list/array/tensor or a boolean mask (a copy)."""
        return self._take(index_tensor(idxs, len(self)))

    def reorder(self, indices: Any) -> None:
        """Keep rows ``indices`` (any index :meth:`select_idxs` takes), in place; ``meta_info`` unchanged."""
        picked = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = picked.batch, picked.non_tensor_batch

    def _pieces(self, sizes: list[int]) -> list["DataProto"]:
        bounds = np.cumsum([0, *sizes]).tolist()
        return [self._slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def chunk(self, chunks: int) -> list["DataProto"]:
        """``chunks`` pieces in order, each viewing its rows (no copy), as verl's chunk.

        Unless padding is enabled (:meth:`is_padding_enabled`), ``len(self)`` must be a
        multiple of ``chunks`` (:class:`BatchError`, an AssertionError, otherwise). With
        padding enabled the pieces are sized as ``torch.chunk`` sizes them
        (``ceil(len / chunks)`` rows, the last fewer), or as ``numpy.array_split`` when
        there is no batch, as in verl; a length ``torch.chunk`` cannot cut into exactly
        ``chunks`` pieces raises :class:`BatchError` (verl fails there too). For pieces
        that always differ by at most one row, use :meth:`array_split`.
        """
        sizes = chunk_sizes(len(self), positive_int(chunks, "chunks"), self.is_padding_enabled(), self.batch is not None)
        return self._pieces(sizes)

    def array_split(self, chunks: int) -> list["DataProto"]:
        """Exactly ``chunks`` pieces in order, sizes differing by at most one (like ``numpy.array_split``).

        Each piece views its rows of this batch (no copy); pickled or sent to Ray,
        a piece carries only its own rows. More pieces than rows give empty pieces.
        """
        return self._pieces(balanced_sizes(len(self), positive_int(chunks, "chunks")))

    def split(self, split_size: int) -> list["DataProto"]:
        """Pieces of ``split_size`` rows (the last may be shorter), each a view."""
        split_size = positive_int(split_size, "split_size")
        return [self._slice(a, min(a + split_size, len(self))) for a in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence["DataProto"], *, meta_info: str = "merge") -> "DataProto":
        """Concatenate along rows (one copy), as the first piece's class.

        Every piece must have a batch or none, and the same batch and non-tensor keys
        (in any order; the first piece's order is kept). A key whose tensors differ in layout
        from piece to piece joins as the most general one: jagged if any piece's is (every
        other piece's rows become its rows), else strided nested if any is; rows that do not
        fit (another rank or fixed size) raise :class:`BatchError`. ``meta_info="merge"`` (verl's):
        ``metrics`` of all pieces (each a dict or a list of dicts) become one dict of
        lists, any other key must have equal values wherever it appears (else
        :class:`BatchError`, an AssertionError). ``meta_info="update"``: the first
        piece's ``meta_info`` updated by each later one (later values win).
        """
        data = list(data)
        if not data:
            raise BatchError("concat needs at least one DataProto")
        try:
            merge = META_INFO_MERGES[meta_info]
        except (KeyError, TypeError):
            raise ArgumentTypeError(f"meta_info must be one of {sorted(META_INFO_MERGES)}, got {meta_info!r}") from None
        batches = [d.batch for d in data if d.batch is not None]
        if len(batches) not in (0, len(data)):
            raise BatchError("cannot concatenate DataProtos with and without a batch")
        try:
            batch = rows.cat_rows(batches) if batches else None
        except (ValueError, RuntimeError) as e:
            raise BatchError(str(e)) from e
        keys = list(data[0].non_tensor_batch)
        if any(set(d.non_tensor_batch) != set(keys) for d in data):
            raise BatchError("cannot concatenate DataProtos with different non_tensor_batch keys")
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in keys}
        return type(data[0])(batch, non_tensor, merge([d.meta_info for d in data]))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: ``aabb`` when ``interleave`` else ``abab`` (a copy)."""
        if isinstance(repeat_times, bool) or not isinstance(repeat_times, (int, np.integer)) or repeat_times < 0:
            raise BatchError(f"repeat_times must be a non-negative integer, got {repeat_times!r}")
        base = torch.arange(len(self))
        index = base.repeat_interleave(int(repeat_times)) if interleave else base.repeat(int(repeat_times))
        return self._take(index)

    def sample_level_repeat(self, repeat_times: Any) -> "DataProto":
        """Row ``i`` repeated ``repeat_times[i]`` times, in order (a copy).

        ``repeat_times``: a list, tuple, 1-D tensor or 1-D numpy array of non-negative
        integers, one per row (:class:`BatchError` otherwise).
        """
        if not isinstance(repeat_times, (list, tuple, torch.Tensor, np.ndarray)):
            raise BatchError(f"repeat_times type must be in [list, torch.Tensor, np.ndarray, tuple], got {type(repeat_times)}")
        counts = torch.as_tensor(np.asarray(repeat_times.tolist() if isinstance(repeat_times, torch.Tensor) else repeat_times))
        if counts.shape != (len(self),) or (counts.numel() and (counts.dtype.is_floating_point or counts.dtype == torch.bool or int(counts.min()) < 0)):
            raise BatchError(f"repeat_times must hold {len(self)} non-negative integers, got {repeat_times!r}")
        return self._take(torch.arange(len(self)).repeat_interleave(counts.to(torch.int64)))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> "DataProto":
        """Each row becomes ``n_split`` rows, as verl's (a copy, except split tensors).

        Keys in ``split_keys`` (dense tensors or non-tensor arrays of two or more
        dimensions) have their second dimension cut into ``n_split`` equal parts, one
        per new row (a view when contiguous); every other key repeats each row
        ``n_split`` times. ``split_keys=None`` repeats every key (verl fails there when
        there are non-tensor values). A second dimension not divisible by ``n_split``,
        or a nested value to split, raises :class:`BatchError`.
        """
        n_split, to_split = positive_int(n_split, "n_split"), set(split_keys or ())
        index = torch.arange(len(self)).repeat_interleave(n_split)

        def unfold(key: str, value: Any) -> Any:
            if key in to_split:
                if is_tensor_collection(value) or getattr(value, "is_nested", False) or value.ndim < 2 or value.shape[1] % n_split:
                    raise BatchError(f"cannot split {key!r} of shape {tuple(value.shape)} into {n_split} along dim 1")
                return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])
            if isinstance(value, np.ndarray):
                return value[index.numpy()]
            if is_tensor_collection(value):
                return rows.map_rows(value, lambda t: rows.take(t, index), len(index))
            return rows.take(value, index)

        batch = None
        if self.batch is not None:
            content = {k: unfold(k, v) for k, v in self.batch.items()}
            batch = TensorDict(content, batch_size=[len(index), *self.batch.batch_size[1:]], device=self.batch.device)
        return self._new(batch, {k: unfold(k, v) for k, v in self.non_tensor_batch.items()})

    # -------------------------------------------------------- padding and iteration

    def is_padding_enabled(self) -> bool:
        """Whether :meth:`chunk` may split unevenly: ``meta_info[AUTO_PADDING_KEY]`` or ``DataProtoConfig.auto_padding``."""
        return self.meta_info.get(AUTO_PADDING_KEY, False) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first row (``padding_candidate="first"``)
        or the last row (anything else), in place; ``meta_info`` unchanged."""
        if padding_size == 0:
            return
        if isinstance(padding_size, bool) or not isinstance(padding_size, (int, np.integer)) or padding_size < 0:
            raise BatchError(f"padding_size must be a non-negative integer, got {padding_size!r}")
        if not len(self):
            raise RowIndexError("cannot pad a DataProto without rows")
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = self._take(torch.cat([torch.arange(len(self)), torch.full((int(padding_size),), row)]))
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator["DataProto"]:
        """Mini-batches of ``mini_batch_size`` rows for ``epochs`` epochs, through a
        ``torch.utils.data.DataLoader`` (``dataloader_kwargs`` go to it, e.g.
        ``shuffle=True``; ``seed`` seeds its generator), as verl's. Each mini-batch is a
        copy of its rows with every column kind and dtype kept, and this DataProto's
        ``meta_info``. ``len(self)`` must be a multiple of ``mini_batch_size``
        (:class:`BatchError` otherwise)."""
        from torch.utils.data import DataLoader, Dataset

        mini_batch_size = positive_int(mini_batch_size, "mini_batch_size")
        if len(self) % mini_batch_size:
            raise BatchError(f"{len(self)} % {mini_batch_size} != 0")
        if not isinstance(dataloader_kwargs or {}, dict):
            raise BatchError(f"dataloader_kwargs must be a dict, got {type(dataloader_kwargs).__name__}")
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        # DataLoader takes any sequence of sample indices; torch types it as its Dataset class
        loader: DataLoader[int] = DataLoader(
            cast("Dataset[int]", range(len(self))), batch_size=mini_batch_size, collate_fn=_TakeRows(self), generator=generator, **(dataloader_kwargs or {})
        )

        def batches() -> Iterator[DataProto]:
            for _ in range(epochs):
                for piece in loader:
                    piece.meta_info = self.meta_info
                    yield piece

        return iter(batches())

    # -------------------------------------------------------- keys

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> "DataProto":
        """A DataProto with only the named keys (all of a kind when its argument is ``None``).

        Non-tensor and meta_info keys keep this DataProto's order. A missing key raises
        :class:`KeyNotFoundError` (verl skips missing non-tensor and meta_info keys).
        The result shares tensors and values unless ``deepcopy`` (which, unlike verl's,
        copies the tensors too).
        """
        batch = self.batch
        if batch_keys is not None:
            batch_keys = list(batch_keys)
            present = [] if batch is None else list(batch.keys(include_nested=True))
            missing = [k for k in batch_keys if k not in present]
            if missing:
                raise not_found(KeyNotFoundError, "batch key", missing, "this DataProto", present)
            batch = None if batch is None else batch.select(*batch_keys)
        non_tensor = pick_keys(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta_info = pick_keys(self.meta_info, meta_info_keys, "meta_info")
        result = type(self)(batch, non_tensor, meta_info)
        return _copy.deepcopy(result) if deepcopy else result

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> "DataProto":
        """Remove the named keys from this DataProto and return them as a new one.

        Every key must be present (:class:`KeyNotFoundError`, an AssertionError and a
        KeyError, before anything is removed). The popped batch keeps this batch's
        size and device; no batch key gives ``batch=None``.
        """
        batch_keys, non_tensor_keys, meta_keys = list(batch_keys or ()), list(non_tensor_batch_keys or ()), list(meta_info_keys or ())
        missing = {
            "batch": [k for k in batch_keys if self.batch is None or k not in self.batch.keys(include_nested=True)],
            "non_tensor_batch": [k for k in non_tensor_keys if k not in self.non_tensor_batch],
            "meta_info": [k for k in meta_keys if k not in self.meta_info],
        }
        present = {"batch": [] if self.batch is None else list(self.batch.keys(include_nested=True)),
                   "non_tensor_batch": list(self.non_tensor_batch), "meta_info": list(self.meta_info)}
        for name, absent in missing.items():
            if absent:
                raise not_found(KeyNotFoundError, f"{name} key", absent, "this DataProto", present[name])
        batch = None
        if batch_keys and self.batch is not None:  # (not None: the keys were found in it)
            batch = TensorDict({k: self.batch.pop(k) for k in batch_keys}, batch_size=self.batch.batch_size, device=self.batch.device)
        non_tensor = {k: self.non_tensor_batch.pop(k) for k in non_tensor_keys}
        meta_info = {k: self.meta_info.pop(k) for k in meta_keys}
        return type(self)(batch, non_tensor, meta_info)

    def rename(self, old_keys: str | list[str] | None = None, new_keys: str | list[str] | None = None) -> "DataProto":
        """Rename batch keys (only those), in place; returns ``self``.

        ``old_keys``/``new_keys``: a key or lists of keys, renamed pairwise (verl's
        rename of several keys fails). A renamed key moves to the end of the batch.
        """
        old_keys, new_keys = key_list(old_keys), key_list(new_keys)
        if len(old_keys) != len(new_keys):
            raise BatchError(f"new_keys and old_keys must have the same length, but got {len(new_keys)} and {len(old_keys)}")
        missing = [k for k in old_keys if self.batch is None or k not in self.batch.keys()]
        if missing:
            raise not_found(KeyNotFoundError, "batch key", missing, "this DataProto", [] if self.batch is None else list(self.batch.keys()))
        if self.batch is not None:  # (None: then there are no keys to rename)
            for old, new in zip(old_keys, new_keys):
                self.batch.rename_key_(old, new)
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Add ``other``'s keys to this DataProto (in place, returned), as verl's.

        A key in both must hold equal values (tensors as in :func:`~arrow_dataproto.verl_api.union_tensor_dict`,
        arrays as in :func:`~arrow_dataproto.verl_api.union_numpy_dict`, ``meta_info`` with ``==``), else
        :class:`BatchError` and nothing changes; tensors already here are kept, arrays
        and ``meta_info`` values are taken from ``other``. A side without a batch takes
        the other's (verl fails there).
        """
        check_union(self, other)
        if self.batch is None:
            self.batch = other.batch
        elif other.batch is not None:
            for key in other.batch.keys():
                if key not in self.batch.keys():
                    self.batch[key] = other.batch[key]
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        return self

    # -------------------------------------------------------- devices, copies, files, pickling

    def to(self, device: str | torch.device) -> "DataProto":
        """Move the batch to ``device`` (in place, returned, as in verl)."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def save_to_disk(self, filepath: str | os.PathLike) -> None:
        """Write this DataProto to an Arrow IPC file (:func:`arrow_dataproto.files.write_file`),
        not a pickle as verl's does; read it back with :meth:`load_from_disk`."""
        from .files import write_file

        write_file(filepath, self)

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike, allow_pickle: bool = False) -> "DataProto":
        """Read a file written by :meth:`save_to_disk` (Arrow), or by verl's own
        ``save_to_disk`` (a pickle, either of verl's serialization modes) when
        ``allow_pickle=True``.

        Without ``allow_pickle`` a pickle file raises :class:`PickleNotAllowedError`, as
        does an Arrow file holding pickled values; unpickling runs code from the file, so
        pass it only for files you trust. Tensors of a verl pickle own their memory.
        """
        from ._ipc import MAGIC, open_regular
        from .files import read_file

        with os.fdopen(open_regular(filepath), "rb") as f:  # a FIFO is refused, never read
            head = f.read(6)
        if head == MAGIC:
            return read_file(filepath, allow_pickle=allow_pickle)
        if not allow_pickle:
            raise PickleNotAllowedError(
                f"{os.fspath(filepath)!r} is not an Arrow file; if verl's save_to_disk wrote it (a pickle), "
                "pass allow_pickle=True to load it (only for files you trust)"
            )
        from ._verl_pickle import load_pickle

        return load_pickle(filepath)

    def to_pandas(self, *, copy: bool = False):
        """One DataFrame row per sample: :func:`arrow_dataproto.pandas.to_pandas` (needs pandas)."""
        from .pandas import to_pandas

        return to_pandas(self, copy=copy)

    def print_size(self, prefix: str = "") -> None:
        """Print the bytes of the batch's tensors and of the non-tensor arrays, in GB, as verl's."""
        tensors = 0 if self.batch is None else sum(
            rows.nbytes(t) for t in self.batch.values(include_nested=True, leaves_only=True) if isinstance(t, torch.Tensor)
        )
        arrays = sum(v.nbytes for v in self.non_tensor_batch.values())
        message = f"Size of tensordict: {tensors / 1024**3} GB, size of non_tensor_batch: {arrays / 1024**3} GB"
        print(f"{prefix}, {message}" if prefix else message)

    def get_data_info(self) -> str:
        """A text listing each column's shape, dtype (and device) and each ``meta_info`` value's type, as verl's."""
        lines = ["batch"]
        for key, value in ({} if self.batch is None else self.batch).items():
            lines.append(f"  {key}: {tuple(value.shape)} ({value.dtype}) {value.device}")
        lines.append("non_tensor_batch")
        lines += [f"  {key}: ndarray{array.shape} ({array.dtype})" for key, array in self.non_tensor_batch.items()]
        lines.append("meta_info")
        lines += [f"  {key}: {type_info(value)}" for key, value in self.meta_info.items()]
        return "\n".join(lines)

    def __copy__(self) -> "DataProto":
        return type(self)(self.batch, dict(self.non_tensor_batch), dict(self.meta_info))

    def __deepcopy__(self, memo: dict) -> "DataProto":
        # leaf by leaf: TensorDict.clone() of a batch with a device takes a foreach path strided nested tensors lack
        batch = None if self.batch is None else rows.map_rows(self.batch, torch.clone, self.batch.batch_size[0])
        return type(self)(batch, _copy.deepcopy(self.non_tensor_batch, memo), _copy.deepcopy(self.meta_info, memo))

    def __reduce_ex__(self, protocol: SupportsIndex):
        from .pickling import reduce_dataproto

        return reduce_dataproto(self)

    def __repr__(self) -> str:
        keys = [] if self.batch is None else list(self.batch.keys(include_nested=True, leaves_only=True))
        return (
            f"DataProto(rows={len(self)}, batch_keys={keys}, "
            f"non_tensor_keys={list(self.non_tensor_batch)}, meta_info_keys={list(self.meta_info)})"
        )


def assemble(cls: type, batch: TensorDict | None, non_tensor_batch: dict, meta_info: dict) -> Any:
    """An instance of ``cls`` holding decoded parts, as every decoder (:func:`~arrow_dataproto.from_arrow`,
    unpickling, :meth:`DataProto.load_from_disk`) and both converters between verl's class and ours build it.

    Our :class:`DataProto` (or a subclass) goes through its constructor, which checks the parts
    (:class:`BatchError`) and puts them in new dicts; any other class (verl's) is built as unpickling
    builds it: ``cls.__new__``, the three attributes set to the parts themselves, no constructor run.
    """
    if issubclass(cls, DataProto):
        return cls(batch, non_tensor_batch, meta_info)
    obj: Any = cls.__new__(cls)  # verl's DataProto, untyped here
    obj.batch, obj.non_tensor_batch, obj.meta_info = batch, non_tensor_batch, meta_info
    return obj


class _TakeRows:
    """DataLoader collate function: the rows a batch sampler picked (picklable for worker processes)."""

    def __init__(self, data: DataProto):
        self.data = data

    def __call__(self, indices: list[int]) -> DataProto:
        return self.data.select_idxs(torch.as_tensor(indices, dtype=torch.int64))
