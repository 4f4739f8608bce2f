"""The serialization paths arrow_dataproto is measured against.

Uniform interface: each rival is an object with

- ``name`` (str): a short label for result tables;
- ``encode(td, non_tensor, meta) -> payload``: a picklable object; pickling it (pickle protocol 5,
  which is what Ray uses) is the rest of the send side;
- ``decode(payload) -> (td, non_tensor, meta)``: run on the unpickled payload.

``td`` is a TensorDict with one batch dimension, ``non_tensor`` a dict of numpy object arrays and
``meta`` a dict, as in an RL trainer's DataProto. The non-tensor dict and meta dict travel through
plain pickle in every rival (that is what the trainer does too); the rivals differ in the tensors.

Rivals (``all_rivals()`` lists those usable in this environment):

1. ``verl_default_like``: ``td.contiguous().consolidate()`` written with ``torch.save`` into a
   ``BytesIO``; the payload carries the bytes; decode is ``torch.load(..., weights_only=False)``.
2. ``verl_numpy_like``: every leaf as ``(dtype name, shape, uint8 numpy view of its bytes)``,
   jagged tensors as ``(layout name, [one triple per row])``; decode copies each view into a
   ``bytearray`` and rebuilds the tensor from it.
3. ``td_consolidated``: ``td.consolidate(metadata=True)`` and the TensorDict pickled as is.
4. ``numpy_floor``: the same bytes as bare numpy arrays (one per leaf; a jagged leaf as its values
   and offsets), rebuilt with ``torch.from_numpy``: one copy in, none out. The decoded tensors share
   memory with the payload: with Ray they view read-only shared memory, which torch does not
   enforce, so they must not be written to.
5. ``verl_dataproto`` and 6. ``verl_dataproto_numpy`` (only if ``verl.protocol`` imports): the real
   ``verl.protocol.DataProto`` pickled by its own ``__getstate__``/``__setstate__``. verl picks its
   mode from the environment variable ``VERL_DATAPROTO_SERIALIZATION_METHOD`` (``numpy`` selects
   numpy mode, anything else the default), read at pickling time and again at unpickling time. To
   keep both modes usable in one process, the payload is a small wrapper, ``VerlPickled``, that
   sets the variable only while it calls ``DataProto.__getstate__`` (when pickled) and
   ``DataProto.__setstate__`` (when unpickled), restoring the old value afterwards. The mode thus
   travels with the payload, and the receiver needs only this module importable. Not thread-safe
   (it changes ``os.environ``), which is fine for a benchmark.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "VerlDefaultLike",
    "VerlNumpyLike",
    "TDConsolidated",
    "NumpyFloor",
    "VerlDataProto",
    "VerlPickled",
    "verl_unavailable_reason",
    "all_rivals",
]

Triple = tuple[str, tuple[int, ...], np.ndarray]


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def _to_triple(t: torch.Tensor) -> Triple:
    """(dtype name, shape, uint8 numpy view of the tensor's bytes); copies only if not contiguous."""
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), data


def _leaves(td: TensorDict):
    return td.items(include_nested=True, leaves_only=True)


def _rebuild(batch_size, device, leaves: dict) -> TensorDict:
    td = TensorDict({}, batch_size=batch_size, device=device)
    for key, value in leaves.items():
        td.set(key, value)
    return td


class VerlDefaultLike:
    """(1) consolidate, then ``torch.save`` into bytes; ``torch.load`` on the way back."""

    name = "verl_default_like"

    def encode(self, td, non_tensor, meta):
        if len(td.keys()) > 0:  # consolidating an empty TensorDict fails
            td = td.contiguous().consolidate()
        buf = io.BytesIO()
        torch.save(td, buf)
        return buf.getvalue(), non_tensor, meta

    def decode(self, payload):
        data, non_tensor, meta = payload
        td = torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
        return td, non_tensor, meta


class VerlNumpyLike:
    """(2) uint8 numpy views out, one ``bytearray`` copy per tensor (per row if jagged) in."""

    name = "verl_numpy_like"

    def encode(self, td, non_tensor, meta):
        items = {}
        for key, t in _leaves(td):
            if t.is_nested:
                items[key] = (str(t.layout).removeprefix("torch."), [_to_triple(r) for r in t.unbind()])
            else:
                items[key] = _to_triple(t)
        device = None if td.device is None else str(td.device)
        return (tuple(td.batch_size), device, items), non_tensor, meta

    @staticmethod
    def _from_triple(triple: Triple) -> torch.Tensor:
        dtype, shape, data = triple
        if data.size == 0:  # torch.frombuffer refuses an empty buffer
            return torch.empty(shape, dtype=_dtype(dtype))
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return raw.view(_dtype(dtype)).view(shape)

    def decode(self, payload):
        (batch_size, device, items), non_tensor, meta = payload
        leaves = {}
        for key, enc in items.items():
            if len(enc) == 3:
                leaves[key] = self._from_triple(enc)
            else:
                layout, rows = enc
                leaves[key] = torch.nested.as_nested_tensor(
                    [self._from_triple(r) for r in rows], layout=getattr(torch, layout)
                )
        return _rebuild(batch_size, device, leaves), non_tensor, meta


class TDConsolidated:
    """(3) tensordict's own fast pickle path: ``consolidate(metadata=True)``, then pickle."""

    name = "td_consolidated"

    def encode(self, td, non_tensor, meta):
        if len(td.keys()) > 0:
            td = td.consolidate(metadata=True)
        return td, non_tensor, meta

    def decode(self, payload):
        return payload


class NumpyFloor:
    """(4) bare numpy arrays of the same bytes; ``torch.from_numpy`` views on the way back."""

    name = "numpy_floor"

    def encode(self, td, non_tensor, meta):
        items = {}
        for key, t in _leaves(td):
            if t.is_nested:
                if t.lengths() is not None or t._ragged_idx != 1:
                    raise NotImplementedError("numpy_floor ships plain jagged tensors (no holes, ragged dim 1)")
                items[key] = ("jagged", _to_triple(t.values()), _to_triple(t.offsets()))
            else:
                items[key] = ("dense", _to_triple(t))
        return (tuple(td.batch_size), items), non_tensor, meta

    @staticmethod
    def _view(triple: Triple) -> torch.Tensor:
        dtype, shape, data = triple
        with warnings.catch_warnings():  # arrays Ray hands back are read-only; see module doc
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(data)
        return raw.view(_dtype(dtype)).view(shape)

    def decode(self, payload):
        (batch_size, items), non_tensor, meta = payload
        leaves = {}
        for key, enc in items.items():
            if enc[0] == "jagged":
                leaves[key] = torch.nested.nested_tensor_from_jagged(self._view(enc[1]), self._view(enc[2]))
            else:
                leaves[key] = self._view(enc[1])
        return _rebuild(batch_size, None, leaves), non_tensor, meta


# ---------------------------------------------------------------------------------------------
# The real verl DataProto (optional).

VERL_ENV = "VERL_DATAPROTO_SERIALIZATION_METHOD"
_verl_reason: str | None | bool = False  # False: not checked yet


def verl_unavailable_reason() -> str | None:
    """None if ``verl.protocol.DataProto`` imports here, else why not."""
    global _verl_reason
    if _verl_reason is False:
        try:
            from verl.protocol import DataProto  # noqa: F401

            _verl_reason = None
        except Exception as exc:  # ImportError, or a broken dependency of verl
            _verl_reason = f"verl.protocol does not import: {type(exc).__name__}: {exc}"
    return _verl_reason


@contextlib.contextmanager
def _verl_mode(mode: str):
    old = os.environ.get(VERL_ENV)
    if mode == "numpy":
        os.environ[VERL_ENV] = "numpy"
    else:
        os.environ.pop(VERL_ENV, None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(VERL_ENV, None)
        else:
            os.environ[VERL_ENV] = old


class VerlPickled:
    """A DataProto that pickles through verl's own code in a fixed mode ("default" or "numpy")."""

    def __init__(self, dataproto, mode: str):
        self.dataproto = dataproto
        self.mode = mode

    def __getstate__(self):
        with _verl_mode(self.mode):
            return self.mode, self.dataproto.__getstate__()

    def __setstate__(self, state):
        from verl.protocol import DataProto

        self.mode, inner = state
        dataproto = DataProto.__new__(DataProto)
        with _verl_mode(self.mode):
            dataproto.__setstate__(inner)
        self.dataproto = dataproto


class VerlDataProto:
    """(5)/(6) ``verl.protocol.DataProto`` pickled by verl itself, in ``mode`` "default" or "numpy"."""

    def __init__(self, mode: str = "default"):
        if mode not in ("default", "numpy"):
            raise ValueError(f"mode must be 'default' or 'numpy', not {mode!r}")
        self.mode = mode
        self.name = "verl_dataproto" if mode == "default" else "verl_dataproto_numpy"

    def encode(self, td, non_tensor, meta):
        from verl.protocol import DataProto

        return VerlPickled(DataProto(batch=td, non_tensor_batch=non_tensor, meta_info=meta), self.mode)

    def decode(self, payload: VerlPickled):
        dp = payload.dataproto
        return dp.batch, dp.non_tensor_batch, dp.meta_info


def all_rivals(include_verl: bool = True) -> list[Any]:
    """Every rival usable here, in the order of the module docstring."""
    rivals: list[Any] = [VerlDefaultLike(), VerlNumpyLike(), TDConsolidated(), NumpyFloor()]
    if include_verl and verl_unavailable_reason() is None:
        rivals += [VerlDataProto("default"), VerlDataProto("numpy")]
    return rivals
