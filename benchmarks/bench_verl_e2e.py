"""verl's own RayWorkerGroup end to end: a PPO-like DataProto dispatched to CPU workers, every pickling mode.

Needs verl (the compat venv: ``scripts/setup.sh compat``). One Ray session
(bounded: one logical CPU per worker, a 1 GiB object store) whose job-level runtime_env
names our setup hook (``arrow_dataproto.integrations.verl.install_from_env``);
each mode is a verl ``RayWorkerGroup`` (``RayResourcePool(use_gpu=False)``)
whose workers get ``VERL_DATAPROTO_SERIALIZATION_METHOD`` through verl's
``worker_env``, with the same setting in the driver:

- ``verl_default``: variable unset, verl's ``torch.save`` pickling;
- ``verl_numpy``: ``numpy``, verl's numpy mode;
- ``install``: ``arrow``, the hook patches verl's class on import (and the
  driver calls ``install()``): our codec, copy-on-write receive;
- ``floor``: no DataProto crosses a process. The same worker group's ``Dispatch.DP_COMPUTE``
  methods take each chunk as bare numpy arrays (``bare``: the tensors' own memory, the jagged
  column as values and offsets) that Ray pickles out of band, and the workers wrap the store's
  read-only views without copying (``from_bare``); the returns travel the same way, and the
  driver concatenates them with verl's ``DataProto.concat``. No codec can move the batch for less.

One step: ``wg.compute(dp)`` with ``Dispatch.DP_COMPUTE_PROTO`` -- verl chunks the
batch, each worker computes per-row statistics on every tensor of its chunk and
returns a new DataProto, verl concatenates the returns. Every step's result is
checked against the same computation run locally on the same chunks (exactly),
untimed, before that mode's next step.
Each mode also runs the step on a batch already in its workers (*held*: placed there
once, untimed; verl dispatches a row index instead), so that per step minus held is what
moving the batch in costs: the driver's pickling and put, the workers' unpickling.
The modes take turns step by step (``harness.interleaved``); reported: median
and best seconds per step, ratio to verl's numpy mode, the workers' own
compute seconds, page faults (minor faults of the computing thread: memory the
compute touches for the first time) and torch thread counts, and the CPU seconds a
step used in all the processes it runs in (the driver, that mode's workers,
Ray's raylet and GCS server; user plus system time from ``psutil``,
read before and after each timed step, in 10 ms ticks; the median of the timed
steps), and the median of each step's CPU seconds over its seconds (how many
cores the step kept busy). A step lasts at least its CPU seconds over the
machine's cores: where both modes keep every core busy, the ratio of their
steps is about the ratio of their CPU seconds, whatever the codec.

Worker start: a plain actor that never sees a DataProto, created and pinged,
in a Ray session whose runtime_env sets the variable to ``arrow``, without the
hook and with it.

    python benchmarks/bench_verl_e2e.py            # 2048 rows (132 MiB), 4 workers, 5 steps
    python benchmarks/bench_verl_e2e.py --quick    # 64 rows, 2 workers, 1 step: to try it (CI)
    python benchmarks/bench_verl_e2e.py --rows 256 --tokens 128   # another size, 4 workers
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

import harness  # noqa: E402

HOOK = "arrow_dataproto.integrations.verl.install_from_env"
ENV = "VERL_DATAPROTO_SERIALIZATION_METHOD"
MODES = {"verl_default": None, "verl_numpy": "numpy", "install": "arrow", "floor": None}


def make_batch(rows: int, prompt: int, response: int, seed: int = 0):
    """A verl DataProto shaped like a PPO step (int64 ids and masks, float32 and bf16, a jagged column,
    uid strings, dict ``extra_info``, metrics in ``meta_info``)."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    total = prompt + response
    lengths = torch.randint(1, response + 1, (rows,), generator=g)
    batch = TensorDict(
        {
            "prompts": torch.randint(0, 32000, (rows, prompt), generator=g),
            "responses": torch.randint(0, 32000, (rows, response), generator=g),
            "input_ids": torch.randint(0, 32000, (rows, total), generator=g),
            "attention_mask": torch.randint(0, 2, (rows, total), generator=g),
            "response_mask": torch.randint(0, 2, (rows, response), generator=g),
            "old_log_probs": torch.randn(rows, response, generator=g),
            "values": torch.randn(rows, response, generator=g).bfloat16(),
            "response_tokens": torch.nested.nested_tensor(
                [torch.randint(0, 32000, (int(n),), generator=g) for n in lengths], layout=torch.jagged
            ),
        },
        batch_size=[rows],
    )
    non_tensor = {
        "uid": np.array([f"{seed}-{i:08x}" for i in range(rows)], dtype=object),
        "extra_info": np.array([{"index": i, "split": "train"} for i in range(rows)], dtype=object),
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info={"temperature": 1.0, "global_steps": 3})


def compute(data):
    """The workers' step: per-row statistics read from every tensor; a new DataProto."""
    import torch
    from verl.protocol import DataProto

    b = data.batch
    mask = b["response_mask"].float()
    logp = b["old_log_probs"]
    adv = (logp - logp.mean(-1, keepdim=True)) * mask + b["values"].float()
    returns = adv.flip(-1).cumsum(-1).flip(-1)
    score = (b["input_ids"] * b["attention_mask"]).sum(-1) + b["prompts"].sum(-1) + b["responses"].sum(-1)
    jagged = b["response_tokens"]
    tokens = torch.stack([row.sum() for row in jagged.unbind()]) if len(data) else torch.zeros(0, dtype=torch.int64)
    return DataProto.from_dict(
        {"advantages": adv, "returns": returns, "score": score, "tokens": tokens},
        non_tensors={"uid": data.non_tensor_batch["uid"]},
        meta_info={"global_steps": data.meta_info["global_steps"]},
    )


def bare(data) -> dict:
    """``data``'s columns as numpy arrays over the tensors' own memory (no copy; bf16 as int16,
    the jagged column as its values and offsets from 0), plus its non-tensor columns and meta_info."""
    import torch

    columns = {"meta_info": data.meta_info, "non_tensor": dict(data.non_tensor_batch), "tensors": {}}
    for key, tensor in data.batch.items():
        if tensor.is_nested:
            offsets = tensor.offsets()
            values = tensor.values()[int(offsets[0]) : int(offsets[-1])]
            columns["tensors"][key] = ("jagged", values.numpy(), (offsets - offsets[0]).numpy())
        elif tensor.dtype == torch.bfloat16:
            columns["tensors"][key] = ("bfloat16", tensor.contiguous().view(torch.int16).numpy())
        else:
            columns["tensors"][key] = ("plain", tensor.contiguous().numpy())
    return columns


def collect_bare(parts: list):
    """The workers' ``bare`` returns as one verl DataProto, by verl's own collection
    (``DataProto.concat`` of views over Ray's store)."""
    from verl.protocol import DataProto

    return DataProto.concat([from_bare(part) for part in parts])


def from_bare(columns):
    """The verl DataProto over ``bare``'s arrays, without copying (read-only views stay read-only)."""
    import warnings

    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto

    tensors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch.from_numpy of a read-only view: read, never written
        for key, (kind, *arrays) in columns["tensors"].items():
            first = torch.from_numpy(arrays[0])
            if kind == "jagged":
                tensors[key] = torch.nested.nested_tensor_from_jagged(first, torch.from_numpy(arrays[1]))
            else:
                tensors[key] = first.view(torch.bfloat16) if kind == "bfloat16" else first
    rows = len(next(iter(columns["non_tensor"].values())))
    batch = TensorDict(tensors, batch_size=[rows])
    return DataProto(batch=batch, non_tensor_batch=columns["non_tensor"], meta_info=columns["meta_info"])


def worker_class():
    import ray
    import torch
    from verl.protocol import DataProto
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register

    @ray.remote
    class StepWorker(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def step(self, data):
            return self.timed_compute(data)

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def hold(self, data):
            self.held = data
            return DataProto.from_dict({"rows": torch.tensor([len(data)])})

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def step_held(self, index):
            assert len(index) == len(self.held), "the index chunks as the held batch did"
            return self.timed_compute(self.held)

        @register(dispatch_mode=Dispatch.DP_COMPUTE)
        def step_bare(self, columns):
            return bare(self.timed_compute(from_bare(columns)))

        @register(dispatch_mode=Dispatch.DP_COMPUTE)
        def hold_bare(self, columns):
            self.held = from_bare(columns)

        @register(dispatch_mode=Dispatch.DP_COMPUTE)
        def step_held_bare(self, rows):
            assert rows == len(self.held), "the held chunk has the rows the batch's chunk has"
            return bare(self.timed_compute(self.held))

        def timed_compute(self, data):
            import resource

            faults, start = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt, time.perf_counter()
            out = compute(data)
            seconds = time.perf_counter() - start
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
            out.meta_info["metrics"] = {"compute_s": seconds, "threads": torch.get_num_threads(), "faults": faults}
            return out

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def patched(self):
            from arrow_dataproto.integrations import verl as adp_verl

            return adp_verl.is_installed()

    return StepWorker


def cpu_seconds(processes) -> float:
    """User plus system CPU seconds used so far by ``processes`` (``psutil.Process``)."""
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def ray_servers() -> list:
    """The raylet and GCS server this driver's ``ray.init`` started (its children), as ``psutil.Process``."""
    import psutil

    found = [p for p in psutil.Process().children() if p.name() in ("raylet", "gcs_server")]
    if len(found) != 2:
        raise RuntimeError(f"expected this driver's raylet and GCS server among its children, found {found}")
    return found


def set_driver_mode(value: str | None) -> None:
    from arrow_dataproto.integrations import verl as adp_verl

    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value
    if value == "arrow":
        adp_verl.install()
    else:
        adp_verl.uninstall()


def check(result, reference, mode: str) -> None:
    import numpy as np
    import torch

    assert len(result) == len(reference), f"{mode}: {len(result)} rows, expected {len(reference)}"
    for key in reference.batch.keys():
        assert torch.equal(result.batch[key], reference.batch[key]), f"{mode}: {key} differs"
    assert np.array_equal(result.non_tensor_batch["uid"], reference.non_tensor_batch["uid"]), f"{mode}: uid differs"


def steps(args) -> tuple[dict, dict, dict]:
    import ray
    import torch
    from verl.protocol import DataProto
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    data = make_batch(args.rows, args.prompt, args.response)
    reference = DataProto.concat([compute(c) for c in data.chunk(args.workers)])
    groups = {}
    for mode, value in MODES.items():
        pool = RayResourcePool([args.workers], use_gpu=False, max_colocate_count=1)
        env = {} if value is None else {ENV: value}
        groups[mode] = RayWorkerGroup(pool, RayClassWithInitArgs(cls=worker_class()), worker_env=env, device_name="cpu")
        patched = groups[mode].patched()
        assert all(patched) == (value == "arrow") and any(patched) == (value == "arrow"), f"{mode}: hook {patched}"
    import psutil

    servers = ray_servers()
    processes = {}  # each mode's step runs in these
    for mode, group in groups.items():
        workers = ray.get([w.__ray_call__.remote(lambda self: os.getpid()) for w in group.workers])
        processes[mode] = [psutil.Process(), *servers, *map(psutil.Process, workers)]
    cpu: dict = {(mode, held): [] for mode in MODES for held in (False, True)}
    index = DataProto.from_dict({"row": torch.arange(len(data))})  # chunks as the batch does
    chunk_rows = [len(c) for c in data.chunk(args.workers)]

    def calls(mode, group) -> dict:
        """A mode's three calls: the DataProto modes through ``Dispatch.DP_COMPUTE_PROTO``, the floor
        through ``Dispatch.DP_COMPUTE`` with its chunks as bare arrays."""
        if mode == "floor":
            def chunks() -> list:
                return [bare(c) for c in data.chunk(args.workers)]

            return {
                "hold": lambda: group.hold_bare(chunks()),
                "step": lambda: collect_bare(group.step_bare(chunks())),
                "held": lambda: collect_bare(group.step_held_bare(chunk_rows)),
            }
        return {"hold": lambda: group.hold(data), "step": lambda: group.step(data), "held": lambda: group.step_held(index)}

    call = {mode: calls(mode, group) for mode, group in groups.items()}
    for mode, value in MODES.items():
        set_driver_mode(value)
        call[mode]["hold"]()

    seen: dict = {mode: {"compute_s": [], "threads": set(), "faults": []} for mode in MODES}
    last: dict = {}  # each task's last result, checked untimed before its next step and at the end

    def checked(task) -> None:
        out = last.pop(task, None)
        if out is not None:
            mode = task[0]
            metrics = out.meta_info["metrics"]
            seen[mode]["compute_s"].append(statistics.median(metrics["compute_s"]))
            seen[mode]["threads"].update(metrics["threads"])
            seen[mode]["faults"].append(statistics.median(metrics["faults"]))
            check(out, reference, mode)

    def run(mode, held):
        def step():  # timed: verl's dispatch, the workers' step, verl's collection
            before, start = cpu_seconds(processes[mode]), time.perf_counter()
            out = call[mode]["held" if held else "step"]()
            last[mode, held] = out
            cpu[mode, held].append((cpu_seconds(processes[mode]) - before, time.perf_counter() - start))
            return out

        def setup():
            checked((mode, held))
            set_driver_mode(MODES[mode])

        return step, setup

    timings = harness.interleaved({(mode, held): run(mode, held) for mode in MODES for held in (False, True)}, args.repeats)
    for task in list(last):
        checked(task)
    set_driver_mode(None)
    nbytes = sum(t.numel() * t.element_size() for t in data.batch.values() if not t.is_nested)
    nbytes += data.batch["response_tokens"].values().numel() * 8
    for group in groups.values():
        for worker in group.workers:
            ray.kill(worker)
    cpu_s = {task: statistics.median(c for c, _ in spent[1:]) for task, spent in cpu.items()}  # [0]: the warm-up
    busy = {task: statistics.median(c / w for c, w in spent[1:]) for task, spent in cpu.items()}
    return timings, seen, {"MiB": nbytes / 2**20, "copy_s": one_copy_seconds(data), "cpu_s": cpu_s, "busy": busy}


def one_copy_seconds(data, repeats: int = 5) -> dict[str, float]:
    """Median seconds to copy every tensor byte of ``data`` once, here: into new memory
    (``new``: page faults included), and into memory already written (``warm``: as Ray's put
    writes into a store whose pages earlier objects touched). Ray's put of the batch costs at
    least the warm copy."""
    import torch

    leaves = [t.values() if t.is_nested else t for t in data.batch.values()]
    new, warm = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        copies = [torch.empty_like(t).copy_(t) for t in leaves]
        new.append(time.perf_counter() - start)
        start = time.perf_counter()
        for copy, t in zip(copies, leaves):
            copy.copy_(t)
        warm.append(time.perf_counter() - start)
        del copies
    return {"new": statistics.median(new), "warm": statistics.median(warm)}


def over(value: float, base: float) -> str:
    """``value / base`` to two places; "-" where ``base`` is 0 (a tiny step's CPU seconds, in
    10 ms ticks, or its moving-in time can be)."""
    return f"{value / base:.2f}" if base else "-"


def worker_start(repeats: int, hooked: bool) -> float:
    """Median seconds to create a plain actor and get its first reply, in a fresh session."""
    import ray

    env: dict = {"env_vars": {ENV: "arrow"}}  # a runtime_env either way: only the hook differs
    if hooked:
        env["worker_process_setup_hook"] = HOOK
    ray.init(num_cpus=1, object_store_memory=256 * 2**20, include_dashboard=False, runtime_env=env)
    try:

        @ray.remote(num_cpus=0)
        class Plain:
            def ping(self):
                return os.getpid()

        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            actor = Plain.remote()
            ray.get(actor.ping.remote())
            times.append(time.perf_counter() - start)
            ray.kill(actor)
        return statistics.median(times[1:])
    finally:
        ray.shutdown()


def main() -> None:
    def sizes(parser) -> None:
        parser.add_argument("--rows", type=int, default=2048, help="rows of the batch (default 2048)")
        parser.add_argument("--tokens", type=int, default=1024, help="prompt and response tokens each (default 1024)")
        parser.add_argument("--workers", type=int, default=4, help="workers of each group (default 4)")

    args = harness.arguments(__doc__, "verl_e2e.md", repeats=5, quick="64 rows of 16+16 tokens, 2 workers", more=sizes)
    args.rows, args.prompt, args.response, args.workers = (
        (64, 16, 16, 2) if args.quick else (args.rows, args.tokens, args.tokens, args.workers)
    )
    args.repeats = 1 if args.quick else args.repeats
    import ray

    starts = {hooked: worker_start(max(args.repeats, 3), hooked) for hooked in (False, True)}
    ray.init(
        num_cpus=args.workers * len(MODES),  # one CPU per worker of each group (logical: they take turns)
        object_store_memory=2**30,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": HOOK},
    )
    try:
        timings, seen, measured = steps(args)
    finally:
        ray.shutdown()
    base, floor = timings["verl_numpy", False], timings["floor", False]
    moved = {mode: timings[mode, False].median - timings[mode, True].median for mode in MODES}
    cpu = {mode: measured["cpu_s"][mode, False] for mode in MODES}
    lines = [
        "# verl RayWorkerGroup end to end (`benchmarks/bench_verl_e2e.py`)",
        "",
        f"Command: `{harness.command('bench_verl_e2e.py')}`; {args.rows} rows, {args.prompt}+{args.response} tokens "
        f"({measured['MiB']:.0f} MiB of tensors), {args.workers} CPU workers, `Dispatch.DP_COMPUTE_PROTO`; "
        f"median (best) of {args.repeats} steps after a warm-up, modes taking turns. Every result checked "
        "exactly against the same computation run locally (untimed). Seconds.",
        "",
        "*held*: the same step on a batch already in the workers (`hold`, untimed): verl dispatches a",
        "row index, the workers compute on their held chunk and return the same result. *moving the batch",
        "in* = per step - held: the driver's pickling and put, the workers' unpickling. *CPU per step*:",
        "user plus system seconds in the driver, the mode's workers, the raylet and the GCS server during a",
        "step (median of the timed steps; 10 ms ticks, so only steps of 0.1 s and more are measured well);",
        "*cores busy*: the median of each step's CPU seconds over its seconds. A step lasts at least its",
        f"CPU seconds over the cores ({os.cpu_count()} here): where both modes keep every core busy, the ratio",
        "of their steps is about the ratio of their CPU seconds. *floor*: bare numpy arrays through the same",
        "workers (`Dispatch.DP_COMPUTE`), pickled out of band by Ray and wrapped as read-only views on",
        "receipt; no codec moves the batch for less.",
        "",
        "| mode | per step | x numpy mode | x floor | held | moving the batch in | x numpy mode's | "
        "workers' compute (median) | page faults per compute | workers' torch threads | CPU per step | "
        "x numpy mode's | cores busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        lines.append(
            f"| {mode} | {harness.pair(timings[mode, False])} | {harness.ratio(timings[mode, False], base, 2)} | "
            f"{harness.ratio(timings[mode, False], floor, 2)} | {harness.pair(timings[mode, True])} | {moved[mode]:.3f} | {over(moved[mode], moved['verl_numpy'])} | "
            f"{statistics.median(seen[mode]['compute_s']):.3f} | {statistics.median(seen[mode]['faults']):.0f} | "
            f"{sorted(seen[mode]['threads'])} | "
            f"{cpu[mode]:.3f} | {over(cpu[mode], cpu['verl_numpy'])} | {measured['busy'][mode, False]:.2f} |"
        )
    lines += [
        "",
        "Worker start (a plain actor that receives no DataProto: created and pinged; median seconds):",
        "",
        "| session | start | x without hook |",
        "|---|---:|---:|",
        f"| `{ENV}=arrow`, no hook | {starts[False]:.3f} | 1.00 |",
        f"| with `{HOOK}` and `{ENV}=arrow` | {starts[True]:.3f} | {starts[True] / starts[False]:.2f} |",
        "",
        "For scale: one copy of the batch's tensor bytes in this driver took "
        f"{measured['copy_s']['new']:.3f} s into new memory and {measured['copy_s']['warm']:.3f} s into memory "
        "already written (medians of 5); moving the batch in costs at least the second, since Ray copies it "
        f"once into its store. A step at 0.5x numpy mode's ({0.5 * base.median:.3f} s) would leave moving the "
        f"batch in {0.5 * base.median - timings['install', True].median:.3f} s beside install's held step; the "
        f"floor's step ({floor.median:.3f} s) is {floor.median / base.median:.2f}x numpy mode's.",
    ]
    harness.save("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
