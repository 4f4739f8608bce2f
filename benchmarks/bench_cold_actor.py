"""A fresh Ray actor's first batch against its tenth, with and without ``transport.warm_up()``.

One trial: the driver starts ``--actors`` fresh actors at once and waits until each has
finished ``__init__`` ("start": creation to ready); then it ``ray.put`` s the batch once
and sends the same reference to every actor, ``--calls`` times in a row, each call after
the same ``--pause`` (the first included: the previous call's copy-on-write views are
released on a background thread, and a call that overlapped that release would map the
object afresh, which the first call never does). Each call receives the batch and reads
every byte of every tensor; a call's time is from the ``.remote()`` calls until every
actor has returned (the put is not timed). "first" is the first call; "warm" is the
median of the last half of the calls. The actors are killed after each trial, and every
trial's actors are checked to be processes never seen before.

Modes, taking turns in every trial:

- ``cold``: an actor whose ``__init__`` does nothing; its first batch pays for importing
  torch, tensordict and arrow_dataproto, and for the first calls of the codec;
- ``warm_up()``: the same actor, whose ``__init__`` calls
  :func:`arrow_dataproto.transport.warm_up` (the cost moves to "start");
- ``numpy_floor cold``: the tensors as bare numpy arrays (what the floor's first batch
  costs in a fresh actor, which imports nothing more).

The actors' module imports nothing heavy (the class is pickled by value and its methods
touch tensors only through their methods), so "cold" is cold: each cold actor reports
the modules it has imported when ready, and torch, tensordict or arrow_dataproto among
them fails the run. Ray itself imports pyarrow (and numpy) in every worker when it first
deserializes an argument, in every mode. "Private memory" is each actor's resident
anonymous memory (``RssAnon``) when ready and after the calls, averaged over actors.

    python benchmarks/bench_cold_actor.py                 # PPO batch, 1 and 4 actors
    python benchmarks/bench_cold_actor.py --quick         # a small batch, one trial
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
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


# What a cold actor must not have imported before its first batch. Not pyarrow (nor numpy):
# Ray's worker imports it itself when it first deserializes anything, here the actor's
# constructor argument (ray/_private/arrow_serialization.py), floor included.
HEAVY = ("torch", "tensordict", "arrow_dataproto")


def _private_bytes() -> int:
    """This process's resident anonymous memory (``RssAnon``: heap, copies, written pages;
    not the store's pages nor the libraries' code, which are shared)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise OSError("no RssAnon in /proc/self/status")


def _usage() -> tuple[float, int]:
    """This process's CPU seconds so far (user + system, every thread) and its minor page faults."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime, used.ru_minflt


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

    def ready(self) -> tuple[int, list[str], int, tuple[float, int]]:
        """The process id, the heavy modules imported so far, the private memory and the usage at start."""
        return os.getpid(), [m for m in HEAVY if m in sys.modules], self.base, _usage()

    def receive(self, data) -> tuple[float, int]:
        """Read every byte; the usage so far (Ray decoded ``data`` before this method ran:
        the usage between two calls' returns covers the second call's decode and read)."""
        _read_every_byte(data)
        return _usage()

    def private(self) -> int:
        gc.collect()
        return _private_bytes()


def trial(mode: str, payload, actors: int, calls: int, pause: float, seen: set[int]) -> dict:
    gc.collect()
    start = time.perf_counter()
    workers = [Worker.remote(mode == WARM_UP) for _ in range(actors)]
    ready = ray.get([w.ready.remote() for w in workers])
    started = time.perf_counter() - start
    pids = {pid for pid, _, _, _ in ready}
    assert len(pids) == actors and not pids & seen, "every actor of every trial is a fresh process"
    seen |= pids
    imported = sorted({m for _, modules, _, _ in ready for m in modules})
    if mode != WARM_UP:  # cold: the actor's module and __init__ imported nothing heavy
        assert not imported, f"a cold actor imported {imported} before its first batch"
    ref = ray.put(payload)
    times = []
    usage = [[u for _, _, _, u in ready]]  # per call, per actor: (CPU seconds, minor faults) so far
    for _ in range(calls):
        # Every call, the first included, comes after the same pause: the previous
        # call's views are released meanwhile (copy-on-write leases end on a background
        # thread; a call that overlapped one would map the object afresh).
        time.sleep(pause)
        t0 = time.perf_counter()
        usage.append(ray.get([w.receive.remote(ref) for w in workers]))
        times.append(time.perf_counter() - t0)
    private = ray.get([w.private.remote() for w in workers])
    for w in workers:
        ray.kill(w)
    del ref
    time.sleep(1.0)  # the killed workers exit and the store releases the object
    # each call's CPU time and faults, averaged over the actors
    cpu = [statistics.mean(b[0] - a[0] for a, b in zip(before, after)) for before, after in zip(usage, usage[1:])]
    faults = [statistics.mean(b[1] - a[1] for a, b in zip(before, after)) for before, after in zip(usage, usage[1:])]
    last = len(times) // 2
    return {"start": started, "first": times[0], "warm": statistics.median(times[last:]),
            "cpu_first": cpu[0], "cpu_warm": statistics.median(cpu[last:]),
            "faults_first": faults[0], "faults_warm": statistics.median(faults[last:]),
            "private_start": statistics.mean(base for _, _, base, _ in ready), "private": statistics.mean(private)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small batch, one trial, print only")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.2, help="seconds before each call, the first included")
    parser.add_argument("--actors", default="1,4", help="comma-separated numbers of actors started at once")
    parser.add_argument("--out", help="results file (default: benchmarks/results/cold_actor.md unless --quick)")
    args = parser.parse_args()
    out = args.out or (None if args.quick else RESULTS / "cold_actor.md")
    trials = 1 if args.quick else args.trials
    td, non_tensor, meta = ppo_batch(rows=128 if args.quick else 2560)
    dp = DataProto(td, non_tensor, meta)
    floor = {k: v.numpy() for k, v in td.items()}
    size = nbytes(td)
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    ray.init(address="local", num_cpus=4, object_store_memory=2 * 2**30, include_dashboard=False,
             configure_logging=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    rows = []
    seen: set[int] = set()
    try:
        for actors in (int(a) for a in args.actors.split(",")):
            results: dict = {mode: [] for mode in (COLD, WARM_UP, FLOOR)}
            for t in range(trials):
                for mode in results:
                    r = trial(mode, floor if mode == FLOOR else dp, actors, args.calls, args.pause, seen)
                    r["ratio"] = r["first"] / r["warm"]
                    r["cpu_ratio"] = r["cpu_first"] / r["cpu_warm"]
                    results[mode].append(r)
                    print(f"{actors} actor(s) trial {t} {mode:17s} start {r['start']:6.2f} s  first {r['first']:6.3f} s"
                          f"  warm {r['warm']:6.3f} s  ({r['ratio']:6.2f}x)  CPU {r['cpu_first'] * 1e3:6.0f} /"
                          f" {r['cpu_warm'] * 1e3:4.0f} ms ({r['cpu_ratio']:6.2f}x)  faults {r['faults_first']:6.0f} /"
                          f" {r['faults_warm']:4.0f}  private {r['private_start'] / 2**20:4.0f}"
                          f" -> {r['private'] / 2**20:4.0f} MiB", flush=True)
            for mode, runs in results.items():
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                rows.append((actors, mode, med, runs))
    finally:
        ray.shutdown()
    load_after = os.getloadavg()
    lines = [
        "# A fresh actor's first batch (`benchmarks/bench_cold_actor.py`)",
        "",
        f"Command: `{command('bench_cold_actor.py')}`, {began}; load average (1, 5, 15 min) before",
        f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}",
        f"({os.cpu_count()} cores). PPO batch from `ppo_batch()`: {size / 2**20:.0f} MiB of tensors plus its object",
        f"columns (the floor: the tensors as numpy arrays only); median of {trials} trial(s), each with fresh",
        f"actors (new processes) and {args.calls} calls of the same object, each after a {args.pause:g} s pause; each call",
        "reads every byte. \"start\": creation to `__init__` done; \"first\"/\"warm\": the first call / the median",
        "of the last half, in wall-clock time seen by the driver, and in CPU time of the actor's process (all",
        "its threads, averaged over actors: less sensitive to other load on the machine) with its minor page",
        "faults; \"first / warm\": the median of the trials' ratios (their range in brackets); the target is",
        "<= 1.5x for `warm_up()`. Private memory: each actor's resident anonymous memory (`RssAnon`) when",
        "started and after the calls, averaged over actors.",
        "",
        "| actors | mode | start (s) | first batch (s) | warm batch (s) | first / warm | actor CPU first / warm (ms) |"
        " CPU first / warm | page faults first / warm | private at start | private after |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(runs: list, key: str) -> str:
        values = [r[key] for r in runs]
        return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"

    for actors, mode, med, runs in rows:
        lines.append(f"| {actors} | {mode} | {med['start']:.2f} | {med['first']:.3f} | {med['warm']:.3f} |"
                     f" {ratio(runs, 'ratio')} | {med['cpu_first'] * 1e3:.0f} / {med['cpu_warm'] * 1e3:.0f} |"
                     f" {ratio(runs, 'cpu_ratio')} | {med['faults_first']:.0f} / {med['faults_warm']:.0f} |"
                     f" {med['private_start'] / 2**20:.0f} MiB | {med['private'] / 2**20:.0f} MiB |")
    save("\n".join(lines) + "\n", out)


if __name__ == "__main__":
    main()
