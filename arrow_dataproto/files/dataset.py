"""Several Arrow files with the same columns read as one: :class:`DatasetReader`, :func:`open_dataset`."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import pyarrow as pa

from .._format import PORTABLE, is_foreign
from ..errors import DecodeError, SchemaMismatchError
from .evolution import schema_difference
from .base import BatchReader
from .options import ReadKeywords, ReadOptions
from .reader import FileReader

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _stored_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` in the stored form: a portable file's columns as their stored types, without
    ``adp.portable`` (what :func:`_portable.from_portable` makes of its batches)."""
    if is_foreign(schema) or PORTABLE.encode() not in (schema.metadata or {}):
        return schema
    try:
        from .. import _portable

        return _portable.from_portable(pa.RecordBatch.from_pylist([], schema=schema)).schema
    except (pa.ArrowException, ValueError, TypeError) as e:  # DecodeError is a ValueError
        raise DecodeError(f"a portable schema that has no stored form: {e}") from e


class DatasetReader(BatchReader):
    """Several Arrow files with the same columns read as one; made by :func:`open_dataset`.

    Batches are numbered across the files in order; everything else (``options`` and
    ``keywords`` included) is as in :class:`FileReader`. ``files`` holds each file's reader.
    """

    def __init__(
        self, paths: Sequence[str | os.PathLike], *, options: ReadOptions | None = None, **keywords: Unpack[ReadKeywords]
    ):
        super().__init__(options, keywords)
        if not paths:
            raise FileNotFoundError("a dataset needs at least one file")
        self.files: list[FileReader] = []
        try:
            # each file decodes nothing itself (this reader does: one bar, one original schema)
            file_options = dataclasses.replace(self.options, progress=False, schema=None)
            for path in paths:
                self.files.append(FileReader(path, options=file_options))
            first = self.files[0]
            stored = _stored_schema(first.schema)
            for other in self.files[1:]:  # compared in the stored form, as FileWriter compares batches
                differences = schema_difference(stored, _stored_schema(other.schema))
                if differences:
                    raise SchemaMismatchError(
                        f"{other.path} does not match the columns of {first.path}: " + "; ".join(differences)
                    )
        except BaseException:
            self.close()
            raise
        self.schema = first.schema
        self._starts = [0, *itertools.accumulate(f.num_batches for f in self.files)]

    @property
    def num_batches(self) -> int:
        return self._starts[-1]

    def _paths(self) -> list[Path]:
        return [f.path for f in self.files]

    def _split(self, indices: Sequence[int]):
        """``(file, local indices)`` groups of consecutive batch indices in the same file."""
        def file_of(i: int) -> int:
            return bisect.bisect_right(self._starts, i) - 1

        for f, group in itertools.groupby(indices, key=file_of):
            yield self.files[f], [i - self._starts[f] for i in group]

    def _read(self, indices, fields):
        return [item for file, local in self._split(indices) for item in file._read(local, fields)]

    def _count_rows(self):
        return [rows for file in self.files for rows in file.batch_rows]

    def _metadata(self, i):
        file, local = next(self._split([i]))
        return file._metadata(local[0])

    def verify(self) -> int:
        """:meth:`FileReader.verify` of every file, in order; the number of buffers checked."""
        return sum(file.verify() for file in self.files)

    def close(self) -> None:
        for file in self.files:
            file.close()

    def __repr__(self) -> str:
        return f"<DatasetReader of {len(self.files)} files: {self.num_batches} batches, {len(self.columns)} columns>"



def open_dataset(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    options: ReadOptions | None = None,
    **keywords: Unpack[ReadKeywords],
) -> DatasetReader:
    """Open several files as one: a folder (its ``*.arrow`` files, sorted by name) or a list of paths.

    Every file must have the columns of the first (:class:`SchemaMismatchError` names
    the file and the differences), compared in the stored form as :class:`FileWriter` compares
    batches: portable and stored files (and IPC stream files) of the same batches mix, and so do
    files of different minor format versions (a reader accepts every minor of its major).
    ``options`` (a :class:`~arrow_dataproto.files.ReadOptions`) and ``keywords`` as in
    :func:`open_file`; ``schema`` and ``progress`` apply to the dataset as a whole. For Arrow-level
    filtering and scans, :meth:`~DatasetReader.arrow_dataset` gives a ``pyarrow.dataset``.
    """
    if isinstance(paths, (str, os.PathLike)) and Path(paths).is_dir():
        folder, paths = paths, sorted(Path(paths).glob("*.arrow"))
        if not paths:
            raise FileNotFoundError(f"no *.arrow files in {folder}")
    elif isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return DatasetReader(list(paths), options=options, **keywords)
