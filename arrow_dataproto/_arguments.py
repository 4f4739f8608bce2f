"""What :class:`~arrow_dataproto.DataProto`'s methods accept, checked and normalised: row
indices, counts, non-tensor values and key lists. Every refusal is the library's own error
(:mod:`arrow_dataproto.errors`), which also derives from what verl raises."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch

from .errors import ArgumentTypeError, BatchError, KeyNotFoundError, RowIndexError, not_found


def object_array(values: Any) -> np.ndarray:
    """A numpy array of ``values`` (an array as it is); a list or tuple becomes a 1-D object
    array (lists inside stay lists); anything else raises :class:`ArgumentTypeError`."""
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, (list, tuple)):
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
    raise ArgumentTypeError(f"non-tensor values must be numpy arrays or lists, got {type(values).__name__}")


def index_tensor(index: Any, length: int) -> torch.Tensor:
    """A 1-D int64 tensor of rows in ``range(length)`` from a list, numpy array or tensor of
    ints (negative ones count from the end) or bools (a mask of ``length``): a new tensor.
    Out-of-range rows and masks of another length raise :class:`RowIndexError`, other
    element types :class:`ArgumentTypeError`."""
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


def pick_keys(values: dict, keys: Iterable[str] | None, name: str) -> dict:
    """The items of ``values`` whose keys are in ``keys``, in ``values``' order (``values``
    itself when ``keys`` is ``None``); a missing key raises :class:`KeyNotFoundError` naming ``name``."""
    if keys is None:
        return values
    keys = list(keys)
    missing = [k for k in keys if k not in values]
    if missing:
        raise not_found(KeyNotFoundError, f"{name} key", missing, "this DataProto", values)
    return {k: v for k, v in values.items() if k in keys}


def key_list(keys: Any) -> list:
    """A key as ``[key]``, a list as it is; anything else raises :class:`ArgumentTypeError`."""
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, list):
        return keys
    raise ArgumentTypeError(f"keys must be a list or a string, but got {type(keys)}")
