"""Sending DataProtos between Ray actors: per-call receive options, scatter and gather.

Nothing here is needed for Ray to work: a DataProto pickles through Arrow with
every tensor buffer out of band (:mod:`arrow_dataproto.pickling`), so
``ray.put(dp)``, a DataProto as a task or actor argument and as a return value
cost one copy of the tensor bytes into the object store, whoever started Ray.
This module adds what a trainer dispatching batches to a group of workers uses.

What a receiver gets -- copy-on-write views of the store by default,
``copy=True`` its own copy, ``copy=False`` shared views under a read-only
contract, ``device=`` straight onto a device -- is set by the
:class:`~arrow_dataproto.ReceiveOptions` in force where the DataProto is
unpickled (:func:`~arrow_dataproto.receive_mode` says which mode, and why,
e.g. why copy-on-write fell back to copying). This module adds the narrow scopes: :func:`get` (one ``ray.get``),
:func:`receive_as` (one object, chosen by its sender) and :func:`receiving` (a
function or actor method); which choice wins over which is the table of
:meth:`~arrow_dataproto.ReceiveOptions.resolve`.

An actor method's DataProto *argument* is decoded by Ray before the method
runs, under that worker's process-wide options (rows 3-5 of that table: a
decorator on the method is too late). To choose per call, either the sender
wraps it with :func:`receive_as`, or it sends the ``ObjectRef`` inside a list
(Ray resolves only top-level references) and the method fetches it with
:func:`get` or under :func:`receiving`.

Ray is an optional dependency, imported when a function here is first called.
"""

from __future__ import annotations

import functools
import pickle
import sys
from typing import Any, Callable, Sequence, SupportsIndex

import torch
from tensordict import TensorDict

from ._optional import require
from ._container import DataProto
from .errors import DataProtoError, OptionError
from .pickling import Copy, rebuild_dataproto, receive_options, transport_state

__all__ = ["Parcel", "receive_as", "get", "receiving", "scatter", "broadcast", "gather", "scatter_gather", "warm_up"]


def _ray():
    return require("ray", "arrow_dataproto.transport")


# ---------------------------------------------------------------- per-object options


class Parcel:
    """A DataProto that unpickles as a plain :class:`~arrow_dataproto.DataProto`
    decoded with the receive options given here (``None``: the receiver's own).

    Costs the same as sending the DataProto itself: the tensor buffers go out of
    band, and the options add a few bytes. Build it with :func:`receive_as`.
    """

    __slots__ = ("data", "copy", "device")

    def __init__(self, data: Any, *, copy: Copy | None = None, device: str | None = None):
        self.data = data
        self.copy = copy
        self.device = None if device is None else str(device)

    def chunk(self, chunks: int) -> list["Parcel"]:
        """The data's pieces (a DataProto's :meth:`~DataProto.array_split`), each with these options."""
        return [Parcel(piece, copy=self.copy, device=self.device) for piece in _split(self.data, chunks)]

    def __reduce_ex__(self, protocol: SupportsIndex):
        return _unpack, (self.copy, self.device, *transport_state(self.data))

    def __repr__(self) -> str:
        return f"Parcel({self.data!r}, copy={self.copy}, device={self.device!r})"


def _unpack(copy: Copy | None, device: str | None, schema_bytes: bytes, num_rows: int, columns: list) -> DataProto:
    with receive_options(copy=copy, device=device):
        return rebuild_dataproto(schema_bytes, num_rows, columns)


def receive_as(data: Any, *, copy: Copy | None = None, device: str | None = None) -> Parcel:
    """Wrap ``data`` (a DataProto, verl's included, or a TensorDict) so that whoever
    unpickles it gets a :class:`~arrow_dataproto.DataProto` decoded with ``copy``
    and ``device`` (options left ``None`` are the receiver's).

    >>> worker.update.remote(receive_as(batch, copy=False))       # read-only views
    >>> worker.generate.remote(receive_as(batch, device="cuda"))  # straight onto the GPU
    """
    return Parcel(data, copy=copy, device=device)


# ---------------------------------------------------------------- per-call options


def get(refs: Any, *, copy: Copy | None = None, device: str | None = None, timeout: float | None = None) -> Any:
    """``ray.get(refs, timeout=timeout)``, decoding the DataProtos it returns with
    ``copy`` and ``device`` (``None``: the options in force, see
    :func:`~arrow_dataproto.get_receive_options`).

    Works in the driver and inside actors and tasks. Errors are Ray's, except
    that a DataProto that fails to decode (here, or as a task's argument)
    raises the library's error, e.g. :class:`~arrow_dataproto.DecodeError`
    naming the column, chained to the Ray error that carried it.
    """
    ray = _ray()
    try:
        with receive_options(copy=copy, device=device):
            return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayError as error:
        cause = _library_error(error)
        if cause is None:
            raise
        raise cause from error


def _library_error(error: BaseException) -> DataProtoError | None:
    """The library error inside a Ray error, if any. Ray reports an object that
    fails to unpickle as ``RaySystemError`` (``client_exc``: the error raised),
    and a task whose argument fails to unpickle as ``RayTaskError`` (``cause``:
    that ``RaySystemError``)."""
    found: object = error
    for _ in range(3):
        if isinstance(found, DataProtoError):
            return found
        found = getattr(found, "client_exc", None) or getattr(found, "cause", None)
    return None


def receiving(*, copy: Copy | None = None, device: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: the function runs under ``receive_options(copy=copy, device=device)``,
    so the DataProtos it fetches with ``ray.get`` are decoded so. Its own
    arguments are not: Ray decodes them before the call.

    Unlike the context manager itself, the decorated function pickles, as Ray
    needs for an actor class defined in ``__main__``.

    >>> @ray.remote
    ... class Worker:
    ...     @receiving(copy=False)
    ...     def score(self, refs):
    ...         batch = ray.get(refs[0])       # read-only views of the object store
    """

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with receive_options(copy=copy, device=device):
                return function(*args, **kwargs)

        return wrapper

    return decorate


# ---------------------------------------------------------------- dispatch and collect


def _split(data: Any, chunks: int) -> list:
    """Balanced pieces of a DataProto (its verl-style ``chunk`` needs equal ones); ``chunk`` of anything else."""
    return data.array_split(chunks) if isinstance(data, DataProto) else data.chunk(chunks)


def scatter(actors: Sequence[Any], method: str, data: Any, *args: Any, **kwargs: Any) -> list:
    """Call ``actor.<method>.remote(piece, *args, **kwargs)`` on each actor, with
    ``data.array_split(len(actors))`` as pieces (``chunk`` for other types), in order;
    return the ``ObjectRef`` s.

    ``data`` is a DataProto or a :class:`Parcel` (each piece keeps its receive
    options). Each piece views its rows of ``data``, so each actor is sent only
    its own rows (one copy into the object store); pieces differ in size by at
    most one row, and are empty when there are more actors than rows. ``args``
    and ``kwargs`` go to every call as they are (``ray.put`` a large one once and
    pass its reference).
    """
    if not actors:
        raise OptionError("scatter needs at least one actor")
    pieces = _split(data, len(actors))
    if len(pieces) != len(actors):
        raise OptionError(f"{type(data).__name__}.chunk({len(actors)}) gave {len(pieces)} pieces, one per actor needed")
    return [getattr(actor, method).remote(piece, *args, **kwargs) for actor, piece in zip(actors, pieces)]


def broadcast(actors: Sequence[Any], method: str, data: Any, *args: Any, **kwargs: Any) -> list:
    """Call ``actor.<method>.remote(data, *args, **kwargs)`` on each actor with the
    same ``data``, stored once: one ``ray.put``, whose reference every call gets
    (passing ``data`` itself would store one copy per call). Returns the ``ObjectRef`` s.

    Each actor decodes it under its own receive options (``data`` may be a
    :class:`Parcel`): by default each gets a private copy-on-write view, so the
    actors share the object's pages until one writes; with ``copy=False`` all of
    them view the same shared memory, so one's in-place write reaches all.
    """
    if not actors:
        raise OptionError("broadcast needs at least one actor")
    ref = _ray().put(data)
    return [getattr(actor, method).remote(ref, *args, **kwargs) for actor in actors]


def gather(refs: Sequence[Any], *, device: str | None = None, timeout: float | None = None) -> Any:
    """Wait for ``refs``; if every result is a DataProto, return their
    :meth:`DataProto.concat` in order, else the list of results.

    The concatenation is the only copy: results are decoded as views of the
    object store first (``device``: decoded onto it, then concatenated there).
    Other results are decoded again under the options in force (``device``
    aside), so a DataProto inside them is a copy by default.
    A failed call raises Ray's error (e.g. ``RayActorError`` for a dead actor,
    ``RayTaskError`` wrapping the method's exception), or the library's error
    for a piece or a result that does not decode (see :func:`get`).
    """
    refs = list(refs)
    results = get(refs, copy=False, device=device, timeout=timeout)
    if results and all(isinstance(r, DataProto) for r in results):
        return DataProto.concat(results)
    del results  # views of the object store: not for the caller
    return get(refs, device=device, timeout=timeout)


def scatter_gather(actors: Sequence[Any], method: str, data: Any, *args: Any, **kwargs: Any) -> Any:
    """:func:`scatter` then :func:`gather`: chunk ``data`` over ``actors``, call
    ``method`` on each with its piece, and concatenate the DataProtos they return.

    >>> out = scatter_gather(workers, "compute_log_prob", batch)
    >>> out = scatter_gather(workers, "update_actor", receive_as(batch, copy=False), epochs=1)
    """
    return gather(scatter(actors, method, data, *args, **kwargs))


# ---------------------------------------------------------------- a worker's first batch


def warm_up() -> None:
    """Import and prime, in this process, everything receiving a DataProto uses:
    torch, tensordict, pyarrow and the codec's code paths (dense and jagged tensors,
    meta_info), and, in a Ray worker or driver, the copy-on-write mapping of the
    object store (the raylet's descriptor found, the store mapped once). Call it in
    an actor's ``__init__``; it puts and gets one object of about 300 KiB, and copies
    nothing else. Without Ray it round-trips the same batch through ``pickle``.

    What is left to a fresh actor's first batch is what any reader of fresh memory
    pays, a bare numpy array included: the kernel maps each page of the batch into
    this process when it is first read (a few hundredths of a second per 250 MiB;
    later objects in the same store memory find their pages mapped).

    The object has no object column: encoding one (``pyarrow.array``) imports pandas,
    about 20 MiB and a few tenths of a second, which receiving never needs (decoding
    object columns uses nothing that importing this module does not load).
    """
    rows = 64
    batch = TensorDict(
        {
            "input_ids": torch.zeros(rows, 512, dtype=torch.int64),  # over Ray's inline limit: in the store
            "jagged": torch.nested.nested_tensor([torch.zeros(i + 1) for i in range(rows)], layout=torch.jagged),
        },
        batch_size=[rows],
    )
    data = DataProto(batch, meta_info={"step": 0})
    ray = sys.modules.get("ray")  # a Ray worker or driver has imported it; importing it here would cost a second
    if ray is not None and ray.is_initialized():
        ray.get(ray.put(data))
    else:
        pickle.loads(pickle.dumps(data, protocol=5))
