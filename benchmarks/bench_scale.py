"""How time and memory grow with the batch: 16 MiB -> 8 GiB, every path, one child process per case.

Each case (a path, a batch, a size) runs in its own child process with its own Ray
session (for the Ray paths), whose object store is sized for that case, so that the
peaks of one case are not mixed with the leftovers of another. A child prints one
``RESULT {json}`` line; the parent merges the rows into ``benchmarks/results/scale.json``
(rows of earlier runs of other cases are kept, so large sizes can run a few at a time),
then writes the table (``scale.md``) and the plot (``scale.png``) from all rows.

Three children per size, each after running every phase on a small batch of the same kind
(imports and first calls paid there); the phases into new memory run once, the others
``--repeats`` times (the median is shown); "read" = every byte of every tensor is read (a max):

- ``ray`` (a Ray session, 4 reader actors): ``ray.put(dp)`` into a fresh store ("put, fresh
  store": its pages are touched for the first time), one actor ``ray.get`` s it (the default
  receive, copy-on-write) and reads it ("get+read", timed in the actor), then 4 actors at
  once ("4 x get+read", wall time from the calls until all four are done); the object is
  freed and, once the store holds no object, ``ray.put`` again ("put": store pages reused,
  the steady state);
- ``floor``: the same for the same bytes as plain numpy arrays in a dict (each tensor, a
  jagged one as values and offsets, read as its torch dtype; the string column as its numpy
  object array): what Ray itself costs. The table gives each Ray phase of ours as a multiple of it;
- ``local`` (no Ray): ``to_ipc`` ("fresh memory": the first, into pages new to the
  process; then into pages the first one freed), ``from_ipc`` + read; ``files.write_file``
  to local disk (the page cache takes it; "fresh pages" the first), then
  ``open_file(...).read_all()`` + read (memory-mapped, from the page cache); a file of 4
  batches (written untimed), ``read_rows`` of rows 1/8 to 7/8 (across all four batches: a
  concatenation, one copy of 3/4 of the bytes) + read.

The first touch of memory new to a process costs far more here than a copy (a virtual
machine whose host backs guest pages lazily: measured 2.8 s/GiB for a first fill against
0.1 s/GiB for a second), so the phases that write new memory are shown both ways.

Batches: ``mix`` (the size sweep): per row an int64 ``input_ids`` [1024], a bfloat16
``log_probs`` [1024], a jagged float32 ``values`` (row lengths 1..2048) and a uuid-like
``uid`` string: about 14 KiB a row. The limit cases, each just over a 32-bit limit:
``wide`` (one uint8 [2^21 + 1, 1024] column: more than 2^31 elements in its Arrow child),
``long`` (one 1-D int8 column of 2^31 + 64 rows), ``jagged`` (int8 jagged values, 2^31 + 64
of them: 64-bit offsets), ``strings`` (a non-tensor column of 65 KiB strings, more than
2^31 bytes of text: ``large_string``), and ``over_store`` (a 1 GiB ``mix`` batch through
a 512 MiB store: Ray's fallback allocation).

Memory (sampled every 5 ms from ``/proc/<pid>/status`` by a process of its own):
"driver peak" = the largest growth of the driver's private (anonymous) resident memory
during the phase, over the batch; the batch itself is resident before, so the driver's
whole footprint is ``(1 + driver peak) x batch`` (the target of ``ray.put``: <= 1.1x).
"reader peak" = the same for the reader (the actor; the driver itself for ipc and
files). "store" = growth of the driver's resident shared and file-backed pages during
the phase: the object-store pages ``ray.put`` wrote (shared memory, or the fallback
file), or the file pages a reader mapped.

    python benchmarks/bench_scale.py                                  # the sweep to --max-size (4G)
    python benchmarks/bench_scale.py --max-size 8G --cases all        # to 8 GiB, and the limit cases
    python benchmarks/bench_scale.py --sizes 16M,64M --paths ray,ipc  # some cases (merged into scale.json)
    python benchmarks/bench_scale.py --cases strings,wide             # limit cases only
    python benchmarks/bench_scale.py --render                         # table and plot from scale.json only
    python benchmarks/bench_scale.py --quick                          # 16 and 64 MiB, every path, print only
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
RESULT_PREFIX = "RESULT "
MiB, GiB = 2**20, 2**30
PATHS = ("ray", "floor", "local")  # one child each: the Ray phases; the same for a bare array; ipc, files and read_rows
SWEEP = (16 * MiB, 64 * MiB, 256 * MiB, GiB, 2 * GiB, 4 * GiB, 8 * GiB)
LIMIT_CASES = {  # name -> paths it runs on
    "wide": ("ray", "local"),
    "long": ("ray", "local"),
    "jagged": ("ray", "local"),
    "strings": ("ray", "local"),
    "over_store": ("ray", "floor"),
}
OVER_STORE = (GiB, 512 * MiB)  # batch, store
FAN_OUT = 4
STARTS = 3  # tries of a child whose Ray node timed out while starting
FLAT_FROM = 64 * MiB  # the target: per-GiB cost flat within 1.3x from here up


# ---------------------------------------------------------------- batches (child)


def mix_batch(size: int):
    """The sweep batch of about ``size`` bytes (see the module docstring)."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    import arrow_dataproto as adp
    from arrow_dataproto import _jagged

    width = 1024
    lengths = torch.arange(1, 2049, dtype=torch.int64)  # the jagged rows cycle through 1..2048
    per_row = width * 8 + width * 2 + 4 * 1024.5 + 8 + 36
    rows = max(16, int(size / per_row)) // 8 * 8  # read_rows writes it as 4 equal batches
    row_lengths = lengths.repeat(rows // 2048 + 1)[:rows]
    offsets = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(row_lengths, 0, out=offsets[1:])
    values = torch.arange(int(offsets[-1]), dtype=torch.float32)
    batch = TensorDict(
        {
            "input_ids": torch.arange(rows * width, dtype=torch.int64).view(rows, width),
            "log_probs": torch.full((rows, width), 0.5, dtype=torch.bfloat16),
            "values": _jagged.build(values, offsets, 1),
        },
        batch_size=[rows],
    )
    uid = np.array([f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(rows)], dtype=object)
    return adp.DataProto(batch, {"uid": uid}, {"temperature": 0.7})


def limit_batch(name: str, small: bool = False):
    """A batch just over one 32-bit limit (see the module docstring); ``small``: the same
    kind of batch at 1/1024 of the size (to warm the paths up)."""
    import numpy as np
    import torch
    from tensordict import TensorDict

    import arrow_dataproto as adp
    from arrow_dataproto import _jagged

    if name == "wide":
        rows = 2**21 + 1 if not small else 2**11
        t = torch.ones(rows, 1024, dtype=torch.uint8)
        t[-1] = 7
        return adp.DataProto(TensorDict({"pixels": t}, batch_size=[rows]))
    if name == "long":
        t = torch.ones(2**31 + 64 if not small else 2**21, dtype=torch.int8)
        t[-1] = 7
        return adp.DataProto(TensorDict({"flags": t}, batch_size=[len(t)]))
    if name == "jagged":
        rows = 2**20 if not small else 2**10
        row_lengths = torch.full((rows,), 2048, dtype=torch.int64)
        row_lengths[-1] += 64
        offsets = torch.zeros(rows + 1, dtype=torch.int64)
        torch.cumsum(row_lengths, 0, out=offsets[1:])
        values = torch.ones(int(offsets[-1]), dtype=torch.int8)
        values[-1] = 7
        return adp.DataProto(TensorDict({"tokens": _jagged.build(values, offsets, 1)}, batch_size=[rows]))
    if name == "strings":
        rows, chars = (2**15 + 64 if not small else 32), 2**16
        text = np.empty(rows, dtype=object)
        for i in range(rows):
            text[i] = f"{i:08d}" * (chars // 8)
        ids = torch.arange(rows, dtype=torch.int64)
        return adp.DataProto(TensorDict({"ids": ids}, batch_size=[rows]), {"text": text})
    if name == "over_store":
        return mix_batch(OVER_STORE[0])
    raise ValueError(f"unknown batch {name!r}")


def batch_bytes(dp) -> int:
    """Tensor bytes (jagged values and offsets included) plus the UTF-8 bytes of string columns."""
    from arrow_dataproto.testing.samples import nbytes

    total = nbytes(dp.batch) if dp.batch is not None else 0
    for values in dp.non_tensor_batch.values():
        total += sum(len(s) for s in values) if values.dtype == object else values.nbytes
    return total


def bare(dp) -> dict:
    """The floor's batch: the same bytes as plain numpy arrays, each with the torch dtype to
    read it as (bfloat16 travels as int16; a jagged tensor as its values and offsets), and the
    ``non_tensor_batch`` arrays as they are (views of ``dp``'s memory, no copy)."""
    import torch

    out: dict = {}
    for name, t in dp.batch.items(include_nested=True, leaves_only=True):
        parts = {f"{name}.values": t.values(), f"{name}.offsets": t.offsets()} if t.is_nested else {name: t}
        for key, part in parts.items():
            as_numpy = part.view(torch.int16) if part.dtype == torch.bfloat16 else part
            out[key] = (as_numpy.contiguous().numpy(), str(part.dtype).removeprefix("torch."))
    return {**out, **dp.non_tensor_batch}


def read_all(dp) -> float:
    """Read every byte of every tensor (a max); string columns are already Python objects.
    The floor's batch (:func:`bare`): every array as its torch dtype, the same way."""
    import warnings

    import torch

    if isinstance(dp, dict):
        total = 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.from_numpy of Ray's read-only arrays
            for value in dp.values():
                if isinstance(value, tuple):
                    total += float(torch.from_numpy(value[0]).view(getattr(torch, value[1])).max())
        return total
    total = 0.0
    for t in dp.batch.values(include_nested=True, leaves_only=True):
        t = t.values() if t.is_nested else t
        # max, not sum: torch sums small integers in int64 through a widened copy (8x an int8 column)
        total += float(t.any() if t.dtype == torch.bool else t.max())
    return total


# ---------------------------------------------------------------- memory (child)


_SAMPLER = r"""
import json, select, sys
pids = [int(p) for p in sys.argv[1:]]
def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out
base = anon = shared = None
def sample():
    for p in pids:
        now, b = status(p), base[p]
        anon[p] = max(anon[p], now["RssAnon"] - b["RssAnon"])
        shared[p] = max(shared[p], now["RssShmem"] + now["RssFile"] - b["RssShmem"] - b["RssFile"])
while True:
    if select.select([sys.stdin], [], [], 0.005)[0]:
        command = sys.stdin.readline().strip()
        if command == "start":
            base = {p: status(p) for p in pids}
            anon, shared = dict.fromkeys(pids, 0), dict.fromkeys(pids, 0)
            print("started", flush=True)
        elif command == "stop":
            sample()
            print(json.dumps([anon, shared]), flush=True)
            base = None
        else:
            break
    elif base is not None:
        sample()
"""


class Peaks:
    """The largest growth of each process's private and shared/file-backed resident memory
    while the ``with`` block runs, sampled every 5 ms by a process of its own (a thread would
    wait for the GIL, which ``pa.array`` and others hold for seconds)."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER, *map(str, pids)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def _ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def __enter__(self):
        self._ask("start")
        return self

    def __exit__(self, *exc):
        anon, shared = json.loads(self._ask("stop"))
        self.anon = {int(p): v for p, v in anon.items()}
        self.shared = {int(p): v for p, v in shared.items()}

    def close(self) -> None:
        self._ask("quit")
        self.proc.wait()


def phase(name: str, fn, peaks: Peaks, driver: int, readers: list[int], nbytes: int, seconds=None) -> tuple:
    """Run ``fn`` once under ``peaks``; ``(result, row)``. ``seconds(result)`` gives the
    time when it is measured elsewhere (in an actor); else the wall time of ``fn``."""
    gc.collect()
    with peaks:
        start = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - start
    row = {
        "phase": name,
        "s": seconds(result) if seconds else wall,
        "driver_peak": peaks.anon[driver] / nbytes,
        "reader_peak": max(peaks.anon[r] for r in readers) / nbytes,
        "store": peaks.shared[driver] / nbytes,
    }
    return result, row


def median_row(rows: list[dict]) -> dict:
    """One row for repeats of a phase: the median time (and every time, in order), the largest peaks."""
    times = [r["s"] for r in rows]
    out = {k: max(r[k] for r in rows) for k in ("driver_peak", "reader_peak", "store")}
    return {"phase": rows[0]["phase"], "s": sorted(times)[len(times) // 2], "times": times, **out}


# ---------------------------------------------------------------- the paths (child)


def _ray_reader():
    import ray

    @ray.remote(num_cpus=0)
    class Reader:
        def pid(self) -> int:
            return os.getpid()

        def collect(self) -> None:
            gc.collect()

        def get_read(self, refs) -> float:
            """Seconds to ``ray.get`` the batch (the default receive) and read every byte of it."""
            start = time.perf_counter()
            dp = ray.get(refs[0])
            read_all(dp)
            return time.perf_counter() - start

    return Reader


def _store_empty(timeout: float = 60.0) -> None:
    """Wait until the object store holds no object: Ray frees an object some time after its
    last reference is dropped (0.2-0.8 s measured at 1-4 GiB), and a put into a store still
    holding the last one goes to Ray's fallback allocation."""
    from ray._private.internal_api import memory_summary

    deadline = time.monotonic() + timeout
    while " 0 objects" not in memory_summary(stats_only=True) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_ray(dp, nbytes: int, store: int, warm, repeats: int) -> list[dict]:
    """put (fresh store pages), get+read in one actor, 4 actors at once, put again (store
    pages reused); each phase but the first ``repeats`` times."""
    import ray

    ray.init(
        num_cpus=2,
        object_store_memory=store,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}},
    )
    peaks = None
    try:
        actors = [_ray_reader().remote() for _ in range(FAN_OUT)]
        readers = ray.get([a.pid.remote() for a in actors])
        small = ray.put(warm)  # every step once on a small batch: imports and first calls paid here
        ray.get([a.get_read.remote([small]) for a in actors])
        del small
        me = os.getpid()
        peaks = Peaks([me, *readers])

        def settle():
            gc.collect()
            ray.get([a.collect.remote() for a in actors])

        settle()
        _store_empty()
        ref, put = phase("put, fresh store", lambda: ray.put(dp), peaks, me, readers, nbytes)
        gets, fans = [], []
        for _ in range(repeats):
            settle()
            gets.append(phase(
                "get+read", lambda: ray.get(actors[0].get_read.remote([ref])), peaks, me, readers[:1], nbytes,
                seconds=lambda s: s,
            )[1])
        for _ in range(repeats):
            settle()
            fans.append(phase(
                f"{FAN_OUT} x get+read", lambda: ray.get([a.get_read.remote([ref]) for a in actors]), peaks, me, readers,
                nbytes,
            )[1])
        del ref
        again = []
        for _ in range(repeats):
            settle()
            _store_empty()
            ref, row = phase("put", lambda: ray.put(dp), peaks, me, readers, nbytes)
            again.append(row)
            del ref
        return [put, median_row(again), median_row(gets), median_row(fans)]
    finally:
        if peaks is not None:
            peaks.close()
        ray.shutdown()


def run_local(dp, nbytes: int, folder: Path, warm, repeats: int) -> list[dict]:
    """to_ipc, from_ipc + read; write_file, open_file + read_all + read; read_rows across 4
    batches; each phase but the first of each kind ``repeats`` times (on the warm-up batch once)."""
    import arrow_dataproto as adp
    from arrow_dataproto import files

    me = os.getpid()
    peaks = Peaks([me])
    single, chunked = folder / "batch.arrow", folder / "batches.arrow"

    def read_file(path):
        with files.open_file(path) as reader:
            return read_all(reader.read_all())

    def read_rows(path, start, stop):
        with files.open_file(path) as reader:
            return read_all(reader.read_rows(start, stop))

    def timed(name, fn, times, after=lambda result: None):
        rows_ = []
        for _ in range(times):
            result, row = phase(name, fn, peaks, me, [me], nbytes)
            rows_.append(row)
            after(result)
            del result
        return median_row(rows_)

    try:
        for data in (warm, dp):
            n = 1 if data is warm else repeats
            buf, fresh = phase("to_ipc, fresh memory", lambda: adp.to_ipc(data), peaks, me, [me], nbytes)
            del buf
            rows_ = [fresh, timed("to_ipc", lambda: adp.to_ipc(data), n)]
            buf = adp.to_ipc(data)
            rows_.append(timed("from_ipc+read", lambda: read_all(adp.from_ipc(buf)), n))
            del buf
            rows_.append(phase("write_file, fresh pages", lambda: files.write_file(single, data), peaks, me, [me], nbytes)[1])
            single.unlink()
            rows_.append(timed("write_file", lambda: files.write_file(single, data), n, after=lambda _: single.unlink()))
            files.write_file(single, data)
            rows_.append(timed("open_file+read", lambda: read_file(single), n))
            single.unlink()
            files.write_file(chunked, data.array_split(4))
            rows = len(data)
            start, stop = rows // 8, rows - rows // 8
            row = timed("read_rows 1/8..7/8", lambda: read_rows(chunked, start, stop), n)
            row["s"] *= rows / (stop - start)  # per GiB of the rows read, as if the whole batch
            row["times"] = [t * rows / (stop - start) for t in row["times"]]
            rows_.append(row)
            chunked.unlink()
        return rows_
    finally:
        peaks.close()


def run_floor(dp, nbytes: int, store: int, warm, repeats: int) -> list[dict]:
    """The Ray phases for the same bytes as plain numpy arrays (:func:`bare`): what Ray itself costs."""
    return run_ray(bare(dp), nbytes, store, bare(warm), repeats)


def store_size(nbytes: int, case: str) -> int:
    if case == "over_store":
        return OVER_STORE[1]
    return max(256 * MiB, int(nbytes * 1.15) + 128 * MiB)


def child(spec: dict) -> dict:
    case, path, size, repeats = spec["batch"], spec["path"], spec["size"], spec.get("repeats", 1)
    dp = mix_batch(size) if case == "mix" else limit_batch(case)
    warm = mix_batch(MiB) if case in ("mix", "over_store") else limit_batch(case, small=True)
    nbytes = batch_bytes(dp)
    row = {**spec, "bytes": nbytes, "store_bytes": None}
    folder = Path(tempfile.mkdtemp(prefix="adp-scale-", dir=os.environ.get("ADP_SCALE_DIR")))
    try:
        if path == "ray":
            row["store_bytes"] = store = store_size(nbytes, case)
            row["phases"] = run_ray(dp, nbytes, store, warm, repeats)
        elif path == "floor":
            row["store_bytes"] = store = store_size(nbytes, case)
            row["phases"] = run_floor(dp, nbytes, store, warm, repeats)
        elif path == "local":
            row["phases"] = run_local(dp, nbytes, folder, warm, repeats)
        else:
            raise ValueError(f"unknown path {path!r}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return row


# ---------------------------------------------------------------- the parent


def parse_size(text: str) -> int:
    units = {"K": 2**10, "M": MiB, "G": GiB}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def show_size(n: int) -> str:
    return f"{n / GiB:g} GiB" if n >= GiB else f"{n / MiB:g} MiB"


def run_case(spec: dict, log) -> dict:
    """One case in a child process; a row with ``error`` if it failed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    start = time.time()
    for _ in range(STARTS):  # on a loaded machine Ray's node may time out while starting: again
        proc = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, env=env
        )
        if "timed out during startup" not in proc.stderr:
            break
    found = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode == 0 and found:
        row = json.loads(found[-1][len(RESULT_PREFIX):])
    else:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        row = {**spec, "error": f"exit {proc.returncode}: " + " / ".join(tail).replace("|", "/")[-600:]}
    row["child_s"] = round(time.time() - start, 1)
    row["load"] = os.getloadavg()[0]
    log(summary(row))
    return row


def summary(row: dict) -> str:
    head = f"{row['batch']:>10} {row['path']:>9} {show_size(row['size']):>9}"
    if "error" in row:
        return f"{head}  FAILED {row['error']}"
    cells = [
        f"{p['phase']} {p['s'] / (row['bytes'] / GiB):.3f} s/GiB {[round(t, 3) for t in p.get('times', [])]} "
        f"drv {p['driver_peak']:.2f} rdr {p['reader_peak']:.2f}"
        for p in row["phases"]
    ]
    return f"{head}  " + "; ".join(cells) + f"  (child {row['child_s']} s, load {row['load']:.1f})"


def key(row: dict) -> tuple:
    return row["batch"], row["path"], row["size"]


def load_rows(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    rows = {key(r): r for r in old}
    rows.update({key(r): r for r in new})
    return sorted(rows.values(), key=lambda r: (r["batch"] != "mix", r["batch"], PATHS.index(r["path"]), r["size"]))


def per_gib(rows: list[dict], path: str) -> dict[str, dict[int, float]]:
    """phase -> {size: seconds per GiB} over the mix sweep's rows of ``path``."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["batch"] == "mix" and r["path"] == path and "error" not in r:
            for p in r["phases"]:
                out.setdefault(p["phase"], {})[r["size"]] = p["s"] / (r["bytes"] / GiB)
    return out


def flatness(rows: list[dict]) -> dict[tuple[str, str], tuple[float, int, int]]:
    """(path, phase) -> (max/min of s per GiB over the mix sizes >= FLAT_FROM, smallest size, largest size)."""
    out = {}
    for path in PATHS:
        for ph, costs in per_gib(rows, path).items():
            points = {size: c for size, c in costs.items() if size >= FLAT_FROM}
            if points:
                out[path, ph] = (max(points.values()) / min(points.values()), min(points), max(points))
    return out


def over_floor(rows: list[dict]) -> dict[str, dict[int, float]]:
    """Ray phase -> {size: our seconds / the floor's (a bare array of the same bytes)}."""
    ours, floor = per_gib(rows, "ray"), per_gib(rows, "floor")
    return {
        ph: {size: c / floor[ph][size] for size, c in costs.items() if size in floor.get(ph, {})}
        for ph, costs in ours.items()
    }


def table(rows: list[dict], command: str, note: str) -> str:
    lines = [
        "## Scale: time and memory against batch size",
        "",
        f"Command: `{command}` (cases run a few at a time and merged; `scale.json` holds every row).",
        "",
        "![per-GiB cost and driver peak against batch size](scale.png)",
        "",
        f"Machine: {os.cpu_count()} cores, {round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GiB)} GiB RAM "
        f"(shared with other engineers' runs: the load average when each case ended is in the table), "
        f"Python {platform.python_version()}. One child process per case, each with its own Ray session "
        "(object store sized for the case: 1.15x the batch + 128 MiB, at least 256 MiB), after a warm-up "
        "on a 1 MiB batch. The phases into new memory (fresh) run once; the others run as many times as "
        "`runs` says, the median shown (each put into an emptied store). `floor`: the Ray phases for the "
        "same bytes as plain numpy arrays (read as the same torch dtypes).",
        "",
        note,
        "",
        "- s/GiB: the phase's seconds per GiB of batch (read_rows: per GiB of the rows read).",
        "- driver / reader peak: largest growth of private resident memory during the phase, × the batch "
        "(the driver's footprint is 1 + that, × the batch); reader = the actor (fan-out: the largest "
        "of the four), else the driver.",
        "- store: growth of the driver's shared + file-backed resident pages (the object-store pages "
        "`ray.put` wrote, or the file pages mapped), × the batch.",
        "",
        "| batch | path | size | bytes | phase | runs | s | s/GiB | driver peak | reader peak | store | load |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['batch']} | {r['path']} | {show_size(r['size'])} | | **failed** | | {r['error']} | | | | | |")
            continue
        for p in r["phases"]:
            lines.append(
                f"| {r['batch']} | {r['path']} | {show_size(r['size'])} | {r['bytes'] / GiB:.3f} GiB | {p['phase']} "
                f"| {len(p.get('times', [p['s']]))} | {p['s']:.3f} | {p['s'] / (r['bytes'] / GiB):.3f} | {p['driver_peak']:.2f} | {p['reader_peak']:.2f} "
                f"| {p['store']:.2f} | {r['load']:.1f} |"
            )
    lines += ["", "### Targets", "", f"Per-GiB cost, max / min over the mix sizes from {show_size(FLAT_FROM)} up (target <= 1.3):", ""]
    lines += ["| path | phase | sizes | max/min s per GiB |", "|---|---|---|---:|"]
    for (path, ph), (spread, lo, hi) in flatness(rows).items():
        lines.append(f"| {path} | {ph} | {show_size(lo)} - {show_size(hi)} | {spread:.2f} |")
    ratios = over_floor(rows)
    sizes = sorted({size for costs in ratios.values() for size in costs})
    if sizes:
        lines += ["", "Ray phases, x the floor (the same phase for the same bytes as plain numpy arrays):", ""]
        lines += ["| phase | " + " | ".join(show_size(z) for z in sizes) + " |", "|---|" + "---:|" * len(sizes)]
        for ph, costs in ratios.items():
            lines.append(f"| {ph} | " + " | ".join(f"{costs[z]:.2f}" if z in costs else "" for z in sizes) + " |")
    for which, keep in (("mix batches from 64 MiB", lambda r: r["batch"] == "mix" and r["size"] >= FLAT_FROM), ("any batch", lambda r: True)):
        puts = [(p["driver_peak"], r["batch"]) for r in rows if "error" not in r and keep(r) for p in r["phases"] if p["phase"].startswith("put")]
        if puts:
            worst = max(puts)
            lines += ["", f"Driver footprint during `ray.put`, worst over {which}: {1 + worst[0]:.2f}x the batch ({worst[1]}; target <= 1.1)."]
    failed = [r for r in rows if "error" in r]
    lines += ["", f"Failed cases: {len(failed)}." + "".join(f" {r['batch']}/{r['path']}/{show_size(r['size'])}" for r in failed)]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cost, peak) = plt.subplots(1, 2, figsize=(13, 5))
    series: dict[str, list[tuple[int, float, float]]] = {}
    for r in rows:
        if r["batch"] != "mix" or "error" in r:
            continue
        for p in r["phases"]:
            series.setdefault(f"{r['path']}: {p['phase']}", []).append(
                (r["bytes"], p["s"] / (r["bytes"] / GiB), max(p["driver_peak"], p["reader_peak"]))
            )
    colors = [plt.get_cmap("tab20")(i) for i in range(20)]
    for i, (name, points) in enumerate(sorted(series.items())):
        points.sort()
        xs = [b / MiB for b, _, _ in points]
        style = {"marker": "o", "label": name, "color": colors[(2 * i) % 20 + (2 * i) // 20]}
        cost.plot(xs, [c for _, c, _ in points], **style)
        peak.plot(xs, [1 + m for _, _, m in points], **style)
    for ax in (cost, peak):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (MiB)")
        ax.grid(True, which="both", alpha=0.3)
    cost.set_yscale("log")
    cost.set_ylabel("seconds per GiB")
    cost.set_title("per-GiB cost (flat = linear scaling)")
    peak.set_ylabel("1 + largest private growth (driver or reader), x batch")
    peak.set_title("peak private memory during the phase")
    peak.axhline(1.1, color="grey", linestyle="--", linewidth=1)
    if series:
        cost.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plan(args) -> list[dict]:
    specs = []
    if args.cases is None or args.sizes or args.cases == "all":
        paths = args.paths.split(",") if args.paths else list(PATHS)
        sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else [s for s in SWEEP if s <= args.max_size]
        specs += [{"batch": "mix", "path": p, "size": s, "repeats": args.repeats} for s in sizes for p in paths]
    if args.cases:
        names = list(LIMIT_CASES) if args.cases in ("all", "limits") else args.cases.split(",")
        wanted = set(args.paths.split(",")) if args.paths else None
        for name in names:
            size = OVER_STORE[0] if name == "over_store" else 2 * GiB
            specs += [
                {"batch": name, "path": p, "size": size, "repeats": args.repeats}
                for p in LIMIT_CASES[name]
                if wanted is None or p in wanted
            ]
    return specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="comma-separated sizes of the mix sweep (16M,1G...); default: the sweep to --max-size")
    parser.add_argument("--max-size", type=parse_size, default=4 * GiB, help="largest sweep size (default 4G)")
    parser.add_argument("--paths", help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument(
        "--cases", help=f"limit cases: all (with the sweep), limits (without), or some of {','.join(LIMIT_CASES)} (without)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each phase but the fresh ones; the median is shown")
    parser.add_argument("--render", action="store_true", help="only write the table and plot from scale.json")
    parser.add_argument("--quick", action="store_true", help="16 and 64 MiB, every path, print only")
    parser.add_argument("--note", default="", help="a line for the report (the machine's load, where the sweep stops)")
    parser.add_argument("--rows", type=Path, default=RESULTS / "scale.json", help="the rows file merged into (default scale.json)")
    parser.add_argument("--merge", type=Path, action="append", default=[], help="another rows file to merge in")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(RESULT_PREFIX + json.dumps(child(json.loads(args.child))), flush=True)
        return
    store = args.rows
    if args.quick:
        args.sizes = args.sizes or "16M,64M"
        for spec in plan(args):
            run_case(spec, print)
        return
    new = [] if args.render else [run_case(spec, lambda s: print(s, flush=True)) for spec in plan(args)]
    rows = load_rows(store)
    for extra in args.merge:
        rows = merge(rows, load_rows(extra))
    rows = merge(rows, new)
    RESULTS.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(rows, indent=1))
    note_file = RESULTS / "scale-note.txt"
    if args.note:
        note_file.write_text(args.note)
    note = note_file.read_text() if note_file.exists() else ""
    (RESULTS / "scale.md").write_text(table(rows, "python benchmarks/bench_scale.py " + " ".join(sys.argv[1:]), note))
    plot(rows, RESULTS / "scale.png")
    print((RESULTS / "scale.md").read_text())


if __name__ == "__main__":
    main()
