"""Text shared by the commands: sizes, counts, lines clipped to the terminal."""

from __future__ import annotations

import shutil


def human_size(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def plural(n: int, noun: str) -> str:
    """``plural(1, "batch")`` -> ``"1 batch"``, ``plural(2, "batch")`` -> ``"2 batches"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith(('s', 'ch')) else 's'}"


def clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def terminal_width() -> int:
    return shutil.get_terminal_size((100, 24)).columns
