"""Cost in the number of columns: a file's second ``write`` and its schema comparison.

Each later batch of a file is compared with the file's schema (``schema_difference``);
that comparison was quadratic in the number of columns (6,000 columns: 7.4 s for the
second ``write``; 4x the columns, 16x the time). For 1,500, 6,000 and 24,000 one-value
float32 columns this measures, in one run, the second ``FileWriter.write`` (encoding
included) and ``schema_difference`` alone, and prints each time's ratio to the smallest
case next to the ratio of the column counts (linear: the two ratios match).

    python benchmarks/bench_columns.py            # writes benchmarks/results/columns.md
    python benchmarks/bench_columns.py --quick    # fewer columns, prints only
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from tensordict import TensorDict

from harness import arguments, command, interleaved, pair, save

from arrow_dataproto import DataProto, to_arrow
from arrow_dataproto.files import FileWriter, schema_difference


def measure(columns: int, folder: Path, repeats: int) -> dict:
    dp = DataProto(batch=TensorDict({f"c{i}": torch.zeros(4) for i in range(columns)}, batch_size=[4]))
    schema = to_arrow(dp).schema
    writers: list[FileWriter] = []

    def fresh() -> None:
        for w in writers:
            w.abort()
        writers.clear()
        writer = FileWriter(folder / f"{columns}.arrow")
        writer.write(dp)
        writers.append(writer)

    times = interleaved(
        {
            "second write": (lambda: writers[0].write(dp), fresh),
            "schema_difference": (lambda: schema_difference(schema, schema), None),
        },
        repeats,
    )
    for w in writers:
        w.abort()
    return times


def report(cmd: str, results: dict[int, dict]) -> str:
    base = min(results)
    lines = [
        "# Cost in the number of columns",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {os.cpu_count()} cores, torch {torch.__version__}. Seconds, median (best); "
        f"ratios against {base:,} columns (linear: the time ratio follows the column ratio).",
        "",
        "| columns | column ratio | second write | ratio | schema_difference | ratio |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n, t in sorted(results.items()):
        w, d = t["second write"], t["schema_difference"]
        lines.append(
            f"| {n:,} | {n / base:.0f} | {pair(w)} | {w.median / results[base]['second write'].median:.1f} "
            f"| {pair(d, 4)} | {d.median / results[base]['schema_difference'].median:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments(__doc__, "columns.md", repeats=3, quick="fewer columns")
    counts = [250, 1000] if args.quick else [1500, 6000, 24000]
    repeats = 1 if args.quick else args.repeats
    folder = Path(tempfile.mkdtemp(prefix="bench_columns_", dir="/tmp"))
    try:
        results = {n: measure(n, folder, repeats) for n in counts}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    save(report(command("bench_columns.py"), results), args.out)


if __name__ == "__main__":
    main()
