"""arrow-dataproto: move RL training batches between processes, machines and files as Arrow.

Public API::

    DataProto, DataProtoItem, DataProtoConfig  the batch container (verl-compatible; verl's
                                               module-level helpers: arrow_dataproto.verl_api)
    to_arrow, from_arrow, to_ipc, from_ipc     the codec
    receive_options, set_receive_options       what an unpickled DataProto copies and where it goes
    receive_mode                               the receive mode in force here (copy-on-write by default), and why
    write_file, FileWriter, open_file,         Arrow IPC files of batches (arrow_dataproto.files)
    read_file, open_dataset, recover_file
    to_pandas, from_pandas                     DataFrames (arrow_dataproto.pandas; needs pandas)
    DataProtoError and its subclasses          every error the library raises
"""

from .codec import FORMAT_VERSION, from_arrow, from_ipc, to_arrow, to_ipc
from .errors import (
    ArgumentTypeError,
    BatchError,
    ColumnNotFoundError,
    DataProtoError,
    DecodeError,
    EncodeError,
    FormatVersionError,
    KeyNotFoundError,
    PickleNotAllowedError,
    RowIndexError,
    SchemaMismatchError,
)
from .files import FileWriter, open_dataset, open_file, read_file, recover_file, write_file
from .pickling import ReceiveMode, ReceiveOptions, get_receive_options, receive_mode, receive_options, set_receive_options
from .protocol import DataProto, DataProtoConfig, DataProtoItem

__version__ = "0.1.0"


def __getattr__(name: str):
    # pandas is an optional dependency: import its module only when asked for.
    if name in ("to_pandas", "from_pandas"):
        from . import pandas as _pandas

        return getattr(_pandas, name)
    raise AttributeError(f"module 'arrow_dataproto' has no attribute {name!r}")

__all__ = [
    "DataProto",
    "DataProtoItem",
    "DataProtoConfig",
    "to_arrow",
    "from_arrow",
    "to_ipc",
    "from_ipc",
    "FORMAT_VERSION",
    "ReceiveMode",
    "ReceiveOptions",
    "receive_mode",
    "get_receive_options",
    "receive_options",
    "set_receive_options",
    "write_file",
    "FileWriter",
    "open_file",
    "read_file",
    "open_dataset",
    "recover_file",
    "ArgumentTypeError",
    "BatchError",
    "ColumnNotFoundError",
    "DataProtoError",
    "DecodeError",
    "EncodeError",
    "FormatVersionError",
    "KeyNotFoundError",
    "PickleNotAllowedError",
    "RowIndexError",
    "SchemaMismatchError",
]
