"""Ray Data over rollout files: a parallel reader, and a Ray Data batch <-> DataProto.

:func:`read_files` turns Arrow files of DataProto batches (written by
:func:`arrow_dataproto.files.write_file` or :class:`~arrow_dataproto.files.FileWriter`)
into a ``ray.data.Dataset`` with **one block per record batch**. The driver reads
only what counts the batches and their rows (footers and batch headers, see
:class:`DataProtoDatasource`), never the values; every batch is
read by a Ray task, in parallel, on whichever node Ray picks, and only the columns
asked for: ``columns=`` here, or a later ``Dataset.select_columns`` pushed down
into the read.

A block is the record batch as stored (a ``pyarrow.Table``): tensors are still
Arrow columns (bfloat16 as its bits, pickled objects as bytes) and the batch's
TensorDict tree and ``meta_info`` ride along in the schema metadata. Inside
``map_batches(..., batch_format="pyarrow")``, :func:`to_dataproto` makes a
DataProto of a batch (zero-copy), and :func:`from_dataproto` makes the table to
return::

    import arrow_dataproto as adp

    ds = adp.ray_data.read_files("rollouts/", columns=["responses", "advantages", "data_source"])

    def score(table):
        dp = adp.ray_data.to_dataproto(table)
        dp.batch["score"] = dp.batch["advantages"].sum(dim=1)
        return adp.ray_data.from_dataproto(dp)

    ds = ds.map_batches(score, batch_format="pyarrow")

A batch Ray hands to ``map_batches`` may be part of a block, or span several;
:func:`to_dataproto` takes its row count from the rows present, and its
``meta_info`` is that of the first record batch in it.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Iterable

import pyarrow as pa
import torch

from ._optional import missing_dependency

try:  # Ray Data needs pandas, which the ray extra does not bring
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ModuleNotFoundError as e:
    raise missing_dependency("arrow_dataproto.ray_data", e) from e

from ._codec import to_arrow
from ._container import DataProto
from ._decoding import from_arrow
from ._format import PORTABLE, resolve_columns
from ._limits import MaxDecoded
from ._portable import from_portable, to_portable
from .errors import ArgumentTypeError
from .files import open_dataset, open_file

__all__ = ["read_files", "to_dataproto", "from_dataproto", "DataProtoDatasource"]


class DataProtoDatasource(Datasource):
    """The ``ray.data`` datasource behind :func:`read_files`: one read task per record batch.

    Holds only paths, batch indices and row counts (read when it is made, from the footers
    and record batch headers alone, as :attr:`~arrow_dataproto.files.FileReader.batch_rows`
    counts them: no batch is read), so shipping it to the read tasks costs nothing.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Iterable[str | os.PathLike],
        *,
        columns: Iterable[str] | None = None,
        max_decoded_bytes: MaxDecoded = "auto",
        verify: bool = False,
    ):
        super().__init__()
        with open_dataset(paths, max_decoded_bytes=max_decoded_bytes) as dataset:
            self._columns = list(dataset.columns)
            # a dataset may mix portable and stored files: every block takes the first file's form
            self._portable = PORTABLE.encode() in (dataset.schema.metadata or {})
            # checks the names now (ColumnNotFoundError); a nested TensorDict's name selects its leaves
            self._selected = None if columns is None else resolve_columns(self._columns, columns, str(dataset))
            self._batches = []  # (path, batch index, rows, estimated bytes: the file's size pro rata)
            for file in dataset.files:
                size, total = os.path.getsize(file.path), max(file.num_rows, 1)
                path = os.path.abspath(file.path)  # read tasks run in the workers' working directory, not ours
                self._batches += [(path, i, rows, size * rows // total) for i, rows in enumerate(file.batch_rows)]
        self._projection_map = None
        self._max_decoded_bytes, self._verify = max_decoded_bytes, verify

    @property
    def num_batches(self) -> int:
        return len(self._batches)

    def supports_projection_pushdown(self) -> bool:
        return True

    def estimate_inmemory_data_size(self) -> int:
        return sum(size for *_, size in self._batches)

    def _read_columns(self) -> list[str] | None:
        projected = self._get_data_columns()
        if projected is None:
            return self._selected
        if self._selected is None:
            return projected
        keep = set(projected)
        return [name for name in self._selected if name in keep]

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None) -> list[ReadTask]:
        columns, max_decoded_bytes, verify = self._read_columns(), self._max_decoded_bytes, self._verify
        form = to_portable if self._portable else from_portable

        def read(path: str, i: int) -> list[pa.Table]:
            with open_file(path, max_decoded_bytes=max_decoded_bytes, verify=verify) as reader:
                return [pa.Table.from_batches([form(reader.read_arrow(i, columns))])]

        return [
            ReadTask(
                functools.partial(read, path, i),
                BlockMetadata(num_rows=rows, size_bytes=size, input_files=(path,), exec_stats=None),
                per_task_row_limit=per_task_row_limit,
            )
            for path, i, rows, size in self._batches
        ]


def read_files(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    columns: Iterable[str] | None = None,
    max_decoded_bytes: MaxDecoded = "auto",
    verify: bool = False,
    **read_args: Any,
) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of DataProto files, read in parallel, one block per record batch.

    ``paths``: a file, a folder (its ``*.arrow`` files, sorted by name) or a list of
    files, all with the columns of the first (:class:`~arrow_dataproto.SchemaMismatchError`
    otherwise, as :func:`~arrow_dataproto.files.open_dataset`). The driver opens each
    file to read its footer and row counts, nothing more. ``columns``: read only these
    (a nested TensorDict's name selects its leaves; :class:`~arrow_dataproto.ColumnNotFoundError`
    for an unknown name). ``max_decoded_bytes`` and ``verify`` apply in every read task as
    in :func:`~arrow_dataproto.files.open_file`. ``read_args`` go to
    ``ray.data.read_datasource`` (``num_cpus``, ``concurrency``, ``ray_remote_args``...);
    unless given, ``override_num_blocks`` is the number of record batches, so that Ray
    does not split them.

    Blocks are the stored record batches (see the module docstring), in the form of the first
    file (portable or not: a dataset may mix both, as :func:`~arrow_dataproto.files.open_dataset`
    compares them in the stored form); use :func:`to_dataproto` in
    ``map_batches(..., batch_format="pyarrow")``.
    """
    datasource = DataProtoDatasource(paths, columns=columns, max_decoded_bytes=max_decoded_bytes, verify=verify)
    read_args.setdefault("override_num_blocks", max(datasource.num_batches, 1))
    return ray.data.read_datasource(datasource, **read_args)


def to_dataproto(
    batch: pa.Table | pa.RecordBatch,
    *,
    device: str | torch.device | None = None,
    copy: bool = False,
    allow_pickle: bool = False,
) -> DataProto:
    """The DataProto of a Ray Data batch in the ``"pyarrow"`` batch format.

    As :func:`~arrow_dataproto.from_arrow`: zero-copy over the batch's buffers unless
    ``copy=True`` or a device is given; pickled columns need ``allow_pickle=True``; a
    batch of several chunks is combined first (one copy). A batch in another format
    (a dict of numpy arrays, a DataFrame) is an :class:`~arrow_dataproto.ArgumentTypeError`:
    pass ``batch_format="pyarrow"`` to ``map_batches``.
    """
    if not isinstance(batch, (pa.Table, pa.RecordBatch)):
        raise ArgumentTypeError(
            f"expected a pyarrow Table (map_batches(..., batch_format='pyarrow')), got {type(batch).__name__}"
        )
    return from_arrow(batch, device=device, copy=copy, allow_pickle=allow_pickle)


def from_dataproto(data: Any) -> pa.Table:
    """A DataProto (ours or verl's) or TensorDict as a ``pyarrow.Table`` to return from
    ``map_batches``: :func:`~arrow_dataproto.to_arrow`, zero-copy over CPU tensors."""
    return pa.Table.from_batches([to_arrow(data)])
