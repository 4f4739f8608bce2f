"""What :class:`~arrow_dataproto.files.FileReader` and :class:`~arrow_dataproto.files.DatasetReader`
share (:class:`BatchReader`): a file's or dataset's batches as rows and columns, decoded into DataProtos.
"""

from __future__ import annotations

import bisect
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import pyarrow as pa

from .._format import META_INFO_ENCODING, Node, is_foreign, newer_version_rule, resolve_columns
from .._meta_info import decode_meta_info
from .._objects import PICKLE
from .._progress import progress_bar
from ..errors import DecodeError, PickleNotAllowedError, RowIndexError
from .layout import ColumnInfo
from .options import ReadKeywords, ReadOptions, read_options

if TYPE_CHECKING:
    import torch

    from .._container import DataProto


def _empty() -> DataProto:
    from .._container import DataProto

    return DataProto()


class BatchReader:
    """What :class:`FileReader` and :class:`DatasetReader` share: rows, columns, decoding.

    Subclasses provide ``schema``, ``num_batches``, ``_read``, ``_count_rows`` and ``_metadata``.
    ``options`` holds how it reads (:class:`~arrow_dataproto.files.ReadOptions`: ``options``
    with each of ``keywords`` replacing its field); ``allow_pickle``, ``device``, ``copy`` and
    ``progress`` read it.
    """

    schema: pa.Schema

    def __init__(self, options: ReadOptions | None, keywords: ReadKeywords):
        self.options = read_options(options, keywords)
        self.original_schema = None
        if self.options.schema is not None:
            from .. import _restore

            self.original_schema = _restore.original_schema(self.options.schema, allow_pickle=self.allow_pickle)
        self._batch_rows: list[int] | None = None

    # -- the options, as attributes (see ReadOptions)

    @property
    def allow_pickle(self) -> bool:
        return self.options.allow_pickle

    @property
    def device(self) -> str | torch.device | None:
        return self.options.device

    @property
    def copy(self) -> bool:
        return self.options.copy

    @property
    def progress(self) -> bool:
        return self.options.progress

    # -- subclass hooks

    @property
    def num_batches(self) -> int:
        raise NotImplementedError

    def _read(self, indices: Sequence[int], fields: list[int] | None) -> list[tuple[pa.RecordBatch, dict[str, str]]]:
        """Batches ``indices`` with only the columns ``fields`` (all if None) and their schema metadata."""
        raise NotImplementedError

    def _count_rows(self) -> list[int]:
        """The number of rows of each batch, from message headers (no batch read)."""
        raise NotImplementedError

    def _metadata(self, i: int) -> dict[str, str]:
        """The schema metadata of batch ``i``, reading as little as possible."""
        raise NotImplementedError

    def _paths(self) -> list[Path]:
        raise NotImplementedError

    # -- layout

    @property
    def columns(self) -> list[str]:
        """Column names: TensorDict leaves (nested keys joined by ``.``), then non-tensor columns."""
        return list(self.schema.names)

    def column_info(self) -> list[ColumnInfo]:
        """Every column's kind, dtype, per-row shape and device, from the schema alone."""
        return [ColumnInfo.from_field(field) for field in self.schema]

    @property
    def pickled_columns(self) -> list[str]:
        """Columns whose values are pickled (reading them needs ``allow_pickle=True``)."""
        return [c.name for c in self.column_info() if c.kind == PICKLE]

    @property
    def batch_rows(self) -> list[int]:
        """The number of rows of each batch (computed once, from the record batch message
        headers alone: no batch is read, nothing decompressed)."""
        if self._batch_rows is None:
            self._batch_rows = self._count_rows()
        return self._batch_rows

    @property
    def num_rows(self) -> int:
        return sum(self.batch_rows)

    def meta_info_encoding(self, i: int = 0) -> str | None:
        """How batch ``i``'s ``meta_info`` is stored: ``"json"``, ``"pickle"``, or None if it has none."""
        return self._metadata(self._index(i)).get(META_INFO_ENCODING)

    def read_meta_info(self, i: int = 0) -> dict:
        """Batch ``i``'s ``meta_info`` alone (:class:`PickleNotAllowedError` if pickled and not allowed)."""
        metadata = self._metadata(self._index(i))
        with newer_version_rule(metadata):
            return self._refusing_pickles(lambda: decode_meta_info(metadata, allow_pickle=self.allow_pickle))

    def column_nbytes(self) -> dict[str, int]:
        """Bytes each column takes in memory, all batches together (uncompressed sizes:
        a compressed file is decompressed batch by batch to count them)."""
        totals = dict.fromkeys(self.columns, 0)
        with progress_bar(self.progress, total=self.num_batches, desc="sizing", unit="batch") as bar:
            for i in range(self.num_batches):
                batch, _ = self._read([i], None)[0]
                for name, column in zip(batch.schema.names, batch.columns):
                    totals[name] += column.nbytes
                bar.update()
        return totals

    def arrow_dataset(self):
        """The file(s) as a ``pyarrow.dataset.Dataset``, for Arrow-level scans and filters.

        Columns appear as stored (bfloat16 as uint16, tensors as fixed_shape_tensor; a
        portable file's in its plain types: float32, nested fixed-size lists); only
        the first batch's ``meta_info`` is visible (as schema metadata)."""
        import pyarrow.dataset as ds

        return ds.dataset([str(p) for p in self._paths()], format="ipc")

    # -- reading

    def _index(self, i: int) -> int:
        n = self.num_batches
        if not -n <= i < n:
            raise RowIndexError(f"batch {i} out of range: {self} has {n} batches" + (f" (0 to {n - 1}, or -{n} to -1)" if n else ""))
        return i % n

    def _fields(self, columns: Iterable[str] | None) -> tuple[list[int] | None, list[str] | None]:
        """Indices and names of the columns asked for (a nested TensorDict's name selects its leaves)."""
        if columns is None:
            return None, None
        keep = resolve_columns(self.columns, columns, str(self))
        return [i for i, n in enumerate(self.columns) if n in keep], keep

    def _refusing_pickles(self, decode):
        try:
            return decode()
        except PickleNotAllowedError as e:
            raise PickleNotAllowedError(
                f"{self}: {e}; open it with allow_pickle=True if you trust it, or read without "
                "the pickled parts (columns=[...], meta_info=False)"
            ) from None

    def _decode(
        self,
        batch: pa.RecordBatch,
        metadata: dict[str, str],
        keep: list[str] | None,
        rows: tuple[int, int] | None,
        meta_info: bool,
    ) -> DataProto:
        from .._codec import decode
        from .._container import DataProto

        batch = batch.replace_schema_metadata(metadata)

        def decoded() -> DataProto:
            parts = decode(
                batch, columns=keep, rows=rows, meta_info=meta_info,
                device=self.device, copy=self.copy, allow_pickle=self.allow_pickle, schema=self.original_schema,
                validated=True,  # every batch _read returns passed validate_arrow
            )
            return DataProto(batch=parts.batch, non_tensor_batch=parts.non_tensor_batch, meta_info=parts.meta_info)

        return self._refusing_pickles(decoded)

    def read_batch(self, i: int, columns: Iterable[str] | None = None, *, meta_info: bool = True) -> DataProto:
        """Batch ``i`` as written (zero-copy for uncompressed files).

        ``columns``: read only these (a nested TensorDict's name selects all its leaves);
        ``meta_info=False`` leaves ``meta_info`` empty (nothing of it is decoded).
        """
        fields, keep = self._fields(columns)
        batch, metadata = self._read([self._index(i)], fields)[0]
        return self._decode(batch, metadata, keep, None, meta_info)

    def read_arrow(self, i: int, columns: Iterable[str] | None = None) -> pa.RecordBatch:
        """Batch ``i`` as stored, nothing decoded: a RecordBatch that :func:`~arrow_dataproto.from_arrow`
        turns into the DataProto :meth:`read_batch` gives (its schema metadata holds the
        batch's tree, trimmed to ``columns``, and ``meta_info``).

        Zero-copy for uncompressed files (the columns view the file's memory map); a
        compressed file decompresses only ``columns``. Pickled columns stay bytes, so no
        ``allow_pickle`` is needed here; decoding them is what needs it.
        """
        fields, keep = self._fields(columns)
        batch, metadata = self._read([self._index(i)], fields)[0]
        tree = Node.parse(metadata) if keep is not None and not is_foreign(self.schema) else None
        if tree is not None:
            metadata = {**metadata, **tree.select(set(keep or ())).metadata()}
        return batch.replace_schema_metadata(metadata)

    def read_rows(
        self, start: int = 0, stop: int | None = None, columns: Iterable[str] | None = None, *, meta_info: bool = True
    ) -> DataProto:
        """Rows ``start:stop`` across batches (Python slice rules, step 1, except that ``start``
        must be a row of the file or its end: :class:`RowIndexError` otherwise; ``stop`` past
        the end stops at the end).

        Rows within one batch are a zero-copy view (uncompressed files); rows spanning
        several batches are concatenated (one copy), and their ``meta_info`` is the first
        batch's updated by the later ones'. ``columns`` and ``meta_info`` as in :meth:`read_batch`.
        """
        fields, keep = self._fields(columns)
        if not -self.num_rows <= start <= self.num_rows:
            raise RowIndexError(f"read_rows({start}, {stop}): start {start} is outside {self}, which has {self.num_rows} rows (start 0 to {self.num_rows}, or -{self.num_rows} to -1)")
        start, stop, _ = slice(start, stop).indices(self.num_rows)
        stop = max(start, stop)
        bounds = [0, *itertools.accumulate(self.batch_rows)]
        if start == stop:  # no rows, but the columns of the file
            if not self.num_batches:
                return _empty()
            first = min(bisect.bisect_right(bounds, start) - 1, self.num_batches - 1)
            spans: list[tuple[int, int, int | None]] = [(first, 0, 0)]
        else:
            spans = [
                (i, max(start, bounds[i]) - bounds[i], min(stop, bounds[i + 1]) - bounds[i])
                for i in range(self.num_batches)
                if bounds[i] < stop and bounds[i + 1] > start
            ]
        return self._gather(spans, fields, keep, meta_info)

    def read_all(self, columns: Iterable[str] | None = None, *, meta_info: bool = True) -> DataProto:
        """Every row as one DataProto (one batch: zero-copy; several: concatenated, see :meth:`read_rows`)."""
        fields, keep = self._fields(columns)
        if not self.num_batches:
            return _empty()
        return self._gather([(i, 0, None) for i in range(self.num_batches)], fields, keep, meta_info)

    def _gather(self, spans: list[tuple[int, int, int | None]], fields, keep, meta_info: bool) -> DataProto:
        """Rows ``a:b`` of batch ``i`` for each ``(i, a, b)`` (``b`` None: the whole batch), concatenated."""
        parts = []
        batches = self._read([i for i, _, _ in spans], fields)
        if len(batches) > 1 and is_foreign(self.schema):  # one table: one rule over all its rows
            pieces = [batch.slice(a, (batch.num_rows if b is None else b) - a) for (_, a, b), (batch, _) in zip(spans, batches)]
            from .._codec import as_record_batch

            try:
                whole = as_record_batch(pa.Table.from_batches(pieces), validated=True)  # _read validated each
            except (pa.ArrowException, ValueError) as e:  # DecodeError is a ValueError
                raise DecodeError(f"{self}: the batches do not form one table: {e}") from e
            return self._decode(whole, batches[0][1], keep, None, meta_info)
        with progress_bar(self.progress and len(spans) > 1, total=len(spans), desc="reading", unit="batch") as bar:
            for (_, a, b), (batch, metadata) in zip(spans, batches):
                rows = None if b is None or (a, b) == (0, batch.num_rows) else (a, b)
                parts.append(self._decode(batch, metadata, keep, rows, meta_info))
                bar.update()
        return parts[0] if len(parts) == 1 else type(parts[0]).concat(parts, meta_info="update")

    def iter_batches(self, columns: Iterable[str] | None = None, *, meta_info: bool = True) -> Iterator[DataProto]:
        """Each batch in order, as :meth:`read_batch` returns it."""
        with progress_bar(self.progress, total=self.num_batches, desc="reading", unit="batch") as bar:
            for i in range(self.num_batches):
                yield self.read_batch(i, columns, meta_info=meta_info)
                bar.update()

    def __iter__(self) -> Iterator[DataProto]:
        return self.iter_batches()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError
