"""verl's rules that are not methods of ``DataProto``: the padding switch and chunk sizes,
equality of values, the union of two batches, how concatenation merges ``meta_info``, and
how ``get_data_info`` names a value's type.

:class:`~arrow_dataproto.DataProto` applies them; :mod:`arrow_dataproto.verl_api` is
their public home (``from verl.protocol import union_numpy_dict`` becomes
``from arrow_dataproto.verl_api import union_numpy_dict``). Semantics are verl 0.9.1's
(``tests/test_verl_parity.py``); every refusal is a :class:`BatchError`, an AssertionError
as verl's.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from .errors import BatchError

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


def chunk_sizes(length: int, chunks: int, padding: bool, has_batch: bool) -> list[int]:
    """The row counts of verl's ``DataProto.chunk`` into ``chunks`` pieces: equal ones, else
    :class:`BatchError`; with ``padding`` enabled, as ``torch.chunk`` sizes them (``ceil(length
    / chunks)``, the last fewer), or as :func:`balanced_sizes` without a batch (or rows). A length
    ``torch.chunk`` cannot cut into exactly ``chunks`` pieces raises :class:`BatchError`."""
    if not padding:
        if length % chunks:
            raise BatchError(f"only support equal chunk. Got size of DataProto {length} and chunk {chunks}.")
        return [length // chunks] * chunks
    if not has_batch or length == 0:
        return balanced_sizes(length, chunks)
    step = -(-length // chunks)
    sizes = [min(step, length - a) for a in range(0, length, step)]
    if len(sizes) != chunks:
        raise BatchError(
            f"torch.chunk cuts {length} rows into {len(sizes)} pieces, not {chunks}: pad to a multiple of "
            f"{chunks} first (pad_dataproto_to_divisor) or use array_split"
        )
    return sizes


def balanced_sizes(length: int, chunks: int) -> list[int]:
    """``chunks`` sizes adding up to ``length``, the first ``length % chunks`` one larger (``numpy.array_split``'s)."""
    size, extra = divmod(length, chunks)
    return [size + (i < extra) for i in range(chunks)]


def type_info(value: Any) -> str:
    """A value's type as verl's ``get_data_info`` names it, with the element types of lists
    (first three), tuples and dicts (first item), and the shape and dtype of numpy arrays."""
    if isinstance(value, list):
        kinds = {type_info(v) for v in value[:3]}
        return f"list[{'|'.join(kinds) if kinds else '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(type_info(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        key, item = next(iter(value.items()))
        return f"dict[{type_info(key)}: {type_info(item)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    return type(value).__name__


# ---------------------------------------------------------------- equality


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


# ---------------------------------------------------------------- union


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


def check_union(data: Any, other: Any) -> None:
    """:class:`BatchError` unless DataProto ``other`` may be unioned into ``data``: the same
    number of rows where both have rows, and every key in both equal by the rules of
    :func:`union_tensor_dict`, :func:`union_numpy_dict` and :func:`union_two_dict`."""
    if len(data) != len(other) and _has_rows(data) and _has_rows(other):
        raise BatchError(f"cannot union {len(data)} rows with {len(other)} rows")
    if data.batch is not None and other.batch is not None:
        _check_tensor_union(data.batch, other.batch)
    _check_union(data.non_tensor_batch, other.non_tensor_batch, _numpy_conflict)
    _check_union(data.meta_info, other.meta_info, _meta_conflict)


def _has_rows(data: Any) -> bool:
    return data.batch is not None or bool(data.non_tensor_batch)


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


# ---------------------------------------------------------------- concatenation


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


META_INFO_MERGES: dict[str, Callable[[list[dict]], dict]] = {"merge": _merge_meta_info, "update": _update_meta_info}
"""How :meth:`DataProto.concat` combines the pieces' ``meta_info``, by the name of its ``meta_info`` argument."""
