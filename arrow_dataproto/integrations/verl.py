"""Make verl's own ``DataProto`` pickle through Arrow.

::

    from arrow_dataproto.integrations import verl as adp_verl
    adp_verl.install()      # this process: verl.protocol.DataProto now pickles as Arrow

After :func:`install`, pickling a ``verl.protocol.DataProto`` -- ``pickle``,
``ray.put``, a Ray task or actor argument or return value, verl's
``save_to_disk`` -- encodes it with :func:`arrow_dataproto.to_arrow`; under
pickle protocol 5 (Ray) every tensor's bytes travel out of band, so Ray copies
them once into its object store. The pickle names :func:`rebuild`, so any
process where arrow-dataproto is importable unpickles it as verl's own class,
patched or not, under that process's :class:`~arrow_dataproto.ReceiveOptions`
(by default tensors own their memory; ``copy=False`` views the received
buffers, read-only contract; ``device=`` decodes onto a device). Only the three
fields travel: attributes a subclass adds are not carried.

A patched class still loads what an unpatched verl pickled: both its default
state (the batch as ``torch.save`` bytes) and its
``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy`` state, told apart by the state
itself, so sender and receiver need not agree on any setting.

Selection by environment, as verl selects its numpy mode:
:func:`install_from_env` installs when ``VERL_DATAPROTO_SERIALIZATION_METHOD``
is ``arrow``. A variable cannot change a class in a process that never imports
this module, so Ray workers run it as their setup hook::

    ray.init(runtime_env={
        "env_vars": {"VERL_DATAPROTO_SERIALIZATION_METHOD": "arrow"},
        "worker_process_setup_hook": "arrow_dataproto.integrations.verl.install_from_env",
    })

and the driver calls ``install_from_env()`` (or ``install()``) itself. Name
``...verl.install`` as the hook instead to patch regardless of the variable.
Mixed processes interoperate: an unpatched verl takes ``arrow`` for its default
mode, so a process without the hook sends ``torch.save`` states, which patched
processes load, and loads their Arrow pickles through :func:`rebuild`.

``copy.copy`` and ``copy.deepcopy`` of a patched object do not go through the
codec: both give new tensors (as verl's pickling-based copies do), ``copy.copy``
shares ``non_tensor_batch`` and ``meta_info``, ``copy.deepcopy`` copies them too.
"""

from __future__ import annotations

import copy
import io
import math
import os
import pickle
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, is_tensor_collection

from .._codec import device_available, to_arrow
from .._dtypes import dtype_from_name
from ..errors import DecodeError, column_error
from ..pickling import get_receive_options, rebuild_dataproto, transport_state

__all__ = [
    "ENV_VAR",
    "VerlNotFoundError",
    "install",
    "install_from_env",
    "is_installed",
    "load_state",
    "rebuild",
    "unpickle",
    "VerlState",
    "uninstall",
    "verl_dataproto_class",
]

ENV_VAR = "VERL_DATAPROTO_SERIALIZATION_METHOD"
"""verl's own switch between its pickling modes; the value ``arrow`` selects this one."""

_PATCHED = ("__reduce_ex__", "__setstate__", "__copy__", "__deepcopy__")
_ABSENT = object()
_originals: dict[type, dict[str, Any]] = {}  # patched class -> what its __dict__ held before


class VerlNotFoundError(ImportError):
    """``verl.protocol`` cannot be imported in this process (verl or one of its imports is missing)."""


def verl_dataproto_class() -> type:
    """``verl.protocol.DataProto``; :class:`VerlNotFoundError` when verl cannot be imported."""
    try:
        from verl.protocol import DataProto
    except ImportError as e:
        raise VerlNotFoundError(
            f"arrow_dataproto.integrations.verl needs verl: `import verl.protocol` failed ({e})"
        ) from e
    return DataProto


# ---------------------------------------------------------------- patching


def install(cls: type | None = None) -> type:
    """Make ``cls`` (default ``verl.protocol.DataProto``) pickle through Arrow; returns the class.

    Patches the class in this process only (subclasses inherit the patch);
    calling it again does nothing. Raises :class:`VerlNotFoundError` when
    ``cls`` is omitted and verl cannot be imported.
    """
    cls = verl_dataproto_class() if cls is None else cls
    if cls not in _originals:
        _originals[cls] = {name: cls.__dict__.get(name, _ABSENT) for name in _PATCHED}
        for name, method in zip(_PATCHED, (_reduce_ex, load_state, _copy, _deepcopy)):
            setattr(cls, name, method)
    return cls


def uninstall(cls: type | None = None) -> None:
    """Restore the pickling ``cls`` (default ``verl.protocol.DataProto``) had before :func:`install`.

    A class that is not patched is left alone. Objects pickled while patched
    still load afterwards (their pickles name :func:`rebuild`).
    """
    cls = verl_dataproto_class() if cls is None else cls
    for name, original in _originals.pop(cls, {}).items():
        if original is _ABSENT:
            delattr(cls, name)
        else:
            setattr(cls, name, original)


def is_installed(cls: type | None = None) -> bool:
    """Whether ``cls`` (default ``verl.protocol.DataProto``) is patched in this process."""
    return (verl_dataproto_class() if cls is None else cls) in _originals


def install_from_env() -> bool:
    """:func:`install` if ``VERL_DATAPROTO_SERIALIZATION_METHOD`` is ``arrow``; returns whether it did.

    Meant as Ray's ``worker_process_setup_hook`` (see the module docstring).
    Any other value, or none, leaves verl's own pickling in place.
    """
    if os.environ.get(ENV_VAR) != "arrow":
        return False
    install()
    return True


def _new(cls: type[object], batch: Any, non_tensor_batch: dict, meta_info: dict) -> Any:
    """An instance of ``cls`` holding the three fields, set as unpickling sets them (no constructor checks)."""
    obj: Any = cls.__new__(cls)  # verl's DataProto, untyped here
    obj.batch, obj.non_tensor_batch, obj.meta_info = batch, non_tensor_batch, meta_info
    return obj


def _reduce_ex(self, protocol: int) -> tuple:
    return rebuild, (type(self), *transport_state(to_arrow(self)))


def rebuild(cls: type, schema_bytes: bytes, num_rows: int, columns: list[tuple]) -> Any:
    """Unpickle an Arrow-pickled DataProto as ``cls`` (the function patched pickles name).

    Decodes under :func:`~arrow_dataproto.get_receive_options`, which validates
    the payload (rows of every column, shapes, offsets) and raises
    :class:`DecodeError` for a malformed one; ``cls``'s constructor is not run again.
    """
    decoded = rebuild_dataproto(schema_bytes, num_rows, columns)
    return _new(cls, decoded.batch, decoded.non_tensor_batch, decoded.meta_info)


def _copy(self) -> Any:
    batch = None if self.batch is None else self.batch.clone()
    return _new(type(self), batch, self.non_tensor_batch, self.meta_info)


def _deepcopy(self, memo: dict) -> Any:
    batch = None if self.batch is None else self.batch.clone()
    result = _new(type(self), batch, copy.deepcopy(self.non_tensor_batch, memo), copy.deepcopy(self.meta_info, memo))
    memo[id(self)] = result
    return result


# ---------------------------------------------------------------- states pickled by an unpatched verl


def load_state(self: Any, state: Any) -> None:
    """Set ``self``'s three fields from a state pickled by an unpatched verl:
    ``(encoded_batch, non_tensor_batch, meta_info)`` (the patched ``__setstate__``; any
    object with the three attributes will do, verl need not be installed).

    ``encoded_batch`` is ``torch.save`` bytes (verl's default mode), a
    ``(batch_size, device, items)`` tuple (its numpy mode) or ``None``. Tensors
    always own their memory (``ReceiveOptions.copy`` does not apply); they go to
    ``ReceiveOptions.device`` if set, else to the recorded device, or the CPU if
    this process lacks it. Raises :class:`DecodeError` for any other state.
    """
    if not (isinstance(state, tuple) and len(state) == 3):
        raise DecodeError(f"not a verl DataProto state: expected a 3-tuple, got {_describe(state)}")
    encoded, non_tensor_batch, meta_info = state
    if encoded is None:
        batch = None
    elif isinstance(encoded, (bytes, bytearray, memoryview)):
        batch = _load_torch_save(encoded)
    elif isinstance(encoded, tuple):
        batch = load_numpy_mode(encoded)
    else:
        raise DecodeError(f"verl DataProto state: the batch is neither bytes nor a tuple but {_describe(encoded)}")
    _check_parts(batch, non_tensor_batch, meta_info)
    self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


class VerlState:
    """What a pickle of verl's ``DataProto`` loads into under :func:`unpickle`: an object with
    its ``batch``, ``non_tensor_batch`` and ``meta_info``, decoded by :func:`load_state`."""

    batch: Any
    non_tensor_batch: dict
    meta_info: dict

    def __setstate__(self, state: Any) -> None:
        load_state(self, state)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("verl.protocol", "DataProto"):
            return VerlState
        return super().find_class(module, name)


def unpickle(file: Any) -> Any:
    """Unpickle a binary file object, loading verl's ``DataProto`` as a :class:`VerlState`
    (verl need not be installed; both of verl's modes); everything else loads as usual.

    This runs whatever code the pickle names: only for files you trust. Errors are the
    unpickler's, or :class:`DecodeError` for a verl state that does not decode.
    """
    return _Unpickler(file).load()


def _describe(value: Any) -> str:
    return f"{type(value).__name__} of length {len(value)}" if isinstance(value, (tuple, list)) else type(value).__name__


def _check_parts(batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
    """What verl's constructor asserts: one batch dimension, numpy arrays with the batch's rows, dicts."""
    if batch is not None and batch.batch_dims != 1:
        raise DecodeError(f"verl DataProto state: batch_size {list(batch.batch_size)} must have one dimension")
    if not isinstance(non_tensor_batch, dict) or not isinstance(meta_info, dict):
        raise DecodeError(
            "verl DataProto state: non_tensor_batch and meta_info must be dicts, got "
            f"{type(non_tensor_batch).__name__} and {type(meta_info).__name__}"
        )
    for key, values in non_tensor_batch.items():
        if not isinstance(values, np.ndarray) or values.ndim == 0:
            raise column_error(DecodeError, str(key), f"expected a numpy array with rows, got {_describe(values)}")
        if batch is not None and len(values) != batch.batch_size[0]:
            raise column_error(DecodeError, str(key), f"{len(values)} rows, the batch has {batch.batch_size[0]}")


def _here_or_cpu(storage: Any, location: str) -> Any:
    """``torch.load`` map_location: keep the saved device if this process has it, else the CPU."""
    return None if device_available(location) else storage


def _load_torch_save(data: bytes | bytearray | memoryview) -> TensorDict | None:
    """The batch of verl's default mode: a (consolidated) TensorDict or ``None`` written by ``torch.save``.

    ``weights_only=False`` because the bytes hold a pickled TensorDict: this
    trusts the sender no more than unpickling the surrounding state already does.
    """
    try:
        batch = torch.load(io.BytesIO(data), weights_only=False, map_location=_here_or_cpu)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, ImportError) as e:
        raise DecodeError(f"verl DataProto state: the torch.save batch does not load: {e}") from e
    if batch is not None and not is_tensor_collection(batch):
        raise DecodeError(f"verl DataProto state: torch.save holds a {type(batch).__name__}, not a TensorDict")
    device = get_receive_options().device
    return batch if batch is None or device is None else batch.to(device)


def load_numpy_mode(encoded: tuple) -> TensorDict:
    """The batch of verl's numpy mode: ``(batch_size, device, {key: entry})`` where an entry is
    ``(dtype_name, shape, uint8_array)`` for a dense tensor or ``(layout_name, [such triples])``
    for a nested tensor, one triple per row."""
    if len(encoded) != 3:
        raise DecodeError(f"verl numpy-mode batch: expected (batch_size, device, items), got {_describe(encoded)}")
    batch_size, device, items = encoded
    if not (isinstance(batch_size, (tuple, list)) and all(isinstance(n, int) and n >= 0 for n in batch_size)):
        raise DecodeError(f"verl numpy-mode batch: malformed batch_size {batch_size!r}")
    if not (device is None or isinstance(device, str)) or not isinstance(items, dict):
        raise DecodeError(f"verl numpy-mode batch: malformed device {device!r} or items {_describe(items)}")
    tensors = {}
    for key, entry in items.items():
        if not isinstance(key, str) or not isinstance(entry, tuple) or len(entry) not in (2, 3):
            raise DecodeError(f"verl numpy-mode batch: malformed entry {key!r}: {_describe(entry)}")
        tensors[key] = legacy_tensor(key, entry) if len(entry) == 3 else _legacy_nested(key, *entry)
    target = get_receive_options().device or (device if device is None or device_available(device) else "cpu")
    try:
        return TensorDict(tensors, batch_size=list(batch_size), device=target)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise DecodeError(f"verl numpy-mode batch: tensors do not fit batch_size {list(batch_size)}: {e}") from e


def legacy_tensor(key: str, entry: tuple, row: int | None = None) -> torch.Tensor:
    """One ``(dtype_name, shape, uint8_array)`` triple as a tensor that owns a copy of the bytes."""
    where = key if row is None else f"{key}[{row}]"
    name, shape, data = entry
    if not isinstance(name, str):
        raise column_error(DecodeError, where, f"dtype name must be a str, got {type(name).__name__}")
    dtype = dtype_from_name(name, where)
    if not (isinstance(shape, (tuple, list)) and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise column_error(DecodeError, where, f"malformed shape {shape!r}")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1):
        raise column_error(DecodeError, where, f"expected a 1-D uint8 numpy array, got {_describe(data)}")
    expected = math.prod(shape) * dtype.itemsize
    if data.size != expected:
        raise column_error(DecodeError, where, f"{data.size} bytes for shape {list(shape)} of {name} ({expected})")
    return torch.from_numpy(data.copy()).view(dtype).view(tuple(shape))


def _legacy_nested(key: str, layout: Any, rows: Any) -> torch.Tensor:
    if layout not in ("jagged", "strided") or not isinstance(rows, list):
        raise column_error(DecodeError, key, f"malformed nested entry ({layout!r}, {_describe(rows)})")
    tensors = []
    for i, entry in enumerate(rows):
        if not (isinstance(entry, tuple) and len(entry) == 3):
            raise column_error(DecodeError, f"{key}[{i}]", f"expected a (dtype, shape, bytes) triple, got {_describe(entry)}")
        tensors.append(legacy_tensor(key, entry, i))
    try:
        return torch.nested.as_nested_tensor(tensors, layout=getattr(torch, layout))
    except (RuntimeError, ValueError, TypeError) as e:
        raise column_error(DecodeError, key, f"rows do not form a {layout} nested tensor: {e}") from e
