"""A fresh Ray actor's first batch against its tenth, with and without ``transport.warm_up()``.

One trial: the driver starts ``--actors`` fresh actors at once and waits until each has
finished ``__init__`` ("start": creation to ready); then it ``ray.put`` s the batch once
and sends the same reference to every actor, ``--calls`` times in a row. Each call
receives the batch and reads every byte of every tensor; a call's time is from the
``.remote()`` calls until every actor has returned (the put is not timed). "first" is
the first call; "warm" is the median of the last half of the calls. The actors are
killed after each trial, so the next trial starts fresh worker processes.

Modes, taking turns in every trial:

- ``cold``: an actor whose ``__init__`` does nothing; its first batch pays for importing
  torch, tensordict, pyarrow and arrow_dataproto, and for the first calls of the codec;
- ``warm_up()``: the same actor, whose ``__init__`` calls
  :func:`arrow_dataproto.transport.warm_up` (the cost moves to "start");
- ``numpy_floor cold``: bare numpy arrays (what the floor's first batch costs in a fresh
  actor, which imports only numpy).

The actors' module imports nothing heavy (the class is pickled by value and its methods
touch tensors only through their methods), so "cold" is cold. "Private memory" is the
growth of each actor's resident anonymous memory over the trial, averaged over actors.

    python benchmarks/bench_cold_actor.py                 # PPO batch, 1 and 4 actors
    python benchmarks/bench_cold_actor.py --quick         # a small batch, one trial
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from arrow_dataproto import DataProto  # noqa: E402
from benchmarks.batches import nbytes, ppo_batch  # noqa: E402
from benchmarks.harness import RESULTS, command, save  # noqa: E402

COLD, WARM_UP, FLOOR = "cold", "warm_up()", "numpy_floor cold"


def _private_bytes() -> int:
    with open("/proc/self/statm") as f:
        _, resident, shared = (int(x) for x in f.read().split()[:3])
    return (resident - shared) * os.sysconf("SC_PAGE_SIZE")


def _read_every_byte(data) -> float:
    """Sum every tensor of a DataProto (values of jagged ones), or every array of a dict."""
    if isinstance(data, dict):
        return float(sum(a.sum() for a in data.values()))
    total = 0.0
    for t in data.batch.values(include_nested=True, leaves_only=True):
        total += float((t.values() if t.is_nested else t).sum())
    return total


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, warm: bool):
        if warm:
            from arrow_dataproto import transport

            transport.warm_up()
        self.base = _private_bytes()

    def ready(self) -> int:
        return os.getpid()

    def receive(self, data) -> float:
        return _read_every_byte(data)

    def private_growth(self) -> int:
        gc.collect()
        return _private_bytes() - self.base


def trial(mode: str, payload, actors: int, calls: int) -> dict:
    gc.collect()
    start = time.perf_counter()
    workers = [Worker.remote(mode == WARM_UP) for _ in range(actors)]
    pids = ray.get([w.ready.remote() for w in workers])
    started = time.perf_counter() - start
    assert len(set(pids)) == actors
    ref = ray.put(payload)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        ray.get([w.receive.remote(ref) for w in workers])
        times.append(time.perf_counter() - t0)
    growth = statistics.mean(ray.get([w.private_growth.remote() for w in workers]))
    for w in workers:
        ray.kill(w)
    del ref
    time.sleep(1.0)  # the killed workers exit and the store releases the object
    warm = statistics.median(times[len(times) // 2:])
    return {"start": started, "first": times[0], "warm": warm, "growth": growth}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small batch, one trial, print only")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--actors", default="1,4", help="comma-separated numbers of actors started at once")
    parser.add_argument("--out", help="results file (default: benchmarks/results/cold_actor.md unless --quick)")
    args = parser.parse_args()
    out = args.out or (None if args.quick else RESULTS / "cold_actor.md")
    trials = 1 if args.quick else args.trials
    td, non_tensor, meta = ppo_batch(rows=128 if args.quick else 2560)
    dp = DataProto(td, non_tensor, meta)
    floor = {k: v.numpy() for k, v in td.items()}
    size = nbytes(td)
    ray.init(num_cpus=4, object_store_memory=3 * 2**30, include_dashboard=False, configure_logging=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    rows = []
    try:
        for actors in (int(a) for a in args.actors.split(",")):
            results: dict = {mode: [] for mode in (COLD, WARM_UP, FLOOR)}
            for t in range(trials):
                for mode in results:
                    r = trial(mode, floor if mode == FLOOR else dp, actors, args.calls)
                    results[mode].append(r)
                    print(f"{actors} actor(s) trial {t} {mode:17s} start {r['start']:6.2f} s  first {r['first']:6.3f} s"
                          f"  warm {r['warm']:6.3f} s  private +{r['growth'] / 2**20:5.0f} MiB", flush=True)
            for mode, runs in results.items():
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                rows.append((actors, mode, med))
    finally:
        ray.shutdown()
    lines = [
        "# A fresh actor's first batch (`benchmarks/bench_cold_actor.py`)",
        "",
        f"Command: `{command('bench_cold_actor.py')}`. PPO batch from `ppo_batch()`, {size / 2**20:.0f} MiB of",
        f"tensors plus its object columns; median of {trials} trial(s), each with fresh actors and {args.calls} calls;",
        "each call reads every byte. \"first\"/\"warm\": the first call / the median of the last half; the last",
        "column is the target's ratio (<= 1.5x for `warm_up()`). Load average at the end:",
        f"{os.getloadavg()[0]:.1f}.",
        "",
        "| actors | mode | start (s) | first batch (s) | warm batch (s) | private memory per actor | first / warm |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for actors, mode, med in rows:
        lines.append(f"| {actors} | {mode} | {med['start']:.2f} | {med['first']:.3f} | {med['warm']:.3f} |"
                     f" {med['growth'] / 2**20:.0f} MiB | {med['first'] / med['warm']:.2f}x |")
    save("\n".join(lines) + "\n", out)


if __name__ == "__main__":
    main()
