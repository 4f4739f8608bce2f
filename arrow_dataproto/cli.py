"""The ``arrow-dataproto`` command (also ``python -m arrow_dataproto``).

::

    arrow-dataproto inspect FILE [--stats] [--json]  rows, batches, meta_info, columns, sizes, row lengths
    arrow-dataproto head FILE [-n N] [--start S] [--columns C ...] [--allow-pickle]
    arrow-dataproto convert IN OUT [--allow-pickle] [--compression C] [--portable] [--stream]
    arrow-dataproto recover IN OUT [--compression C]
    arrow-dataproto verify FILE                     every buffer against the checksums written with it
    arrow-dataproto bench [NAME ...] [--quick] [--list] [--dir DIR]

Nothing is unpickled without ``--allow-pickle``: ``inspect`` never unpickles,
``head`` shows pickled columns as ``<pickled>``, and ``convert`` refuses a
pickle. Exit status: 0 on success, 1 on an error (printed as one line), 2 for
a bad command line. torch, pyarrow and the rest of the library are imported by
the command that needs them, so ``--help`` and usage errors answer at once, and
``inspect`` (without ``--stats``), ``verify`` and ``head`` import neither torch nor
tensordict (``head`` decodes with torch only the values numpy cannot show exactly, see
:mod:`arrow_dataproto._preview`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .errors import DataProtoError, DecodeError, PickleNotAllowedError

if TYPE_CHECKING:
    import numpy as np

    from .files import ColumnInfo, FileReader
    from ._container import DataProto
    from ._preview import TensorRows

PICKLED = "<pickled>"
"""What ``head`` shows in a pickled column without ``--allow-pickle``."""

ALLOW_PICKLE_HINT = "(on the command line: --allow-pickle, only for a file you trust)"


def _size(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"


def _count(n: int, noun: str) -> str:
    """``_count(1, "batch")`` -> ``"1 batch"``, ``_count(2, "batch")`` -> ``"2 batches"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith(('s', 'ch')) else 's'}"


def _shape(shape: Any) -> str:
    if shape is None:  # another tool's column
        return "-"
    if not isinstance(shape, list):
        return str(shape)
    return "[" + ", ".join("*" if n is None else str(n) for n in shape) + "]"


def _clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _terminal_width() -> int:
    return shutil.get_terminal_size((100, 24)).columns


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths))).rstrip() for row in rows]


# ---------------------------------------------------------------- inspect


def _lengths_summary(lengths: list[np.ndarray]) -> dict | None:
    import numpy as np

    if not lengths:
        return None
    every = np.concatenate(lengths)
    if not every.size:
        return None
    return {"min": int(every.min()), "median": float(np.median(every)), "max": int(every.max())}


def _value_stats(reader: FileReader, info: ColumnInfo) -> dict | None:
    """min / mean / max (and NaN count) of a numeric column's values, one batch at a time."""
    import numpy as np
    import torch

    if info.kind in ("pickle", "string", "object"):
        return None
    low, high, total, count, nans = float("inf"), float("-inf"), 0.0, 0, 0
    for i in range(reader.num_batches):
        data = reader.read_batch(i, [info.name], meta_info=False)
        if info.is_tensor:
            assert data.batch is not None  # a tensor column was read
            column = data.batch[tuple(info.name.split("."))]
            if column.is_nested:
                rows = column.unbind()
                column = torch.cat([row.reshape(-1) for row in rows]) if rows else torch.empty(0)
            if column.is_complex():
                return None
            values = column.reshape(-1).to(torch.float64).numpy()
        else:
            array = data.non_tensor_batch[info.name]
            if array.dtype.kind not in "biuf":
                return None
            values = array.reshape(-1).astype(np.float64)
        finite = values[~np.isnan(values)]
        nans += int(values.size - finite.size)
        if finite.size:
            low, high = min(low, float(finite.min())), max(high, float(finite.max()))
            total += float(finite.sum())
            count += int(finite.size)
    if not count:
        return {"min": None, "mean": None, "max": None, "nan": nans}
    return {"min": low, "mean": total / count, "max": high, "nan": nans}


def _meta_info_of(metadata: dict[str, str]) -> tuple[str | None, dict | None]:
    """How a batch's meta_info is stored (``"json"``, ``"pickle"`` or None) and its value,
    None when pickled: nothing is unpickled here."""
    from ._format import META_INFO_ENCODING
    from ._objects import decode_meta_info

    encoding = metadata.get(META_INFO_ENCODING)
    return encoding, None if encoding == "pickle" else _shown(decode_meta_info(metadata, allow_pickle=False))


def _shown(value: Any) -> Any:
    """``value`` for JSON output: a tensor (in ``json+tensors`` meta_info) as ``"tensor(dtype, [shape])"``."""
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "shape") and not isinstance(value, (int, float, str)):
        return f"tensor({str(value.dtype).removeprefix('torch.')}, {list(value.shape)})"
    return value


def describe(path: str | os.PathLike, *, stats: bool = False) -> dict:
    """What ``inspect`` shows, as a JSON-compatible dict; nothing is unpickled.

    Sizes, row counts, row lengths and ``meta_info`` come from the IPC metadata of the file
    or stream file (:func:`arrow_dataproto.files.read_layout`): nothing is decompressed but
    the offsets of list-like columns, and neither torch nor tensordict is imported. Another
    tool's file with column types the metadata cannot size (view types) is sized by reading
    its batches. ``stats=True`` adds each numeric column's min / mean / max and NaN count,
    which decodes every numeric column (one batch of one column at a time, with torch).
    """
    from ._format import VERSION, check_schema
    from .files.layout import ColumnInfo, read_file_layout

    try:
        file_layout = read_file_layout(path)
    except DecodeError:  # view types, or a damaged file: the reader says which
        return _describe_by_reading(path, stats)
    schema, layout = file_layout.schema, file_layout.batches
    foreign = not any(key.startswith(b"adp.") for key in (schema.metadata or {}))
    raw = {name: sum(b.raw_bytes[name] for b in layout) for name in schema.names}
    stored = {name: sum(b.stored_bytes[name] for b in layout) for name in schema.names}
    codecs = [b.compression for b in layout if b.compression is not None]
    compression = file_layout.footer.get("adp.compression") or (codecs[0] if codecs else "none")
    infos = [ColumnInfo.from_field(field) for field in schema]
    info = {
        "path": str(path),
        "file_bytes": os.path.getsize(path),
        "format_version": None if foreign else check_schema(schema)[VERSION],
        "compression": compression,
        "rows": sum(b.rows for b in layout),
        "batches": len(layout),
        "batch_rows": [b.rows for b in layout],
    }
    columns = _columns(infos, raw, stored, layout)
    if stats:
        from .files import open_file

        with open_file(path) as reader:
            for column, c in zip(columns, infos):
                column["stats"] = _value_stats(reader, c)
    return _with_meta_info(info, layout, columns)


def _columns(infos: list[ColumnInfo], raw: dict, stored: dict, layout: list) -> list[dict]:
    return [
        {
            "name": c.name,
            "kind": c.kind,
            "dtype": c.dtype,
            "shape": c.shape,
            "device": c.device,
            "bytes": raw[c.name],
            "stored_bytes": stored[c.name],
            "row_lengths": _lengths_summary([b.row_lengths[c.name] for b in layout if c.name in b.row_lengths]),
        }
        for c in infos
    ]


def _with_meta_info(info: dict, layout: list, columns: list[dict]) -> dict:
    encodings, per_batch = zip(*[_meta_info_of(b.metadata) for b in layout]) if layout else ((), ())
    info["meta_info"] = {
        "encoding": encodings[0] if encodings else None,
        "keys": list(per_batch[0]) if per_batch and per_batch[0] is not None else None,
        "batches": list(per_batch),
    }
    info["columns"] = columns
    return info


def _describe_by_reading(path: str | os.PathLike, stats: bool) -> dict:
    """:func:`describe` of a file whose metadata cannot size every column: another tool's view
    types (``string_view``, ``list_view``), sized by reading each batch."""
    from ._format import VERSION, check_schema
    from .files import BatchLayout, open_file

    with open_file(path) as reader:
        layout = [BatchLayout(rows, reader.compression, {}, {}, {}, {}) for rows in reader.batch_rows]
        raw = stored = reader.column_nbytes()
        infos = reader.column_info()
        columns = _columns(infos, raw, stored, layout)
        if stats:
            for column, c in zip(columns, infos):
                column["stats"] = _value_stats(reader, c)
        info = {
            "path": str(path),
            "file_bytes": reader.file_size,
            "format_version": None if reader.foreign else check_schema(reader.schema)[VERSION],
            "compression": reader.compression or "none",
            "rows": sum(b.rows for b in layout),
            "batches": len(layout),
            "batch_rows": [b.rows for b in layout],
        }
    return _with_meta_info(info, layout, columns)


def _brief(value: Any, width: int = 24) -> str:
    """A meta_info value in a few characters: scalars as they are, containers by size."""
    if isinstance(value, (list, tuple)):
        text = json.dumps(value)
        return text if len(text) <= width else f"[{len(value)} items]"
    if isinstance(value, dict):
        text = json.dumps(value)
        return text if len(text) <= width else "{" + ", ".join(map(str, value)) + "}"
    return _clip(str(value), width)


def _print_description(info: dict, most_batches: int = 8) -> None:
    width = _terminal_width()
    rows = info["batch_rows"]
    sizes = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    compressed = info["compression"] != "none"
    raw_total = sum(c["bytes"] for c in info["columns"])
    print(info["path"])
    print(
        f"  {_count(info['rows'], 'row')} in {_count(info['batches'], 'batch')} ({sizes}); "
        f"{_size(info['file_bytes'])} on disk"
        + (f" ({_size(raw_total)} uncompressed)" if compressed else "")
        + f", compression {info['compression']}, "
        + (f"format {info['format_version']}" if info["format_version"] else "another tool's file (no arrow-dataproto metadata)")
    )
    meta = info["meta_info"]
    if meta["encoding"] == "pickle":
        print("  meta_info (batch 0): pickled, not shown (needs --allow-pickle to read)")
    else:
        print(f"  meta_info (batch 0): {', '.join(meta['keys'] or []) or '{}'}")

    header = ["column", "kind", "dtype", "row shape", "device"]
    header += ["stored", "raw"] if compressed else ["bytes"]
    header += ["row lengths min/median/max"]
    with_stats = any("stats" in c for c in info["columns"])
    if with_stats:
        header += ["min", "mean", "max", "NaN"]
    table = [tuple(header)]
    for c in info["columns"]:
        cells = [c["name"], c["kind"], c["dtype"], _shape(c["shape"]), c["device"] or "-"]
        cells += [_size(c["stored_bytes"]), _size(c["bytes"])] if compressed else [_size(c["bytes"])]
        lengths = c["row_lengths"]
        cells.append("-" if lengths is None else f"{lengths['min']} / {lengths['median']:g} / {lengths['max']}")
        if with_stats:
            stats = c.get("stats")
            cells += ["-"] * 4 if stats is None else [
                "-" if stats[k] is None else f"{stats[k]:.4g}" for k in ("min", "mean", "max")
            ] + [str(stats["nan"])]
        table.append(tuple(cells))
    for line in _table(table):
        print(line)
    pickled = [c["name"] for c in info["columns"] if c["kind"] == "pickle"]
    if pickled:
        print(f"  pickled columns: {', '.join(pickled)} (reading their values needs --allow-pickle)")

    batches = meta["batches"]
    if any(m != {} for m in batches):  # None: pickled
        print("  meta_info per batch:")
        shown = range(len(batches)) if len(batches) <= most_batches else [*range(most_batches - 2), -2, -1]
        for i in shown:
            i %= len(batches)
            m = batches[i]
            text = "pickled, not shown" if m is None else ", ".join(f"{k}={_brief(v)}" for k, v in m.items()) or "{}"
            print(_clip(f"    batch {i} ({rows[i]} rows): {text}", width))
            if i == most_batches - 3 and len(batches) > most_batches:
                print(f"    ... {len(batches) - most_batches} more (--json shows every batch)")


def _inspect(args: argparse.Namespace) -> int:
    info = describe(args.file, stats=args.stats)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_description(info)
    return 0


# ---------------------------------------------------------------- head


_SHORT_DTYPES = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
    "complex128": "c128", "complex64": "c64", "complex32": "c32", "bool": "bool",
}
"""How ``head`` names a dtype in a tensor cell; others keep their name (``float8_e4m3fn``)."""


Cell = "str | tuple[str, list[str]]"
"""A ``head`` cell: text, or an array's ``(dtype[shape], first values)`` drawn to the column's width."""


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (float, complex)) else str(value)


def _render(cell: Any, width: int) -> str:
    """A cell in at most ``width`` characters: ``f32[512] -0.51 -4.78 …`` keeps whole numbers only."""
    if isinstance(cell, str):
        return _clip(cell, width)
    text, values = cell
    for k, value in enumerate(values):
        more = k + 1 < len(values)
        if len(text) + 1 + len(value) + (2 if more else 0) > width:
            return _clip(text, width - 2) + " …" if width > len(text) else _clip(text, width)
        text += " " + value
    return text


def _array_cell(dtype: str, shape: tuple[int, ...], ragged: list[bool], values: list) -> tuple[str, list[str]]:
    """``("f32[512]", ["-0.51", ...])``; a ragged size is marked ``*`` (``i64[*37]``)."""
    dims = ",".join(("*" if r else "") + str(n) for n, r in zip(shape, ragged))
    return f"{_SHORT_DTYPES.get(dtype, dtype)}[{dims}]", [_number(v) for v in values]


def _tensor_cells(column: TensorRows, most: int) -> list[Any]:
    """The cells of a tensor column's rows (numpy arrays or torch tensors, as shown)."""
    cells: list[Any] = []
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

    from ._preview import TensorRows

    rows = list(column.unbind() if column.is_nested else column)
    if column.dtype.is_floating_point and column.dtype not in (torch.float16, torch.float32, torch.float64):
        rows = [row.float() for row in rows]
    ragged = [n is None for n in info.shape] if isinstance(info.shape, list) else []
    return TensorRows(str(column.dtype).removeprefix("torch."), ragged, rows)


def _object_cells(values: np.ndarray, most: int) -> list[Any]:
    import numpy as np

    cells: list[Any] = []
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
               allow_pickle: bool = False, most: int = 16) -> tuple[list[str], list[int], list[list[Any]], list[str]]:
    """Rows ``start:start+n`` of a file as cells: ``(column names, row numbers, cells by column,
    hidden pickled columns)``; an array cell keeps its first ``most`` values (see :func:`_render`).
    Without ``allow_pickle`` pickled columns read as ``<pickled>`` and ``meta_info`` is not
    read: nothing is unpickled. The rows are read with pyarrow and numpy alone where they
    can be shown exactly that way (:mod:`arrow_dataproto._preview`), else decoded with torch."""
    from ._format import resolve_columns
    from ._preview import decoded_rows
    from .files import open_file

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
    cells = []
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


def _fit(names: list[str], cells: list[list[Any]], index_width: int, width: int,
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


def _head(args: argparse.Namespace) -> int:
    names, index, cells, hidden = head_table(args.file, args.n, args.start, args.columns, args.allow_pickle)
    index_width = max([len(str(i)) for i in index] + [1])
    widths, shown = _fit(names, cells, index_width, _terminal_width())
    more = "  …" if shown < len(names) else ""
    columns = list(zip(names, cells, widths))[:shown]
    print((" " * index_width + "".join("  " + _clip(n, w).ljust(w) for n, _, w in columns) + more).rstrip())
    for r, i in enumerate(index):
        line = str(i).rjust(index_width) + "".join("  " + _render(c[r], w).ljust(w) for _, c, w in columns)
        print((line + more).rstrip())
    if not index:
        print(f"(no rows from row {args.start}; --start counts from 0, negative from the end)", file=sys.stderr)
    if shown < len(names):
        rest = names[shown:]
        print(f"({_count(len(rest), 'more column')} not shown: {', '.join(rest)}; choose with --columns)", file=sys.stderr)
    if hidden:
        print(f"(columns {', '.join(hidden)} are pickled: shown as {PICKLED}; --allow-pickle decodes them, "
              "only for files you trust)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- convert and recover


def load_pickled_dataproto(path: str | os.PathLike) -> DataProto:
    """A DataProto pickled by verl's ``save_to_disk`` (or ``pickle.dump`` of ours), as our DataProto.

    This unpickles: it runs whatever code the file names. Only for files you trust.
    verl need not be installed: its DataProto class is replaced by a stand-in that
    decodes verl's state (``torch.save`` bytes or numpy mode). Raises
    :class:`DecodeError` if the file holds something else or a class that cannot be found.
    """
    from ._container import DataProto
    from ._ipc import open_regular
    from .integrations.verl import VerlState, unpickle

    with os.fdopen(open_regular(path), "rb") as f:  # a FIFO is refused, never read
        try:
            loaded = unpickle(f)
        except DataProtoError:
            raise
        except Exception as e:  # unpickling can raise anything
            raise DecodeError(f"{path}: cannot unpickle: {e!r}") from e
    if isinstance(loaded, (DataProto, VerlState)):
        return DataProto(loaded.batch, loaded.non_tensor_batch, loaded.meta_info)
    raise DecodeError(f"{path}: the pickle holds a {type(loaded).__name__}, not a DataProto")


def _compression(name: str | None) -> str | None:
    return None if name in (None, "none") else name


def _report_written(source: str, out: str, verb: str = "wrote") -> None:
    """One line for ``convert`` and ``recover``: rows, batches, compression, sizes before and after."""
    from .files import open_file

    with open_file(out) as reader:
        rows, batches, compression, pickled = reader.num_rows, reader.num_batches, reader.compression, reader.pickled_columns
    print(f"{verb} {out}: {_count(rows, 'row')} in {_count(batches, 'batch')}, compression {compression or 'none'}, "
          f"{_size(os.path.getsize(source))} -> {_size(os.path.getsize(out))}")
    if pickled:
        print(f"note: columns {', '.join(pickled)} are stored pickled (reading them needs allow_pickle=True)")


def _convert(args: argparse.Namespace) -> int:
    from ._ipc import MAGIC, open_regular
    from .files import copy_file, open_file, write_file

    with os.fdopen(open_regular(args.input), "rb") as f:  # a FIFO is refused, never read
        start = f.read(len(MAGIC))
    if start == MAGIC or start.startswith(b"\xff\xff\xff\xff"):  # an Arrow IPC file or stream file
        if args.compression is None:  # keep the source's
            with open_file(args.input) as reader:
                compression = None if reader.compression == "unknown" else reader.compression
        else:
            compression = _compression(args.compression)
        copy_file(args.input, args.output, compression=compression, portable=args.portable, stream=args.stream)
    elif not start.startswith(b"\x80"):
        raise DecodeError(f"{args.input}: neither an Arrow file nor a pickle")
    elif not args.allow_pickle:
        raise PickleNotAllowedError(f"{args.input} is a Python pickle: loading it runs code the file names")
    else:
        write_file(args.output, load_pickled_dataproto(args.input), compression=_compression(args.compression),
                   portable=args.portable, stream=args.stream)
    _report_written(args.input, args.output)
    return 0


def _recover(args: argparse.Namespace) -> int:
    from .files import open_file, recover_file

    batches = recover_file(args.input, args.output, compression=_compression(args.compression))
    with open_file(args.output) as reader:
        rows = reader.num_rows
    print(f"recovered {_count(batches, 'complete batch')} ({_count(rows, 'row')}) into {args.output}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .files.layout import verify_checksums  # pyarrow alone: no torch

    batches, checked = verify_checksums(args.file)
    print(f"{args.file}: {batches} batches, {checked} buffers match their checksums")
    return 0


# ---------------------------------------------------------------- bench


def _benchmarks_dir(explicit: str | None) -> Path:
    """``--dir``, else ``./benchmarks``, else the ``benchmarks`` folder of a source checkout."""
    if explicit is not None:
        folder = Path(explicit)
        if not folder.is_dir():
            raise FileNotFoundError(f"no benchmarks folder at {folder}")
        return folder
    candidates = [Path.cwd() / "benchmarks", Path(__file__).resolve().parent.parent / "benchmarks"]
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise FileNotFoundError(
        "no benchmarks/ folder found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "): the benchmarks ship with the source repository, not the installed package; "
        "run this from a checkout or pass --dir"
    )


def _bench(args: argparse.Namespace) -> int:
    from ._progress import progress_bar

    folder = _benchmarks_dir(args.dir)
    scripts = sorted(folder.glob("bench_*.py"))
    names = {s.stem.removeprefix("bench_"): s for s in scripts}
    if args.names:
        unknown = [n for n in args.names if n.removeprefix("bench_") not in names]
        if unknown:
            raise FileNotFoundError(f"no benchmark {unknown} in {folder}; there are: {', '.join(names) or 'none'}")
        scripts = [names[n.removeprefix("bench_")] for n in args.names]
    if args.list or not scripts:
        print("\n".join(names) if names else f"no bench_*.py scripts in {folder}")
        return 0 if names else 1
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder.parent), env.get("PYTHONPATH")]))
    failed = []
    with progress_bar(True, total=len(scripts), desc="benchmarks", unit="script") as bar:
        for script in scripts:
            bar.write(f"== {script.name}")
            command = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
            with subprocess.Popen(
                command, cwd=folder.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            ) as process:
                assert process.stdout is not None  # stdout=PIPE
                for line in process.stdout:
                    bar.write(line.rstrip("\n"))
            if process.returncode:
                failed.append(f"{script.name} (exit {process.returncode})")
            bar.update()
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- entry point


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arrow-dataproto", description="Inspect, read and convert arrow-dataproto Arrow files."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("inspect", help="rows, batches and columns of a file (never unpickles)",
                            description="Show a file's rows, batches, compression and each batch's meta_info and, "
                            "for each column, its kind, torch/numpy dtype, per-row shape (* = ragged), device, bytes "
                            "stored and uncompressed, and row lengths (min/median/max) of jagged and list columns. "
                            "All of it comes from the file's metadata: nothing is decompressed but list offsets.")
    p.add_argument("file")
    p.add_argument("--stats", action="store_true",
                   help="also min/mean/max and NaN count of numeric columns (reads every value)")
    p.add_argument("--json", action="store_true", help="print the same information as JSON")
    p.set_defaults(run=_inspect)

    p = commands.add_parser("head", help="the first rows as a table",
                            description="Print rows of a file as a table that fits the terminal: a tensor cell shows "
                            "its dtype, row shape (* before a ragged size) and first values, e.g. "
                            "'f32[512] -0.51 -4.78 …' or 'i64[*37] 151644 8948 …'. Pickled columns show as "
                            "<pickled> unless --allow-pickle.")
    p.add_argument("file")
    p.add_argument("-n", type=int, default=5, help="number of rows (default 5)")
    p.add_argument("--start", type=int, default=0, help="first row (default 0; negative counts from the end)")
    p.add_argument("--columns", nargs="+", metavar="C", help="only these columns, in this order (a nested TensorDict's name selects its leaves)")
    p.add_argument("--allow-pickle", action="store_true", help="decode pickled columns (runs code from the file)")
    p.set_defaults(run=_head)

    compressions = ["none", "lz4", "zstd"]
    p = commands.add_parser("convert", help="a pickled DataProto (verl's save_to_disk) or an Arrow file -> Arrow file",
                            description="Write IN as an Arrow file OUT. IN is a DataProto pickled by verl's "
                            "save_to_disk (or pickle.dump of ours), which needs --allow-pickle because unpickling "
                            "runs code; verl need not be installed. IN may also be an Arrow file (or stream file) of ours, copied "
                            "without unpickling anything, e.g. with another --compression.")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--allow-pickle", action="store_true", help="allow unpickling IN (only for a file you trust)")
    p.add_argument("--compression", choices=compressions,
                   help="compression of OUT (default: IN's for an Arrow file, none for a pickle)")
    p.add_argument("--portable", action="store_true",
                   help="write the portable view: plain Arrow types (bf16/fp8 as float32, bools, nested lists) that "
                   "pandas, polars, DuckDB and HF datasets read as values; reads back bit-exact (default: the stored "
                   "types, also for a portable IN)")
    p.add_argument("--stream", action="store_true",
                   help="write an Arrow IPC stream file (what datasets.Dataset.from_file opens) instead of an IPC file")
    p.set_defaults(run=_convert)

    p = commands.add_parser("recover", help="copy the complete batches of an unfinished file",
                            description="Copy every complete batch of IN, a file whose writer did not finish "
                            "(no footer: e.g. a leftover PATH.*.partial), into a valid Arrow file OUT.")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--compression", choices=compressions, default="none", help="compression of OUT (default none)")
    p.set_defaults(run=_recover)

    p = commands.add_parser("verify", help="check every buffer against the checksums written with the file",
                            description="Check every buffer of every batch of FILE against the checksums it "
                            "was written with (FileWriter(checksums=True)); exit status 1 names the first "
                            "batch, column and buffer that differ.")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(run=_verify)

    p = commands.add_parser("bench", help="run the benchmarks (source checkout only)",
                            description="Run benchmarks/bench_*.py one after the other with a progress bar, "
                            "printing their output. The benchmarks ship with the source repository.")
    p.add_argument("names", nargs="*", metavar="NAME", help="only these benchmarks (e.g. codec files)")
    p.add_argument("--quick", action="store_true", help="pass --quick to each script (small sizes)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--dir", help="the benchmarks folder (default: ./benchmarks or the checkout's)")
    p.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    source = getattr(args, "file", None) or getattr(args, "input", None)
    if source is not None and not os.path.exists(source):  # answered before torch is imported
        print(f"arrow-dataproto: error: no such file: {source!r}", file=sys.stderr)
        return 1
    try:
        return args.run(args)
    except BrokenPipeError:  # output piped into a program that stopped reading (e.g. `| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except PickleNotAllowedError as e:
        print(f"arrow-dataproto: {e}\n{ALLOW_PICKLE_HINT}", file=sys.stderr)
    except (DataProtoError, OSError) as e:
        print(f"arrow-dataproto: error: {e}", file=sys.stderr)
    return 1
