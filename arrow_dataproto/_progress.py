"""Progress bars: tqdm's when it is installed and wanted, else a silent stand-in with the same methods."""

from __future__ import annotations

from typing import Any


class _Silent:
    """Stands in for a tqdm bar when progress is off or tqdm is not installed."""

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
    """A ``tqdm.auto.tqdm(**kwargs)`` bar if ``enabled`` and tqdm is installed, else a silent
    stand-in with the same ``update``/``close``/``write`` methods and context manager."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return _Silent()
        return tqdm(**kwargs)
    return _Silent()
