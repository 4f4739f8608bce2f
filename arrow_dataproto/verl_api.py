"""verl's module-level DataProto helpers, for code that imports them from ``verl.protocol``.

Swap ``from verl.protocol import X`` for ``from arrow_dataproto.verl_api import X``::

    DataProto, DataProtoItem, DataProtoConfig      the container (also at the top level: arrow_dataproto.DataProto)
    pad_dataproto_to_divisor, unpad_dataproto      pad rows to a multiple, and undo it
    fold_batch_dim, unfold_batch_dim               [B, ...] <-> [B', B/B', ...]
    union_tensor_dict, union_numpy_dict,           merging with verl's equality rules
    union_two_dict, list_of_dict_to_dict_of_list
    collate_fn                                     DataProtoItems -> one DataProto
    serialize_single_tensor, serialize_tensordict, verl's numpy-mode tensor format
    deserialize_single_tensor, deserialize_tensordict

Semantics are verl 0.9.1's (checked against it by ``tests/test_verl_parity.py``);
the differences, where verl fails or changes its input, are in the docstrings and
in the verl API table of docs/verl.md. Errors are the library's own and also derive from
what verl raises (:mod:`arrow_dataproto.errors`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from .errors import ArgumentTypeError, BatchError, DecodeError
from ._arguments import positive_int
from ._container import DataProto, DataProtoItem
from ._verl_pickle import legacy_tensor, load_numpy_mode
from ._verl_rules import (
    AUTO_PADDING_KEY,
    DataProtoConfig,
    list_of_dict_to_dict_of_list,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
    values_equal,
)

__all__ = [
    "AUTO_PADDING_KEY",
    "DataProto",
    "DataProtoConfig",
    "DataProtoItem",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
    "values_equal",
]

_log = logging.getLogger(__name__)


# ---------------------------------------------------------------- padding


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """``(padded, pad_size)``: ``data`` followed by its first rows again (cycling) until
    its length is a multiple of ``size_divisor``; ``data`` itself when it already is.

    As in verl the padding is a :meth:`DataProto.concat`, so ``meta_info`` is merged
    the way concat merges it (``metrics`` become a dict of lists).
    """
    if not isinstance(data, DataProto):
        raise BatchError(f"data must be a DataProto, got {type(data).__name__}")
    size_divisor, length = positive_int(size_divisor, "size_divisor"), len(data)
    if length % size_divisor == 0:
        if length == 0:
            _log.warning("padding a DataProto with no item, no changed made")
        return data, 0
    pad_size = size_divisor - length % size_divisor
    pieces, remaining = [data], pad_size
    while remaining > 0:
        pieces.append(data[: min(remaining, length)])
        remaining -= min(remaining, length)
    return DataProto.concat(pieces), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """``data`` without its last ``pad_size`` rows (a view), as left by :func:`pad_dataproto_to_divisor`."""
    return data[:-pad_size] if pad_size != 0 else data


# ---------------------------------------------------------------- folding


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Rows ``[B, ...]`` regrouped as ``[new_batch_size, B // new_batch_size, ...]``
    (tensors, nested TensorDicts and non-tensor arrays); the result has
    ``new_batch_size`` rows and ``data``'s ``meta_info``. Views where the memory
    allows, copies otherwise. ``B`` must be a multiple of ``new_batch_size``, and
    nested (jagged/strided) tensors cannot be folded (:class:`BatchError`). Unlike
    verl's, ``data`` is left unchanged.
    """
    new_batch_size, length = positive_int(new_batch_size, "new_batch_size"), len(data)
    if length % new_batch_size:
        raise BatchError(f"{length} rows do not fold into {new_batch_size} groups")
    group = length // new_batch_size

    def fold(value: Any) -> Any:
        if is_tensor_collection(value):
            content = {k: fold(v) for k, v in value.items()}
            return TensorDict(content, batch_size=[new_batch_size, group, *value.batch_size[1:]], device=value.device)
        if getattr(value, "is_nested", False):
            raise BatchError("nested (jagged or strided) tensors cannot be folded")
        return value.reshape(new_batch_size, group, *value.shape[1:])

    batch = None
    if data.batch is not None:
        content = {k: fold(v) for k, v in data.batch.items()}
        batch = TensorDict(content, batch_size=[new_batch_size], device=data.batch.device)
    non_tensor = {k: fold(v) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """The inverse of :func:`fold_batch_dim`: the first ``batch_dims`` dimensions of every
    tensor and non-tensor array merged into rows. They must be the same for every
    value (:class:`BatchError` otherwise). Unlike verl's, ``data`` is left unchanged.
    """
    batch_dims = positive_int(batch_dims, "batch_dims")
    leaves = [] if data.batch is None else list(data.batch.values(include_nested=True, leaves_only=True))
    shapes = {tuple(v.shape[:batch_dims]) for v in leaves + list(data.non_tensor_batch.values())}
    if len(shapes) != 1 or len(next(iter(shapes))) != batch_dims or any(getattr(v, "is_nested", False) for v in leaves):
        raise BatchError(f"the values do not share their first {batch_dims} dense dimensions: {sorted(shapes)}")
    length = math.prod(next(iter(shapes)))

    def unfold(value: Any) -> Any:
        if is_tensor_collection(value):
            content = {k: unfold(v) for k, v in value.items()}
            return TensorDict(content, batch_size=[length, *value.batch_size[batch_dims:]], device=value.device)
        return value.reshape(length, *value.shape[batch_dims:])

    batch = None if data.batch is None else unfold(data.batch)
    non_tensor = {k: unfold(v) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


# ---------------------------------------------------------------- collating


def collate_fn(x: list[DataProtoItem]) -> DataProto:
    """Stack rows (:class:`DataProtoItem`, e.g. ``dp[i]``) into one DataProto without ``meta_info``.

    Tensors of equal shapes are stacked; rows of differing lengths become a jagged
    nested tensor (verl fails there). Non-tensor values become object arrays
    (``np.array(values, dtype=object)``, as verl), keyed by the first item's keys.
    """
    if not x:
        raise BatchError("collate_fn needs at least one item")
    batches = [item.batch for item in x]
    if any((b is None) != (batches[0] is None) for b in batches):
        raise BatchError("cannot collate items with and without a batch")
    batch = None if batches[0] is None else _stack(batches)
    non_tensor = list_of_dict_to_dict_of_list([item.non_tensor_batch for item in x])
    return DataProto(batch=batch, non_tensor_batch={k: np.array(v, dtype=object) for k, v in non_tensor.items()})


def _stack(values: list) -> Any:
    first = values[0]
    if is_tensor_collection(first):
        if any(set(v.keys()) != set(first.keys()) for v in values):
            raise BatchError("cannot collate rows with different batch keys")
        content = {k: _stack([v[k] for v in values]) for k in first.keys()}
        return TensorDict(content, batch_size=[len(values), *first.batch_size], device=first.device)
    if all(v.shape == first.shape for v in values):
        return torch.stack(values)
    try:
        return torch.nested.nested_tensor(values, layout=torch.jagged)
    except (RuntimeError, ValueError) as e:
        raise BatchError(f"rows of shapes {[tuple(v.shape) for v in values]} neither stack nor form a jagged tensor: {e}") from e


# ---------------------------------------------------------------- verl's numpy-mode tensor format


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, torch.Size, np.ndarray]:
    """``(dtype_name, shape, bytes)``: a dense tensor as verl's numpy mode sends it,
    its bytes a 1-D uint8 numpy array (a view of a contiguous CPU tensor, else of a copy)."""
    if not isinstance(obj, torch.Tensor) or obj.is_nested:
        raise ArgumentTypeError(f"expected a dense tensor, got {type(obj).__name__}")
    data = obj.detach().cpu().flatten().contiguous().view(torch.uint8).numpy()
    return str(obj.dtype).removeprefix("torch."), obj.shape, data


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """``(batch_size, device, {key: entry})`` as verl's numpy mode sends a batch: a dense
    tensor's entry is :func:`serialize_single_tensor`'s triple, a nested tensor's is
    ``(layout_name, [one triple per row])``. Nested TensorDicts have no form here
    (:class:`ArgumentTypeError`)."""
    items: dict[str, tuple] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"{key!r}: verl's numpy format has no nested TensorDicts")
        if value.is_nested:
            items[key] = (str(value.layout).removeprefix("torch."), [serialize_single_tensor(row) for row in value.unbind()])
        else:
            items[key] = serialize_single_tensor(value)
    return tuple(batch.batch_size), None if batch.device is None else str(batch.device), items


def deserialize_single_tensor(arr: tuple) -> torch.Tensor:
    """The tensor of a :func:`serialize_single_tensor` triple (owning a copy of the bytes);
    a malformed triple raises :class:`~arrow_dataproto.DecodeError`."""
    if not (isinstance(arr, tuple) and len(arr) == 3):
        raise DecodeError(f"expected a (dtype, shape, bytes) triple, got {type(arr).__name__}")
    return legacy_tensor("tensor", arr)


def deserialize_tensordict(arr: tuple) -> TensorDict:
    """The TensorDict of a :func:`serialize_tensordict` tuple (tensors own their memory,
    placed on the recorded device if this process has it, else the CPU); a malformed
    tuple raises :class:`~arrow_dataproto.DecodeError`."""
    return load_numpy_mode(arr)
