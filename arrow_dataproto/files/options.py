"""How the readers read: :class:`ReadOptions`, one frozen object taken by :func:`open_file`,
:func:`read_file`, :func:`open_dataset`, :class:`FileReader` and :class:`DatasetReader`.

Each of them takes ``options=ReadOptions(...)`` and the same options as keywords
(:class:`ReadKeywords`): ``open_file(path, copy=True)`` is
``open_file(path, options=ReadOptions(copy=True))``. Given both, each keyword replaces that
field of ``options`` (``dataclasses.replace``), so a keyword always takes effect; a name that is
no option raises ``TypeError`` at the call.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, TypedDict

import pyarrow as pa

from .. import _limits
from ..errors import ArgumentTypeError

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How a reader reads and decodes a file's batches (every field checked when built:
    :class:`~arrow_dataproto.errors.ArgumentTypeError` for a value of another type).

    ``allow_pickle``: decode pickled columns and ``meta_info`` (unpickling runs code from the
    file: only for files you trust); otherwise reading them raises
    :class:`~arrow_dataproto.errors.PickleNotAllowedError`.

    ``device``: place every tensor there (like ``map_location``; a ``str`` or ``torch.device``);
    ``None``: the device each tensor was written from, or the CPU where this process lacks it.

    ``copy=True``: tensors own their memory instead of viewing the file's private mapping.

    ``progress=True``: show a bar while reading many batches.

    ``max_decoded_bytes``: a file is untrusted input; the batches one read call decompresses may
    decode to at most this (``"auto"``: 64 MiB or 256 times the file's size, whichever is larger;
    an int: that many bytes; ``None``: no limit), checked from the message headers before
    anything is decompressed (:class:`~arrow_dataproto.errors.DecodeError` beyond it).

    ``verify=True``: check each batch read against the checksums it was written with
    (``FileWriter(checksums=True)``; :class:`~arrow_dataproto.errors.DecodeError` on a mismatch
    or a batch without them); opening stays O(1) either way.

    ``schema``: for a file another tool wrote from one of ours (polars ``write_ipc`` of a
    filtered frame, say), the original file's path or ``pa.Schema``: its columns read back
    as stored, as :func:`~arrow_dataproto.from_arrow` says (read when the reader opens).
    """

    allow_pickle: bool = False
    device: str | torch.device | None = None
    copy: bool = False
    progress: bool = False
    max_decoded_bytes: _limits.MaxDecoded = "auto"
    verify: bool = False
    schema: pa.Schema | str | os.PathLike | None = None

    def __post_init__(self) -> None:
        for name in ("allow_pickle", "copy", "progress", "verify"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentTypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        torch_module = sys.modules.get("torch")  # a torch.device exists only once torch is imported
        if not (self.device is None or isinstance(self.device, str)
                or (torch_module is not None and isinstance(self.device, torch_module.device))):
            raise ArgumentTypeError(f"device must be a str, a torch.device or None, got {self.device!r}")
        _limits.check_max_decoded(self.max_decoded_bytes)
        if not (self.schema is None or isinstance(self.schema, (pa.Schema, str, os.PathLike))):
            raise ArgumentTypeError(f"schema must be a pyarrow.Schema, a file's path or None, got {type(self.schema).__name__}")


class ReadKeywords(TypedDict, total=False):
    """The fields of :class:`ReadOptions` as keywords of the readers (type checkers check them)."""

    allow_pickle: bool
    device: str | torch.device | None
    copy: bool
    progress: bool
    max_decoded_bytes: _limits.MaxDecoded
    verify: bool
    schema: pa.Schema | str | os.PathLike | None


def read_options(options: ReadOptions | None, keywords: ReadKeywords) -> ReadOptions:
    """``options`` (``ReadOptions()`` if None) with each of ``keywords`` replacing its field;
    ``TypeError`` for a keyword that is no option, :class:`ArgumentTypeError` for ``options``
    that are not a :class:`ReadOptions`."""
    if options is None:
        return ReadOptions(**keywords)
    if not isinstance(options, ReadOptions):
        raise ArgumentTypeError(f"options must be a ReadOptions, got {type(options).__name__}")
    return dataclasses.replace(options, **keywords)
