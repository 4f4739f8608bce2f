"""This checkout's arrow_dataproto against the one of another git revision, side by side in one run.

What a refactor must not slow down: the codec (``to_ipc``/``from_ipc``, pickle protocol 5
with out-of-band buffers) and the files (``write_file``, ``read_file``, one pass over
every tensor byte, ``read_rows`` of a slice, the row count of a many-batch file), on the
seed batch (one 1 GiB int64 tensor), the PPO batch, its first 256 rows (tens of MiB, where
a receive in ordinary memory skips re-reading ``/proc/self/maps``), and the PPO batch's columns
for 16 rows (where the per-object and per-column work is all there is).

The other revision's package is extracted with ``git archive`` into a temporary folder
under another top-level name (the package imports itself only relatively), so both load
in this process and take turns in every round (``harness.interleaved``, every other
round in reverse order, so that neither side always runs first). A ratio is the
revision's median over this checkout's: above 1.0, this checkout is faster.

    python benchmarks/bench_revisions.py --rev ee0ca13          # full sizes; writes results/revisions.md
    python benchmarks/bench_revisions.py --quick                # against HEAD, small sizes, prints only
"""

from __future__ import annotations

import argparse
import gc
import importlib
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

from batches import nbytes, ppo_batch, seed_batch
from harness import RESULTS, interleaved, pair, save

import arrow_dataproto as adp

ROOT = Path(__file__).resolve().parent.parent


def load_revision(rev: str, folder: Path) -> ModuleType:
    """The package as it was at ``rev``, imported as ``adp_<rev>`` from ``folder``."""
    name = "adp_" + "".join(c if c.isalnum() else "_" for c in rev)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "arrow_dataproto"],
        check=True, capture_output=True,
    ).stdout
    with tempfile.TemporaryFile() as tar_file:
        tar_file.write(archive)
        tar_file.seek(0)
        with tarfile.open(fileobj=tar_file) as tar:
            tar.extractall(folder, filter="data")
    (folder / "arrow_dataproto").rename(folder / name)
    sys.path.insert(0, str(folder))
    return importlib.import_module(name)


def _pickled(dp):
    buffers: list = []
    return pickle.dumps(dp, protocol=5, buffer_callback=buffers.append), buffers


def _tasks(package: ModuleType, td, non_tensor, meta, folder: Path, batches: int) -> dict:
    """The timed operations of one package on one batch (inputs prepared here, untimed)."""
    dp = package.DataProto(batch=td, non_tensor_batch=non_tensor, meta_info=meta)
    stream = package.to_ipc(dp)
    payload, buffers = _pickled(dp)
    files = importlib.import_module(package.__name__ + ".files")
    path = folder / f"{package.__name__}.arrow"
    files.write_file(path, dp)
    many = folder / f"{package.__name__}-many.arrow"
    rows = len(dp)
    with files.FileWriter(many) as writer:
        for i in range(batches):
            writer.write(dp[i * rows // batches:(i + 1) * rows // batches])

    def scan():
        batch = files.read_file(path).batch
        return sum(float(t.sum()) for t in batch.values(include_nested=True, leaves_only=True))

    def row_count():
        with files.open_file(many) as reader:
            return reader.num_rows

    def read_rows():
        with files.open_file(many) as reader:
            return reader.read_rows(rows // 3, 2 * rows // 3)

    return {
        "to_ipc": lambda: package.to_ipc(dp),
        "from_ipc": lambda: package.from_ipc(stream),
        "pickle.dumps": lambda: _pickled(dp),
        "pickle.loads (copy)": lambda: pickle.loads(payload, buffers=buffers),
        "write_file": lambda: files.write_file(path, dp),
        "read_file": lambda: files.read_file(path),
        "read_file + scan": scan,
        f"num_rows ({batches} batches)": row_count,
        "read_rows (a third)": read_rows,
    }


def run(rev: str, old: ModuleType, cases, folder: Path, repeats: int, batches: int) -> list[tuple]:
    """Rows ``(batch, operation, this checkout's Timing, the revision's Timing)``."""
    rows = []
    for case, build in cases:
        td, non_tensor, meta = build()
        print(f"\n{case}: {nbytes(td) / 2**20:.0f} MiB of tensors", flush=True)
        ours = _tasks(adp, td, non_tensor, meta, folder, batches)
        theirs = _tasks(old, td, non_tensor, meta, folder, batches)
        tasks = {}
        for op in ours:
            tasks["now", op] = (ours[op], None)
            tasks[rev, op] = (theirs[op], None)
        timings = interleaved(tasks, repeats, alternate=True)
        for op in ours:
            now, then = timings["now", op], timings[rev, op]
            rows.append((case, op, now, then))
            print(f"  {op:<26} now {pair(now, 2, 1e3)} ms   {rev} {pair(then, 2, 1e3)} ms   "
                  f"{then.median / now.median:.2f}", flush=True)
        del td, non_tensor, meta, ours, theirs, tasks
        gc.collect()
    return rows


def table(rev: str, rows: list[tuple], command_line: str) -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    lines = [
        f"# This checkout ({head}) against {rev}, side by side",
        "",
        f"`{command_line}`: milliseconds, median (best) of the interleaved rounds; ratios = {rev}'s",
        "median (best) / this checkout's (above 1.0: this checkout is faster). Noise only ever adds",
        "time, so where the medians of disk-bound rows scatter, the ratio of the bests is the steadier one.",
        "",
        f"| batch | operation | now (ms) | {rev} (ms) | ratio of medians | ratio of bests |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for case, op, now, then in rows:
        lines.append(f"| {case} | {op} | {pair(now, 2, 1e3)} | {pair(then, 2, 1e3)} |"
                     f" {then.median / now.median:.2f} | {then.best / now.best:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="HEAD", help="the git revision to compare with (default HEAD: what the "
                        "uncommitted change costs; a commit before a refactor)")
    parser.add_argument("--quick", action="store_true", help="small batches, one repeat, print only")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=64, help="record batches of the many-batch file")
    parser.add_argument("--out", help="results file (default: benchmarks/results/revisions.md unless --quick)")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    out = args.out or (None if args.quick else RESULTS / "revisions.md")
    if args.quick:
        cases = [("seed (quick)", lambda: (seed_batch(rows=64, cols=1024), {}, {})),
                 ("ppo (quick)", lambda: ppo_batch(rows=64, prompt=64, response=64))]
    else:
        cases = [("seed", lambda: (seed_batch(), {}, {})), ("ppo", ppo_batch),
                 ("ppo, 256 rows", lambda: ppo_batch(rows=256)),
                 ("ppo, 16 rows", lambda: ppo_batch(rows=16, prompt=16, response=16))]
    folder = Path(tempfile.mkdtemp(prefix="adp-revisions-"))
    try:
        old = load_revision(args.rev, folder)
        rows = run(args.rev, old, cases, folder, repeats, args.batches)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    save(table(args.rev, rows, "python benchmarks/bench_revisions.py " + " ".join(sys.argv[1:])), out)


if __name__ == "__main__":
    main()
