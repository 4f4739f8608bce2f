"""Progress bars: tqdm's when wanted (the ``progress`` extra), else a silent stand-in with the same methods."""

from __future__ import annotations

from typing import Any

from ._optional import require


class _Silent:
    """Stands in for a tqdm bar when progress is off."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    @staticmethod
    def write(line: str) -> None:
        print(line)

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress_bar(enabled: bool, **kwargs: Any) -> Any:
    """A ``tqdm.auto.tqdm(**kwargs)`` bar if ``enabled``, else a silent stand-in with the same
    ``update``/``close``/``write`` methods and context manager. Enabled without tqdm installed:
    :class:`~arrow_dataproto.errors.MissingDependencyError` (the ``progress`` extra)."""
    if enabled:
        return require("tqdm.auto", "progress=True").tqdm(**kwargs)
    return _Silent()
