"""The ``arrow-dataproto`` command (also ``python -m arrow_dataproto``).

::

    arrow-dataproto inspect FILE [--stats] [--json]  rows, batches, meta_info, columns, sizes, row lengths
    arrow-dataproto head FILE [-n N] [--start S] [--columns C ...] [--allow-pickle]
    arrow-dataproto convert IN OUT [--allow-pickle] [--compression C] [--portable] [--stream]
    arrow-dataproto recover IN OUT [--compression C]
    arrow-dataproto verify FILE                     the structure, and every buffer against its checksums
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
import os
import subprocess
import sys
from pathlib import Path

from .. import __version__
from ..errors import DataProtoError, DecodeError, PickleNotAllowedError
from . import _head, _inspect
from ._head import PICKLED, head_table
from ._inspect import describe
from ._text import human_size, plural

__all__ = ["ALLOW_PICKLE_HINT", "PICKLED", "describe", "head_table", "main"]

ALLOW_PICKLE_HINT = "(on the command line: --allow-pickle, only for a file you trust)"


# ---------------------------------------------------------------- convert and recover


def _compression(name: str | None) -> str | None:
    return None if name in (None, "none") else name


def _report_written(source: str, out: str, verb: str = "wrote") -> None:
    """One line for ``convert`` and ``recover``: rows, batches, compression, sizes before and after."""
    from ..files import open_file

    with open_file(out) as reader:
        rows, batches, compression, pickled = reader.num_rows, reader.num_batches, reader.compression, reader.pickled_columns
    print(f"{verb} {out}: {plural(rows, 'row')} in {plural(batches, 'batch')}, compression {compression or 'none'}, "
          f"{human_size(os.path.getsize(source))} -> {human_size(os.path.getsize(out))}")
    if pickled:
        print(f"note: columns {', '.join(pickled)} are stored pickled (reading them needs allow_pickle=True)")


def _convert(args: argparse.Namespace) -> int:
    from .._ipc import CONTINUATION, MAGIC, open_regular
    from ..files import copy_file, open_file, write_file

    with os.fdopen(open_regular(args.input), "rb") as f:  # a FIFO is refused, never read
        start = f.read(len(MAGIC))
    if start == MAGIC or start.startswith(CONTINUATION):  # an Arrow IPC file or stream file
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
        from .._container import DataProto

        # a pickle of verl's DataProto (verl need not be installed) or of ours
        write_file(args.output, DataProto.load_from_disk(args.input, allow_pickle=True),
                   compression=_compression(args.compression), portable=args.portable, stream=args.stream)
    _report_written(args.input, args.output)
    return 0


def _recover(args: argparse.Namespace) -> int:
    from ..files import open_file, recover_file

    batches = recover_file(args.input, args.output, compression=_compression(args.compression))
    with open_file(args.output) as reader:
        rows = reader.num_rows
    print(f"recovered {plural(batches, 'complete batch')} ({plural(rows, 'row')}) into {args.output}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from ..files.layout import verify_checksums  # pyarrow alone: no torch

    batches, checked, unchecked = verify_checksums(args.file)
    structure = "structure valid (footer, message headers, Arrow's full validation of each batch)"
    if not unchecked:
        print(f"{args.file}: {batches} batches, {structure}; {checked} buffers match their checksums")
    elif unchecked == batches:
        print(f"{args.file}: {batches} batches, {structure}; no checksums (written without checksums=True): "
              "the values themselves were not checked")
    else:
        print(f"{args.file}: {batches} batches, {structure}; {checked} buffers match their checksums, "
              f"{unchecked} batches have none (their values were not checked)")
    return 0


# ---------------------------------------------------------------- bench


def _benchmarks_dir(explicit: str | None) -> Path:
    """``--dir``, else ``./benchmarks``, else the ``benchmarks`` folder of a source checkout."""
    if explicit is not None:
        folder = Path(explicit)
        if not folder.is_dir():
            raise FileNotFoundError(f"no benchmarks folder at {folder}")
        return folder
    candidates = [Path.cwd() / "benchmarks", Path(__file__).resolve().parents[2] / "benchmarks"]
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
    from .._progress import progress_bar

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
    p.set_defaults(run=_inspect.run)

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
    p.set_defaults(run=_head.run)

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

    p = commands.add_parser("verify", help="check the file's structure, and every buffer against its checksums",
                            description="Check the structure of FILE (footer, message headers, Arrow's full "
                            "validation of every batch) and every buffer of every batch against the checksums it "
                            "was written with (FileWriter(checksums=True)); it says which batches had none. Exit "
                            "status 1 names the first batch, column and buffer that differ, or what is malformed.")
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
