"""TransferQueue checkpoints on the arrow_dataproto backend beside the same bytes through arrow_dataproto.files.

A 1 GiB partition (the seed batch: one int64 tensor, 6400 rows, put by one ``kv_batch_put``) is
saved and loaded with ``tq.save_checkpoint`` / ``tq.load_checkpoint`` (controller state, our
Arrow IPC file with checksums, manifest, fsyncs, TransferQueue's rename), side by side in one
process, interleaved, with the rivals on the same bytes:

- ``files.write_file`` of the same batch (no checksums, no fsync: the bar of the issue), and
  ``write_file(checksums=True)`` followed by an fsync of the file (what a save must do);
- ``files.open_file`` and ``read_batch(0)``: the batch memory-mapped, nothing read until touched
  (the bar of the issue), and ``open_file(copy=True)``: every byte read into memory once (what a
  load into Ray's object store must do at least: one copy).

Ratios are medians over the rival's median (higher = slower). Files go to ``--dir`` (default: a
temporary folder under /tmp), so the numbers are this disk's and its page cache's.

Run: ``python benchmarks/bench_tq_checkpoint.py [--quick] [--repeats N] [--dir DIR]``; the report goes
to ``benchmarks/results/transfer_queue_checkpoint.md`` (``--out``), and the runs kept are a section of
``benchmarks/results/transfer_queue.md``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import ray
from omegaconf import OmegaConf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from batches import nbytes, seed_batch  # noqa: E402

import arrow_dataproto as adp  # noqa: E402
import arrow_dataproto.integrations.transfer_queue  # noqa: E402,F401  (registers the backend)
from arrow_dataproto import files  # noqa: E402

SAVE, WRITE, WRITE_SYNC = "tq.save_checkpoint", "files.write_file", "files.write_file(checksums=True) + fsync"
LOAD, OPEN, OPEN_COPY = "tq.load_checkpoint", "files.open_file + read_batch (mapped)", "files.open_file(copy=True) + read_batch"
CONFIG = {"backend": {"storage_backend": "arrow_dataproto", "arrow_dataproto": {}}}


def main() -> None:
    def more(parser):
        parser.add_argument("--dir", help="where the files go (default: a temporary folder under /tmp)")

    args = harness.arguments(__doc__, "transfer_queue_checkpoint.md", repeats=5, quick="256 MiB", more=more)
    import transfer_queue as tq

    rows = 1600 if args.quick else 6400
    td = seed_batch(rows)
    dp = adp.DataProto(batch=td)
    folder = Path(tempfile.mkdtemp(prefix="bench_tq_ckpt.", dir=args.dir))
    ray.init(address="local", num_cpus=8, object_store_memory=3 * 1024**3, include_dashboard=False,
             configure_logging=False, runtime_env={"worker_process_setup_hook": "arrow_dataproto.integrations.register_transfer_queue"})
    try:
        tq.init(OmegaConf.create(CONFIG))
        names = [f"k{i}" for i in range(rows)]
        tq.kv_batch_put(keys=names, partition_id="bench", fields=td)
        checkpoint, plain, synced = folder / "ckpt", folder / "plain.arrow", folder / "synced.arrow"

        def write_synced():
            files.write_file(synced, dp, checksums=True)
            with open(synced, "rb") as f:
                os.fsync(f.fileno())

        def read_mapped():
            with files.open_file(plain) as reader:
                return reader.read_batch(0)

        def read_copy():
            with files.open_file(plain, copy=True) as reader:
                return reader.read_batch(0)

        saves = harness.interleaved({
            SAVE: (lambda: tq.save_checkpoint(checkpoint), None),
            WRITE: (lambda: files.write_file(plain, dp), None),
            WRITE_SYNC: (write_synced, None),
        }, args.repeats, alternate=True)
        loads = harness.interleaved({
            LOAD: (lambda: tq.load_checkpoint(checkpoint), None),
            OPEN: (read_mapped, None),
            OPEN_COPY: (read_copy, None),
        }, args.repeats, alternate=True)
        got = tq.kv_batch_get(keys=names, partition_id="bench")["input_ids"]
        assert got.equal(td["input_ids"]), "the loaded rows differ from those put"
        tq.close()
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)

    lines = [
        f"## {nbytes(td) / 2**30:.2f} GiB partition ({rows} rows, one int64 tensor): save and load",
        "",
        f"`{harness.command('bench_tq_checkpoint.py')}`; seconds, median (best) of {args.repeats} interleaved rounds.",
        "",
        "| path | seconds | x files.write_file | x write_file(checksums) + fsync |",
        "|---|---:|---:|---:|",
    ]
    for name in (SAVE, WRITE, WRITE_SYNC):
        lines.append(f"| {name} | {harness.pair(saves[name])} | {harness.ratio(saves[name], saves[WRITE], 2)} "
                     f"| {harness.ratio(saves[name], saves[WRITE_SYNC], 2)} |")
    lines += ["", "| path | seconds | x open_file (mapped) | x open_file(copy=True) |", "|---|---:|---:|---:|"]
    for name in (LOAD, OPEN, OPEN_COPY):
        lines.append(f"| {name} | {harness.pair(loads[name])} | {harness.ratio(loads[name], loads[OPEN], 1)} "
                     f"| {harness.ratio(loads[name], loads[OPEN_COPY], 2)} |")
    harness.save("\n".join(lines) + "\n", None if args.quick else args.out)


if __name__ == "__main__":
    main()
