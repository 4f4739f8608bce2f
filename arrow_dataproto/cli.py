"""The ``arrow-dataproto`` command (also ``python -m arrow_dataproto``).

::

    arrow-dataproto inspect FILE [--json]           rows, batches, columns, dtypes, shapes, bytes
    arrow-dataproto head FILE [-n N] [--start S] [--columns C ...] [--allow-pickle]
    arrow-dataproto convert IN OUT [--allow-pickle] [--compression C]
    arrow-dataproto recover IN OUT [--compression C]
    arrow-dataproto verify FILE                     every buffer against the checksums written with it
    arrow-dataproto bench [NAME ...] [--quick] [--list] [--dir DIR]

Nothing is unpickled without ``--allow-pickle``: ``inspect`` never unpickles,
``head`` shows pickled columns as ``<pickled>``, and ``convert`` refuses a
pickle. Exit status: 0 on success, 1 on an error (printed as one line), 2 for
a bad command line.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import __version__
from ._format import VERSION, check_schema
from .errors import DataProtoError, DecodeError, PickleNotAllowedError
from .files import MAGIC, copy_file, open_file, open_regular, progress_bar, recover_file, write_file
from ._container import DataProto

PICKLED = "<pickled>"
"""What ``head`` shows in a pickled column without ``--allow-pickle``."""


def _size(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def _shape(shape: Any) -> str:
    if not isinstance(shape, list):
        return str(shape)
    return "[" + ", ".join("*" if n is None else str(n) for n in shape) + "]"


# ---------------------------------------------------------------- inspect


def describe(path: str | os.PathLike) -> dict:
    """What ``inspect`` shows, as a JSON-compatible dict; nothing is unpickled."""
    with open_file(path) as reader:
        encoding = reader.meta_info_encoding() if reader.num_batches else None
        meta_keys = list(reader.read_meta_info()) if encoding == "json" else None
        nbytes = reader.column_nbytes()
        return {
            "path": str(path),
            "file_bytes": reader.file_size,
            "format_version": check_schema(reader.schema)[VERSION],
            "compression": reader.compression or "none",
            "rows": reader.num_rows,
            "batches": reader.num_batches,
            "batch_rows": reader.batch_rows,
            "meta_info": {"encoding": encoding, "keys": meta_keys},
            "columns": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "dtype": c.dtype,
                    "shape": c.shape,
                    "device": c.device,
                    "bytes": nbytes[c.name],
                }
                for c in reader.column_info()
            ],
        }


def _print_description(info: dict) -> None:
    rows = info["batch_rows"]
    sizes = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    print(info["path"])
    print(
        f"  {info['rows']} rows in {info['batches']} batches ({sizes}); {_size(info['file_bytes'])} on disk, "
        f"compression {info['compression']}, format {info['format_version']}"
    )
    meta = info["meta_info"]
    if meta["encoding"] == "json":
        print(f"  meta_info (batch 0): {', '.join(meta['keys']) or '{}'}")
    elif meta["encoding"] == "pickle":
        print("  meta_info (batch 0): pickled, not shown (needs --allow-pickle to read)")
    bytes_label = "bytes (uncompressed)" if info["compression"] != "none" else "bytes"
    table = [("column", "kind", "dtype", "row shape", "device", bytes_label)]
    for c in info["columns"]:
        table.append((c["name"], c["kind"], c["dtype"], _shape(c["shape"]), c["device"] or "-", _size(c["bytes"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    pickled = [c["name"] for c in info["columns"] if c["kind"] == "pickle"]
    if pickled:
        print(f"  pickled columns: {', '.join(pickled)} (reading their values needs --allow-pickle)")


def _inspect(args: argparse.Namespace) -> int:
    info = describe(args.file)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_description(info)
    return 0


# ---------------------------------------------------------------- head


def _head_frame(path: str, n: int, start: int, columns: list[str] | None, allow_pickle: bool):
    """Rows ``start:start+n`` as a DataFrame indexed by row number in the file, and the pickled
    columns filled with ``<pickled>`` instead of being decoded (without ``allow_pickle``;
    ``meta_info`` is then not read either: nothing is unpickled)."""
    from .pandas import to_pandas

    with open_file(path, allow_pickle=allow_pickle) as reader:
        wanted = reader.columns if columns is None else list(columns)
        hidden = [] if allow_pickle else [c for c in reader.pickled_columns if c in wanted]
        first = slice(start, None).indices(reader.num_rows)[0]
        data = reader.read_rows(first, first + n, [c for c in wanted if c not in hidden], meta_info=allow_pickle)
        order = reader.columns
    frame = to_pandas(data)
    for name in hidden:
        frame[name] = PICKLED
    frame = frame[[c for c in order if c in frame.columns]]
    frame.index = range(first, first + len(frame))
    return frame, hidden


def _head(args: argparse.Namespace) -> int:
    import pandas as pd

    frame, hidden = _head_frame(args.file, args.n, args.start, args.columns, args.allow_pickle)
    width = shutil.get_terminal_size().columns
    with pd.option_context(
        "display.max_columns", None, "display.max_rows", None, "display.width", width, "display.max_colwidth", 40
    ):
        print(frame)
    if hidden:
        print(f"(columns {', '.join(hidden)} are pickled: shown as {PICKLED}; --allow-pickle decodes them, "
              "only for files you trust)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- convert and recover


class _VerlDataProto:
    """Stands in for ``verl.protocol.DataProto`` while unpickling, so verl need not be installed.

    Unpickling sets its ``batch``, ``non_tensor_batch`` and ``meta_info`` from a state
    verl pickled, through :mod:`arrow_dataproto.integrations.verl` (both of verl's modes).
    """

    def __setstate__(self, state: Any) -> None:
        from .integrations.verl import load_state

        load_state(self, state)


class _VerlUnpickler(pickle.Unpickler):
    """An unpickler that loads ``verl.protocol.DataProto`` as :class:`_VerlDataProto`; all else as usual."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("verl.protocol", "DataProto"):
            return _VerlDataProto
        return super().find_class(module, name)


def load_pickled_dataproto(path: str | os.PathLike) -> DataProto:
    """A DataProto pickled by verl's ``save_to_disk`` (or ``pickle.dump`` of ours), as our DataProto.

    This unpickles: it runs whatever code the file names. Only for files you trust.
    verl need not be installed: its DataProto class is replaced by a stand-in that
    decodes verl's state (``torch.save`` bytes or numpy mode). Raises
    :class:`DecodeError` if the file holds something else or a class that cannot be found.
    """
    with open(path, "rb") as f:
        try:
            loaded = _VerlUnpickler(f).load()
        except DataProtoError:
            raise
        except Exception as e:  # unpickling can raise anything
            raise DecodeError(f"{path}: cannot unpickle: {e!r}") from e
    if isinstance(loaded, (DataProto, _VerlDataProto)):
        return DataProto(loaded.batch, loaded.non_tensor_batch, loaded.meta_info)
    raise DecodeError(f"{path}: the pickle holds a {type(loaded).__name__}, not a DataProto")


def _convert(args: argparse.Namespace) -> int:
    with os.fdopen(open_regular(args.input), "rb") as f:  # a FIFO is refused, never read
        start = f.read(len(MAGIC))
    compression = None if args.compression == "none" else args.compression
    if start == MAGIC:
        batches = copy_file(args.input, args.output, compression=compression)
        print(f"wrote {args.output}: {batches} batches, compression {args.compression}")
        return 0
    if not start.startswith(b"\x80"):
        raise DecodeError(f"{args.input}: neither an Arrow file nor a pickle")
    if not args.allow_pickle:
        raise PickleNotAllowedError(
            f"{args.input} is a Python pickle: loading it runs code the file names. "
            "Pass --allow-pickle only if you trust where it came from"
        )
    data = load_pickled_dataproto(args.input)
    write_file(args.output, data, compression=compression)
    with open_file(args.output) as reader:
        pickled = reader.pickled_columns
    print(f"wrote {args.output}: {len(data)} rows, compression {args.compression}")
    if pickled:
        print(f"note: columns {', '.join(pickled)} are stored pickled (reading them needs allow_pickle=True)")
    return 0


def _recover(args: argparse.Namespace) -> int:
    compression = None if args.compression == "none" else args.compression
    batches = recover_file(args.input, args.output, compression=compression)
    with open_file(args.output) as reader:
        rows = reader.num_rows
    print(f"recovered {batches} complete batches ({rows} rows) into {args.output}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    with open_file(args.file) as reader:
        checked = reader.verify()
        print(f"{args.file}: {reader.num_batches} batches, {checked} buffers match their checksums")
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
                            description="Show a file's rows, batches, compression, meta_info keys and, for each "
                            "column, its kind, torch/numpy dtype, per-row shape (* = ragged), device and bytes.")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the same information as JSON")
    p.set_defaults(run=_inspect)

    p = commands.add_parser("head", help="the first rows as a table",
                            description="Print rows of a file as a table (via pandas): tensors as per-row arrays, "
                            "bf16/fp8 shown as float32. Pickled columns show as <pickled> unless --allow-pickle.")
    p.add_argument("file")
    p.add_argument("-n", type=int, default=5, help="number of rows (default 5)")
    p.add_argument("--start", type=int, default=0, help="first row (default 0; negative counts from the end)")
    p.add_argument("--columns", nargs="+", metavar="C", help="only these columns (a nested TensorDict's name selects its leaves)")
    p.add_argument("--allow-pickle", action="store_true", help="decode pickled columns (runs code from the file)")
    p.set_defaults(run=_head)

    compressions = ["none", "lz4", "zstd"]
    p = commands.add_parser("convert", help="a pickled DataProto (verl's save_to_disk) or an Arrow file -> Arrow file",
                            description="Write IN as an Arrow file OUT. IN is a DataProto pickled by verl's "
                            "save_to_disk (or pickle.dump of ours), which needs --allow-pickle because unpickling "
                            "runs code; verl need not be installed. IN may also be an Arrow file of ours, copied "
                            "with another --compression without unpickling anything.")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--allow-pickle", action="store_true", help="allow unpickling IN (only for a file you trust)")
    p.add_argument("--compression", choices=compressions, default="none", help="compression of OUT (default none)")
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
    try:
        return args.run(args)
    except BrokenPipeError:  # output piped into a program that stopped reading (e.g. `| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except PickleNotAllowedError as e:
        print(f"arrow-dataproto: {e}\n(on the command line: --allow-pickle, only for a file you trust)", file=sys.stderr)
    except (DataProtoError, OSError) as e:
        print(f"arrow-dataproto: error: {e}", file=sys.stderr)
    return 1
