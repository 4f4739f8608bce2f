"""DataProto batches in Arrow IPC files: write, append, open, read rows and columns, recover.

A file is an Arrow IPC *file* (the random-access format, ``.arrow``; pyarrow,
``pandas.read_feather``, polars and DuckDB open it) holding one record batch
per DataProto written, every batch with the same columns. Layout:

- the footer schema is the first batch's schema: the columns, their field
  metadata (torch dtype, per-row shape, device, layout) and that batch's schema
  metadata (see ``docs/format.md``);
- every batch carries its own schema metadata as the batch's custom metadata,
  so its batch size, TensorDict tree and ``meta_info`` read back exactly;
- the footer metadata records the compression (``adp.compression``).

``FileWriter(portable=True)`` writes the portable view of each batch (plain Arrow types other
tools read as values, see ``docs/format.md``) and ``stream=True`` an IPC *stream* file (what
HF ``datasets.Dataset.from_file`` opens); the readers give the same DataProtos back from
every form.

Reading (:func:`open_file`) is zero-copy for uncompressed files: each read call
maps the file privately (``mmap.ACCESS_COPY``) and decoded tensors view the
mapped pages, so nothing is read from disk until a tensor is touched. An
in-place write to such a tensor copies the touched page privately: it never
changes the file, nor what another read call returns (each call has its own
mapping; tensors from one call share it). A mapping lives as long as any tensor
or array viewing it, whether or not the reader is closed. Compressed files are
decompressed into new memory, column by column as read. Measured
(``benchmarks/results/files.md``): a read call costs well under a millisecond
whatever the file size, and the first in-place write over a mapped tensor costs
about what ``clone()`` would (each touched page is copied once). Like any
private writable mapping, it counts toward the commit limit on systems with
strict overcommit; ``copy=True`` reads into ordinary memory instead.

Never truncate or rewrite a file in place while it is open: touching a mapped
page past the new end of the file kills the process (``SIGBUS``). This module
never does: a writer writes ``PATH.<random>.partial`` and renames it over
``PATH`` when closed, which leaves open readers on the old file.

The readers also open any other Arrow IPC file, and IPC *stream* files (no ``ARROW1``
magic: HF ``datasets``' cache files, ``polars.write_ipc_stream``, :func:`~arrow_dataproto.to_ipc`
written to disk), memory-mapped the same way. A stream has no footer: opening one reads its
message headers once (nothing is decompressed) to find each batch, which is then read by
index (zero-copy if uncompressed; a stream with dictionary batches is read in order up to
the batch asked for). Another tool's columns are read by the rule of
:func:`~arrow_dataproto.from_arrow` (``docs/format.md``, "Reading tables of other tools");
``read_all``/``read_rows`` read its batches as one table.

Errors: a file that is not Arrow (or names another format), truncated or corrupt raises
:class:`~arrow_dataproto.errors.DecodeError` (never a raw pyarrow error). Arrow
files carry no checksum: a flipped bit in tensor values reads back unnoticed
unless the file was written with ``checksums=True`` and is read with
``verify=True`` (see :mod:`arrow_dataproto._checksum`); pickled columns or ``meta_info`` raise
:class:`~arrow_dataproto.errors.PickleNotAllowedError` unless the reader was
opened with ``allow_pickle=True``.

Modules: :mod:`~arrow_dataproto.files.writer` (writing), :mod:`~arrow_dataproto.files.evolution`
(what the batches of a file share, schema promotion), :mod:`~arrow_dataproto.files.base` (what
the readers share: rows, columns, decoding), :mod:`~arrow_dataproto.files.options`
(:class:`ReadOptions`: how the readers read), :mod:`~arrow_dataproto.files.reader` (reading
one file), :mod:`~arrow_dataproto.files.dataset` (several files as one),
:mod:`~arrow_dataproto.files.recover` (copy and recovery) and :mod:`~arrow_dataproto.files.layout`
(a file's layout and checksums from its IPC metadata, with pyarrow and numpy alone).
This package imports neither torch nor tensordict until a batch is encoded or decoded.
"""

from .dataset import DatasetReader, open_dataset
from .evolution import schema_difference
from .layout import BatchLayout, ColumnInfo, layout_readable, read_layout
from .options import ReadOptions
from .reader import FileReader, open_file, read_file
from .recover import copy_file, recover_file
from .writer import FileWriter, write_file

__all__ = [
    "BatchLayout",
    "ColumnInfo",
    "DatasetReader",
    "FileReader",
    "FileWriter",
    "ReadOptions",
    "copy_file",
    "layout_readable",
    "open_dataset",
    "open_file",
    "read_file",
    "read_layout",
    "recover_file",
    "write_file",
]
