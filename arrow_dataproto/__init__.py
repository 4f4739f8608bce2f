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

Names are imported on first use (PEP 562), so ``import arrow_dataproto`` (and the
``arrow-dataproto`` command's ``--help``) does not import torch or pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

__version__ = "0.1.0"

_LAZY = {
    "codec": ("FORMAT_VERSION", "from_arrow", "from_ipc", "to_arrow", "to_ipc"),
    "files": ("FileWriter", "open_dataset", "open_file", "read_file", "recover_file", "write_file"),
    "pickling": (
        "ReceiveMode", "ReceiveOptions", "get_receive_options", "receive_mode", "receive_options", "set_receive_options"
    ),
    "protocol": ("DataProto", "DataProtoConfig", "DataProtoItem"),
    "pandas": ("to_pandas", "from_pandas"),  # optional dependency; not in __all__
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

if TYPE_CHECKING:
    from .codec import FORMAT_VERSION, from_arrow, from_ipc, to_arrow, to_ipc
    from .files import FileWriter, open_dataset, open_file, read_file, recover_file, write_file
    from .pandas import from_pandas, to_pandas
    from .pickling import (
        ReceiveMode,
        ReceiveOptions,
        get_receive_options,
        receive_mode,
        receive_options,
        set_receive_options,
    )
    from .protocol import DataProto, DataProtoConfig, DataProtoItem


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'arrow_dataproto' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


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
