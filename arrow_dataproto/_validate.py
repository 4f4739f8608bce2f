"""The validation gate, with pyarrow alone: every path that reads a RecordBatch's values or
sizes (decoding, sizes, copies, recovery, pandas, the command line's ``head``) puts the batch
through :func:`validate_arrow` first; every decoder that refuses nulls does so with
:func:`no_nulls`."""

from __future__ import annotations

import pyarrow as pa

from .errors import DecodeError, column_error


def validate_arrow(record_batch: pa.RecordBatch, where: str = "") -> None:
    """Raise :class:`DecodeError` unless every value of ``record_batch`` lies within its buffers.

    Arrow's full validation (every offset within its buffers, UTF-8, ...) plus what it
    skips (:func:`_check_offsets`); :class:`DecodeError` naming the column otherwise. Costs
    one pass over offsets and strings, none over fixed-width values.
    """
    if not isinstance(record_batch, pa.RecordBatch):
        raise DecodeError(f"expected a pyarrow.RecordBatch, got {type(record_batch).__name__}")
    prefix = f"{where}: " if where else ""
    try:
        record_batch.validate(full=True)
    except pa.ArrowException as e:
        raise DecodeError(f"{prefix}invalid Arrow data: {e}") from e
    for name, column in zip(record_batch.schema.names, record_batch.columns):
        _check_offsets(name, column)


def no_nulls(name: str, array: pa.Array, what: str) -> None:
    """Raise :class:`DecodeError` naming column ``name`` ("``N`` null ``what``") if ``array``
    holds nulls (its own validity bitmap, not its children's)."""
    if array.null_count:
        raise column_error(DecodeError, name, f"{array.null_count} null {what}")


def _check_offsets(name: str, array: pa.Array) -> None:
    """What Arrow's full validation skips (pyarrow 26): a negative offset, and a fixed_size_list
    whose values end before its offset + length. Either would let a view read outside the
    buffers; only hand-built arrays (``Array.from_buffers``: a pickled state) can have them."""
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    kind = array.type
    if array.offset < 0:
        raise column_error(DecodeError, name, f"negative array offset {array.offset}")
    if pa.types.is_fixed_size_list(kind) and len(array.values) < (array.offset + len(array)) * kind.list_size:
        raise column_error(DecodeError, name, "fixed_size_list values end before its offset + length")
    if pa.types.is_struct(kind):
        children = [array.field(i) for i in range(kind.num_fields)]
    elif pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        children = [array.values]
    else:
        children = []
    for child in children:
        _check_offsets(name, child)
