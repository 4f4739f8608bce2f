"""Optional dependencies: importing one, and the error that names its extra when it is missing.

Every optional import of the package goes through :func:`require` (an import inside a function)
or :func:`missing_dependency` (a module-level import), so that a missing package is always a
:class:`~arrow_dataproto.errors.MissingDependencyError` whose message says which extra to
install and how.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TypeVar

from .errors import MissingDependencyError

EXTRA_OF = {
    "ray": "ray",
    "pandas": "interop",
    "polars": "interop",
    "duckdb": "interop",
    "datasets": "interop",
    "tqdm": "progress",
    "xxhash": "integrity",
    "transfer_queue": "transfer-queue",
    "omegaconf": "transfer-queue",
}
"""Top-level module -> the extra of arrow-dataproto (``pyproject.toml``) that installs it."""


def install_line(extra: str) -> str:
    """How to install ``extra``: from a checkout (the package is not on PyPI yet), with the
    constraints file that keeps torch on its CPU build where one is available."""
    return (
        f"install the {extra!r} extra: pip install -c constraints.txt -e \".[{extra}]\" "
        f"in a checkout of arrow-dataproto (once it is on PyPI: pip install \"arrow-dataproto[{extra}]\")"
    )


_Missing = TypeVar("_Missing", bound=MissingDependencyError)


def missing_dependency(
    what: str, error: ImportError, extra: str | None = None, cls: type[_Missing] = MissingDependencyError  # type: ignore[assignment]
) -> _Missing:
    """The error (``cls``) for ``what`` (a module or feature of this package) when importing an
    optional dependency failed with ``error``. It names the extra ``extra``, else the one that
    installs the module ``error`` names; its ``name`` is that module."""
    module = (error.name or "").split(".")[0]
    extra = extra or EXTRA_OF.get(module)
    hint = install_line(extra) if extra else "install it"
    return cls(f"{what} needs {module or 'a module'}, which is not installed ({error}): {hint}", name=error.name)


def require(module: str, what: str) -> ModuleType:
    """``import module``; a :class:`MissingDependencyError` for ``what`` if it (or a module it
    imports) is not installed."""
    try:
        return importlib.import_module(module)
    except MissingDependencyError:
        raise
    except ModuleNotFoundError as e:
        raise missing_dependency(what, e) from e
