"""Pickling a DataProto through Arrow, with every buffer out of band.

``pickle.dumps(dp, protocol=5, buffer_callback=...)`` (what Ray does) hands
each Arrow buffer -- each tensor's bytes -- to the callback as a
``PickleBuffer``; the in-band part is the schema and a few integers per column,
a few KiB whatever the batch size. Protocols below 5 carry the bytes in band.

What the receiver gets is set by :class:`ReceiveOptions`: by default
(``copy="on_write"``) tensors are copy-on-write views of Ray's shared memory,
private to the receiving process; ``copy=True`` copies every tensor;
``copy=False`` views the buffers as they are (shared: read-only contract);
``device=`` decodes straight onto a device. They are chosen per call, per
block, per process or by environment variable; :meth:`ReceiveOptions.resolve`
holds the one table of which choice wins. :func:`receive_mode` tells what is in
force, and why.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, Union

import numpy as np
import pyarrow as pa
import torch

from . import _malloc, _shm
from ._codec import check_device, to_arrow
from ._compat import ray_external_transport
from ._container import DataProto, assemble
from ._decoding import from_arrow
from ._wire import batch_from_state, batch_state, fast_parts, fast_state, state_buffers
from .errors import OptionError

ON_WRITE: Final = "on_write"
Copy = Union[bool, Literal["on_write"]]


@dataclass(frozen=True)
class ReceiveOptions:
    """How an unpickled DataProto is rebuilt.

    ``copy="on_write"`` (default): CPU tensors are private copy-on-write views.
    Buffers in Ray's object store (sealed objects over ~100 KiB: immutable
    while pinned) are mapped again with ``MAP_PRIVATE``: no copy on receipt,
    reads at zero-copy speed, and an in-place write copies the pages it touches
    in this process only. The tensors keep the Ray object alive (pinned) until
    the last of them dies. Every other buffer is copied, never viewed: ordinary
    memory (inlined small objects, plain ``pickle.loads``), writable shared
    memory (``multiprocessing.shared_memory``, a ``MAP_SHARED`` file, torch
    shared memory: its owner may change or truncate it), and every buffer where
    mapping is impossible here (see :func:`receive_mode`).
    ``copy=True``: tensors own their memory (one copy; none extra when
    ``device`` is an accelerator, where the transfer is the copy).
    ``copy=False``: CPU tensors view the received buffers (Ray: the shared-memory
    object store). Treat them as read-only: an in-place write changes the
    object for every process that reads it.
    ``device``: where tensors go (``None``: the device recorded by the sender,
    or the CPU if this process lacks it). A device this process lacks, or a
    ``copy`` other than these three, raises :class:`~arrow_dataproto.OptionError`.

    Numeric numpy columns of ``non_tensor_batch`` are copies in both copying
    modes, and read-only views with ``copy=False``.

    Which options apply where: :meth:`resolve`.
    """

    copy: Copy = ON_WRITE
    device: str | None = None

    def __post_init__(self):
        if self.copy not in (True, False, ON_WRITE) or not isinstance(self.copy, (bool, str)):
            raise OptionError(f"copy must be True, False or {ON_WRITE!r}, got {self.copy!r}")
        if self.device is not None:
            check_device(self.device)

    @property
    def copy_on_write_views(self) -> bool:
        """Whether buffers from Ray's object store become copy-on-write views under these
        options: ``copy="on_write"`` with tensors that stay on the CPU (a ``device`` off
        the CPU copies: the transfer is the copy)."""
        return self.copy == ON_WRITE and not _off_cpu(self.device)

    @classmethod
    def resolve(
        cls, copy: Copy | None = None, device: str | None = None, *, over: ReceiveOptions | None = None
    ) -> ReceiveOptions:
        """The receive options that apply here: ``copy`` and ``device`` each come
        from the first source of this table that sets it. Every way of choosing
        them goes through this method.

        ====  ==============================================  =============================================
        row   source                                          scope
        ====  ==============================================  =============================================
        1     the arguments given here: those of              one object or one scope; the sender's
              ``transport.receive_as(dp, copy=, device=)``,   ``receive_as`` is applied where the object is
              ``transport.get``, ``@transport.receiving``,    unpickled, inside the receiver's scopes, so
              ``with receive_options``                        it wins over them
        2     the innermost ``receive_options`` block         this thread or task; a block holds all that
              (``get`` and ``receiving`` open one)            was in force when it was entered: a
                                                              ``set_receive_options`` inside blocks
                                                              applies once the outermost has ended
        3     ``set_receive_options(copy=, device=)``         the process, each option as last set
        4     ``ARROW_DATAPROTO_COPY=on_write|1|0``,          the process, read at import (an unusable
              ``ARROW_DATAPROTO_DEVICE=cuda``                 value is logged and skipped); an actor's:
                                                              ``.options(runtime_env={"env_vars": ...})``
        5     built in                                        ``copy="on_write"``; ``device=None``: the
                                                              sender's device, or the CPU if this process
                                                              lacks it
        ====  ==============================================  =============================================

        ``over``: the options that the arguments override, in place of rows 2-5
        (:func:`set_receive_options` passes rows 3-5 alone). Raises
        :class:`~arrow_dataproto.OptionError` for a ``copy`` other than
        ``True``/``False``/``"on_write"`` or a device this process lacks.
        """
        if over is None:
            over = _block.get() or _process_default  # row 2, else the process default: 3 over 4 over 5
        return cls(  # row 1 over the rest
            copy=copy if copy is not None else over.copy,
            device=device if device is not None else over.device,
        )


_COPY_WORDS: Final[dict[str, Copy]] = {
    ON_WRITE: ON_WRITE,
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}
"""``ARROW_DATAPROTO_COPY`` (lower case, ``-`` read as ``_``) -> the ``copy=`` value it stands for."""


def _from_environment() -> ReceiveOptions:
    """Rows 4 over 5 of :meth:`ReceiveOptions.resolve`: the environment variables,
    each unset or unusable one (logged) replaced by the built-in default."""
    word = os.environ.get("ARROW_DATAPROTO_COPY", ON_WRITE).strip().lower().replace("-", "_")
    copy = _COPY_WORDS.get(word)
    if copy is None:
        logging.getLogger("arrow_dataproto").warning(
            "ARROW_DATAPROTO_COPY=%r is not one of on_write, 1, 0: using on_write", word
        )
        copy = ON_WRITE
    device = os.environ.get("ARROW_DATAPROTO_DEVICE") or None
    try:
        return ReceiveOptions(copy=copy, device=device)
    except OptionError as e:
        logging.getLogger("arrow_dataproto").warning("ARROW_DATAPROTO_DEVICE=%r ignored: %s", device, e)
        return ReceiveOptions(copy=copy)


_process_default = _from_environment()  # rows 3-5: set_receive_options overrides it
_block: contextvars.ContextVar[ReceiveOptions | None] = contextvars.ContextVar("arrow_dataproto_receive", default=None)


def get_receive_options() -> ReceiveOptions:
    """The options in force here (:meth:`ReceiveOptions.resolve` without arguments)."""
    return ReceiveOptions.resolve()


def set_receive_options(*, copy: Copy | None = None, device: str | None = None) -> ReceiveOptions:
    """Change the process-wide default, row 3 of :meth:`ReceiveOptions.resolve`
    (arguments left ``None`` keep their value); returns the new default."""
    global _process_default
    _process_default = ReceiveOptions.resolve(copy, device, over=_process_default)
    return _process_default


@contextlib.contextmanager
def receive_options(*, copy: Copy | None = None, device: str | None = None):
    """Within the block, DataProtos unpickled in this thread/task use these options
    (arguments left ``None``: those in force; precedence: :meth:`ReceiveOptions.resolve`).

    >>> with receive_options(copy=False):
    ...     batch = ray.get(ref)      # tensors view the object store: read-only contract
    """
    token = _block.set(ReceiveOptions.resolve(copy, device))
    try:
        yield
    finally:
        _block.reset(token)


# ---------------------------------------------------------------- the picklable state: arrow_dataproto._wire


# ---------------------------------------------------------------- Ray Direct Transport


def direct_transport() -> bool:
    """Whether Ray is serializing, on this thread, the value of a method declared with
    ``@ray.method(tensor_transport=...)`` (Ray Direct Transport).

    Ray then moves every ``torch.Tensor`` it meets in the pickled value through the
    transport (gloo, nccl, ...) and the object store carries the rest. Reads Ray's
    serialization context (Ray 2.60: its thread-local ``use_external_transport``, a private
    API: :func:`arrow_dataproto._compat.ray_external_transport`); ``False`` when Ray is not
    imported or has no such flag.
    """
    return ray_external_transport()


def _map_buffers(state: tuple, convert) -> tuple:
    length, null_count, offset, buffers, children = state
    return (
        length,
        null_count,
        offset,
        [None if b is None else convert(b) for b in buffers],
        [_map_buffers(c, convert) for c in children],
    )


def _as_tensor(buffer: pa.Buffer):
    """A non-empty buffer as a flat ``uint8`` tensor viewing it (Ray sends tensors through its transport)."""
    if not buffer.size:
        return buffer
    with warnings.catch_warnings():  # a read-only buffer: the transport only reads it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.frombuffer(buffer, dtype=np.uint8))


def _as_buffer(buffer):
    """A received ``uint8`` tensor as an Arrow buffer viewing it (a device tensor is brought to the CPU)."""
    if isinstance(buffer, torch.Tensor):
        return pa.py_buffer(buffer.detach().to("cpu").contiguous().numpy())
    return buffer


def transport_state(data) -> tuple[bytes, int, list[tuple]]:
    """The pickled state of a DataProto (ours or verl's) or a TensorDict: :func:`batch_state`
    of :func:`~arrow_dataproto.to_arrow` of it (made through the plans of :mod:`._wire` when
    its tensors are dense CPU tensors: the same state), except under :func:`direct_transport`,
    where each non-empty buffer is a ``uint8`` tensor viewing it, so that Ray's transport
    moves the bytes and the object store gets only the schema and the integers.
    :func:`batch_from_state` and :func:`rebuild_dataproto` take either form."""
    state = fast_state(data)
    schema_bytes, num_rows, columns = state if state is not None else batch_state(to_arrow(data))
    if direct_transport():
        columns = [_map_buffers(c, _as_tensor) for c in columns]
    return schema_bytes, num_rows, columns


def _received_tensors(columns: list) -> tuple[list, bool]:
    """The state with tensors (Ray Direct Transport) turned back into buffers, and whether there were any."""
    found = any(isinstance(b, torch.Tensor) for c in columns for b in state_buffers(c))
    return ([_map_buffers(c, _as_buffer) for c in columns] if found else columns), found


def reduce_dataproto(data) -> tuple:
    """``__reduce_ex__`` value for a DataProto: rebuilt by :func:`rebuild_dataproto`
    (under Ray Direct Transport its buffers are tensors: see :func:`transport_state`)."""
    return rebuild_dataproto, transport_state(data)


def _off_cpu(device: str | None) -> bool:
    return device is not None and torch.device(device).type != "cpu"


def unpickling_options() -> ReceiveOptions:
    """The :func:`get_receive_options` for an unpickle starting here. The first such receive
    in a process that does not copy (``copy`` other than ``True``) raises glibc's heap
    thresholds as one freed 32 MiB block does (:mod:`._malloc`): it frees no large block."""
    options = get_receive_options()
    if options.copy is not True:
        _malloc.raise_thresholds()  # once per process
    return options


def rebuild_dataproto(schema_bytes: bytes, num_rows: int, columns: list[tuple]):
    """Unpickle a DataProto under the :func:`get_receive_options` in force.

    Pickled non-tensor columns are allowed here: unpickling already trusts the sender.
    Buffers that arrived as tensors through Ray Direct Transport are this process's
    own memory: tensors view them (``copy=True`` still copies; tensors that arrived on
    a device are first brought to the CPU, then placed as the options say). The options
    come from :func:`unpickling_options` (which may raise glibc's heap thresholds).
    """
    options = unpickling_options()
    # A state with tensors for buffers (Ray Direct Transport) is never one the plans take
    # (a tensor exports no buffer): looked for only when they do not.
    received = False
    on_write = options.copy_on_write_views
    parts = fast_parts(schema_bytes, num_rows, columns, device=options.device, copy=options.copy is True, private=on_write)
    if parts is not None:
        data = assemble(DataProto, *parts)
    else:
        columns, received = _received_tensors(columns)
        on_write = on_write and not received
        record_batch = batch_from_state(schema_bytes, num_rows, columns, private=on_write)
        data = from_arrow(record_batch, device=options.device, copy=options.copy is True, allow_pickle=True)
    if on_write or received:  # numpy views of private buffers would be read-only: give writable copies
        for key, values in data.non_tensor_batch.items():
            if values.dtype != object and not values.flags.writeable:
                data.non_tensor_batch[key] = np.array(values)
    return data


class ReceiveMode(NamedTuple):
    """What a DataProto received here (through Ray's shared memory) gets, and why.

    ``mode`` names what the receive does, in the words of the ``copy=`` value
    that asks for it (``reason``: one sentence):

    ==============  =====================================  ===========================================
    ``mode``        when                                   the tensors
    ==============  =====================================  ===========================================
    ``"on_write"``  ``copy="on_write"``                    private copy-on-write views
    ``"copy"``      ``copy=True``, an accelerator          own their memory
                    ``device``, or copy-on-write
                    unavailable here
    ``"view"``      ``copy=False``                         view shared memory: read-only contract
    ==============  =====================================  ===========================================
    """

    mode: str
    reason: str


_MODE_ASKED: Final[dict[Copy, ReceiveMode]] = {
    ON_WRITE: ReceiveMode("on_write", "shared-memory buffers are mapped privately; a write copies only the pages it touches"),
    True: ReceiveMode("copy", "copy=True was asked for"),
    False: ReceiveMode("view", "copy=False was asked for: tensors view shared memory, treat them as read-only"),
}
"""The receive mode of each ``copy=`` value, where nothing makes the receive copy instead."""


def receive_mode() -> ReceiveMode:
    """The receive mode in force here for objects in shared memory, and why.

    Copy-on-write falls back to copying, never to shared views: when it is
    unavailable in this process (not Linux, no ``/proc``, no reachable
    descriptor on the object store, ``mmap`` refused: logged once on the
    ``arrow_dataproto`` logger when first met) the reason is given here. Small
    objects that Ray inlines (under ~100 KiB) are never in shared memory and are
    always copied; so are tensors decoded onto an accelerator (the transfer is
    the copy).
    """
    options = get_receive_options()
    if _off_cpu(options.device):
        return ReceiveMode("copy", f"tensors are decoded onto {options.device}: the transfer is the copy")
    unavailable = _shm.unavailable_reason() if options.copy == ON_WRITE else None
    if unavailable is not None:
        return ReceiveMode("copy", f"copy-on-write is unavailable here: {unavailable}")
    return _MODE_ASKED[options.copy]
