"""``DataProto``: the batch container RL trainers pass between workers.

The same three fields, the same methods and the same semantics as verl 0.9.1's
``DataProto`` (checked against the real class by ``tests/test_verl_parity.py``),
so code written against verl keeps working; pickling goes through the Arrow codec
(see :mod:`arrow_dataproto.pickling`). Every row operation works on dense
tensors, jagged and strided ``torch.nested`` tensors and nested TensorDicts.

Where verl's behaviour is a bug or a crash, the README's "verl API coverage"
table lists what this class does instead; where ours was more general, the
general behaviour stays available explicitly (:meth:`DataProto.array_split`,
``DataProto.concat(..., meta_info="update")``, a multi-dimensional batch through
the constructor). Errors are the library's own (:mod:`arrow_dataproto.errors`)
and also derive from what verl raises (mostly ``AssertionError``).
"""

from __future__ import annotations

import copy as _copy
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence, SupportsIndex, cast, overload

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from . import _rows as rows
from .errors import ArgumentTypeError, BatchError, DecodeError, KeyNotFoundError, PickleNotAllowedError, RowIndexError

AUTO_PADDING_KEY = "_verl_auto_padding"
"""The ``meta_info`` key that enables padding for one DataProto (verl's key, so it travels between the two)."""


class _ConfigMeta(type):
    _config: dict = {}
    auto_padding_key = AUTO_PADDING_KEY

    @property
    def auto_padding(cls) -> bool:
        by_env = os.getenv("VERL_AUTO_PADDING", "FALSE").upper() in ("TRUE", "1")
        return by_env or cls._config.get(cls.auto_padding_key, False)

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise BatchError(f"enabled must be a boolean, got {enabled!r} as {type(enabled).__name__}")
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_ConfigMeta):
    """Process-wide settings, as verl's: ``DataProtoConfig.auto_padding = True`` (or the
    environment variable ``VERL_AUTO_PADDING=1``) lets :meth:`DataProto.chunk` split
    unevenly for every DataProto; ``meta_info[AUTO_PADDING_KEY]`` does it for one.
    This is a separate switch from verl's own ``verl.protocol.DataProtoConfig``."""


def _object_array(values: Any) -> np.ndarray:
    """A numpy array of ``values``; a list becomes a 1-D object array (lists inside stay lists)."""
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, (list, tuple)):
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
    raise ArgumentTypeError(f"non-tensor values must be numpy arrays or lists, got {type(values).__name__}")


def _index_tensor(index: Any, length: int) -> torch.Tensor:
    """A 1-D int64 index tensor from a list, numpy array or tensor of ints or bools."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu()
    else:  # np.array copies: a read-only index (a pandas mask, say) would make torch warn
        array = np.array(index)
        if array.dtype.kind not in "biuf":
            raise ArgumentTypeError(f"cannot index rows with {type(index).__name__} of {array.dtype}")
        index = torch.as_tensor(array)
    if index.dtype == torch.bool:
        if index.shape != (length,):
            raise RowIndexError(f"boolean mask of shape {tuple(index.shape)} for {length} rows")
        return index.nonzero().flatten()
    if index.dim() != 1 or (index.numel() and (index.is_floating_point() or index.is_complex())):
        raise RowIndexError(f"row index must be 1-D integers or a boolean mask, got {index.dtype} {tuple(index.shape)}")
    index = index.to(torch.int64)
    if index.numel() and not (-length <= int(index.min()) and int(index.max()) < length):
        raise RowIndexError(f"row index out of range for {length} rows")
    return torch.where(index < 0, index + length, index)


def positive_int(value: Any, name: str) -> int:
    """``value`` as an int; :class:`BatchError` naming ``name`` unless it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BatchError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


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
            sizes = {key: tuple(t.shape[:1]) for key, t in tensors.items()}
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
            return self._take(_index_tensor(item, length))
        raise ArgumentTypeError(f"Indexing with {type(item).__name__} is not supported")

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> "DataProto":
        """Rows ``start:end:step`` (as ``dp[start:end:step]``; a negative step works too)."""
        return self[slice(start, end, step)]

    def select_idxs(self, idxs: Any) -> "DataProto":
        """Rows picked by an index list/array/tensor or a boolean mask (a copy)."""
        return self._take(_index_tensor(idxs, len(self)))

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
        chunks, n = positive_int(chunks, "chunks"), len(self)
        if not self.is_padding_enabled():
            if n % chunks:
                raise BatchError(f"only support equal chunk. Got size of DataProto {n} and chunk {chunks}.")
            sizes = [n // chunks] * chunks
        elif self.batch is None or n == 0:
            sizes = _balanced(n, chunks)
        else:
            step = -(-n // chunks)
            sizes = [min(step, n - a) for a in range(0, n, step)]
            if len(sizes) != chunks:
                raise BatchError(
                    f"torch.chunk cuts {n} rows into {len(sizes)} pieces, not {chunks}: pad to a multiple of "
                    f"{chunks} first (pad_dataproto_to_divisor) or use array_split"
                )
        return self._pieces(sizes)

    def array_split(self, chunks: int) -> list["DataProto"]:
        """Exactly ``chunks`` pieces in order, sizes differing by at most one (like ``numpy.array_split``).

        Each piece views its rows of this batch (no copy); pickled or sent to Ray,
        a piece carries only its own rows. More pieces than rows give empty pieces.
        """
        return self._pieces(_balanced(len(self), positive_int(chunks, "chunks")))

    def split(self, split_size: int) -> list["DataProto"]:
        """Pieces of ``split_size`` rows (the last may be shorter), each a view."""
        split_size = positive_int(split_size, "split_size")
        return [self._slice(a, min(a + split_size, len(self))) for a in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence["DataProto"], *, meta_info: str = "merge") -> "DataProto":
        """Concatenate along rows (one copy), as the first piece's class.

        Every piece must have a batch or none, and the same batch and non-tensor keys
        (in any order; the first piece's order is kept). ``meta_info="merge"`` (verl's):
        ``metrics`` of all pieces (each a dict or a list of dicts) become one dict of
        lists, any other key must have equal values wherever it appears (else
        :class:`BatchError`, an AssertionError). ``meta_info="update"``: the first
        piece's ``meta_info`` updated by each later one (later values win).
        """
        data = list(data)
        if not data:
            raise BatchError("concat needs at least one DataProto")
        try:
            merge = _META_INFO_MERGES[meta_info]
        except (KeyError, TypeError):
            raise ArgumentTypeError(f"meta_info must be one of {sorted(_META_INFO_MERGES)}, got {meta_info!r}") from None
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
            if batch is None and batch_keys:
                raise KeyNotFoundError(f"batch keys {batch_keys}: this DataProto has no batch")
            try:
                batch = None if batch is None else batch.select(*batch_keys)
            except KeyError as e:
                raise KeyNotFoundError(f"batch key not found: {e}") from e
        non_tensor = _pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta_info = _pick(self.meta_info, meta_info_keys, "meta_info")
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
        for name, absent in missing.items():
            if absent:
                raise KeyNotFoundError(f"{name} keys {absent} not found")
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
        old_keys, new_keys = _key_list(old_keys), _key_list(new_keys)
        if len(old_keys) != len(new_keys):
            raise BatchError(f"new_keys and old_keys must have the same length, but got {len(new_keys)} and {len(old_keys)}")
        missing = [k for k in old_keys if self.batch is None or k not in self.batch.keys()]
        if missing:
            raise KeyNotFoundError(f"batch keys {missing} not found")
        if self.batch is not None:  # (None: then there are no keys to rename)
            for old, new in zip(old_keys, new_keys):
                self.batch.rename_key_(old, new)
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Add ``other``'s keys to this DataProto (in place, returned), as verl's.

        A key in both must hold equal values (tensors as in :func:`union_tensor_dict`,
        arrays as in :func:`union_numpy_dict`, ``meta_info`` with ``==``), else
        :class:`BatchError` and nothing changes; tensors already here are kept, arrays
        and ``meta_info`` values are taken from ``other``. A side without a batch takes
        the other's (verl fails there).
        """
        if len(self) != len(other) and _has_rows(self) and _has_rows(other):
            raise BatchError(f"cannot union {len(self)} rows with {len(other)} rows")
        if self.batch is not None and other.batch is not None:
            _check_tensor_union(self.batch, other.batch)
        _check_union(self.non_tensor_batch, other.non_tensor_batch, _numpy_conflict)
        _check_union(self.meta_info, other.meta_info, _meta_conflict)
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
        from .integrations.verl import VerlState, unpickle

        with open(filepath, "rb") as f:
            try:
                loaded = unpickle(f)
            except DecodeError as e:  # every error of a damaged pickle (unpickle's contract)
                raise DecodeError(f"{os.fspath(filepath)!r} is neither an Arrow file nor a readable DataProto pickle: {e}") from e
        if isinstance(loaded, DataProto):
            return loaded
        if isinstance(loaded, VerlState):
            return DataProto(loaded.batch, loaded.non_tensor_batch, loaded.meta_info)
        raise DecodeError(f"{os.fspath(filepath)!r} holds a pickled {type(loaded).__name__}, not a DataProto")

    def to_pandas(self, *, copy: bool = False):
        """One DataFrame row per sample: :func:`arrow_dataproto.pandas.to_pandas` (needs pandas)."""
        from .pandas import to_pandas

        return to_pandas(self, copy=copy)

    def print_size(self, prefix: str = "") -> None:
        """Print the bytes of the batch's tensors and of the non-tensor arrays, in GB, as verl's."""
        tensors = 0 if self.batch is None else sum(
            _nbytes(t) for t in self.batch.values(include_nested=True, leaves_only=True) if isinstance(t, torch.Tensor)
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
        lines += [f"  {key}: {_type_info(value)}" for key, value in self.meta_info.items()]
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


# ---------------------------------------------------------------- merging values (verl's union rules)


def values_equal(a: Any, b: Any, _seen: set[int] | None = None) -> bool:
    """verl's equality for non-tensor values: same type, NaN equals NaN, numpy arrays
    compared by dtype, shape and (recursively, for object arrays) elements; a value
    met again inside itself counts as equal. Other values compare with ``==``."""
    if type(a) is not type(b):
        return False
    seen = set() if _seen is None else _seen
    if id(a) in seen:
        return True
    seen.add(id(a))
    try:
        if isinstance(a, float):
            return a == b or (math.isnan(a) and math.isnan(b))
        if isinstance(a, np.ndarray):
            if a.dtype != b.dtype or a.shape != b.shape:
                return False
            if a.dtype == object:
                return all(values_equal(x, y, seen) for x, y in zip(a.flat, b.flat))
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return bool(a == b)
    finally:
        seen.discard(id(a))


def _meta_equal(a: Any, b: Any) -> bool:
    """``a == b`` as verl compares ``meta_info`` values, where that is a plain truth value;
    arrays, tensors and containers of them compare by :func:`values_equal` / ``torch.equal``."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return _same_tensor(a, b)
    try:
        return bool(a == b)
    except (ValueError, RuntimeError, TypeError):  # an array's == is elementwise
        return values_equal(a, b)


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add ``tensor_dict2``'s keys to ``tensor_dict1`` (in place, returned), as verl's.

    The batch sizes must be equal and a key in both must hold equal tensors (the
    same object, or ``torch.equal``; jagged/strided and nested TensorDicts row by
    row), else :class:`BatchError` and nothing changes; ``tensor_dict1`` keeps its
    own tensor for such a key.
    """
    _check_tensor_union(tensor_dict1, tensor_dict2)
    for key in tensor_dict2.keys():
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = tensor_dict2[key]
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1`` (in place, returned), as verl's:
    a key in both must hold numpy arrays equal by :func:`values_equal` (else
    :class:`BatchError` and nothing changes), and takes ``tensor_dict2``'s array."""
    _check_union(tensor_dict1, tensor_dict2, _numpy_conflict)
    tensor_dict1.update(tensor_dict2)
    return tensor_dict1


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """Add ``dict2``'s items to ``dict1`` (in place, returned); a key in both must hold
    equal values (``==``), else :class:`BatchError` and nothing changes."""
    _check_union(dict1, dict2, _meta_conflict)
    dict1.update(dict2)
    return dict1


def _check_tensor_union(td1: TensorDict, td2: TensorDict) -> None:
    if td1.batch_size != td2.batch_size:
        raise BatchError(f"Two tensor dict must have identical batch size. Got {td1.batch_size} and {td2.batch_size}")
    for key in td2.keys():
        if key in td1.keys() and not _same_tensor(td1[key], td2[key]):
            raise BatchError(f"{key} in tensor_dict1 and tensor_dict2 are not the same object")


def _numpy_conflict(key: str, a: Any, b: Any) -> str | None:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return f"`{key}`: both values must be numpy arrays"
    return None if values_equal(a, b) else f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object."


def _meta_conflict(key: str, a: Any, b: Any) -> str | None:
    return None if _meta_equal(a, b) else f"{key} in meta_dict1 and meta_dict2 are not the same object"


def _check_union(dict1: dict, dict2: dict, conflict: Callable[[str, Any, Any], str | None]) -> None:
    for key, value in dict2.items():
        message = conflict(key, dict1[key], value) if key in dict1 else None
        if message:
            raise BatchError(message)


def _has_rows(data: DataProto) -> bool:
    return data.batch is not None or bool(data.non_tensor_batch)


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """``[{a: 1, b: 2}, {a: 3}]`` -> ``{a: [1, 3], b: [2]}``; keys are the first dict's,
    a key absent from it raises :class:`BatchError` (as verl asserts)."""
    if not list_of_dict:
        return {}
    if not all(isinstance(d, dict) for d in list_of_dict):
        raise BatchError(f"expected a list of dicts, got {[type(d).__name__ for d in list_of_dict]}")
    output: dict[str, list] = {key: [] for key in list_of_dict[0]}
    for d in list_of_dict:
        for key, value in d.items():
            if key not in output:
                raise BatchError(f"Key '{key}' is not present in the keys of the first dictionary in the list.")
            output[key].append(value)
    return output


def _merge_meta_info(metas: list[dict]) -> dict:
    """verl's concat: metrics gathered into a dict of lists, other keys must agree."""
    merged: dict = {}
    metrics: list = []
    for meta in metas:
        for key, value in meta.items():
            if key == "metrics":
                if value is not None:
                    metrics.extend(value) if isinstance(value, list) else metrics.append(value)
            elif key not in merged:
                merged[key] = value
            elif not _meta_equal(merged[key], value):
                raise BatchError(f"Conflicting values for meta_info key '{key}'")
    if metrics:
        merged["metrics"] = list_of_dict_to_dict_of_list(metrics)
    return merged


def _update_meta_info(metas: list[dict]) -> dict:
    merged: dict = {}
    for meta in metas:
        merged.update(meta)
    return merged


_META_INFO_MERGES: dict[str, Callable[[list[dict]], dict]] = {"merge": _merge_meta_info, "update": _update_meta_info}


# ---------------------------------------------------------------- helpers


class _TakeRows:
    """DataLoader collate function: the rows a batch sampler picked (picklable for worker processes)."""

    def __init__(self, data: DataProto):
        self.data = data

    def __call__(self, indices: list[int]) -> DataProto:
        return self.data.select_idxs(torch.as_tensor(indices, dtype=torch.int64))


def _pick(values: dict, keys: Iterable[str] | None, name: str) -> dict:
    if keys is None:
        return values
    keys = list(keys)
    missing = [k for k in keys if k not in values]
    if missing:
        raise KeyNotFoundError(f"{name} keys {missing} not found")
    return {k: v for k, v in values.items() if k in keys}


def _key_list(keys: Any) -> list:
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, list):
        return keys
    raise ArgumentTypeError(f"keys must be a list or a string, but got {type(keys)}")


def _nbytes(t: torch.Tensor) -> int:
    if t.is_nested:
        count = t.values().numel() if t.layout == torch.jagged else sum(r.numel() for r in t.unbind())
        return count * t.element_size()
    return t.numel() * t.element_size()


def _type_info(value: Any) -> str:
    """A value's type, with the element types of lists (first three), tuples and dicts (first item)."""
    if isinstance(value, list):
        kinds = {_type_info(v) for v in value[:3]}
        return f"list[{'|'.join(kinds) if kinds else '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(_type_info(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        key, item = next(iter(value.items()))
        return f"dict[{_type_info(key)}: {_type_info(item)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    return type(value).__name__


def _balanced(length: int, chunks: int) -> list[int]:
    """``chunks`` sizes adding up to ``length``, the first ``length % chunks`` one larger (``numpy.array_split``'s)."""
    size, extra = divmod(length, chunks)
    return [size + (i < extra) for i in range(chunks)]


def _same_tensor(a: Any, b: Any) -> bool:
    """Whether two batch values (tensors, dense or nested, or nested TensorDicts) hold equal data.

    Typed ``Any``: TensorDict's classes have dynamic base classes, so no
    ``isinstance`` check narrows a ``Tensor | TensorDict`` for a type checker.
    """
    if a is b:
        return True
    if is_tensor_collection(a) or is_tensor_collection(b):  # a nested TensorDict: same keys, same leaves
        return (
            is_tensor_collection(a)
            and is_tensor_collection(b)
            and set(a.keys()) == set(b.keys())
            and all(_same_tensor(a[k], b[k]) for k in a.keys())
        )
    if a.is_nested or b.is_nested:
        ra, rb = a.unbind(), b.unbind()
        return len(ra) == len(rb) and all(torch.equal(x, y) for x, y in zip(ra, rb))
    return a.shape == b.shape and torch.equal(a, b)
