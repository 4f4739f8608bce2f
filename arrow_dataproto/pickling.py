"""Pickling a DataProto through Arrow, with every buffer out of band.

``pickle.dumps(dp, protocol=5, buffer_callback=...)`` (what Ray does) hands
each Arrow buffer -- each tensor's bytes -- to the callback as a
``PickleBuffer``; the in-band part is the schema and a few integers per column,
a few KiB whatever the batch size. Protocols below 5 carry the bytes in band.

What the receiver gets is set by :class:`ReceiveOptions`: by default every
tensor is copied out of the received buffers, so that nothing a receiver does
to its tensors can change what another reader of the same bytes (another Ray
worker reading the same object) sees. ``copy=False`` views the buffers
instead; ``device=`` decodes straight onto a device. Choose per call with
:func:`receive_options` or process-wide with :func:`set_receive_options` or the
environment variables ``ARROW_DATAPROTO_COPY`` (``0``/``1``) and
``ARROW_DATAPROTO_DEVICE``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, replace

import pyarrow as pa

from ._codec import record_batch_of
from .errors import DecodeError, column_error


@dataclass(frozen=True)
class ReceiveOptions:
    """How an unpickled DataProto is rebuilt.

    ``copy=True`` (default): tensors own their memory (one copy; none extra when
    ``device`` is an accelerator, where the transfer is the copy).
    ``copy=False``: CPU tensors view the received buffers (Ray: the shared-memory
    object store). Treat them as read-only: an in-place write changes the
    object for every process that reads it.
    ``device``: where tensors go (``None``: the device recorded by the sender,
    or the CPU if this process lacks it).
    """

    copy: bool = True
    device: str | None = None


def _from_environment() -> ReceiveOptions:
    copy = os.environ.get("ARROW_DATAPROTO_COPY", "1").strip().lower() not in ("0", "false", "no", "off")
    return ReceiveOptions(copy=copy, device=os.environ.get("ARROW_DATAPROTO_DEVICE") or None)


_process_default = _from_environment()
_current: contextvars.ContextVar[ReceiveOptions | None] = contextvars.ContextVar("arrow_dataproto_receive", default=None)


def get_receive_options() -> ReceiveOptions:
    """The options in force here: the innermost :func:`receive_options`, else the process default."""
    return _current.get() or _process_default


def set_receive_options(*, copy: bool | None = None, device: str | None = None) -> ReceiveOptions:
    """Change the process-wide default (arguments left ``None`` keep their value); returns the new default."""
    global _process_default
    changes = {k: v for k, v in (("copy", copy), ("device", device)) if v is not None}
    _process_default = replace(_process_default, **changes)
    return _process_default


@contextlib.contextmanager
def receive_options(*, copy: bool | None = None, device: str | None = None):
    """Within the block, DataProtos unpickled in this thread/task use these options.

    >>> with receive_options(copy=False):
    ...     batch = ray.get(ref)      # tensors view the object store: read-only contract
    """
    changes = {k: v for k, v in (("copy", copy), ("device", device)) if v is not None}
    token = _current.set(replace(get_receive_options(), **changes))
    try:
        yield
    finally:
        _current.reset(token)


# ---------------------------------------------------------------- record batch <-> picklable state


def _array_state(array: pa.Array) -> tuple:
    """``(length, null_count, offset, buffers, children)`` of an array's storage (buffers stay pa.Buffer)."""
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    kind = array.type
    if pa.types.is_struct(kind):
        if array.offset:  # struct children are exposed pre-sliced: make the offset 0 first
            array = pa.concat_arrays([array])
        children = [array.field(i) for i in range(kind.num_fields)]
    elif kind.num_fields:  # list, large_list, fixed_size_list
        children = [array.values]
    else:
        children = []
    buffers = array.buffers()[: kind.num_buffers]
    return len(array), array.null_count, array.offset, buffers, [_array_state(c) for c in children]


def _array(kind: pa.DataType, state: tuple) -> pa.Array:
    storage_kind = kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind
    length, null_count, offset, buffers, children = state
    if pa.types.is_struct(storage_kind):
        child_kinds = [storage_kind.field(i).type for i in range(storage_kind.num_fields)]
    elif storage_kind.num_fields:
        child_kinds = [storage_kind.value_type]
    else:
        child_kinds = []
    if len(child_kinds) != len(children):
        raise DecodeError(f"pickled column of type {kind} has {len(children)} children, expected {len(child_kinds)}")
    # Integers pyarrow can take (not too large, not negative); from_arrow checks the rest.
    if not (
        all(type(n) is int for n in (length, null_count, offset))
        and 0 <= length < 2**63
        and 0 <= offset < 2**63
        and -1 <= null_count <= length
    ):
        raise DecodeError(f"array of type {kind}: bad length {length!r}, null count {null_count!r} or offset {offset!r}")
    buffers = [None if b is None else pa.py_buffer(b) for b in buffers]
    child_arrays = [_array(k, c) for k, c in zip(child_kinds, children)] or None
    storage = pa.Array.from_buffers(storage_kind, length, buffers, null_count, offset, child_arrays)
    return pa.ExtensionArray.from_storage(kind, storage) if storage_kind is not kind else storage


def _column(field: pa.Field, state: tuple) -> pa.Array:
    """One pickled column's array; :class:`DecodeError` naming the column if its state is corrupt."""
    try:
        return _array(field.type, state)
    except (pa.ArrowException, OSError, TypeError, ValueError) as e:
        raise column_error(DecodeError, field.name, f"corrupt pickled column: {e}") from e


def batch_state(record_batch: pa.RecordBatch) -> tuple[bytes, int, list[tuple]]:
    """A picklable state of a RecordBatch whose buffers are ``pa.Buffer`` objects (out of band with protocol 5)."""
    return (
        record_batch.schema.serialize().to_pybytes(),
        record_batch.num_rows,
        [_array_state(c) for c in record_batch.columns],
    )


def batch_from_state(schema_bytes: bytes, num_rows: int, columns: list[tuple]) -> pa.RecordBatch:
    """Inverse of :func:`batch_state`, zero-copy over the buffers it is given."""
    if type(num_rows) is not int or not 0 <= num_rows < 2**63:
        raise DecodeError(f"corrupt pickled DataProto: row count {str(num_rows)[:40]}")
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
        if len(columns) != len(schema):
            raise DecodeError(f"pickled batch has {len(columns)} columns, its schema {len(schema)}")
        return record_batch_of([_column(f, c) for f, c in zip(schema, columns)], schema, num_rows)
    except (pa.ArrowException, OSError, TypeError, ValueError) as e:  # pyarrow: OSError for corrupt schema bytes
        if isinstance(e, DecodeError):
            raise
        raise DecodeError(f"corrupt pickled DataProto: {e}") from e


def reduce_dataproto(data) -> tuple:
    """``__reduce_ex__`` value for a DataProto: rebuilt by :func:`rebuild_dataproto`."""
    from ._codec import to_arrow

    return rebuild_dataproto, batch_state(to_arrow(data))


def rebuild_dataproto(schema_bytes: bytes, num_rows: int, columns: list[tuple]):
    """Unpickle a DataProto under the :func:`get_receive_options` in force.

    Pickled non-tensor columns are allowed here: unpickling already trusts the sender.
    """
    from ._decoding import from_arrow

    options = get_receive_options()
    record_batch = batch_from_state(schema_bytes, num_rows, columns)
    return from_arrow(record_batch, device=options.device, copy=options.copy, allow_pickle=True)
