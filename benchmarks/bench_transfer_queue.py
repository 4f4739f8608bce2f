"""verl's v1 data path: TransferQueue with its default backend and with ours, against the floor.

One measurement: the driver puts a TensorDict, one reader actor gets it and reads every byte
(wall time, driver side, from the start of the put to the reader's reply). Paths:

- floor: a dict of bare numpy arrays through ``ray.put`` (one copy in, zero-copy out);
- ours direct: ``ray.put(arrow_dataproto.DataProto(batch=td))``;
- ``ray.put(td)`` without and with ``arrow_dataproto.integrations.tensordict.install()``
  (installed in the driver and in the reader);
- TransferQueue 0.1.11 default backend (SimpleStorage: 2 storage units) and with ours
  (``arrow_dataproto``: the writer's object, mapped by the backend's directory actor so that it
  outlives the writer; and with ``owner="putter"``, not mapped):
  ``kv_batch_put`` in the driver, ``kv_batch_get`` in the reader, then ``kv_clear``. Each
  reader connects its TransferQueue client once, untimed, as a worker does at its start
  (``tq.init()``: a round trip to the controller, which an earlier version of this script
  paid in every timed read).

Fan-out: the same put, then 4 readers get and read at once (the default backend is left out:
four private copies plus its storage copy of 1 GiB do not fit next to the other engineers here).
Memory: the driver's private-memory peak during the put, each reader's added private memory
while it holds what it got (median over readers), both in MiB.

Run: ``python benchmarks/bench_transfer_queue.py [--quick] [--repeats N]``.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import numpy as np
import ray
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from batches import nbytes, ppo_batch, seed_batch  # noqa: E402
from bench_ray import PeakSampler, _private_bytes, read_all  # noqa: E402

import arrow_dataproto as adp  # noqa: E402
import arrow_dataproto.integrations.transfer_queue  # noqa: E402,F401  (registers the backend)

FAN_OUT = 4
HOOKS = "arrow_dataproto.integrations.register_transfer_queue"
FLOOR, DIRECT, TD, TD_INSTALL, TQ_DEFAULT, TQ_OURS, TQ_PUTTER = (
    "floor (numpy through ray.put)", "ours direct: ray.put(DataProto)", "ray.put(td)",
    "ray.put(td), install()", "TransferQueue, default backend", "TransferQueue, arrow_dataproto backend",
    "TransferQueue, arrow_dataproto backend, owner=putter",
)
TQ_CONF = {
    TQ_DEFAULT: {"backend": {"storage_backend": "SimpleStorage"}},
    TQ_OURS: {"backend": {"storage_backend": "arrow_dataproto", "arrow_dataproto": {}}},
    TQ_PUTTER: {"backend": {"storage_backend": "arrow_dataproto", "arrow_dataproto": {"owner": "putter"}}},
}


@ray.remote(num_cpus=0)
class Reader:
    def __init__(self, install: bool):
        self.held = None
        if install:
            from arrow_dataproto.integrations import tensordict

            tensordict.install()

    def read(self, path: str, boxed: list, names=None):
        gc.collect()
        base = _private_bytes()  # before the payload is received (it comes boxed: a reference)
        payload = ray.get(boxed[0]) if boxed[0] is not None else None
        if path in TQ_CONF:
            import transfer_queue as tq

            td = tq.kv_batch_get(keys=names, partition_id="bench")
        elif path == FLOOR:
            arrays = {k: torch.from_numpy(v) for k, v in payload.items()}
            td = TensorDict(arrays, batch_size=[len(next(iter(arrays.values())))])
        elif path == DIRECT:
            td = payload.batch
        else:
            td = payload
        read_all(td)
        self.held = td
        return _private_bytes() - base

    def drop(self):
        self.held = None
        gc.collect()

    def attach(self) -> None:
        """Connect this reader's TransferQueue client, once, as a worker does at its start (untimed)."""
        import transfer_queue as tq

        tq.init()


def _payload(path: str, td: TensorDict):
    if path == FLOOR:
        return {k: v.numpy() for k, v in td.items()}
    if path == DIRECT:
        return adp.DataProto(batch=td)
    return td


def measure(path: str, td: TensorDict, readers: list, repeats: int) -> dict:
    import transfer_queue as tq

    names = [f"r{i}" for i in range(td.batch_size[0])]
    times, driver, private = [], [], []
    for round_ in range(repeats + 1):
        ray.get([r.drop.remote() for r in readers])
        gc.collect()
        time.sleep(0.5)
        start = time.perf_counter()
        with PeakSampler() as peak:
            if path in TQ_CONF:
                tq.kv_batch_put(keys=names, partition_id="bench", fields=td)
                ref = None
            else:
                ref = ray.put(_payload(path, td))
        added = ray.get([r.read.remote(path, [ref], names) for r in readers])
        elapsed = time.perf_counter() - start
        del ref
        if path in TQ_CONF:
            tq.kv_clear(keys=names, partition_id="bench")
        if round_:
            times.append(elapsed)
            driver.append(peak.peak)
            private.append(statistics.median(added))
    return {"timing": harness.Timing(statistics.median(times), min(times)),
            "driver": statistics.median(driver), "reader": statistics.median(private)}


def run(paths: list[str], batches: dict, repeats: int, log) -> dict:
    import transfer_queue as tq

    results = {}
    plain = [Reader.remote(False) for _ in range(FAN_OUT)]
    installed = [Reader.remote(True) for _ in range(FAN_OUT)]
    for path in paths:
        if path in TQ_CONF:
            tq.init(OmegaConf.create(TQ_CONF[path]))
        if path == TD_INSTALL:
            from arrow_dataproto.integrations import tensordict

            tensordict.install()
        readers = installed if path == TD_INSTALL else plain
        if path in TQ_CONF:  # fresh readers: a TransferQueue client stays bound to the controller it first met
            readers = [Reader.remote(False) for _ in range(FAN_OUT)]
            ray.get([r.attach.remote() for r in readers])
        for name, td in batches.items():
            results[(name, path, 1)] = measure(path, td, readers[:1], repeats)
            log(name, path, 1, results[(name, path, 1)])
            if path != TQ_DEFAULT and name == "seed":
                results[(name, path, FAN_OUT)] = measure(path, td, readers, repeats)
                log(name, path, FAN_OUT, results[(name, path, FAN_OUT)])
        if path == TD_INSTALL:
            tensordict.uninstall()
        if path in TQ_CONF:
            tq.close()
            for reader in readers:
                ray.kill(reader)
    return results


def report(results: dict, batches: dict, args) -> str:
    mib = 2**20
    lines = [
        "# TransferQueue: default backend vs arrow_dataproto backend vs the floor",
        "",
        f"Command: `{harness.command('bench_transfer_queue.py')}`; {args.repeats} timed rounds after one warm-up.",
        "Ours: one copy per put, the writer's object, which the directory actor maps (pins) before the put returns; "
        "`owner=putter`: not mapped (the rows live as long as the writing process).",
        "Time: driver put + reader(s) get and read every byte, wall, median (best) in s; x floor = median / floor's.",
        "Driver = driver private-memory peak during the put; reader = a reader's added private memory holding the result (MiB).",
        "",
    ]
    for name, td in batches.items():
        for readers in (1, FAN_OUT):
            floor = results.get((name, FLOOR, readers))
            if floor is None:
                continue
            lines += [f"## {name} batch ({nbytes(td) / mib:.0f} MiB), {readers} reader(s)", "",
                      "| path | time s | x floor | driver MiB | reader MiB |", "|---|---:|---:|---:|---:|"]
            for path in (FLOOR, DIRECT, TD, TD_INSTALL, TQ_DEFAULT, TQ_OURS, TQ_PUTTER):
                r = results.get((name, path, readers))
                if r is None:
                    continue
                lines.append(f"| {path} | {harness.pair(r['timing'])} | {harness.ratio(r['timing'], floor['timing'], 2)} "
                             f"| {r['driver'] / mib:.0f} | {r['reader'] / mib:.1f} |")
            lines.append("")
        default, ours = results.get((name, TQ_DEFAULT, 1)), results.get((name, TQ_OURS, 1))
        if default and ours:
            lines += [f"{name}: TransferQueue default / arrow_dataproto backend = "
                      f"{default['timing'].median / ours['timing'].median:.1f}x", ""]
    return "\n".join(lines)


def main() -> None:
    args = harness.arguments(__doc__, "transfer_queue.md", repeats=3, quick="small batches")
    if args.quick:
        batches = {"seed": seed_batch(640, 2048), "ppo": ppo_batch(256, 128, 128)[0]}
    else:
        batches = {"seed": seed_batch(), "ppo": ppo_batch()[0]}
    # Logical CPUs: TransferQueue's controller and each of its default backend's 2 storage units ask for one
    # (with fewer the units are never scheduled and the first put waits for ever); the readers ask for none.
    ray.init(num_cpus=4, object_store_memory=int(4.5 * 2**30), include_dashboard=False, configure_logging=False,
             runtime_env={"worker_process_setup_hook": HOOKS,
                          "env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})

    def log(name, path, readers, r):
        print(f"{name:5} {readers} {path:42} {harness.pair(r['timing'])} driver {r['driver'] / 2**20:.0f} MiB "
              f"reader {r['reader'] / 2**20:.1f} MiB", flush=True)

    paths = [FLOOR, DIRECT, TD, TD_INSTALL, TQ_OURS, TQ_PUTTER, TQ_DEFAULT]
    results = run(paths, batches, args.repeats, log)
    harness.save(report(results, batches, args), args.out)
    ray.shutdown()


if __name__ == "__main__":
    main()
