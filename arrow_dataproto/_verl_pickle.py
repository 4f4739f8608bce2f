"""verl's own pickles of its ``DataProto``, read without verl and without trusting numpy's unpickling.

An unpatched verl pickles its ``DataProto`` as ``(encoded_batch, non_tensor_batch,
meta_info)``: the batch as ``torch.save`` bytes (its default mode) or as
``(batch_size, device, items)`` (its numpy mode, ``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy``).
:func:`load_state` decodes either (verl's patched ``__setstate__``, see
:mod:`arrow_dataproto.integrations.verl`); :func:`unpickle` reads a whole file, verl's class
replaced by :class:`VerlState` (what :meth:`DataProto.load_from_disk` and the command line's
``convert`` read). Tensors of these states own their memory. torch and numpy are imported
when a state is decoded, not with this module (the Ray setup hook imports it).
"""

from __future__ import annotations

import os
import pickle
import types
from typing import TYPE_CHECKING, Any

from . import _compat
from .errors import DecodeError, column_error

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from ._container import DataProto


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
    encoded, non_tensor_batch, meta_info = _resolve(state, 0)
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


# CPython's C unpickler sizes its memo table by the largest index a PUT opcode names, so one
# damaged index allocates gigabytes; the pure-Python unpickler keeps its memo in a dict.
# Slower per opcode, but a verl pickle is a few opcodes per array (the bytes in one frame).
_PythonUnpickler = _compat.PythonUnpickler
_PYTHON_PICKLE = types.SimpleNamespace(__name__="pickle", Unpickler=_compat.PythonUnpickler, load=_compat.python_pickle_load)


class _Unpickler(_PythonUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("verl.protocol", "DataProto"):
            return VerlState
        if module in _NUMPY_MODULES and name in _NUMPY_STANDINS:
            return _NUMPY_STANDINS[name]
        return super().find_class(module, name)


def unpickle(file: Any) -> Any:
    """Unpickle a binary file object, loading verl's ``DataProto`` as a :class:`VerlState`
    (verl need not be installed; both of verl's modes); everything else loads as usual.

    This runs whatever code the pickle names: only for files you trust. numpy
    arrays, dtypes and scalars are rebuilt by checked stand-ins, so that a
    damaged file cannot crash numpy's own unpickling: their dtype states must be
    those numpy writes for a built-in dtype, their shapes must match their bytes
    (or, for object arrays, their items); an array is resolved in the containers
    that hold it (dicts, lists, tuples, sets, object arrays, the DataProto's
    fields), not inside the attributes of other objects. Every error, the
    unpickler's included, is a :class:`DecodeError`.
    """
    try:
        return _resolve(_Unpickler(file).load(), 0)
    except DecodeError:
        raise
    except Exception as e:  # noqa: BLE001 -- a damaged pickle can raise anything the objects it names raise
        raise DecodeError(f"not a readable DataProto pickle: {type(e).__name__}: {e}") from e


def load_pickle(path: str | os.PathLike) -> DataProto:
    """The DataProto pickled in the file at ``path``, by verl's ``save_to_disk`` (either mode;
    verl need not be installed) or by ``pickle.dump`` of ours, as our :class:`DataProto`.

    This runs whatever code the file names (see :func:`unpickle`): only for files you trust.
    A file that is no readable pickle, or holds something else, raises :class:`DecodeError`.
    """
    from ._container import DataProto, assemble  # the container imports this module when it reads a pickle

    with open(path, "rb") as f:
        try:
            loaded = unpickle(f)
        except DecodeError as e:  # every error of a damaged pickle (unpickle's contract)
            raise DecodeError(f"{os.fspath(path)!r} is neither an Arrow file nor a readable DataProto pickle: {e}") from e
    if isinstance(loaded, DataProto):
        return loaded
    if isinstance(loaded, VerlState):
        return assemble(DataProto, loaded.batch, loaded.non_tensor_batch, loaded.meta_info)
    raise DecodeError(f"{os.fspath(path)!r}: the pickle holds a {type(loaded).__name__}, not a DataProto")


# ---------------------------------------------------------------- numpy rebuilt with checks

_NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric", "numpy")
_MAX_DEPTH = 200  # containers nested deeper than this are refused, before Python's recursion limit


class _Dtype:
    """Stands for ``numpy.dtype(name, align, copy)`` until its state is checked."""

    def __init__(self, name: Any, align: Any = False, copy: Any = True):
        import numpy as np

        if not isinstance(name, str) or len(name) > 16 or not isinstance(align, bool):
            raise DecodeError(f"pickled numpy dtype: malformed arguments {str(name)[:40]!r}, {align!r}")
        try:
            self.value = np.dtype(name, align=align)
        except (TypeError, ValueError) as e:
            raise DecodeError(f"pickled numpy dtype {name!r}: {e}") from e
        if self.value.fields is not None or self.value.subdtype is not None:
            raise DecodeError(f"pickled numpy dtype {name!r}: structured and sub-array dtypes are not read")

    def __setstate__(self, state: Any) -> None:
        if self.value.kind in "mM" and isinstance(state, tuple) and len(state) == 9:
            self.value = _datetime_dtype(self.value, state[8])
        expected = self.value.__reduce__()[2]
        if state != expected:  # a state numpy did not write for this dtype: flags, sizes or fields edited
            raise DecodeError(f"pickled numpy dtype {self.value}: state {str(state)[:80]} is not {expected}")


def _datetime_dtype(generic: Any, metadata: Any) -> Any:
    """The datetime64/timedelta64 dtype whose unit the state's metadata ``(None, (unit, count, 1, 1))`` names."""
    import numpy as np

    try:
        unit, count = metadata[1][0], metadata[1][1]
        if isinstance(unit, bytes) and type(count) is int and 0 < count < 2**31 and len(unit) <= 8:
            return np.dtype(f"{generic.str}[{count}{unit.decode('ascii')}]")
    except (TypeError, IndexError, KeyError, ValueError, UnicodeDecodeError):
        pass
    raise DecodeError(f"pickled numpy dtype {generic}: malformed unit {str(metadata)[:80]}")


def _dtype_of(value: Any) -> Any:
    import numpy as np

    if isinstance(value, _Dtype):
        return value.value
    if isinstance(value, np.dtype) and value.fields is None and value.subdtype is None:
        return value
    raise DecodeError(f"pickled numpy value: expected a dtype, got {type(value).__name__}")


def _checked_shape(shape: Any, dtype: Any) -> tuple[int, ...]:
    if not (isinstance(shape, tuple) and len(shape) <= 64 and all(type(n) is int and n >= 0 for n in shape)):
        raise DecodeError(f"pickled numpy array: malformed shape {str(shape)[:80]}")
    count = 1
    for n in shape:
        count *= n
    if count * max(dtype.itemsize, 1) >= 2**62:
        raise DecodeError(f"pickled numpy array: shape {shape} is too large")
    return shape


class _Array:
    """Stands for ``numpy.ndarray`` (``_reconstruct``) until its state is checked; ``value`` is the array."""

    def __init__(self, cls: Any = None, shape: Any = (0,), code: Any = b"b"):
        import numpy as np

        if cls is not np.ndarray:
            raise DecodeError(f"pickled numpy array of class {getattr(cls, '__name__', cls)!r}: only ndarray is read")
        self.value: Any = None

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5 and type(state[0]) is int):
            raise DecodeError(f"pickled numpy array: malformed state {_describe(state)}")
        _, shape, dtype, fortran, data = state
        self.value = _build_array(data, _dtype_of(dtype), shape, "F" if fortran is True else "C")


def _build_array(data: Any, dtype: Any, shape: Any, order: str) -> Any:
    """A new array of ``dtype`` and ``shape`` from ``data`` (bytes, or for object arrays a list), checked first."""
    import numpy as np

    shape = _checked_shape(shape, dtype)
    count = 1
    for n in shape:
        count *= n
    if dtype.hasobject:
        if dtype != np.dtype(object) or not isinstance(data, list) or len(data) != count:
            raise DecodeError(f"pickled object array: {_describe(data)} for shape {shape}")
        out = np.empty(count, dtype=object)
        for i, item in enumerate(data):
            out[i] = _resolve(item, 1)
        return out.reshape(shape, order=order)  # type: ignore[call-overload]
    if isinstance(data, pickle.PickleBuffer):
        data = data.raw()
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != count * dtype.itemsize:
        size = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__
        raise DecodeError(f"pickled numpy array: {size} bytes for shape {shape} of {dtype}")
    out = np.frombuffer(data, dtype=dtype, count=count)
    if dtype.kind == "U":
        from ._objects import beyond_unicode

        code = beyond_unicode(out)
        if code is not None:
            raise DecodeError(f"pickled numpy {dtype} array: a value holds {code:#x}, beyond Unicode (U+10FFFF)")
    return out.reshape(shape, order=order).copy(order="K")  # type: ignore[call-overload]


def _frombuffer(data: Any, dtype: Any, shape: Any, order: Any) -> Any:
    return _build_array(data, _dtype_of(dtype), shape, "F" if order == "F" else "C")


def _scalar(dtype: Any, data: Any = None) -> Any:
    import numpy as np

    dtype = _dtype_of(dtype)
    if dtype.hasobject:  # numpy would read the bytes as an object pointer
        raise DecodeError("pickled numpy scalar of object dtype")
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise DecodeError(f"pickled numpy scalar of {dtype}: {_describe(data)}")
    return np.frombuffer(data, dtype=dtype)[0].copy()


_NUMPY_STANDINS = {"_reconstruct": _Array, "dtype": _Dtype, "scalar": _scalar, "_frombuffer": _frombuffer}


def _resolve(value: Any, depth: int) -> Any:
    """``value`` with each stand-in replaced by what it stands for, in dicts, lists, tuples, sets
    and the fields of a :class:`VerlState`."""
    if isinstance(value, (_Array, _Dtype)):
        if value.value is None:
            raise DecodeError("pickled numpy array without its state")
        return value.value
    if depth > _MAX_DEPTH and isinstance(value, (dict, list, tuple, set, VerlState)):
        raise DecodeError(f"pickled value nested deeper than {_MAX_DEPTH} containers")
    if isinstance(value, dict):
        for key, item in value.items():
            new = _resolve(item, depth + 1)
            if new is not item:
                value[key] = new
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = _resolve(item, depth + 1)
    elif type(value) is tuple:
        items = tuple(_resolve(item, depth + 1) for item in value)
        if any(a is not b for a, b in zip(items, value)):
            return items
    elif type(value) is set:
        return {_resolve(item, depth + 1) for item in value}
    elif isinstance(value, VerlState):  # one rebuilt by a reduce function (the compact pickle), not by load_state
        value.non_tensor_batch = _resolve(value.non_tensor_batch, depth + 1)
        value.meta_info = _resolve(value.meta_info, depth + 1)
    return value


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
    import numpy as np

    for key, values in non_tensor_batch.items():
        if not isinstance(values, np.ndarray) or values.ndim == 0:
            raise column_error(DecodeError, str(key), f"expected a numpy array with rows, got {_describe(values)}")
        if batch is not None and len(values) != batch.batch_size[0]:
            raise column_error(DecodeError, str(key), f"{len(values)} rows, the batch has {batch.batch_size[0]}")


def _here_or_cpu(storage: Any, location: str) -> Any:
    """``torch.load`` map_location: keep the saved device if this process has it, else the CPU."""
    from ._codec import device_available

    return None if device_available(location) else storage


def _load_torch_save(data: bytes | bytearray | memoryview) -> TensorDict | None:
    """The batch of verl's default mode: a (consolidated) TensorDict or ``None`` written by ``torch.save``.

    ``weights_only=False`` because the bytes hold a pickled TensorDict: this
    trusts the sender no more than unpickling the surrounding state already does.
    """
    import io

    import torch
    from tensordict import is_tensor_collection

    from .pickling import get_receive_options

    try:
        batch = torch.load(io.BytesIO(data), weights_only=False, map_location=_here_or_cpu, pickle_module=_PYTHON_PICKLE)
    except Exception as e:  # noqa: BLE001 -- damaged bytes can raise anything the objects they name raise
        raise DecodeError(f"verl DataProto state: the torch.save batch does not load: {type(e).__name__}: {e}") from e
    if batch is not None and not is_tensor_collection(batch):
        raise DecodeError(f"verl DataProto state: torch.save holds a {type(batch).__name__}, not a TensorDict")
    device = get_receive_options().device
    return batch if batch is None or device is None else batch.to(device)


def load_numpy_mode(encoded: tuple) -> TensorDict:
    """The batch of verl's numpy mode: ``(batch_size, device, {key: entry})`` where an entry is
    ``(dtype_name, shape, uint8_array)`` for a dense tensor or ``(layout_name, [such triples])``
    for a nested tensor, one triple per row."""
    from tensordict import TensorDict

    from ._codec import device_available
    from .pickling import get_receive_options

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
    import math

    import numpy as np
    import torch

    from ._dtypes import dtype_from_name

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
    import torch

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
