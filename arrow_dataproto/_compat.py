"""Every private API of another project that arrow-dataproto relies on, in one place.

Each entry says what it is, why a public API does not do, and what we do the day it goes.
``tests/test_compat.py`` holds a canary for each: it asserts that the private API still
exists and behaves as we rely on, so an upgrade of CPython, torch or Ray that changes one
fails there first, naming it, rather than somewhere in the codec.

Nothing is imported here at module level beyond the standard library: torch and Ray are
looked up when an entry is used, so the torch-free paths (files, the command line) stay so.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import sys
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch


# --- CPython ------------------------------------------------------------------------------


def ascii_json_encoder() -> Callable[[Any], str]:
    """A compact (``","``/``":"``), ASCII-escaped JSON encoder of values that hold no NaN,
    infinity or cycle, which the caller has checked.

    Private API: ``json.encoder.c_make_encoder``, the C encoder ``json.dumps`` builds on each
    call. Made once here, it saves that per-call setup (most of the cost for small rows).
    If it goes (or on an interpreter without the C accelerator): ``JSONEncoder.encode``,
    the same text, slower."""
    encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, check_circular=False, separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return encoder.encode
    # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)
    chunks = make(None, encoder.default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False)
    return lambda value: "".join(chunks(value, 0))


PythonUnpickler = pickle._Unpickler
"""The pure-Python unpickler.

Private API: ``pickle._Unpickler``. The C unpickler sizes its memo table by the largest
index a ``PUT`` opcode names, so one damaged index in an untrusted verl pickle allocates
gigabytes; this one keeps its memo in a dict. If it goes: a copy of CPython's pure-Python
unpickler (Lib/pickle.py, PSF licence) would have to be vendored."""

python_pickle_load: Callable[..., Any] = pickle._load  # type: ignore[attr-defined]
"""``pickle.load`` through :data:`PythonUnpickler` (``load(file, *, fix_imports, encoding,
errors, buffers)``), for ``torch.load(pickle_module=...)``, which calls the module's ``load``.

Private API: ``pickle._load``. If it goes: ``lambda file, **kw: PythonUnpickler(file, **kw).load()``."""


# --- torch --------------------------------------------------------------------------------


def ragged_idx(t: Any) -> int:
    """The ragged dimension of a jagged nested tensor (1 = right after the batch dimension).

    Private API: the ``_ragged_idx`` attribute of torch's ``NestedTensor`` (torch has no
    public accessor; ``nested_tensor_from_jagged(jagged_dim=...)`` sets it). If it goes: the
    index of the one ``torch.SymInt`` in ``t.shape`` (the ragged size is a nested symbolic int)."""
    return t._ragged_idx


def nested_tensor_size(t: torch.Tensor) -> torch.Tensor:
    """The row shapes of a strided nested tensor: an int64 tensor of ``(rows, row ndim)``.

    Private API: ``Tensor._nested_tensor_size()``. Without it the shapes come one row at a
    time (``[row.shape for row in t.unbind()]``), a Python loop over the rows: the fallback
    if it goes."""
    return t._nested_tensor_size()


def nested_view_from_buffer(
    values: torch.Tensor, sizes: torch.Tensor, strides: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """A strided nested tensor viewing the flat ``values`` (no copy): row ``i`` has shape
    ``sizes[i]``, strides ``strides[i]`` and starts at element ``offsets[i]``.

    Private API: ``torch._nested_view_from_buffer``. The public constructors
    (``torch.nested.nested_tensor``, ``as_nested_tensor``) copy every row. If it goes:
    ``torch.nested.as_nested_tensor`` of the row views, one copy of the values."""
    import torch

    return torch._nested_view_from_buffer(values, sizes, strides, offsets)


def jagged_class() -> type | None:
    """torch's class of jagged nested tensors, ``None`` if it has moved.

    Private API: ``torch.nested._internal.nested_tensor.NestedTensor``. Every jagged
    tensor is one. Each public query on it (``is_nested``, ``layout``, ``values()``) and
    the public constructor ``nested_tensor_from_jagged`` go through its
    ``__torch_function__`` and the dispatcher: 10-130 us a call, most of the cost of a
    small batch's jagged column. What :mod:`arrow_dataproto._jagged` relies on instead:
    ``isinstance(t, NestedTensor)`` for "jagged"; the attributes ``_values``, ``_offsets``
    and ``_lengths`` (what ``values()``, ``offsets()`` and ``lengths()`` return, without
    the autograd view); and ``NestedTensor(values, offsets, _ragged_idx=k)``, the object
    the public constructor builds, less the autograd view of ``values``. If it goes: the
    public calls (the same results, slower)."""
    try:
        from torch.nested._internal.nested_tensor import NestedTensor
    except ImportError:
        return None
    return NestedTensor


def torch_function_off() -> Any:
    """A context in which tensor subclasses' ``__torch_function__`` is skipped (their
    ``__torch_dispatch__`` still runs, so every op still means what it says).

    Private API: ``torch._C.DisableTorchFunctionSubclass``, what torch's own
    ``Tensor.__torch_function__`` enters; the "Extending torch" notes show it only by
    example. A jagged tensor's ``__torch_function__`` makes each attribute read
    (``device``, ``dtype``, ``requires_grad``, ``is_nested``) cost 10-16 us; within
    this context 0.1 us. If it goes: ``contextlib.nullcontext()`` (slower, the same results)."""
    import torch

    off = getattr(torch._C, "DisableTorchFunctionSubclass", None)
    return off() if off is not None else contextlib.nullcontext()


FX_TRACE_LOGGER = "torch.fx._symbolic_trace"
"""The logger of the private module ``torch.fx._symbolic_trace``, which logs a notice for
torch.fx users from inside ``nested_tensor_from_jagged``; :mod:`arrow_dataproto._jagged`
filters that notice out. If the module is renamed, the filter catches nothing and the notice
shows again (once per process): harmless."""


# --- Ray ----------------------------------------------------------------------------------


def ray_external_transport() -> bool:
    """Whether Ray is serializing, on this thread, the value of a method declared with
    ``@ray.method(tensor_transport=...)`` (Ray Direct Transport); False when Ray is not
    imported.

    Private API: the thread-local ``use_external_transport`` flag of the serialization
    context of ``ray._private.worker.global_worker`` (Ray 2.60), set around
    ``SerializationContext.serialize_rdt_objects``. Ray offers no public way to tell. If it
    goes: False, so batches take the object store as before direct transport (still exact,
    not through gloo/nccl).

    Asking makes no context where Ray has none yet (``serialization_context_map`` empty: a
    process that imported Ray without using it). Making one imports pydantic, about a second,
    and direct transport always runs in an existing context."""
    ray = sys.modules.get("ray")
    worker: Any = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)
    if not getattr(worker, "serialization_context_map", None):
        return False
    try:
        context = worker.get_serialization_context()
    except Exception:  # no Ray, a Ray without this context: not under direct transport
        return False
    return bool(getattr(getattr(context, "_thread_local", None), "use_external_transport", False))
