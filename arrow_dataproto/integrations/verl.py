"""Make verl's own ``DataProto`` pickle as arrow-dataproto does: tensors' bytes out of band, viewed on receipt.

::

    from arrow_dataproto.integrations import verl as adp_verl
    adp_verl.install()      # this process: verl.protocol.DataProto no longer pickles through torch.save

After :func:`install`, pickling a ``verl.protocol.DataProto`` -- ``pickle``,
``ray.put``, a Ray task or actor argument or return value, verl's
``save_to_disk`` -- takes one of two forms, and any process where arrow-dataproto
is importable unpickles either as verl's own class, patched or not, under that
process's :class:`~arrow_dataproto.ReceiveOptions` (by default, copy-on-write views
of Ray's shared-memory object store: private to this process, a write copies only the
pages it touches; buffers not in shared memory are copied; ``copy=True`` copies every
tensor, ``copy=False`` views the received buffers, read-only contract; ``device=``
decodes onto a device). Only the three fields travel: attributes a subclass adds are
not carried.

- **Plain content under protocol 5** (Ray): CPU tensors outside autograd, dense or
  jagged, in a flat TensorDict, and numpy columns whose rows match. It pickles as each
  tensor's dtype, shape and bytes, out of band, named :func:`rebuild_compact`
  (:mod:`arrow_dataproto._compact`): no Arrow arrays, whose per-object work (0.3-1 ms to
  encode, 0.5-1 ms to decode) buys nothing in a pickle that only this library reads,
  and that made ``install()`` slower than bare numpy arrays in verl's worker groups. Up
  to 2 MiB of tensors (``_compact.COPY_UP_TO``) are copied on receipt under the default,
  which costs about what a copy-on-write lease does and pins nothing in Ray's store.
- **Anything else** (nested TensorDicts, strided nested tensors, tensors on a device,
  protocols below 5, Ray Direct Transport): encoded by :func:`arrow_dataproto.to_arrow`,
  named :func:`rebuild`, which validates the payload.

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
processes load, and loads their pickles through :func:`rebuild_compact` and :func:`rebuild`.

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
from typing import Any

from .._verl_pickle import VerlState, load_state, unpickle

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
    "rebuild_compact",
    "reduce_through_arrow",
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


def _reduce_ex(self, protocol: int) -> tuple:
    from .. import _compact
    from ..pickling import direct_transport

    if protocol >= 5 and not direct_transport():
        compact = _compact.state(self)
        if compact is not None:
            return rebuild_compact, (type(self), compact)
    return reduce_through_arrow(self)


def reduce_through_arrow(data: Any) -> tuple:
    """The Arrow form of a patched DataProto's reduction, named :func:`rebuild`: what
    ``__reduce_ex__`` gives for content the compact state does not take (and what a
    benchmark calls to compare the two forms on the same object)."""
    from ..pickling import transport_state

    return rebuild, (type(data), *transport_state(data))


def rebuild(cls: type, schema_bytes: bytes, num_rows: int, columns: list[tuple]) -> Any:
    """Unpickle an Arrow-pickled DataProto as ``cls`` (the function patched pickles name).

    Decodes under :func:`~arrow_dataproto.get_receive_options`, which validates
    the payload (rows of every column, shapes, offsets) and raises
    :class:`DecodeError` for a malformed one; ``cls``'s constructor is not run again.
    """
    from .._container import assemble
    from ..pickling import rebuild_dataproto

    decoded = rebuild_dataproto(schema_bytes, num_rows, columns)
    return assemble(cls, decoded.batch, decoded.non_tensor_batch, decoded.meta_info)


def rebuild_compact(cls: type, compact: tuple) -> Any:
    """Unpickle a DataProto pickled as its tensors' bytes (see :mod:`arrow_dataproto._compact`)
    as ``cls``, under :func:`~arrow_dataproto.get_receive_options`: by default copies up to
    2 MiB of tensors and copy-on-write views above; copies with ``copy=True``; views of the
    received buffers with ``copy=False`` (the options of :func:`~arrow_dataproto.pickling.unpickling_options`,
    as for :func:`rebuild`). :class:`DecodeError` for a malformed state."""
    from .. import _compact
    from .._container import assemble
    from ..pickling import unpickling_options

    options = unpickling_options()
    batch, non_tensor_batch, meta_info = _compact.parts(
        compact, copy=options.copy, device=options.device, private=options.copy_on_write_views
    )
    return assemble(cls, batch, non_tensor_batch, meta_info)


def _copy(self) -> Any:
    from .._container import assemble

    batch = None if self.batch is None else self.batch.clone()
    return assemble(type(self), batch, self.non_tensor_batch, self.meta_info)


def _deepcopy(self, memo: dict) -> Any:
    from .._container import assemble

    batch = None if self.batch is None else self.batch.clone()
    result = assemble(type(self), batch, copy.deepcopy(self.non_tensor_batch, memo), copy.deepcopy(self.meta_info, memo))
    memo[id(self)] = result
    return result


# ---------------------------------------------------------------- across the two classes


def to_verl(data: Any) -> Any:
    """``data`` (an :class:`arrow_dataproto.DataProto`) as verl's ``DataProto``, sharing its
    TensorDict and arrays: zero-copy, no constructor checks (ours has made them). What
    verl's worker groups accept (their dispatch asserts verl's own class). Raises
    :class:`VerlNotFoundError` without verl."""
    from .._container import assemble

    return assemble(verl_dataproto_class(), data.batch, data.non_tensor_batch, data.meta_info)


def from_verl(data: Any) -> Any:
    """verl's ``DataProto`` (or any object with its three fields) as an
    :class:`arrow_dataproto.DataProto` over the same TensorDict: zero-copy for the tensors;
    ``non_tensor_batch`` and ``meta_info`` are new dicts of the same values (lists become
    object arrays, as in our constructor)."""
    from .._container import DataProto, assemble

    return assemble(DataProto, data.batch, data.non_tensor_batch, data.meta_info)


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
