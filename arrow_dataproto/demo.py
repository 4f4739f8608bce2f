"""The demo: build a realistic PPO batch, round-trip it every way, print what happened.

Run ``python -m arrow_dataproto.demo`` (``--rows``/``--prompt``/``--response`` to
resize, ``--repeats`` for the number of timed runs, ``--no-ray`` to skip the Ray
actor round trip, which starts a local Ray). Received through Ray, tensors are
copy-on-write views of the object store by default; with ``copy=False`` they are
plain views of its shared memory: writable (torch has no read-only tensors), and a
write reaches every later reader of the object. Every timing is taken after one
untimed warm-up run and reported as the median and the best of ``--repeats`` runs.
Run from a source checkout (``bash scripts/demo.sh`` does), it also measures verl's
two pickling modes side by side with ours, with ``benchmarks/bench_codec.py``'s code.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import logging
import os
import pickle
import statistics
import tempfile
import time
from typing import Any, Callable, TypeVar

import torch

from . import DataProto, from_ipc, receive_options, to_arrow, to_ipc
from ._optional import install_line
from .files import open_file, write_file
from .testing.samples import nbytes, ppo_batch

T = TypeVar("T")
_LABEL = 46


def _timed(label: str, repeats: int, fn: Callable[[], T]) -> T:
    """Run ``fn`` once untimed, then ``repeats`` times; print the median and best; return a result."""
    result = fn()
    times = []
    for _ in range(repeats):
        del result
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    print(f"  {label:<{_LABEL}} median {1e3 * statistics.median(times):9.2f} ms   best {1e3 * min(times):9.2f} ms")
    return result


def _note(label: str, text: str) -> None:
    print(f"  {label:<{_LABEL}} {text}")


def _check(label: str, original: DataProto, other: DataProto) -> None:
    a, b = original.batch, other.batch
    assert a is not None and b is not None  # the demo's batches all have tensors
    same = list(a.keys()) == list(b.keys()) and all(torch.equal(a[k], b[k]) for k in a.keys())
    same = same and all((original.non_tensor_batch[k] == other.non_tensor_batch[k]).all() for k in original.non_tensor_batch)
    same = same and original.meta_info == other.meta_info
    _note(label, "exact" if same else "MISMATCH")
    if not same:
        raise SystemExit(f"demo: {label} did not round-trip exactly")


def _against_rivals(data: DataProto, repeats: int) -> None:
    """verl's pickling modes and ours, measured by ``benchmarks/bench_codec.py`` (a source checkout)."""
    folder = os.path.join(os.getcwd(), "benchmarks")
    if not os.path.isfile(os.path.join(folder, "bench_codec.py")):
        print("  (run from a source checkout, e.g. `bash scripts/demo.sh`, to compare with verl's pickling)")
        return
    import runpy
    import sys

    sys.path.insert(0, folder)  # the benchmark scripts import their siblings (harness, rivals) by name
    try:
        bench_codec = runpy.run_path(os.path.join(folder, "bench_codec.py"), run_name="bench_codec")
    finally:
        sys.path.remove(folder)
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines; the table below says it all
        rows = bench_codec["run"]([("this batch", lambda: (data.batch, data.non_tensor_batch, data.meta_info))], repeats)
    print(f"  median of {repeats} runs after a warm-up; x = time / ours zero-copy (higher = slower than ours)")
    print(f"  {'path':<34} {'encode ms':>10} {'decode ms':>10} {'encode x':>9} {'decode x':>9}")
    base_encode, base_decode = rows[0][2].median, rows[0][3].median  # ours zero-copy comes first
    for _, name, encode, decode in rows:
        print(f"  {name:<34} {encode.median * 1e3:10.2f} {decode.median * 1e3:10.2f} "
              f"{encode.median / base_encode:9.1f} {decode.median / base_decode:9.1f}")
    names = {name for _, name, _, _ in rows}
    for name, text in _RIVALS.items():
        if any(shown.startswith(name) for shown in names):
            print(f"  {name}: {text}")


_RIVALS = {
    "verl_default_like": "verl's default pickling (torch.save of the consolidated TensorDict)",
    "verl_numpy_like": "verl's numpy mode (VERL_DATAPROTO_SERIALIZATION_METHOD=numpy): each tensor's bytes, "
    "copied into a new buffer on decode",
    "td_consolidated": "tensordict's own td.consolidate(metadata=True), pickled as is",
    "numpy_floor": "the same bytes as bare numpy arrays, no codec: the floor a codec is measured against",
    "verl_dataproto": "verl's real DataProto class pickled by verl itself (_numpy: its numpy mode)",
}
"""What each row of the comparison is (``benchmarks/rivals.py`` has the details)."""

_NEXT = (
    "Next: README.md (the quick start and one section per use), docs/ray.md (receive options,",
    "copy-on-write, measuring a receiver's memory), docs/files.md (files, append, pandas/polars/DuckDB,",
    "the command line), docs/verl.md (verl v0 and v1), docs/benchmarks.md (what each path costs).",
)
"""Where the demo sends its reader next."""


def _ray_round_trip(data: DataProto, tensor_bytes: int, repeats: int) -> None:
    try:
        import ray
    except ImportError:
        print(f"  ray is not installed: skipping the actor round trip ({install_line('ray')})")
        return

    @ray.remote
    class Learner:
        def update(self, batch: DataProto) -> DataProto:
            assert batch.batch is not None
            batch.batch["advantages"].mul_(2)  # copy-on-write by default: safe to write, the store keeps its bytes
            return batch.select(batch_keys=["advantages"], non_tensor_batch_keys=["uid"])

    store = max(256 * 1024**2, 4 * tensor_bytes)  # room for a few copies of the batch
    start = time.perf_counter()
    # Quiet start: no dashboard, no worker logs, and Ray's own INFO/WARNING start-up lines off.
    ray.init(num_cpus=2, object_store_memory=store, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    _note("ray.init (once)", f"{1e3 * (time.perf_counter() - start):.0f} ms")
    try:
        learner = Learner.remote()  # type: ignore[attr-defined]  # ray's stubs type a @ray.remote class as the plain class
        ref = _timed("ray.put (one copy into the object store)", repeats, lambda: ray.put(data))
        result = _timed("actor.update(ref), ray.get of its result", repeats,
                        lambda: ray.get(learner.update.remote(ref)))
        _timed("ray.get(ref) default (copy-on-write views)", repeats, lambda: ray.get(ref))
        with receive_options(copy=True):
            _timed("ray.get(ref) with copy=True (private copies)", repeats, lambda: ray.get(ref))
        with receive_options(copy=False):  # writable, and a write reaches every later reader
            _timed("ray.get(ref) copy=False (shared-memory views)", repeats, lambda: ray.get(ref))
        ok = (
            result.batch is not None
            and data.batch is not None
            and torch.equal(result.batch["advantages"], data.batch["advantages"] * 2)
        )
        ok = ok and bool((result.non_tensor_batch["uid"] == data.non_tensor_batch["uid"]).all())
        _note("actor saw and returned exact data", "yes" if ok else "NO")
        if not ok:
            raise SystemExit("demo: the actor round trip was not exact")
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=2560, help="samples in the batch (default 2560)")
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens per sample (default 1024)")
    parser.add_argument("--response", type=int, default=1024, help="response tokens per sample (default 1024)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each step, after a warm-up (default 5)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray actor round trip")
    parser.add_argument("--no-rivals", action="store_true", help="skip the comparison with verl's pickling")
    args = parser.parse_args(argv)
    repeats = max(1, args.repeats)

    batch, non_tensor, meta_info = ppo_batch(args.rows, args.prompt, args.response)
    data = DataProto(batch, non_tensor, meta_info)
    tensor_bytes = nbytes(batch)
    print(f"PPO batch: {len(data)} rows x ({args.prompt} prompt + {args.response} response) tokens")
    print(f"  {len(batch.keys())} tensor columns, {tensor_bytes / 2**20:.1f} MiB; non-tensor {list(non_tensor)}")
    print(f"  meta_info keys {list(meta_info)}")
    print(f"  timings: median and best of {repeats} runs, each step warmed up once first; "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}\n")

    print("Codec (tensor bytes are never copied by encode or decode):")
    record_batch = _timed("to_arrow", repeats, lambda: to_arrow(data))
    _note("", f"{record_batch.num_columns} columns, {record_batch.num_rows} rows")
    buffer = _timed("to_ipc (one copy into one IPC buffer)", repeats, lambda: to_ipc(data))
    decoded = _timed("from_ipc (zero-copy views of that buffer)", repeats, lambda: from_ipc(buffer))
    _check("from_ipc(to_ipc(batch))", data, decoded)

    print("\nPickle protocol 5 (what Ray uses):")
    buffers: list[Any] = []

    def dumps() -> bytes:
        buffers.clear()
        return pickle.dumps(data, protocol=5, buffer_callback=buffers.append)

    payload = _timed("pickle.dumps with out-of-band buffers", repeats, dumps)
    oob = sum(b.raw().nbytes for b in buffers)
    _note("", f"in-band {len(payload) / 1024:.1f} KiB, out-of-band {oob / 2**20:.1f} MiB in {len(buffers)} buffers")
    unpickled = _timed("pickle.loads (default receive options)", repeats, lambda: pickle.loads(payload, buffers=buffers))
    _check("pickle round trip", data, unpickled)

    print("\nArrow file on disk:")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.arrow")
        _timed("write_file", repeats, lambda: write_file(path, data))
        _note("", f"{os.path.getsize(path) / 2**20:.1f} MiB")
        with open_file(path) as reader:
            from_disk = _timed("read_batch (memory-mapped, no byte read)", repeats, lambda: reader.read_batch(0))
            _check("file round trip", data, from_disk)
            columns = _timed("read_batch with two columns", repeats, lambda: reader.read_batch(0, ["advantages", "uid"]))
            assert columns.batch is not None
            _note("", f"{list(columns.batch.keys())} + {list(columns.non_tensor_batch)}")
        del from_disk, columns

    if not args.no_rivals:
        print("\nAgainst verl's pickling, side by side (benchmarks/bench_codec.py; encode = sender, decode = receiver):")
        _against_rivals(data, min(repeats, 3))  # verl's default mode takes seconds per run at full size
    if not args.no_ray:
        print("\nRay: driver -> actor -> driver:")
        _ray_round_trip(data, tensor_bytes, repeats)
    print("\ndone. " + "\n".join(_NEXT))


if __name__ == "__main__":
    main()
