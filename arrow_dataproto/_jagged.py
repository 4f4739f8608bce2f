"""The one place that takes jagged ``torch.nested`` tensors apart and builds them.

A jagged tensor (``layout=torch.jagged``) is a values tensor, int64 offsets and
a ragged dimension ``ragged_idx`` (1 = right after the batch dimension). Every
module that needs its rows (the tensor codec, row selection, pandas) goes
through :func:`parts` and :func:`build`, so the ragged-dimension bookkeeping is
written once.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import torch

from ._compat import FX_TRACE_LOGGER, jagged_class, ragged_idx, torch_function_off

JaggedTensor = Any
"""A ``torch.nested`` tensor with ``layout=torch.jagged`` (torch's type stubs lack its methods)."""

# torch logs this notice (once per process) from inside nested_tensor_from_jagged;
# it concerns torch.fx users, not anyone building a nested tensor.
_FX_NOTICE = "is_fx_tracing will return true"
_FX_LOGGER = logging.getLogger(FX_TRACE_LOGGER)


def _not_fx_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_FX_NOTICE)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    _FX_LOGGER.addFilter(_not_fx_notice)
    try:
        yield
    finally:
        _FX_LOGGER.removeFilter(_not_fx_notice)


_JAGGED = jagged_class()
"""torch's jagged tensor class (``None``: the public, slower calls only; see :func:`._compat.jagged_class`)."""


def is_jagged(t: torch.Tensor) -> bool:
    if _JAGGED is not None:
        return isinstance(t, _JAGGED)
    return t.is_nested and t.layout == torch.jagged


def _requires_grad(t: JaggedTensor) -> bool:
    with torch_function_off():  # the jagged class's __torch_function__ costs 10 us a read
        return t.requires_grad


def parts(t: JaggedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, offsets)`` of a jagged tensor: values with the ragged dimension first,
    and its offsets (which need not start at 0). Views, except for a tensor with holes
    between rows (``lengths()`` set), which is compacted first (a copy). A tensor outside
    autograd gives its values tensor itself, not an autograd view of it."""
    if t.lengths() is not None:
        t = t.contiguous()
    values = t._values if _JAGGED is not None and not _requires_grad(t) else t.values()
    dim = ragged_idx(t) - 1
    return (values.movedim(dim, 0) if dim else values), t.offsets()


def build(values: torch.Tensor, offsets: torch.Tensor, ragged_idx: int) -> JaggedTensor:
    """The jagged tensor whose rows are ``values[offsets[i]:offsets[i + 1]]`` (values with the
    ragged dimension first), ragged at ``ragged_idx``. Views ``values`` and ``offsets``;
    outside autograd (neither requires grad) it is built without torch's dispatcher."""
    if ragged_idx != 1:
        values = values.movedim(0, ragged_idx - 1)
    if _JAGGED is not None and not (values.requires_grad or offsets.requires_grad) and values.device == offsets.device:
        return _JAGGED(values, offsets, _ragged_idx=ragged_idx)
    with _quiet():
        return torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=ragged_idx)


def clone(t: JaggedTensor) -> JaggedTensor:
    """A jagged tensor owning new copies of ``t``'s values and offsets (``t.clone()`` shares the offsets)."""
    values, offsets = parts(t)
    return build(values.clone(), offsets.clone(), ragged_idx(t))
