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
(by default, copy-on-write views of Ray's shared-memory object store:
private to this process, a write copies only the pages it touches; buffers
not in shared memory are copied; ``copy=True`` copies every tensor,
``copy=False`` views the received buffers, read-only contract; ``device=``
decodes onto a device). Only the three
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
import importlib.abc
import importlib.machinery
import os
import pickle
import sys
import types
from typing import TYPE_CHECKING, Any

from ..errors import DecodeError, column_error

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

__all__ = [
    "ENV_VAR",
    "from_verl",
    "save_verl_readable",
    "to_verl",
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

    Meant as Ray's ``worker_process_setup_hook`` (see the module docstring), so
    it imports nothing heavy: if ``verl.protocol`` is not imported yet, the class
    is patched when it is (an import hook on ``sys.meta_path``, removed once it
    has fired). A worker that never imports verl pays nothing, and torch is not
    imported before Ray has set the worker's ``OMP_NUM_THREADS``. Any other
    value, or none, leaves verl's own pickling in place.
    """
    if os.environ.get(ENV_VAR) != "arrow":
        return False
    if _VERL_MODULE in sys.modules:
        install()
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
    return True


_VERL_MODULE = "verl.protocol"


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``verl.protocol`` with the other finders and runs :func:`install` on its class once it has loaded."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _VERL_MODULE:
            return None
        sys.meta_path.remove(self)  # fires once; the other finders locate the module
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        spec.loader = _InstallingLoader(spec.loader)
        return spec


class _InstallingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        install(module.DataProto)


def _new(cls: type[object], batch: Any, non_tensor_batch: dict, meta_info: dict) -> Any:
    """An instance of ``cls`` holding the three fields, set as unpickling sets them (no constructor checks)."""
    obj: Any = cls.__new__(cls)  # verl's DataProto, untyped here
    obj.batch, obj.non_tensor_batch, obj.meta_info = batch, non_tensor_batch, meta_info
    return obj


def _reduce_ex(self, protocol: int) -> tuple:
    from .._codec import to_arrow
    from ..pickling import transport_state

    return rebuild, (type(self), *transport_state(to_arrow(self)))


def rebuild(cls: type, schema_bytes: bytes, num_rows: int, columns: list[tuple]) -> Any:
    """Unpickle an Arrow-pickled DataProto as ``cls`` (the function patched pickles name).

    Decodes under :func:`~arrow_dataproto.get_receive_options`, which validates
    the payload (rows of every column, shapes, offsets) and raises
    :class:`DecodeError` for a malformed one; ``cls``'s constructor is not run again.
    """
    from ..pickling import rebuild_dataproto

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


# ---------------------------------------------------------------- across the two classes


def to_verl(data: Any) -> Any:
    """``data`` (an :class:`arrow_dataproto.DataProto`) as verl's ``DataProto``, sharing its
    TensorDict and arrays: zero-copy, no constructor checks (ours has made them). What
    verl's worker groups accept (their dispatch asserts verl's own class). Raises
    :class:`VerlNotFoundError` without verl."""
    return _new(verl_dataproto_class(), data.batch, data.non_tensor_batch, data.meta_info)


def from_verl(data: Any) -> Any:
    """verl's ``DataProto`` (or any object with its three fields) as an
    :class:`arrow_dataproto.DataProto` over the same TensorDict: zero-copy for the tensors;
    ``non_tensor_batch`` and ``meta_info`` are new dicts of the same values (lists become
    object arrays, as in our constructor)."""
    from .._container import DataProto

    return DataProto(data.batch, data.non_tensor_batch, data.meta_info)


def save_verl_readable(data: Any, path: str | os.PathLike) -> None:
    """Write verl's ``DataProto`` ``data`` as verl's own ``save_to_disk`` writes it without
    this library: verl's ``__getstate__`` (its default or numpy mode, as
    ``VERL_DATAPROTO_SERIALIZATION_METHOD`` selects; ``arrow`` counts as the default), so that
    an environment without arrow-dataproto reads it with ``DataProto.load_from_disk``.
    Under :func:`install`, verl's ``save_to_disk`` writes an Arrow pickle instead, which
    needs this library to load."""
    import copyreg

    cls = type(data)
    state = cls.__getstate__(data)  # verl's own: install() patches only __reduce_ex__ and __setstate__

    class _Pickler(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if obj is data:
                return copyreg.__newobj__, (cls,), state  # type: ignore[attr-defined]
            return NotImplemented

    with open(path, "wb") as f:
        _Pickler(f).dump(data)


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
_PythonUnpickler = pickle._Unpickler
_PYTHON_PICKLE = types.SimpleNamespace(__name__="pickle", Unpickler=_PythonUnpickler, load=pickle._load)  # type: ignore[attr-defined]


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
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order=order).copy(order="K")  # type: ignore[call-overload]


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
    """``value`` with each stand-in replaced by what it stands for, in dicts, lists, tuples and sets."""
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
    from .._codec import device_available

    return None if device_available(location) else storage


def _load_torch_save(data: bytes | bytearray | memoryview) -> TensorDict | None:
    """The batch of verl's default mode: a (consolidated) TensorDict or ``None`` written by ``torch.save``.

    ``weights_only=False`` because the bytes hold a pickled TensorDict: this
    trusts the sender no more than unpickling the surrounding state already does.
    """
    import io

    import torch
    from tensordict import is_tensor_collection

    from ..pickling import get_receive_options

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

    from .._codec import device_available
    from ..pickling import get_receive_options

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

    from .._dtypes import dtype_from_name

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
