"""``from_arrow`` and ``from_ipc``: the codec's decoded parts as a :class:`~arrow_dataproto.DataProto`."""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa
import torch

from ._codec import decode, read_stream
from ._container import DataProto
from ._format import resolve_columns
from .errors import DecodeError


def from_arrow(
    record_batch: pa.RecordBatch,
    *,
    columns: Iterable[str] | None = None,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
) -> DataProto:
    """Rebuild a :class:`~arrow_dataproto.DataProto` from a RecordBatch made by :func:`to_arrow`.

    Zero-copy by default: CPU tensors (and numeric numpy columns) view the
    RecordBatch's buffers, so they are only as writable as that memory, and
    writes show in every other view of it. ``copy=True`` gives tensors that own
    their memory. ``device`` (like ``map_location``) places every tensor there
    (one copy each); otherwise each goes to its recorded device, or to the CPU
    with one ``RuntimeWarning`` if this process lacks it. ``columns`` decodes
    only those columns (a nested TensorDict's name selects all its leaves;
    :class:`ColumnNotFoundError` for an unknown name); the others are not read.

    Pickled non-tensor columns or ``meta_info`` are refused with
    :class:`PickleNotAllowedError` unless ``allow_pickle=True``: only allow
    pickles from a trusted source. Every length, offset and shape is checked
    against the buffers before a tensor is built; a malformed batch raises
    :class:`DecodeError`, an unknown major version :class:`FormatVersionError`.
    """
    if columns is not None:
        if not isinstance(record_batch, pa.RecordBatch):
            raise DecodeError(f"expected a pyarrow.RecordBatch, got {type(record_batch).__name__}")
        columns = resolve_columns(record_batch.schema.names, columns, "the batch")
    batch, non_tensor_batch, meta_info = decode(
        record_batch, columns=columns, device=device, copy=copy, allow_pickle=allow_pickle
    )
    return DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta_info)


def from_ipc(
    buffer: Any,
    *,
    columns: Iterable[str] | None = None,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
    max_decoded_bytes: int | str | None = "auto",
) -> DataProto:
    """Decode an Arrow IPC stream written by :func:`to_ipc` (``pa.Buffer``, bytes-like, or memoryview).

    Zero-copy for uncompressed streams: tensors view ``buffer`` itself, which
    stays alive as long as they do. Do not write to them unless the buffer is
    yours and writable (a ``bytes`` object is not), or pass ``copy=True``.
    Compressed streams are decompressed into new memory. Other arguments and
    errors as in :func:`from_arrow`; a stream holding several record batches is
    concatenated (a copy).

    ``buffer`` is untrusted: a compressed stream may decode to at most
    ``max_decoded_bytes`` (default ``"auto"``: 64 MiB or 256 times the stream's size,
    whichever is larger; an int: that many bytes; ``None``: no limit), checked from the
    message headers before anything is decompressed (:class:`DecodeError` beyond it).
    """
    parts = [
        from_arrow(b, columns=columns, device=device, copy=copy, allow_pickle=allow_pickle)
        for b in read_stream(buffer, max_decoded_bytes)
    ]
    return parts[0] if len(parts) == 1 else DataProto.concat(parts, meta_info="update")
