"""arrow-dataproto: move RL training batches between processes, machines and files as Arrow.

Public API::

    DataProto, DataProtoItem, DataProtoConfig  the batch container (verl-compatible; verl's
                                               module-level helpers: arrow_dataproto.verl_api)
    to_arrow, from_arrow, to_ipc, from_ipc     the codec (FORMAT_VERSION: the format it writes)
    ReceiveOptions, receive_options, ...       what an unpickled DataProto copies and where it goes
    receive_mode                               the receive mode in force here (copy-on-write by default), and why
    DataProtoError and its subclasses          every error the library raises

Namespaces::

    arrow_dataproto.files                      Arrow IPC files of batches (write, read, recover)
    arrow_dataproto.pandas                     DataFrames (needs pandas)
    arrow_dataproto.transport                  Ray helpers (needs Ray)
    arrow_dataproto.integrations.verl          make verl's own DataProto pickle through Arrow
    arrow_dataproto.testing                    sample batches, exact-equality assertions, strategies

Modules whose names start with an underscore are internal; ``docs/architecture.md``
shows how they fit together.
"""

from ._codec import to_arrow, to_ipc
from ._container import DataProto, DataProtoConfig, DataProtoItem
from ._decoding import from_arrow, from_ipc
from ._format import FORMAT_VERSION
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
from .pickling import ReceiveMode, ReceiveOptions, get_receive_options, receive_mode, receive_options, set_receive_options

__version__ = "0.1.0"

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
