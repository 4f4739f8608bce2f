"""``arrow-dataproto head``: rows of a file as a table that fits the terminal."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from ._text import clip, plural, terminal_width

if TYPE_CHECKING:
    import numpy as np

    from ..files import ColumnInfo, FileReader
    from .._preview import TensorRows

PICKLED = "<pickled>"
"""What ``head`` shows in a pickled column without ``--allow-pickle``."""


_SHORT_DTYPES = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
    "complex128": "c128", "complex64": "c64", "complex32": "c32", "bool": "bool",
}
"""How ``head`` names a dtype in a tensor cell; others keep their name (``float8_e4m3fn``)."""


Cell = str | tuple[str, list[str]]
"""A ``head`` cell: text, or an array's ``(dtype[shape], first values)`` drawn to the column's width."""


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (float, complex)) else str(value)


def _render(cell: Cell, width: int) -> str:
    """A cell in at most ``width`` characters: ``f32[512] -0.51 -4.78 …`` keeps whole numbers only."""
    if isinstance(cell, str):
        return clip(cell, width)
    text, values = cell
    for k, value in enumerate(values):
        more = k + 1 < len(values)
        if len(text) + 1 + len(value) + (2 if more else 0) > width:
            return clip(text, width - 2) + " …" if width > len(text) else clip(text, width)
        text += " " + value
    return text


def _array_cell(dtype: str, shape: tuple[int, ...], ragged: list[bool], values: list) -> tuple[str, list[str]]:
    """``("f32[512]", ["-0.51", ...])``; a ragged size is marked ``*`` (``i64[*37]``)."""
    dims = ",".join(("*" if r else "") + str(n) for n, r in zip(shape, ragged))
    return f"{_SHORT_DTYPES.get(dtype, dtype)}[{dims}]", [_number(v) for v in values]


def _tensor_cells(column: TensorRows, most: int) -> list[Cell]:
    """The cells of a tensor column's rows (numpy arrays or torch tensors, as shown)."""
    cells: list[Cell] = []
    for row in column.rows:
        values = row.reshape(-1)[:most]
        if row.ndim == 0:
            cells.append(_number(values.item()))
            continue
        marks = column.ragged if len(column.ragged) == row.ndim else [False] * row.ndim
        cells.append(_array_cell(column.dtype, tuple(row.shape), marks, values.tolist()))
    return cells


def _torch_rows(column: Any, info: ColumnInfo) -> TensorRows:
    """A decoded tensor column's rows as shown (bf16 and fp8 have no Python conversion of their own)."""
    import torch

    from .._preview import TensorRows

    rows = list(column.unbind() if column.is_nested else column)
    if column.dtype.is_floating_point and column.dtype not in (torch.float16, torch.float32, torch.float64):
        rows = [row.float() for row in rows]
    ragged = [n is None for n in info.shape] if isinstance(info.shape, list) else []
    return TensorRows(str(column.dtype).removeprefix("torch."), ragged, rows)


def _object_cells(values: np.ndarray, most: int) -> list[Cell]:
    import numpy as np

    cells: list[Cell] = []
    for value in values:
        if isinstance(value, np.ndarray):
            flat = value.reshape(-1)[:most].tolist()
            cells.append(_array_cell(str(value.dtype), value.shape, [False] * value.ndim, flat))
        elif isinstance(value, (float, np.floating)):
            cells.append(_number(float(value)))
        else:
            cells.append(str(value))
    return cells


def _head_columns(reader: FileReader, asked: list[str] | None) -> list[str]:
    """The columns to show, in the order asked (a nested TensorDict's name: its leaves in file order).
    Unknown names are kept, so that reading them raises the library's error."""
    if asked is None:
        return reader.columns
    out: list[str] = []
    for name in asked:
        leaves = [name] if name in reader.columns else [c for c in reader.columns if c.startswith(name + ".")]
        out += [c for c in leaves or [name] if c not in out]
    return out


def head_table(path: str | os.PathLike, n: int = 5, start: int = 0, columns: list[str] | None = None,
               allow_pickle: bool = False, most: int = 16) -> tuple[list[str], list[int], list[list[Cell]], list[str]]:
    """Rows ``start:start+n`` of a file as cells: ``(column names, row numbers, cells by column,
    hidden pickled columns)``; an array cell keeps its first ``most`` values (see :func:`_render`).
    Without ``allow_pickle`` pickled columns read as ``<pickled>`` and ``meta_info`` is not
    read: nothing is unpickled. The rows are read with pyarrow and numpy alone where they
    can be shown exactly that way (:mod:`arrow_dataproto._preview`), else decoded with torch."""
    from .._format import resolve_columns
    from .._preview import decoded_rows
    from ..files import open_file

    with open_file(path, allow_pickle=allow_pickle) as reader:
        names = _head_columns(reader, columns)
        hidden = [] if allow_pickle else [c for c in names if c in reader.pickled_columns]
        first = slice(start, None).indices(reader.num_rows)[0]
        if not reader.num_batches:  # the columns, and no rows (an unknown name is still refused)
            resolve_columns(reader.columns, names, str(reader))
            return names, [], [[] for _ in names], hidden
        shown = [c for c in names if c not in hidden]
        count = max(0, min(n, reader.num_rows - first))
        values = decoded_rows(_stored_rows(reader, first, first + count, shown), allow_pickle=allow_pickle)
        if values is None:
            data = reader.read_rows(first, first + n, shown, meta_info=allow_pickle)
            infos = {c.name: c for c in reader.column_info()}
            values = {name: data.non_tensor_batch[name] if name in data.non_tensor_batch
                      else _torch_rows(data.batch[tuple(name.split("."))], infos[name]) for name in shown}
    cells: list[list[Cell]] = []
    for name in names:
        if name in hidden:
            cells.append([PICKLED] * count)
        else:
            column = values[name]
            cells.append(_tensor_cells(column, most) if isinstance(column, tuple) else _object_cells(column, most))
    return names, list(range(first, first + count)), cells, hidden


def _stored_rows(reader: FileReader, start: int, stop: int, columns: list[str]) -> list:
    """Rows ``start:stop`` of ``columns`` as stored: a slice of each batch they span, validated."""
    pieces, at = [], 0
    for i, rows in enumerate(reader.batch_rows):
        a, b = max(start, at), min(stop, at + rows)
        if a < b:
            pieces.append(reader.read_arrow(i, columns).slice(a - at, b - a))
        at += rows
    return pieces


def _fit(names: list[str], cells: list[list[Cell]], index_width: int, width: int,
         widest: int = 40, narrowest: int = 20) -> tuple[list[int], int]:
    """Column widths that fit ``width`` characters: each column as wide as its header and cells
    (at most ``widest``); the widest are narrowed first, down to ``narrowest`` (or their
    header); then columns are dropped from the right. Returns the widths and how many fit."""
    natural = [
        min(widest, max([len(name), *(len(_render(c, widest)) for c in column)])) for name, column in zip(names, cells)
    ]
    floor = [min(w, max(narrowest, len(name))) for w, name in zip(natural, names)]
    widths = list(natural)

    def total(ws: list[int]) -> int:
        return index_width + sum(2 + w for w in ws)

    while total(widths) > width:
        k = max(range(len(widths)), key=lambda j: widths[j] - floor[j], default=None)
        if k is None or widths[k] <= floor[k]:
            break
        widths[k] -= 1
    shown = len(widths)
    while shown > 1 and total(widths[:shown]) + 2 > width:
        shown -= 1
    return widths, shown


def run(args: argparse.Namespace) -> int:
    names, index, cells, hidden = head_table(args.file, args.n, args.start, args.columns, args.allow_pickle)
    index_width = max([len(str(i)) for i in index] + [1])
    widths, shown = _fit(names, cells, index_width, terminal_width())
    more = "  …" if shown < len(names) else ""
    columns = list(zip(names, cells, widths))[:shown]
    print((" " * index_width + "".join("  " + clip(n, w).ljust(w) for n, _, w in columns) + more).rstrip())
    for r, i in enumerate(index):
        line = str(i).rjust(index_width) + "".join("  " + _render(c[r], w).ljust(w) for _, c, w in columns)
        print((line + more).rstrip())
    if not index:
        print(f"(no rows from row {args.start}; --start counts from 0, negative from the end)", file=sys.stderr)
    if shown < len(names):
        rest = names[shown:]
        print(f"({plural(len(rest), 'more column')} not shown: {', '.join(rest)}; choose with --columns)", file=sys.stderr)
    if hidden:
        print(f"(columns {', '.join(hidden)} are pickled: shown as {PICKLED}; --allow-pickle decodes them, "
              "only for files you trust)", file=sys.stderr)
    return 0
