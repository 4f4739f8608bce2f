"""The exceptions arrow-dataproto raises.

Every error the library raises on purpose derives from :class:`DataProtoError`, so
``except arrow_dataproto.DataProtoError`` catches all of them. Each one also derives
from the closest built-in (``ValueError`` or ``TypeError``) so that existing handlers
keep working.
"""

from __future__ import annotations

from typing import Any, Iterable, TypeVar


class DataProtoError(Exception):
    """Base class of every error raised by arrow-dataproto."""


class EncodeError(DataProtoError, TypeError):
    """A value cannot be encoded (unsupported dtype, layout or batch shape)."""


class DecodeError(DataProtoError, ValueError):
    """Bytes, a file or a RecordBatch are not a valid arrow-dataproto payload.

    Raised for truncated or corrupted input, a schema whose metadata is missing or
    inconsistent, or buffers too small for the shapes they claim to hold.
    """


class FormatVersionError(DecodeError):
    """The payload was written by a format version this reader cannot read: another major
    version, or a newer minor version whose content (a column kind, an encoding, a dtype)
    this reader does not know. The message names both versions."""


class UnknownContentError(DecodeError):
    """The payload holds a column kind, an encoding or a dtype this reader does not know.
    Where the payload's minor version is newer than this reader's, a
    :class:`FormatVersionError` is raised instead."""


class PickleNotAllowedError(DecodeError):
    """The payload holds pickled values and the caller did not pass ``allow_pickle=True``."""


PICKLE_REFUSED = (
    "holds pickled values; pass allow_pickle=True only for data from a trusted source "
    "(unpickling can run arbitrary code)"
)
"""The end of a :class:`PickleNotAllowedError` message, after what holds the pickles."""


class SchemaMismatchError(DataProtoError, ValueError):
    """A batch does not match the schema of the file or batches it is combined with."""


class ColumnNotFoundError(DataProtoError, KeyError):
    """A column asked for by name is not in the file or batch (message: :func:`not_found`)."""

    def __str__(self) -> str:  # KeyError's is the repr of its message: quotes around quotes
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


# The container's errors. verl's DataProto checks most of its preconditions with
# ``assert``, so code written against it catches AssertionError; each of these also
# derives from the built-in a Python user would expect.


class BatchError(DataProtoError, AssertionError, ValueError):
    """A DataProto operation's precondition does not hold.

    Rows that differ between columns, chunks that cannot be equal, a mini-batch size
    that does not divide the rows, values that differ between two DataProtos being
    merged (``union``, ``concat``'s ``meta_info``), a batch of the wrong rank.
    """


class KeyNotFoundError(ColumnNotFoundError, AssertionError):
    """A key named in ``pop``/``select``/``rename`` is not in the DataProto."""


class RowIndexError(DataProtoError, IndexError):
    """A row index or mask does not fit the DataProto's rows."""


class ArgumentTypeError(DataProtoError, TypeError, ValueError):
    """An argument has a type the operation does not take (verl raises TypeError or ValueError here)."""


class OptionError(DataProtoError, ValueError):
    """An option or argument has a value the library does not take: a receive mode
    other than ``True``/``False``/``"on_write"``, a device this process lacks, no actors."""


class MissingDependencyError(DataProtoError, ModuleNotFoundError):
    """An optional package that a feature needs is not installed. The message names the
    missing module, the extra of arrow-dataproto that brings it and an install line;
    ``name`` is the missing module."""


_Error = TypeVar("_Error", bound=DataProtoError)


_NotFound = TypeVar("_NotFound", bound=ColumnNotFoundError)


def not_found(cls: type[_NotFound], kind: str, missing: Iterable[Any], where: str, present: Iterable[Any]) -> _NotFound:
    """The error for names asked for and absent (columns, keys), in the one format of them all:
    ``no column ['x'] in the batch; columns: ['a', 'b']``."""
    return cls(f"no {kind} {list(missing)} in {where}; {kind}s: {list(present)}")


def column_error(cls: type[_Error], column: str, message: str) -> _Error:
    """Build ``cls`` with a message that names the column it concerns."""
    return cls(f"column {column!r}: {message}")
