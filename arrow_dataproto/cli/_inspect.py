"""``arrow-dataproto inspect``: a file's rows, batches, meta_info and columns, from its metadata."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from ..errors import DecodeError
from ._text import clip, human_size, plural, terminal_width

if TYPE_CHECKING:
    import numpy as np

    from ..files import ColumnInfo, FileReader


def _shape(shape: Any) -> str:
    if shape is None:  # another tool's column
        return "-"
    if not isinstance(shape, list):
        return str(shape)
    return "[" + ", ".join("*" if n is None else str(n) for n in shape) + "]"


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths))).rstrip() for row in rows]



def _lengths_summary(lengths: list[np.ndarray]) -> dict | None:
    import numpy as np

    if not lengths:
        return None
    every = np.concatenate(lengths)
    if not every.size:
        return None
    return {"min": int(every.min()), "median": float(np.median(every)), "max": int(every.max())}


def _arrow_values(column: Any) -> np.ndarray | None:
    """The numeric values of another tool's column (integers, floats, booleans, decimals, and
    lists, fixed-size lists and tensors of them; nulls left out) as float64, or None for
    any other type."""
    import numpy as np
    import pyarrow as pa

    while True:
        if pa.types.is_map(column.type):  # (a MapArray is a ListArray of key-value structs)
            return None
        if isinstance(column.type, pa.BaseExtensionType):
            column = column.storage
        elif isinstance(column, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray, pa.ListViewArray, pa.LargeListViewArray)):
            column = column.flatten()  # the values its rows hold (not those under null rows)
        else:
            break
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind) or pa.types.is_decimal(kind)):
        return None
    return np.asarray(column.drop_null().to_numpy(zero_copy_only=False)).astype(np.float64)


def _value_stats(reader: FileReader, info: ColumnInfo) -> dict | None:
    """min / mean / max (and NaN count) of a numeric column's values, one batch at a time
    (another tool's column from its Arrow values, nulls left out: see :func:`_arrow_values`)."""
    import numpy as np
    import torch

    if info.kind in ("pickle", "string", "object"):
        return None
    low, high, total, count, nans = float("inf"), float("-inf"), 0.0, 0, 0
    for i in range(reader.num_batches):
        if info.kind == "arrow":
            found = _arrow_values(reader.read_arrow(i, [info.name]).column(0))
            if found is None:
                return None
            values = found
        elif info.is_tensor:
            data = reader.read_batch(i, [info.name], meta_info=False)
            assert data.batch is not None  # a tensor column was read
            column = data.batch[tuple(info.name.split("."))]
            if column.is_nested:
                rows = column.unbind()
                column = torch.cat([row.reshape(-1) for row in rows]) if rows else torch.empty(0)
            if column.is_complex():
                return None
            values = column.reshape(-1).to(torch.float64).numpy()
        else:
            array = reader.read_batch(i, [info.name], meta_info=False).non_tensor_batch[info.name]
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
    from .._format import META_INFO_ENCODING
    from .._meta_info import decode_meta_info

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
    from .._format import VERSION, check_schema
    from ..files.layout import ColumnInfo, read_file_layout

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
        from ..files import open_file

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
    from .._format import VERSION, check_schema
    from ..files import BatchLayout, open_file

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
    return clip(str(value), width)


def print_description(info: dict, most_batches: int = 8) -> None:
    width = terminal_width()
    rows = info["batch_rows"]
    sizes = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    compressed = info["compression"] != "none"
    raw_total = sum(c["bytes"] for c in info["columns"])
    print(info["path"])
    print(
        f"  {plural(info['rows'], 'row')} in {plural(info['batches'], 'batch')} ({sizes}); "
        f"{human_size(info['file_bytes'])} on disk"
        + (f" ({human_size(raw_total)} uncompressed)" if compressed else "")
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
        cells += [human_size(c["stored_bytes"]), human_size(c["bytes"])] if compressed else [human_size(c["bytes"])]
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
            print(clip(f"    batch {i} ({rows[i]} rows): {text}", width))
            if i == most_batches - 3 and len(batches) > most_batches:
                print(f"    ... {len(batches) - most_batches} more (--json shows every batch)")


def run(args: argparse.Namespace) -> int:
    info = describe(args.file, stats=args.stats)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print_description(info)
    return 0
