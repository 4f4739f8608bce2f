"""arrow-dataproto: move RL training batches between processes, machines and files as Arrow.

Public API::

    DataProto, DataProtoItem, DataProtoConfig  the batch container (verl-compatible; verl's
                                               module-level helpers: arrow_dataproto.verl_api)
    to_arrow, from_arrow, to_ipc, from_ipc     the codec (FORMAT_VERSION: the format it writes)
    ReceiveOptions, receive_options, ...       what an unpickled DataProto copies and where it goes
    receive_mode                               the receive mode in force here (copy-on-write by default), and why
    DataProtoError and its subclasses          every error the library raises
    StoredFormWarning                          another tool's table looks like our stored forms (pass schema=)

Namespaces::

    arrow_dataproto.files                      Arrow IPC files of batches (write, read, recover)
    arrow_dataproto.pandas                     DataFrames (needs pandas)
    arrow_dataproto.polars                     polars DataFrames (needs polars)
    arrow_dataproto.transport                  Ray helpers (needs Ray)
    arrow_dataproto.ray_data                   Ray Data: read files in parallel; batches <-> DataProto
    arrow_dataproto.integrations.verl          make verl's own DataProto pickle through Arrow
    arrow_dataproto.testing                    sample batches, exact-equality assertions, strategies

Modules whose names start with an underscore are internal; ``docs/architecture.md``
shows how they fit together.

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
    MissingDependencyError,
    OptionError,
    PickleNotAllowedError,
    RowIndexError,
    SchemaMismatchError,
)

__version__ = "0.1.0"

_LAZY = {
    "_codec": ("to_arrow", "to_ipc"),
    "_decoding": ("from_arrow", "from_ipc"),
    "_format": ("FORMAT_VERSION",),
    "_restore": ("StoredFormWarning",),
    "_container": ("DataProto", "DataProtoItem"),
    "_verl_rules": ("DataProtoConfig",),
    "pickling": (
        "ReceiveMode", "ReceiveOptions", "get_receive_options", "receive_mode", "receive_options", "set_receive_options"
    ),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}
_NAMESPACES = ("files", "pandas", "polars", "transport", "ray_data", "testing", "integrations", "verl_api", "pickling")

if TYPE_CHECKING:
    from ._codec import to_arrow, to_ipc
    from ._container import DataProto, DataProtoItem
    from ._decoding import from_arrow, from_ipc
    from ._format import FORMAT_VERSION
    from ._restore import StoredFormWarning
    from ._verl_rules import DataProtoConfig
    from .pickling import (
        ReceiveMode,
        ReceiveOptions,
        get_receive_options,
        receive_mode,
        receive_options,
        set_receive_options,
    )


def __getattr__(name: str) -> Any:
    if name in _NAMESPACES:
        return importlib.import_module(f".{name}", __name__)
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
    "ArgumentTypeError",
    "BatchError",
    "ColumnNotFoundError",
    "DataProtoError",
    "DecodeError",
    "EncodeError",
    "FormatVersionError",
    "KeyNotFoundError",
    "MissingDependencyError",
    "OptionError",
    "PickleNotAllowedError",
    "RowIndexError",
    "SchemaMismatchError",
    "StoredFormWarning",
]
