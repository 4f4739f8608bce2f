"""Where the held step of ``bench_verl_e2e.py`` spends its time: verl's numpy mode against install().

The held step (verl dispatches a row index to workers that hold their chunk of the
batch; each computes and returns a 4 MiB DataProto; verl concatenates the returns) is
where ``install()`` still loses to numpy mode. This script runs it for the two modes
taking turns, in one Ray session, and prints per mode:

- the step's median seconds;
- the driver's phases per step (median milliseconds): verl's ``chunk``, the one
  ``ray.get`` of the returns (waiting for the workers, then unpickling; for install()
  the part spent in our decode, through Arrow or compact, is shown apart) and verl's ``concat``;
- each worker task's phases from Ray's timeline (median milliseconds):
  ``task:deserialize_arguments`` (unpickling the index), ``task:execute`` (verl's
  wrapper and the compute) and ``task:store_outputs`` (pickling and putting the return);
- the workers' page faults per compute (minor faults of the computing thread: memory
  its temporaries touch for the first time).

``ARROW_DATAPROTO_COPY`` in the environment applies to the driver and the workers. With
``--after-move`` each held step follows an untimed step that moves the whole batch in (as in
``bench_verl_e2e.py``, where the two take turns).
Needs verl (the compat venv):

    PYTHONPATH=$PWD .venv-compat/bin/python benchmarks/bench_verl_held.py [rows tokens steps] [--after-move]
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

import bench_verl_e2e as e2e  # noqa: E402

MODES = {"verl_numpy": "numpy", "install": "arrow"}
WORKERS = 4


def timed(owner, name: str, label: str, spent: dict) -> None:
    """Replace ``owner.name`` by a wrapper adding its seconds to ``spent[label]``."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main() -> None:
    after_move = "--after-move" in sys.argv
    numbers = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows, tokens, steps = (int(a) for a in numbers) if numbers else (2048, 1024, 12)
    import ray
    import torch
    from verl.protocol import DataProto
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    from arrow_dataproto import _compact, pickling

    copy = os.environ.get("ARROW_DATAPROTO_COPY", "on_write")
    ray.init(
        num_cpus=WORKERS * len(MODES),
        object_store_memory=2**30,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": e2e.HOOK, "env_vars": {"ARROW_DATAPROTO_COPY": copy}},
    )
    try:
        data = e2e.make_batch(rows, tokens, tokens)
        groups = {}
        for mode, value in MODES.items():
            pool = RayResourcePool([WORKERS], use_gpu=False, max_colocate_count=1)
            cls = RayClassWithInitArgs(cls=e2e.worker_class())
            groups[mode] = RayWorkerGroup(pool, cls, worker_env={e2e.ENV: value}, device_name="cpu")
        index = DataProto.from_dict({"row": torch.arange(len(data))})
        for mode, value in MODES.items():
            e2e.set_driver_mode(value)
            groups[mode].hold(data)

        spent: dict = collections.defaultdict(float)
        timed(ray, "get", "ray.get (waits, then unpickles)", spent)
        timed(DataProto, "chunk", "chunk", spent)
        timed(DataProto, "concat", "concat", spent)
        timed(pickling, "rebuild_dataproto", "of which our decode", spent)
        timed(_compact, "parts", "of which our decode", spent)
        seconds = {mode: [] for mode in MODES}
        phases: dict = {mode: collections.defaultdict(list) for mode in MODES}
        faults: dict = {mode: [] for mode in MODES}  # the workers' page faults per compute (median of the four)
        for _ in range(steps + 1):  # the first is a warm-up
            for mode, value in MODES.items():
                e2e.set_driver_mode(value)
                if after_move:
                    groups[mode].step(data)
                spent.clear()
                start = time.perf_counter()
                out = groups[mode].step_held(index)
                seconds[mode].append(time.perf_counter() - start)
                for label, s in spent.items():
                    phases[mode][label].append(s)
                faults[mode].append(statistics.median(out.meta_info["metrics"]["faults"]))
        e2e.set_driver_mode(None)

        worker_ids = {
            mode: set(ray.get([w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_worker_id()) for w in g.workers]))
            for mode, g in groups.items()
        }
        tasks: dict = {mode: collections.defaultdict(list) for mode in MODES}
        for event in ray.timeline():
            if event.get("ph") == "X" and str(event.get("name", "")).startswith("task:"):
                for mode, ids in worker_ids.items():
                    if any(i in str(event.get("tid")) for i in ids):
                        tasks[mode][event["name"]].append(event["dur"] / 1e3)
    finally:
        ray.shutdown()

    print(f"held step, {rows} rows of {tokens}+{tokens} tokens, {WORKERS} workers, ARROW_DATAPROTO_COPY={copy}, "
          f"median of {steps} steps{', each after a step moving the batch in' if after_move else ''}:")
    base = statistics.median(seconds["verl_numpy"][1:])
    for mode in MODES:
        median = statistics.median(seconds[mode][1:])
        driver = {k: round(statistics.median(v[1:]) * 1e3, 2) for k, v in phases[mode].items()}
        worker = {k: round(statistics.median(v[-steps * WORKERS:]), 2) for k, v in tasks[mode].items()}
        print(f"  {mode}: {median:.4f} s ({median / base:.2f}x numpy mode)")
        print(f"    driver ms: {driver}")
        print(f"    worker task ms: {worker}; page faults per compute: {statistics.median(faults[mode][1:]):.0f}")


if __name__ == "__main__":
    main()
