"""What optional per-buffer checksums cost, side by side in one run.

For the PPO batch (about 280 MB of tensors, strings and dicts) and the seed batch
(one int64 tensor of 0.25 GiB):

- *write*: ``write_file`` with and without ``checksums=True`` (xxHash3 over every buffer);
- *open*: ``open_file`` of the checksummed file with and without ``verify=True``: the open
  reads only the footer either way (verification happens per batch read);
- *read*: ``read_all()`` without verification (memory-mapped, lazy: no byte of the tensors
  is touched) against ``read_all()`` with ``verify=True`` (every byte hashed) and
  ``verify()`` alone; and the floor for reading every byte, a ``read_all()`` followed by
  one pass over every tensor (``sum()``).

The page cache is warm (files were just written); writes are not fsynced.

    python benchmarks/bench_checksum.py            # writes benchmarks/results/checksums.md
    python benchmarks/bench_checksum.py --quick    # small batches, prints only
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from batches import ppo_batch, seed_batch
from harness import arguments, command, interleaved, pair, ratio, save

from arrow_dataproto import DataProto
from arrow_dataproto.files import open_file, write_file

MiB = 2**20


def _scan(dp: DataProto) -> float:
    return sum(float(t.sum()) for t in dp.batch.values(include_nested=True, leaves_only=True) if not t.is_nested)


def measure(case: str, dp: DataProto, folder: Path, repeats: int) -> list[tuple[str, str, str, str]]:
    plain, checked = folder / f"{case}.arrow", folder / f"{case}-checked.arrow"

    def fresh(path: Path):
        return lambda: path.unlink(missing_ok=True)

    def read(verify: bool):
        def run():
            with open_file(checked, verify=verify) as reader:
                return reader.read_all()
        return run

    def verify_only():
        with open_file(checked) as reader:
            return reader.verify()

    def read_and_scan():
        with open_file(checked) as reader:
            return _scan(reader.read_all())

    write_file(checked, dp, checksums=True)
    times = interleaved(
        {
            "write": (lambda: write_file(plain, dp), fresh(plain)),
            "write, checksums=True": (lambda: write_file(checked, dp, checksums=True), fresh(checked)),
        },
        repeats,
    )
    times |= interleaved(
        {
            "open": (lambda: open_file(checked).close(), None),
            "open, verify=True": (lambda: open_file(checked, verify=True).close(), None),
            "read_all (lazy)": (read(False), None),
            "read_all + sum() over every tensor": (read_and_scan, None),
            "read_all, verify=True": (read(True), None),
            "verify()": (verify_only, None),
        },
        repeats,
    )
    size = os.path.getsize(checked) / MiB
    baselines = {"write, checksums=True": "write", "open, verify=True": "open",
                 "read_all + sum() over every tensor": "read_all (lazy)", "read_all, verify=True": "read_all (lazy)",
                 "verify()": "read_all + sum() over every tensor"}
    return [
        (f"{case} ({size:.0f} MiB)", name, pair(t, 4 if name.startswith("open") else 3),
         ratio(t, times[baselines[name]], 2) if name in baselines else "1")
        for name, t in times.items()
    ]


def report(cmd: str, rows) -> str:
    lines = [
        "# Per-buffer checksums: write and read cost",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {os.cpu_count()} cores, torch {torch.__version__}. Seconds, median (best); the ratio is "
        "against the row named in the module docstring's pairing (write: plain write; open: plain open; "
        "lazy read: plain read_all; verify(): read_all + sum()).",
        "",
        "| batch | path | seconds | ratio |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments(__doc__, "checksums.md", repeats=3, quick="small batches")
    if args.quick:
        cases = {"ppo": DataProto(*ppo_batch(rows=64, prompt=128, response=128)),
                 "seed": DataProto(seed_batch(rows=64, cols=4096))}
        repeats = 1
    else:
        cases = {"ppo": DataProto(*ppo_batch()), "seed": DataProto(seed_batch(rows=1600, cols=20480))}
        repeats = args.repeats
    folder = Path(tempfile.mkdtemp(prefix="bench_checksum_", dir="/tmp"))
    try:
        rows = [row for case, dp in cases.items() for row in measure(case, dp, folder, repeats)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    save(report(command("bench_checksum.py"), rows), args.out)


if __name__ == "__main__":
    main()
