"""Adapters for frameworks that have their own DataProto class.

Each submodule imports its framework lazily, so importing it costs nothing
when the framework is absent: :mod:`arrow_dataproto.integrations.verl`,
:mod:`arrow_dataproto.integrations.transfer_queue` (a TransferQueue storage backend; importing
it imports TransferQueue and registers the backend, :func:`register_transfer_queue` is the cheap
Ray worker setup hook that does it on TransferQueue's import).
"""

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

_BACKEND = __name__ + ".transfer_queue"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Imports the TransferQueue backend right after the ``transfer_queue`` package is imported."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "transfer_queue":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            importlib.import_module(_BACKEND)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def register_transfer_queue() -> None:
    """Register the TransferQueue backend ``"arrow_dataproto"`` in this process, cheaply.

    If ``transfer_queue`` is already imported, the backend is imported now; otherwise it is
    imported right after ``transfer_queue`` is (nothing heavy is imported here). Idempotent.
    The Ray worker setup hook::

        runtime_env={"worker_process_setup_hook": "arrow_dataproto.integrations.register_transfer_queue"}
    """
    if "transfer_queue" in sys.modules:
        importlib.import_module(_BACKEND)
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
