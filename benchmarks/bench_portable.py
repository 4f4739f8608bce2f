"""What the portable view costs, side by side with the stored form in one run.

The PPO batch (``batches.ppo_batch``: 2,560 rows, 1,024 + 1,024 tokens) as a mixed-precision
rollout: ``old_log_probs`` and ``ref_log_prob`` in bfloat16, ``response_mask`` as bools, the
other float tensors float32, ids int64. For each path, the stored form (``portable=False``)
against the portable view (``portable=True``):

- *encode*: ``to_arrow(dp)`` (zero-copy) against ``to_arrow(dp, portable=True)`` (widens the
  bf16 columns, packs the bools; the int64/float32 grids stay views);
- *decode*: ``from_arrow`` of each RecordBatch (the portable one is narrowed back first:
  every bf16 value checked);
- *write*: ``write_file`` of each form; *read*: ``read_file`` of each (memory-mapped).

    python benchmarks/bench_portable.py            # writes benchmarks/results/portable.md
    python benchmarks/bench_portable.py --quick    # a small batch, prints only
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from batches import ppo_batch
from harness import arguments, command, interleaved, pair, ratio, save

from arrow_dataproto import DataProto, from_arrow, to_arrow
from arrow_dataproto.files import read_file, write_file

MiB = 2**20


def rollout(rows: int, prompt: int, response: int) -> DataProto:
    batch, non_tensor, meta_info = ppo_batch(rows=rows, prompt=prompt, response=response)
    for name in ("old_log_probs", "ref_log_prob"):
        batch[name] = batch[name].bfloat16()
    batch["response_mask"] = batch["response_mask"].bool()
    return DataProto(batch, non_tensor, meta_info)


def measure(dp: DataProto, folder: Path, repeats: int) -> list[tuple[str, str, str, str]]:
    stored, portable = to_arrow(dp), to_arrow(dp, portable=True)
    paths = {False: folder / "stored.arrow", True: folder / "portable.arrow"}
    rows = []
    for path_name, tasks in {
        "encode (to_arrow)": {p: (lambda p=p: to_arrow(dp, portable=p), None) for p in (False, True)},
        "decode (from_arrow)": {False: (lambda: from_arrow(stored), None), True: (lambda: from_arrow(portable), None)},
        "write_file": {p: (lambda p=p: write_file(paths[p], dp, portable=p), lambda p=p: paths[p].unlink(missing_ok=True))
                       for p in (False, True)},
        "read_file": {p: (lambda p=p: read_file(paths[p]), None) for p in (False, True)},
    }.items():
        times = interleaved(tasks, repeats)
        for p, t in times.items():
            rows.append((path_name, "portable" if p else "stored", pair(t, 4), ratio(t, times[False], 2)))
    sizes = {p: os.path.getsize(path) / MiB for p, path in paths.items()}
    rows.append(("file size (MiB)", "stored / portable", f"{sizes[False]:.0f} / {sizes[True]:.0f}",
                 f"{sizes[True] / sizes[False]:.2f}"))
    return rows


def report(cmd: str, dp: DataProto, rows) -> str:
    lines = [
        "# The portable view: encode, decode, write and read cost",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {os.cpu_count()} cores, torch {torch.__version__}. Batch: {dp.batch.batch_size[0]} rows, "
        f"{to_arrow(dp).nbytes / MiB:.0f} MiB stored. Seconds, median (best); the ratio is the portable "
        "path's median over the stored path's.",
        "",
        "| path | form | seconds | ratio |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments(__doc__, "portable.md", repeats=5, quick="a small batch")
    dp = rollout(64, 128, 128) if args.quick else rollout(2560, 1024, 1024)
    folder = Path(tempfile.mkdtemp(prefix="bench_portable_", dir="/tmp"))
    try:
        rows = measure(dp, folder, 1 if args.quick else args.repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    save(report(command("bench_portable.py"), dp, rows), args.out)


if __name__ == "__main__":
    main()
