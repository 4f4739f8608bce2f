"""Send a tensordict ``TensorDict`` through Ray on the Arrow codec.

::

    from arrow_dataproto.integrations import tensordict as adp_td
    adp_td.install()        # this process: Ray now serializes TensorDicts through Arrow

    ray.init(runtime_env={"worker_process_setup_hook": "arrow_dataproto.integrations.tensordict.install"})

After :func:`install`, ``ray.put(td)``, a ``TensorDict`` passed to a task or an actor
method and one returned from them are encoded by :func:`arrow_dataproto.to_arrow`
with every buffer out of band: Ray copies the tensor bytes once into its object
store (no ``consolidate``, no ``torch.save``), and the receiver decodes them under
its :class:`~arrow_dataproto.ReceiveOptions`: by default copy-on-write views of the
store (no copy on receipt; a write copies the pages it touches, in the writing
process alone). Exact: every dtype bit for bit (bf16, fp8, ...), dense, jagged and
strided nested tensors, nested TensorDicts with their own batch sizes and devices,
``NonTensorData`` / ``NonTensorStack`` leaves (pickled in band, with the small
part), key order, device. What travels is the tree of keys, leaves, batch sizes
and devices; dimension names, the lock and subclasses do not (only the exact class
``TensorDict`` is registered: a subclass, a ``LazyStackedTensorDict`` or a
tensorclass keeps tensordict's own pickling, and so does a TensorDict holding one
at any depth, whole). A TensorDict the codec cannot encode (no batch dimension, no
tensor leaf, content torch refuses to view) falls back to tensordict's pickling
inside the same object. Returned from an actor method declared with
``@ray.method(tensor_transport=...)``, the bytes travel as ``uint8`` tensors
through Ray Direct Transport instead (see :func:`arrow_dataproto.pickling.direct_transport`).

Only Ray's serializer changes (``ray.util.register_serializer``, per process):
``pickle``, ``torch.save`` and ``copy`` keep tensordict's behaviour. Every payload
names :func:`rebuild`, so a process without :func:`install` reads what a process
with it sent (it needs arrow-dataproto importable: Ray's deserialization error then
says ``No module named 'arrow_dataproto'``; the fix is to install the package in
that environment), and a process with it reads tensordict's own pickles.

The setup hook is cheap: it imports neither torch nor tensordict. If tensordict is
not imported yet, :func:`install` registers the serializer when it is (a finder on
``sys.meta_path``), before any TensorDict can exist in the process.

**Plain dicts of tensors** are not changed: Ray pickles each tensor with torch's
reducer (a copy in band). Send a ``TensorDict(d, batch_size=[n])`` under
:func:`install`, or ``arrow_dataproto.DataProto.from_dict(d)``, to get this path.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import pickle
import sys
from typing import Any

from .._optional import missing_dependency
from ..errors import DataProtoError, EncodeError, MissingDependencyError

__all__ = ["RayNotFoundError", "install", "is_installed", "rebuild", "serialize", "uninstall"]

_FORMAT = "adp.tensordict.1"  # first item of every state: the states below may change under another name
_PICKLE = "tensordict.pickle"  # first item of a fallback state: tensordict's own pickle bytes


class RayNotFoundError(MissingDependencyError):
    """:func:`install` needs Ray, and ``import ray`` failed."""


class _Registered:
    """Where this module stands in this process: installed, and registered with Ray or waiting for tensordict."""

    installed = False
    registered = False


def _register() -> None:
    from tensordict import TensorDict

    try:
        import ray.util
    except ModuleNotFoundError as e:
        raise missing_dependency("arrow_dataproto.integrations.tensordict.install", e, cls=RayNotFoundError) from e
    ray.util.register_serializer(TensorDict, serializer=serialize, deserializer=rebuild)
    _Registered.registered = True


class _Loader(importlib.abc.Loader):
    """tensordict's own loader, which registers the serializer once the module has run."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        if _Registered.installed:
            _register()

    def __getattr__(self, name: str) -> Any:  # resources, get_source, ...: the wrapped loader's
        return getattr(self._loader, name)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Finds ``tensordict`` as the other finders do, with a loader that registers after it runs (then leaves)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensordict":
            return None
        _leave_meta_path()
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _WhenImported()


def _leave_meta_path() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Make Ray serialize ``TensorDict`` through Arrow in this process (see the module docstring).

    Calling it again does nothing. Usable as Ray's ``worker_process_setup_hook``.
    Raises :class:`RayNotFoundError` when Ray cannot be imported (at once if
    tensordict is imported, else when it is).
    """
    if _Registered.installed:
        return
    _Registered.installed = True
    if "tensordict" in sys.modules:
        try:
            _register()
        except BaseException:
            _Registered.installed = False
            raise
    else:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Give Ray back its own serialization of ``TensorDict`` in this process.

    Nothing happens if :func:`install` was not called. Objects sent while installed
    still load afterwards (their payloads name :func:`rebuild`).
    """
    _leave_meta_path()
    if _Registered.registered:
        from tensordict import TensorDict
        import ray.util

        ray.util.deregister_serializer(TensorDict)
    _Registered.installed = _Registered.registered = False


def is_installed() -> bool:
    """Whether :func:`install` is in force in this process (registered, or waiting for tensordict's import)."""
    return _Registered.installed


# ---------------------------------------------------------------- the state


class _NotExact(Exception):
    """A nested collection the state cannot hold exactly (its class, its stacking): the whole
    TensorDict keeps tensordict's own pickling."""


def _non_tensors(td: Any, path: tuple, found: list) -> list:
    """``td``'s key order, each nested TensorDict as ``(key, its order)``; its non-tensor leaves go to ``found``.
    Raises :class:`_NotExact` for a nested collection other than a plain ``TensorDict`` (a lazy
    stack, a tensorclass, a subclass): the state would give it back as a plain TensorDict."""
    from tensordict import TensorDict, is_tensor_collection
    from tensordict.utils import is_non_tensor

    order: list = []
    for key, value in td.items():
        if is_non_tensor(value):
            found.append((path + (key,), value))
            order.append(key)
        elif is_tensor_collection(value):
            if type(value) is not TensorDict:
                raise _NotExact(f"{'.'.join(map(str, path + (key,)))}: a {type(value).__name__}")
            order.append((key, _non_tensors(value, path + (key,), found)))
        else:
            order.append(key)
    return order


def serialize(td: Any) -> tuple:
    """What Ray pickles for ``td`` (the registered serializer): ``td``'s tensors as an
    Arrow record batch state (buffers out of band; tensors under Ray Direct Transport),
    its non-tensor leaves and key order in band. A TensorDict the state cannot hold exactly
    travels as tensordict's own pickle bytes instead: one the codec refuses, one holding a
    nested collection other than a plain ``TensorDict`` (a ``LazyStackedTensorDict``, a
    tensorclass, a subclass), or any other error of the encoder (torch's on unusual
    content). If tensordict's pickling fails too: :class:`~arrow_dataproto.EncodeError`."""
    from ..pickling import transport_state

    found: list = []
    try:
        order = _non_tensors(td, (), found)
        tensors = td.exclude(*[path for path, _ in found]) if found else td
        if not any(True for _ in tensors.keys(include_nested=True, leaves_only=True)):
            raise DataProtoError("no tensor leaf")
        state = transport_state(tensors)
    except Exception:  # the library's refusals, _NotExact, torch's errors: tensordict's own pickling
        try:
            return (_PICKLE, pickle.dumps(td, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as e:
            raise EncodeError(f"cannot serialize a TensorDict: neither arrow-dataproto nor tensordict's pickling takes it: {e!r}"[:500]) from e
    return (_FORMAT, *state, found, order if found else None)


def _ordered(td: Any, order: list) -> Any:
    """``td`` rebuilt with its keys (nested ones too) in ``order``."""
    from tensordict import TensorDict

    entries = {}
    for entry in order:
        key, sub = entry if isinstance(entry, tuple) else (entry, None)
        entries[key] = td.get(key) if sub is None else _ordered(td.get(key), sub)
    return TensorDict(entries, batch_size=td.batch_size, device=td.device)


def rebuild(state: tuple) -> Any:
    """The ``TensorDict`` of a :func:`serialize` state (the registered deserializer,
    named by every payload), decoded under :func:`~arrow_dataproto.get_receive_options`.
    Raises :class:`~arrow_dataproto.DecodeError` for a malformed state."""
    from ..errors import DecodeError
    from ..pickling import rebuild_dataproto

    if not (isinstance(state, tuple) and state and state[0] in (_FORMAT, _PICKLE)):
        raise DecodeError(f"not a TensorDict state of arrow-dataproto: {type(state).__name__} {str(state)[:60]}")
    if state[0] == _PICKLE:
        if len(state) != 2 or not isinstance(state[1], (bytes, bytearray)):
            raise DecodeError(f"TensorDict fallback state of {len(state)} items, expected the tag and tensordict's pickle bytes")
        return pickle.loads(state[1])
    if len(state) != 6:
        raise DecodeError(f"TensorDict state of {len(state)} items, expected 6")
    _, schema_bytes, num_rows, columns, found, order = state
    td = rebuild_dataproto(schema_bytes, num_rows, columns).batch
    if found:
        for path, value in found:
            td.set(path, value)
        td = _ordered(td, order)
    return td
