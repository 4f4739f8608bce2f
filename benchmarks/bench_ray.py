"""Driver -> Ray actor -> tensors in hand, for every way of shipping an RL batch.

One measurement: the driver encodes the batch and ``ray.put`` s it ("send"),
then calls ``actor.receive.remote(ref)``; Ray hands the actor the unpickled
argument, the actor finishes decoding it into a TensorDict, reads the last
element of every tensor and returns ("total" = send + call + receive). Median
of ``--repeats`` runs, the paths taking turns within each repeat, after untimed
runs on tiny batches per path. Before each
run both processes collect garbage and the driver waits 0.5 s, so that the
store has released the previous object (else a put may land in store memory
never touched before, and pay its page faults).

Paths (rivals from ``benchmarks/rivals.py``, ours through ``arrow_dataproto``):

- ``numpy_floor``: bare numpy arrays, one copy in, views out (the floor);
- ``numpy_floor+clone``: the floor, then a ``clone()`` of every tensor in the
  actor: what "the floor plus one memory copy" costs;
- ``ours_zero_copy``: ``receive_as(dp, copy=False)``, tensors view the store;
- ``ours_copy``: a plain DataProto, the safe default (tensors own their memory);
- ``ours_register_serializer``: zero-copy as ``ours_zero_copy``, but pickled by
  a serializer given to ``ray.util.register_serializer`` (in the driver, for a
  subclass) instead of ``__reduce_ex__``: compare it with ``ours_zero_copy``;
- ``verl_numpy_like``, ``verl_default_like``, ``td_consolidated``; with verl
  importable also the real ``verl_dataproto`` and ``verl_dataproto_numpy``;
- ``ray_torch_zero_copy``: plain torch tensors with Ray's opt-in reducer,
  ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1``. Ray reads it when it is imported, so
  this path runs in a child process with its own Ray session, started after the
  parent's session is shut down.

"Sender peak" is the driver's largest growth of private (anonymous) resident
memory during the send, sampled every 2 ms from ``/proc/self/statm``: copies
the sender makes besides the one into the shared-memory object store.

    python benchmarks/bench_ray.py              # 1 GiB seed, PPO 2560x(1k+1k), jagged 6400x(1..20480)
    python benchmarks/bench_ray.py --quick      # small batches, to try the script
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ray  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from arrow_dataproto import DataProto, receive_options, to_arrow  # noqa: E402
from arrow_dataproto.pickling import batch_state, rebuild_dataproto  # noqa: E402
from arrow_dataproto.transport import receive_as  # noqa: E402
from benchmarks.batches import jagged_batch, nbytes, ppo_batch, seed_batch  # noqa: E402
from benchmarks.rivals import (  # noqa: E402
    NumpyFloor,
    TDConsolidated,
    VerlDataProto,
    VerlDefaultLike,
    VerlNumpyLike,
    verl_unavailable_reason,
)

CHILD_FLAG = "--child-ray-torch"
RESULT_PREFIX = "RESULT "
FLOOR, FLOOR_CLONE = "numpy_floor", "numpy_floor+clone"
OURS_COPY, OURS_ZERO = "ours_copy", "ours_zero_copy"
VERL_NUMPY, VERL_DEFAULT = "verl_numpy_like", "verl_default_like"


# ---------------------------------------------------------------- batches


def batches(quick: bool) -> dict:
    """name -> builder of ``(td, non_tensor, meta)``."""
    if quick:
        return {
            "seed": lambda: (seed_batch(640, 2048), {}, {}),
            "ppo": lambda: ppo_batch(256, 128, 128),
            "jagged": lambda: (jagged_batch(640, 2048), {}, {}),
        }
    return {
        "seed": lambda: (seed_batch(), {}, {}),
        "ppo": lambda: ppo_batch(),
        "jagged": lambda: (jagged_batch(), {}, {}),
    }


def tiny():
    return ppo_batch(4, 3, 3)


def tiny_jagged():
    return jagged_batch(4, 5), {}, {}


# ---------------------------------------------------------------- paths


def _parts(dp: DataProto):
    return dp.batch, dp.non_tensor_batch, dp.meta_info


class Ours:
    """A DataProto as is (the default copy), or wrapped by ``receive_as(copy=False)``."""

    def __init__(self, copy: bool):
        self.copy = copy
        self.name = OURS_COPY if copy else OURS_ZERO

    def encode(self, td, non_tensor, meta):
        dp = DataProto(td, non_tensor, meta)
        return dp if self.copy else receive_as(dp, copy=False)

    def decode(self, dp):
        return _parts(dp)


class RegisteredDataProto(DataProto):
    """Pickled by the serializer that :meth:`OursRegistered.register` gives Ray, not by ``__reduce_ex__``."""


def _serialize(dp):
    return batch_state(to_arrow(dp))


def _deserialize(state):
    with receive_options(copy=False):
        return rebuild_dataproto(*state)


class OursRegistered:
    name = "ours_register_serializer"

    @staticmethod
    def register():
        ray.util.register_serializer(RegisteredDataProto, serializer=_serialize, deserializer=_deserialize)

    def encode(self, td, non_tensor, meta):
        return RegisteredDataProto(td, non_tensor, meta)

    def decode(self, dp):
        return _parts(dp)


class FloorClone(NumpyFloor):
    """The floor, then one ``clone()`` of every tensor: the floor plus one memory copy."""

    name = FLOOR_CLONE

    def decode(self, payload):
        td, non_tensor, meta = super().decode(payload)
        return td.apply(lambda t: t.clone()), non_tensor, meta


class RayTorch:
    """Plain torch tensors, pickled by Ray's reducer when RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1."""

    name = "ray_torch_zero_copy"

    def encode(self, td, non_tensor, meta):
        tensors = {k: v for k, v in td.items(include_nested=True, leaves_only=True)}
        return (tensors, tuple(td.batch_size)), non_tensor, meta

    def decode(self, payload):
        (tensors, batch_size), non_tensor, meta = payload
        return TensorDict(tensors, batch_size=batch_size), non_tensor, meta


def parent_paths() -> list:
    paths = [NumpyFloor(), FloorClone(), Ours(copy=False), Ours(copy=True), OursRegistered(),
             VerlNumpyLike(), VerlDefaultLike(), TDConsolidated()]
    if verl_unavailable_reason() is None:
        paths += [VerlDataProto("numpy"), VerlDataProto("default")]
    return paths


# ---------------------------------------------------------------- the actor


def touch(td: TensorDict) -> float:
    """Read the last element of every tensor (values of a nested one)."""
    total = 0.0
    for t in td.values(include_nested=True, leaves_only=True):
        t = t.values() if t.is_nested else t
        total += float(t[(-1,) * t.dim()])
    return total


@ray.remote(num_cpus=1)
class Receiver:
    def receive(self, payload, path) -> float:
        td, _, _ = path.decode(payload)
        return touch(td)

    def collect(self) -> None:
        gc.collect()


# ---------------------------------------------------------------- sender memory


def _private_bytes() -> int:
    """Resident anonymous memory of this process (resident minus file-backed and shared pages)."""
    with open("/proc/self/statm") as f:
        _, resident, shared = (int(x) for x in f.read().split()[:3])
    return (resident - shared) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler:
    """Largest growth of :func:`_private_bytes` while the ``with`` block runs."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.peak = interval, 0

    def __enter__(self):
        self.base = _private_bytes()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, _private_bytes() - self.base)

    def __exit__(self, *exc):
        self.peak = max(self.peak, _private_bytes() - self.base)
        self.stop.set()
        self.thread.join()


# ---------------------------------------------------------------- measuring


def run_once(actor, path, data) -> dict:
    gc.collect()
    ray.get(actor.collect.remote())
    time.sleep(0.5)  # let the store process the release of the last object before the next put
    start = time.perf_counter()
    with PeakSampler() as sampler:
        payload = path.encode(*data)
        ref = ray.put(payload)
    sent = time.perf_counter()
    del payload
    ray.get(actor.receive.remote(ref, path))
    end = time.perf_counter()
    del ref
    return {"send": sent - start, "total": end - start, "peak": sampler.peak}


def measure(actor, paths, builders, repeats: int, log) -> list[dict]:
    """Median of ``repeats`` runs per (batch, path); the paths take turns within each
    repeat, so that a change in the machine's load hits them alike."""
    rows = []
    for path in paths:  # warm up imports and code paths in the actor
        run_once(actor, path, tiny())
        run_once(actor, path, tiny_jagged())
    for batch_name, build in builders.items():
        data = build()
        runs = {path.name: [] for path in paths}
        for _ in range(repeats):
            for path in paths:
                runs[path.name].append(run_once(actor, path, data))
        for path in paths:
            row = {"batch": batch_name, "path": path.name, "bytes": nbytes(data[0]), "repeats": repeats}
            row.update({key: statistics.median(r[key] for r in runs[path.name]) for key in ("send", "total")})
            row["best"] = min(r["total"] for r in runs[path.name])
            row["peak"] = max(r["peak"] for r in runs[path.name])
            rows.append(row)
            log(f"{batch_name:7s} {path.name:26s} total {row['total']:8.3f} s  send {row['send']:7.3f} s  "
                f"sender peak {row['peak'] / 2**20:8.0f} MiB")
        del data
        gc.collect()
    return rows


def start_ray(store_gib: float) -> None:
    ray.init(
        num_cpus=2,
        object_store_memory=int(store_gib * 2**30),
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )


def run_session(paths, args, log) -> list[dict]:
    wanted = set(args.paths.split(",")) if args.paths else None
    paths = [p for p in paths if wanted is None or p.name in wanted]
    builders = {k: v for k, v in batches(args.quick).items() if k in args.batches.split(",")}
    start_ray(args.store_gib)
    try:
        if any(isinstance(p, OursRegistered) for p in paths):
            OursRegistered.register()
        actor = Receiver.remote()
        return measure(actor, paths, builders, args.repeats, log)
    finally:
        ray.shutdown()


def run_child(args) -> list[dict]:
    """The Ray-reducer path, in a child process whose Ray has the reducer enabled."""
    command = [sys.executable, __file__, CHILD_FLAG, "--repeats", str(args.repeats), "--store-gib", str(args.store_gib),
               "--batches", args.batches]
    if args.quick:
        command.append("--quick")
    env = {**os.environ, "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}
    child = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in child.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if child.returncode or not lines:
        raise RuntimeError(f"child run failed ({child.returncode}):\n{child.stdout[-3000:]}\n{child.stderr[-5000:]}")
    for line in child.stdout.splitlines():
        if not line.startswith(RESULT_PREFIX):
            print("  [child]", line, flush=True)
    return json.loads(lines[-1][len(RESULT_PREFIX):])


# ---------------------------------------------------------------- reporting


def _by(rows, batch, path):
    return next((r for r in rows if r["batch"] == batch and r["path"] == path), None)


def table(rows) -> str:
    nan = {"total": float("nan")}  # a reference path left out with --paths
    out = []
    for batch in dict.fromkeys(r["batch"] for r in rows):
        size = next(r["bytes"] for r in rows if r["batch"] == batch)
        floor, verl_np, verl_def = (_by(rows, batch, p) or nan for p in (FLOOR, VERL_NUMPY, VERL_DEFAULT))
        out += [
            f"\n### {batch} batch ({size / 2**20:,.0f} MiB of tensors)\n",
            "| path | total s | best s | send s | receive s | × floor | × faster than verl numpy "
            "| × faster than verl default | sender peak MiB (× batch) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["total"]):
            out.append(
                f"| {r['path']} | {r['total']:.3f} | {r['best']:.3f} | {r['send']:.3f} | {r['total'] - r['send']:.3f} "
                f"| {r['total'] / floor['total']:.2f} | {verl_np['total'] / r['total']:.1f} "
                f"| {verl_def['total'] / r['total']:.1f} | {r['peak'] / 2**20:,.0f} ({r['peak'] / size:.2f}) |"
            )
    return "\n".join(out)


def targets(rows) -> str:
    def t(batch, path):
        r = _by(rows, batch, path)
        return r["total"] if r else float("nan")

    checks = [
        ("seed: zero-copy within 1.2x of the floor", t("seed", OURS_ZERO) / t("seed", FLOOR), "<=", 1.2),
        ("seed: safe default within the floor + one copy (x1.1)", t("seed", OURS_COPY) / t("seed", FLOOR_CLONE), "<=", 1.1),
        ("seed: safe default >= 5x faster than verl numpy", t("seed", VERL_NUMPY) / t("seed", OURS_COPY), ">=", 5),
        ("seed: zero-copy >= 5x faster than verl numpy", t("seed", VERL_NUMPY) / t("seed", OURS_ZERO), ">=", 5),
        ("seed: safe default >= 40x faster than verl default", t("seed", VERL_DEFAULT) / t("seed", OURS_COPY), ">=", 40),
        ("seed: zero-copy >= 40x faster than verl default", t("seed", VERL_DEFAULT) / t("seed", OURS_ZERO), ">=", 40),
        ("jagged: safe default >= 50x faster than verl numpy", t("jagged", VERL_NUMPY) / t("jagged", OURS_COPY), ">=", 50),
        ("jagged: zero-copy >= 50x faster than verl numpy", t("jagged", VERL_NUMPY) / t("jagged", OURS_ZERO), ">=", 50),
        ("ppo: zero-copy within 1.2x of the floor", t("ppo", OURS_ZERO) / t("ppo", FLOOR), "<=", 1.2),
        ("jagged: zero-copy within 1.2x of the floor", t("jagged", OURS_ZERO) / t("jagged", FLOOR), "<=", 1.2),
        ("jagged, for context: the floor itself >= 50x faster than verl numpy", t("jagged", VERL_NUMPY) / t("jagged", FLOOR), ">=", 50),
        ("seed, for context: the floor itself >= 40x faster than verl default", t("seed", VERL_DEFAULT) / t("seed", FLOOR), ">=", 40),
    ]
    lines = ["| target | measured | met |", "|---|---:|---|"]
    for label, value, op, bound in checks:
        met = value <= bound if op == "<=" else value >= bound
        lines.append(f"| {label} | {value:.2f} | {'yes' if met else '**no**'} |")
    return "\n".join(lines)


def chart(rows, path: Path) -> None:
    """One horizontal bar chart per batch (log scale), paths in the same order in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    batch_names = list(dict.fromkeys(r["batch"] for r in rows))
    path_names = sorted(dict.fromkeys(r["path"] for r in rows), key=lambda p: _by(rows, batch_names[0], p)["total"])
    fig, axes = plt.subplots(1, len(batch_names), figsize=(5.5 * len(batch_names), 4.5), squeeze=False)
    for ax, batch in zip(axes[0], batch_names):
        values = [(_by(rows, batch, p) or {}).get("total", float("nan")) for p in path_names]
        colors = ["tab:green" if p.startswith("ours") else "tab:gray" if "floor" in p else "tab:red" for p in path_names]
        ax.barh(path_names, values, color=colors)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{batch} batch ({next(r['bytes'] for r in rows if r['batch'] == batch) / 2**20:,.0f} MiB)")
        ax.set_xlabel("seconds, driver → actor → tensors in hand (log)")
        ax.invert_yaxis()
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.3g}", va="center", fontsize=8)
        ax.set_xlim(right=max(values) * 3)
    fig.suptitle("DataProto through Ray (green: arrow-dataproto, grey: floor, red: rivals); lower is better")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(rows, args, command: str) -> str:
    verl_note = (
        "verl is importable: the real `verl_dataproto*` rows are verl 0.9.1's own pickling."
        if verl_unavailable_reason() is None
        else "verl is not installed here: `verl_*_like` are faithful re-implementations of verl 0.9.1's two "
        "pickling modes (benchmarks/rivals.py)."
    )
    return f"""# Ray transport: driver → actor → tensors in hand

Command: `{command}`

Machine: {os.cpu_count()} cores, Python {platform.python_version()}, Ray {ray.__version__}, torch {torch.__version__};
object store bounded to {args.store_gib} GiB; the receiving actor has `num_cpus=1` (so 1 torch thread);
median of {args.repeats} runs per cell (the paths take turns in each repeat), after a warm-up on tiny batches;
a 0.5 s pause before each run lets the store release the previous object.

- total = encode + `ray.put` (send) + remote call + receive (Ray's unpickling of the argument, the rest
  of the decode, reading one element of every tensor); median, and best of the runs; the ratios use medians.
- sender peak = largest growth of the driver's private resident memory during the send (sampled every
  2 ms), i.e. copies besides the one into the shared-memory object store; × batch = over the tensor bytes.
- `numpy_floor+clone` = the floor followed by a `clone()` of every tensor in the actor: the floor plus one
  memory copy, the budget of the safe default.
- `ray_torch_zero_copy` ran in a child process (`RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1` must be set before
  Ray is imported), in its own Ray session started after this one ended.
- {verl_note}
{table(rows)}

## Targets (issue 3)

{targets(rows)}

The safe default copies every tensor once in the receiver, as verl's numpy mode does (its `bytearray`),
so it cannot be several times faster than that mode: the ratios over verl's modes are the zero-copy
mode's to reach, and no path can beat the floor's own ratio (the "for context" rows). The verl rows are
measured here, side by side; the issue's own figures for real verl 0.9.1 on this machine were 12.3 s
(default) and 1.45 s (numpy) for the seed batch.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small batches (a few MiB), to try the script")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store-gib", type=float, default=8.0, help="object store size of each Ray session")
    parser.add_argument("--batches", default="seed,ppo,jagged", help="comma-separated subset of seed,ppo,jagged")
    parser.add_argument("--paths", help="comma-separated subset of the paths (default: all)")
    parser.add_argument("--no-child", action="store_true", help="skip the Ray-reducer path (child process)")
    parser.add_argument("--out", type=Path, help="results file (default: benchmarks/results/ray.md, none with --quick)")
    parser.add_argument("--chart", type=Path, help="chart file (default: benchmarks/ray_chart.png, none with --quick)")
    parser.add_argument(CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # nested-tensor prototype and Ray zero-copy notices

    if args.child_ray_torch:
        rows = run_session([RayTorch()], args, lambda line: print(line, flush=True))
        print(RESULT_PREFIX + json.dumps(rows), flush=True)
        return

    command = "python " + " ".join([str(Path(sys.argv[0]).resolve().relative_to(ROOT))] + sys.argv[1:])
    rows = run_session(parent_paths(), args, lambda line: print(line, flush=True))
    if not args.no_child:
        rows += run_child(args)
    text = report(rows, args, command)
    print(text)
    if not args.quick:
        args.out = args.out or ROOT / "benchmarks" / "results" / "ray.md"
        args.chart = args.chart or ROOT / "benchmarks" / "ray_chart.png"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    if args.chart:
        chart(rows, args.chart)
        print(f"wrote {args.chart}")


if __name__ == "__main__":
    main()
