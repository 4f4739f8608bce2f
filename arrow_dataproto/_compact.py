"""verl DataProtos pickled as their tensors' bytes: no Arrow arrays, a few microseconds a column.

Under ``install()`` a verl DataProto crosses processes through Ray, whose pickle is trusted
(unpickling runs code anyway) and never read by another tool. There the Arrow form costs
per-object work that buys nothing: building, validating and reading Arrow arrays, inferring
the types of object columns (0.3-1 ms to encode, 0.5-1 ms to decode an object). Measured
through Ray to one actor that reads every tensor (``benchmarks/bench_verl_forms.py``), this
state encodes in 0.1-0.9 ms against 0.4-1.6 ms through Arrow, and the default receive's
``ray.get`` takes 0.6-0.9x as long as Arrow's, at every size from 1 to 64 MiB. In verl's
worker group at 2048 rows (``benchmarks/bench_verl_e2e.py``) the step came to 0.93-1.10x
the bare-numpy floor's (ten runs), against 1.04-1.16x through Arrow (five).

So :func:`state` gives a compact pickle state for a DataProto of plain content, and ``None``
for any other (which then pickles through Arrow): per tensor its name, dtype, shape and
bytes (a ``PickleBuffer``, out of band with protocol 5), jagged tensors as values and
offsets; ``non_tensor_batch`` and ``meta_info`` are pickled as they are. Only what is plain
is taken: CPU tensors outside autograd in a flat ``TensorDict`` (dense or jagged, a dtype of
:data:`~._dtypes.STORAGE`), numpy columns whose rows match. Anything else -- nested
TensorDicts, strided nested tensors, a device, a mismatch the Arrow encoder refuses with a
clear error -- is left to the Arrow path.

:func:`parts` rebuilds ``(batch, non_tensor_batch, meta_info)`` under the receive option
``copy``: ``"on_write"`` (the default) copies up to :data:`COPY_UP_TO` bytes of tensors and
gives larger ones as copy-on-write views of the received buffers (:func:`._shm.private_views`:
the same leases as the Arrow path, so a write stays in this process and the Ray object stays
pinned while a view lives); ``True`` copies; ``False`` views the received buffers (the
read-only contract). With ``device`` the tensors are moved there (the transfer is the copy).
A malformed state raises :class:`DecodeError`.
"""

from __future__ import annotations

import math
import pickle
import warnings
from typing import Any, Final

import numpy as np
import torch
from tensordict import TensorDict

from . import _jagged, _shm
from ._compat import ragged_idx, torch_function_off
from ._dtypes import STORAGE, dtype_from_name, dtype_name
from .errors import DecodeError, FormatVersionError, column_error

COPY_UP_TO: Final = 2 << 20
"""The most bytes of tensors that :func:`parts` copies given ``private``; more are
copy-on-write views. Through Ray (``benchmarks/bench_verl_forms.py``), the views' ``ray.get``
takes 1.2-2.2 ms at every size from 1 to 64 MiB, the copy's 1.4 ms at 1 MiB, 1.8 at 2, 2.4 at
4 and 30 at 64 MiB; a view also leaves a lease for a background thread to release (about
0.4 ms), a copy nothing. Up to 2 MiB the two cost about the same, and the copy is simpler
memory: private from the start, nothing pinned in Ray's store."""

VERSION: Final = 1
"""The compact state's layout: ``(VERSION, batch_size, device, columns, non_tensor_batch, meta_info)``."""

_CPU = torch.device("cpu")


def _raw(t: torch.Tensor) -> pickle.PickleBuffer:
    """The bytes of a contiguous CPU tensor, viewed (out of band under protocol 5)."""
    return pickle.PickleBuffer(t.reshape(-1).view(torch.uint8).numpy().data)


def _jagged_column(name: str, t: _jagged.JaggedTensor, shared: dict[int, int], index: int) -> tuple | None:
    """The column of jagged tensor ``t``, column number ``index``; ``None`` for
    one the compact state does not take (holes between rows, autograd). ``shared`` maps the
    ``id`` of each offsets tensor met to the first column holding it."""
    if t.lengths() is not None:
        return None
    values, offsets = _jagged.parts(t)
    if offsets.dtype != torch.int64 or values.requires_grad:
        return None
    owner = shared.setdefault(id(offsets), index)  # the same ragged structure as an earlier column
    start, end = int(offsets[0]), int(offsets[-1])
    if start != 0 or end != values.shape[0]:  # only this tensor's rows (offsets rebased alike for every sharer)
        values, offsets = values[start:end], offsets - start
    values = values.resolve_conj().resolve_neg().contiguous()  # (the bits resolved: a copy, as torch's own pickling makes)
    stored_offsets: Any = _raw(offsets.contiguous()) if owner == index else owner
    return name, dtype_name(t.dtype), tuple(values.shape), _raw(values), stored_offsets, ragged_idx(t)


def state(data: Any) -> tuple | None:
    """The compact pickle state of a DataProto (ours or verl's), or ``None`` when it holds
    anything but the plain content described above. Copies nothing of a contiguous tensor
    (a jagged tensor's rows are exported alone)."""
    batch, non_tensor, meta_info = data.batch, data.non_tensor_batch, data.meta_info
    if type(non_tensor) is not dict or type(meta_info) is not dict:
        return None
    columns: list[tuple] = []
    rows = None
    if batch is not None:
        if type(batch) is not TensorDict or batch.batch_dims < 1 or batch.device not in (None, _CPU):
            return None
        rows = batch.batch_size[0]
        shared: dict[int, int] = {}
        with torch_function_off():  # a jagged tensor's attribute reads: 0.1 us each, not 10
            for name, t in batch.items():
                if type(name) is not str or not isinstance(t, torch.Tensor) or t.device != _CPU:
                    return None
                if t.requires_grad or t.dtype not in STORAGE or name in non_tensor:
                    return None
                if _jagged.is_jagged(t):
                    column = _jagged_column(name, t, shared, len(columns))
                    if column is None:
                        return None
                elif t.is_nested or t.layout != torch.strided or t.dim() == 0:
                    return None
                else:
                    t = t.resolve_conj().resolve_neg().contiguous()  # a conjugate or negative view: resolved (a copy)
                    column = (name, dtype_name(t.dtype), tuple(t.shape), _raw(t), None, 0)
                columns.append(column)
    for name, values in non_tensor.items():
        if type(name) is not str or type(values) is not np.ndarray or values.ndim == 0:
            return None
        if rows is None:
            rows = len(values)
        if len(values) != rows:
            return None
    if batch is None:
        return (VERSION, None, None, columns, non_tensor, meta_info)
    device = None if batch.device is None else str(batch.device)
    return (VERSION, tuple(batch.batch_size), device, columns, non_tensor, meta_info)


# ---------------------------------------------------------------- decode


def _bytes(name: str, buffer: Any, nbytes: int, view: bool) -> torch.Tensor:
    """``nbytes`` received bytes as a flat ``uint8`` tensor: a copy, or (``view``) a view of them."""
    try:
        memory = memoryview(buffer).cast("B")
    except (TypeError, ValueError) as e:
        raise column_error(DecodeError, name, f"corrupt compact state: not a contiguous buffer ({e})") from None
    if memory.nbytes != nbytes:
        raise column_error(DecodeError, name, f"corrupt compact state: {memory.nbytes} bytes, the shape needs {nbytes}")
    if not nbytes:
        return torch.empty(0, dtype=torch.uint8)
    if not view:
        return torch.frombuffer(bytearray(memory), dtype=torch.uint8)
    with warnings.catch_warnings():  # a read-only buffer: the copy=False contract
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(memory, dtype=torch.uint8)


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    """``shape`` if it is a non-empty tuple of sizes in range, else :class:`DecodeError`."""
    if type(shape) is not tuple or not shape or not all(type(n) is int and 0 <= n < 2**62 for n in shape):
        raise column_error(DecodeError, name, f"corrupt compact state: shape {str(shape)[:60]}")
    return shape


def _tensor(name: str, dtype: torch.dtype, shape: tuple[int, ...], buffer: Any, view: bool) -> torch.Tensor:
    """The ``dtype`` tensor of ``shape`` held in ``buffer`` (which must hold exactly its bytes)."""
    count = math.prod(shape)
    if count > 2**62:
        raise column_error(DecodeError, name, f"corrupt compact state: shape {shape}")
    flat = _bytes(name, buffer, count * dtype.itemsize, view)
    if flat.data_ptr() % dtype.itemsize:  # a view of a misaligned buffer: torch crashes on misaligned complex128
        flat = flat.clone()
    return flat.view(dtype).view(shape)


def _offsets(name: str, stored: Any, columns: list[tuple], built: list[Any], rows: int, values: torch.Tensor, view: bool) -> torch.Tensor:
    """A jagged column's offsets: its own, checked, or those of the earlier column it shares them with."""
    if type(stored) is int:
        if not (0 <= stored < len(built) and columns[stored][4] is not None and type(columns[stored][4]) is not int):
            raise column_error(DecodeError, name, f"corrupt compact state: shares the offsets of column {stored}")
        offsets = _jagged.parts(built[stored])[1]
    else:
        offsets = _tensor(name, torch.int64, (rows + 1,), stored, view)
    if int(offsets[0]) != 0 or int(offsets[-1]) != values.shape[0] or bool((offsets[1:] < offsets[:-1]).any()):
        raise column_error(DecodeError, name, "corrupt compact state: offsets do not bound the values in order")
    return offsets


def _column(column: Any, rows: int, columns: list[tuple], built: list[Any], view: bool) -> torch.Tensor:
    """One column's tensor, dense or jagged (``built``: the columns before it, for shared offsets)."""
    if type(column) is not tuple or len(column) != 6 or type(column[0]) is not str:
        raise DecodeError(f"corrupt compact state: a column {str(column)[:60]}")
    name, dtype_text, shape, data, offsets, ragged = column
    if type(dtype_text) is not str:
        raise column_error(DecodeError, name, f"corrupt compact state: dtype {str(dtype_text)[:40]}")
    dtype = dtype_from_name(dtype_text, name)
    values = _tensor(name, dtype, _shape(name, shape), data, view)
    if offsets is None:
        return values
    if type(ragged) is not int or not 1 <= ragged <= values.dim():
        raise column_error(DecodeError, name, f"corrupt compact state: ragged dimension {str(ragged)[:20]}")
    return _jagged.build(values, _offsets(name, offsets, columns, built, rows, values, view), ragged)


def _batch(batch_size: Any, recorded: Any, columns: Any, view: bool, device: str | None) -> TensorDict:
    """The TensorDict of the state's columns, placed on ``device`` if given, else as recorded."""
    if type(batch_size) is not tuple or not batch_size or not all(type(n) is int and n >= 0 for n in batch_size):
        raise DecodeError(f"corrupt compact state: batch size {str(batch_size)[:60]}")
    if recorded not in (None, "cpu") or type(columns) is not list:
        raise DecodeError("corrupt compact state: its device or columns")
    built: list[Any] = []
    with torch_function_off():
        for column in columns:
            built.append(_column(column, batch_size[0], columns, built, view))
    names = [c[0] for c in columns]
    if len(set(names)) != len(names):
        raise DecodeError(f"corrupt compact state: repeated column names {names}")
    target = torch.device(device) if device is not None else None
    if target is not None and target.type != "cpu":
        built = [t.to(target) for t in built]
    try:
        return TensorDict(dict(zip(names, built)), batch_size=list(batch_size), device=target or recorded)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise DecodeError(f"corrupt compact state: tensors do not fit batch_size {list(batch_size)}: {e}") from e


def _buffers(columns: list) -> list:
    """The received buffer objects of well-formed columns (a malformed column is refused later, by :func:`_column`)."""
    found = []
    for column in columns:
        if type(column) is tuple and len(column) == 6:
            found.append(column[3])
            if column[4] is not None and type(column[4]) is not int:
                found.append(column[4])
    return found


def _private(columns: list) -> list | None:
    """``columns`` with each buffer swapped for a copy-on-write view of it (a copy where it is
    not in Ray's store), when they hold more than :data:`COPY_UP_TO` bytes; ``None`` when they
    hold less, or a buffer is not one (the columns are then copied, or refused)."""
    received = _buffers(columns)
    try:
        if sum(memoryview(b).nbytes for b in received) <= COPY_UP_TO:
            return None
        swap = _shm.private_views_by_id(received)
    except (TypeError, ValueError, BufferError):  # not a contiguous buffer: _column refuses it
        return None

    def private(column: Any) -> Any:
        if type(column) is not tuple or len(column) != 6:
            return column
        name, dtype, shape, data, offsets, ragged = column
        return name, dtype, shape, swap.get(id(data), data), swap.get(id(offsets), offsets), ragged

    return [private(c) for c in columns]


def parts(compact: Any, *, copy: bool | str, device: str | None, private: bool) -> tuple[TensorDict | None, dict, dict]:
    """``(batch, non_tensor_batch, meta_info)`` of a state made by :func:`state`.

    Tensors with ``private`` (the caller's receive options say copy-on-write views:
    :attr:`~arrow_dataproto.ReceiveOptions.copy_on_write_views`): copies up to
    :data:`COPY_UP_TO` bytes, else copy-on-write views (see the module); otherwise copies,
    or with ``copy=False`` views of the received buffers. With ``device`` they are moved
    there (the transfer is the copy). Numeric numpy columns are copies, or with
    ``copy=False`` the arrays as unpickled. :class:`DecodeError` for a malformed state;
    :class:`FormatVersionError` (a ``DecodeError``) for another version's."""
    if type(compact) is not tuple or len(compact) != 6:
        raise DecodeError(f"corrupt compact state: {str(compact)[:60]}")
    version, batch_size, recorded, columns, non_tensor, meta_info = compact
    if type(version) is not int or version != VERSION:
        raise FormatVersionError(f"compact state of version {str(version)[:20]}; this reader knows {VERSION}")
    if type(non_tensor) is not dict or type(meta_info) is not dict:
        raise DecodeError("corrupt compact state: non_tensor_batch and meta_info must be dicts")
    view = copy is False
    swapped = _private(columns) if private and type(columns) is list else None
    if swapped is not None:
        columns, view = swapped, True
    batch = None if batch_size is None else _batch(batch_size, recorded, columns, view, device)
    if copy is not False:
        for key, values in non_tensor.items():
            if isinstance(values, np.ndarray) and values.dtype != object and values.base is not None:
                non_tensor[key] = np.array(values)
    return batch, non_tensor, meta_info
