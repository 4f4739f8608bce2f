"""Arrow files against ``numpy.ndarray.tofile`` and ``torch.save``, side by side in one run.

For the seed batch (one 1 GiB int64 tensor) and the PPO batch:

- *write*: ``write_file`` vs raw ``tofile`` of each tensor (the floor: bytes only, no
  metadata, no non-tensor columns) vs ``torch.save`` of the batch;
- *open*: until the tensors are usable: ``read_file`` (memory-mapped, lazy) vs
  ``numpy.fromfile`` vs ``torch.load`` vs ``torch.load(mmap=True)``;
- *open+scan*: the same, then one pass over every tensor byte (``tensor.sum()``), which
  makes the lazy readers actually read;
- compression (none, lz4, zstd): file size, write time, open+scan time;
- one column out of a two-column file of 0.25 GiB and of 1 GiB (the other column
  grows): the time should not depend on the file size;
- copy-on-write: the cost of the first in-place write over a tensor read from a file
  (its pages get private copies) against writing an in-memory tensor and ``clone()``,
  and the fixed cost of one read call (each call maps the file afresh).

Files go to a temporary folder under ``/tmp`` (removed at the end); the page cache is
warm (files were just written), so reads measure memory-mapped / cached reads, not
the disk, and writes are not fsynced (for any path); each timed write creates a new file.

    python benchmarks/bench_files.py            # full sizes; writes benchmarks/results/files.md
    python benchmarks/bench_files.py --quick    # small sizes, prints only
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from batches import nbytes, ppo_batch, seed_batch
from harness import arguments, command, interleaved, save
from harness import pair as _pair

from arrow_dataproto import DataProto
from arrow_dataproto.files import open_file, read_file, write_file

MiB = 2**20


def _fresh(target: Path) -> None:
    """Before a timed write: no old file, and no dirty pages left for writeback to flush during the write."""
    target.unlink(missing_ok=True)
    os.sync()


def _warm(target: Path) -> None:
    """Before a timed read: dirty pages synced and the whole file read once, so that the
    read is served from the page cache whatever the path (the first read() of a freshly
    written file was measured taking seconds here, a cost no format choice changes)."""
    os.sync()
    chunk = bytearray(64 * MiB)
    with open(target, "rb", buffering=0) as f:
        while f.readinto(chunk):
            pass


def _leaves(td: TensorDict) -> dict[str, torch.Tensor]:
    return {".".join(k) if isinstance(k, tuple) else k: v for k, v in td.items(include_nested=True, leaves_only=True)}


def _scan(tensors) -> float:
    """One pass over every byte (forces lazy readers to read)."""
    return sum(float(t.sum()) for t in tensors)


# ---------------------------------------------------------------- the paths


class Ours:
    name = "arrow_dataproto file"

    def __init__(self, compression=None):
        self.compression = compression

    def write(self, path, dp):
        write_file(path, dp, compression=self.compression)

    def open(self, path):
        return list(_leaves(read_file(path).batch).values())


class ToFile:
    """Raw bytes of each tensor one after the other; the reader must know dtypes and shapes."""

    name = "numpy tofile / fromfile"

    def write(self, path, dp):
        self.layout = [(t.dtype, t.shape) for t in _leaves(dp.batch).values()]
        with open(path, "wb") as f:
            for t in _leaves(dp.batch).values():
                t.numpy().tofile(f)

    def open(self, path):
        out = []
        with open(path, "rb") as f:
            for dtype, shape in self.layout:
                np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
                out.append(torch.from_numpy(np.fromfile(f, dtype=np_dtype, count=shape.numel())).view(shape))
        return out


class TorchSave:
    name = "torch.save / torch.load"
    mmap = False

    def write(self, path, dp):
        torch.save({"batch": _leaves(dp.batch), "non_tensor": dp.non_tensor_batch, "meta": dp.meta_info}, path)

    def open(self, path):
        return list(torch.load(path, weights_only=False, mmap=self.mmap)["batch"].values())


class TorchLoadMmap(TorchSave):
    name = "torch.save / torch.load(mmap=True)"
    mmap = True


def compare(case: str, dp: DataProto, folder: Path, repeats: int) -> list[tuple]:
    """Write, open and open+scan for every path; rows ``(case, path, write, open, scan, size)``."""
    paths, tasks = [Ours(), ToFile(), TorchSave(), TorchLoadMmap()], {}
    for i, path_obj in enumerate(paths):
        target = folder / f"{i}.bin"
        tasks[path_obj.name, "write"] = (lambda p=path_obj, t=target: p.write(t, dp), lambda t=target: _fresh(t))
        tasks[path_obj.name, "open"] = (lambda p=path_obj, t=target: p.open(t), lambda t=target: _warm(t))
        tasks[path_obj.name, "scan"] = (lambda p=path_obj, t=target: _scan(p.open(t)), lambda t=target: _warm(t))
    median = interleaved(tasks, repeats)
    rows = []
    for i, path_obj in enumerate(paths):
        w, o, s = (median[path_obj.name, k] for k in ("write", "open", "scan"))
        size = (folder / f"{i}.bin").stat().st_size
        rows.append((case, path_obj.name, w, o, s, size))
        print(f"  {path_obj.name:<36} write {_pair(w)} s  open {_pair(o, 4)} s  open+scan {_pair(s)} s", flush=True)
        (folder / f"{i}.bin").unlink()
    return rows


def compression(case: str, dp: DataProto, folder: Path, repeats: int) -> list[tuple]:
    codecs, tasks = (None, "lz4", "zstd"), {}
    for codec in codecs:
        ours, target = Ours(codec), folder / f"c_{codec}.arrow"
        tasks[codec, "write"] = (lambda o=ours, t=target: o.write(t, dp), lambda t=target: _fresh(t))
        tasks[codec, "scan"] = (lambda o=ours, t=target: _scan(o.open(t)), lambda t=target: _warm(t))
    median = interleaved(tasks, repeats)
    rows = []
    for codec in codecs:
        target = folder / f"c_{codec}.arrow"
        size, w, s = target.stat().st_size, median[codec, "write"], median[codec, "scan"]
        rows.append((case, codec or "none", size, w, s))
        print(f"  {codec or 'none':<5} {size / MiB:9.1f} MiB  write {_pair(w)} s  open+scan {_pair(s)} s", flush=True)
        target.unlink()
    return rows


def one_column(column_mib: int, file_sizes_mib: list[int], folder: Path, repeats: int) -> list[tuple]:
    """Read column ``a`` (``column_mib``) of files whose column ``b`` fills them up to each size."""
    width, tasks, files = 1024, {}, []
    a = torch.arange(column_mib * MiB // 8, dtype=torch.int64).view(-1, width)
    for size in file_sizes_mib:
        b_cols = (size - column_mib) * MiB // 8 // len(a)
        dp = DataProto(TensorDict({"a": a, "b": torch.ones(len(a), b_cols, dtype=torch.int64)}, batch_size=[len(a)]))
        for codec in (None, "zstd"):
            target = folder / f"two_{size}_{codec}.arrow"
            write_file(target, dp, compression=codec)
            files.append((size, codec or "none", target))
            tasks[target] = (lambda t=target: _scan([read_file(t, ["a"]).batch["a"]]), None)
        del dp
    median = interleaved(tasks, repeats)
    rows = []
    for size, codec, target in files:
        rows.append((size, codec, target.stat().st_size, median[target]))
        print(f"  {size} MiB file ({codec}, {target.stat().st_size / MiB:.0f} MiB on disk): "
              f"column a in {_pair(median[target], 4)} s", flush=True)
        target.unlink()
    return rows


def copy_on_write(dp: DataProto, folder: Path, repeats: int) -> list[tuple[str, float]]:
    target, small = folder / "cow.arrow", folder / "small.arrow"
    write_file(target, dp)
    write_file(small, DataProto(TensorDict({"x": torch.zeros(8, 8)}, batch_size=[8])))
    tensor, reader, calls = _leaves(dp.batch)["input_ids"], open_file(small), 200
    tasks = {
        "read_batch(0) of the file (map + decode, no byte read)": lambda: open_file(target).read_batch(0),
        "first add_(1) over a tensor read from the file (private page copies)":
            lambda: open_file(target).read_batch(0).batch["input_ids"].add_(1),
        "add_(1) over an in-memory tensor": lambda: tensor.add_(1),
        "clone() of the in-memory tensor": lambda: tensor.clone(),
        f"{calls} read_batch calls on a small file (fixed cost per call x {calls})":
            lambda: [reader.read_batch(0) for _ in range(calls)],
    }
    median = interleaved({name: (fn, None) for name, fn in tasks.items()}, repeats)
    for name, (seconds, best) in median.items():
        print(f"  {name:<72} {seconds * 1e3:10.3f} ms (best {best * 1e3:.3f})")
    target.unlink()
    return list(median.items())


def report(command: str, main_rows, comp_rows, column_rows, cow_rows) -> str:
    lines = [
        "## Files: Arrow IPC files vs `tofile` and `torch.save` (`benchmarks/bench_files.py`)",
        "",
        f"Command: `{command}`. {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end.",
        "Times: median (best) of the repeats after a warm-up round; the paths run in turn in each round,",
        "in one process. Files in a temporary folder on local disk (`/tmp`), warm page cache (reads are",
        "served from memory: each file is read once, untimed, before each timed read), no fsync on any",
        "path; each timed write creates a new file (the previous one is deleted and dirty pages synced,",
        "untimed). *open*: until tensors are usable; *open+scan*:",
        "then one `sum()` over every tensor byte (what actually reads a memory-mapped file). Ratios: the",
        "path's median / ours (higher = slower than ours). `tofile` writes tensor bytes only (no dtypes,",
        "shapes, non-tensor columns or meta_info).",
        "",
        "| batch | path | write s | open s | open+scan s | file MiB | write x | open x | open+scan x |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {}
    for case, name, w, o, s, size in main_rows:
        base.setdefault(case, (w[0], o[0], s[0]))
        bw, bo, bs = base[case]
        lines.append(f"| {case} | {name} | {_pair(w)} | {_pair(o, 4)} | {_pair(s)} | {size / MiB:.1f} | "
                     f"{w[0] / bw:.2f} | {o[0] / bo:.1f} | {s[0] / bs:.2f} |")
    lines += [
        "",
        "### Compression (ours)",
        "",
        "| batch | compression | file MiB | write s | open+scan s |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [f"| {c} | {codec} | {size / MiB:.1f} | {_pair(w)} | {_pair(s)} |" for c, codec, size, w, s in comp_rows]
    lines += [
        "",
        "### One column of a two-column file (open + scan of column `a` only)",
        "",
        "| file MiB (uncompressed) | compression | on disk MiB | read column a s |",
        "|---:|---|---:|---:|",
    ]
    lines += [f"| {nominal} | {codec} | {size / MiB:.0f} | {_pair(s, 4)} |" for nominal, codec, size, s in column_rows]
    lines += [
        "",
        "### Copy-on-write reads",
        "",
        "| operation | ms |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {s * 1e3:.3f} ({best * 1e3:.3f}) |" for name, (s, best) in cow_rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments(__doc__, "files.md", repeats=5, quick="small batches")
    if args.quick:
        cases = [("seed 64x20480 int64", lambda: DataProto(seed_batch(64, 20480))),
                 ("PPO 64x(256+256)", lambda: DataProto(*ppo_batch(64, 256, 256)))]
        column_mib, sizes, repeats = 8, [16, 64], 1
    else:
        cases = [("seed 6400x20480 int64 (1 GiB)", lambda: DataProto(seed_batch())),
                 ("PPO 2560x(1024+1024)", lambda: DataProto(*ppo_batch()))]
        column_mib, sizes, repeats = 128, [256, 1024], args.repeats
    folder = Path(tempfile.mkdtemp(prefix="bench_files_", dir="/tmp"))
    main_rows, comp_rows, cow_rows = [], [], []
    try:
        for case, build in cases:
            dp = build()
            print(f"\n{case}: {nbytes(dp.batch) / MiB:.0f} MiB of tensors", flush=True)
            main_rows += compare(case, dp, folder, repeats)
            comp_rows += compression(case, dp, folder, repeats)
            if not cow_rows:
                cow_rows = copy_on_write(dp, folder, repeats)
            del dp
            gc.collect()
        print(f"\none column of a 2-column file ({column_mib} MiB column)", flush=True)
        column_rows = one_column(column_mib, sizes, folder, repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    text = report(command("bench_files.py"), main_rows, comp_rows, column_rows, cow_rows)
    save(text, args.out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
