"""TensorDict through Ray with and without ``integrations.tensordict.install()``, and a
DataProto through Ray Direct Transport (gloo) against the object store, side by side.

1. ``ray.put(td)``, driver -> actor reads every byte, 116 MiB PPO TensorDict: the floor (bare
   numpy arrays of the same bytes), tensordict's own pickling, and ours under ``install()``
   (the actor has the setup hook); ratios to the floor.
2. A 256 MiB PPO DataProto returned by one actor and read whole by another: the method
   declared ``@ray.method(tensor_transport="gloo")`` (tensors over gloo) against the same
   method without it (object store); the bytes the direct-transport object leaves in band.

Timings: ``harness.interleaved`` (warm-up, interleaved rounds, median (best)).
``python benchmarks/bench_rdt.py`` writes ``benchmarks/results/rdt.md``; ``--quick`` is small.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray.experimental.collective import create_collective_group  # noqa: E402

import arrow_dataproto as adp  # noqa: E402
from arrow_dataproto.integrations import tensordict as adp_td  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks.batches import nbytes, ppo_batch  # noqa: E402

HOOK = ray._private.runtime_env.setup_hook.export_setup_func_module({}, "arrow_dataproto.integrations.tensordict.install")
ROW_BYTES = 98304  # ppo_batch(rows, 1024, 1024): bytes of tensors per row


def read_all(value) -> int:
    """Touch every byte of every tensor or array in ``value`` (a TensorDict, a DataProto, a dict of
    arrays), with the same numpy sum for every path."""
    if isinstance(value, dict):
        arrays = list(value.values())
    else:
        td = value.batch if isinstance(value, adp.DataProto) else value
        arrays = [t.reshape(-1).view(torch.uint8).numpy() for t in td.values(include_nested=True, leaves_only=True)]
    return sum(int(np.asarray(a).reshape(-1).view(np.uint8).sum()) for a in arrays)


@ray.remote(enable_tensor_transport=True)
class Reader:
    def read(self, value):
        return read_all(value)

    def installed(self):
        return adp_td.is_installed()


@ray.remote
class Sender:
    def __init__(self, rows: int):
        td, non_tensor, meta = ppo_batch(rows, 1024, 1024)
        self.dp = adp.DataProto(td, non_tensor, meta)

    @ray.method(tensor_transport="gloo")
    def by_gloo(self):
        return self.dp

    def by_object_store(self):
        return self.dp

    def in_band_bytes(self):
        context = ray._private.worker.global_worker.get_serialization_context()
        serialized, tensors = context.serialize_rdt_objects(self.dp, "GLOO")
        return serialized.total_bytes, sum(t.numel() for t in tensors)


def main() -> int:
    args = harness.arguments(__doc__, "rdt.md", repeats=5, quick="16 MiB batches")
    repeats = 1 if args.quick else args.repeats
    put_rows = 160 if args.quick else 1240  # 116 MiB
    rdt_rows = 170 if args.quick else 2731  # 256 MiB
    ray.init(num_cpus=2, object_store_memory=2 * 2**30, include_dashboard=False)
    try:
        lines = [f"# TensorDict and Ray Direct Transport through Ray", "", harness.command("bench_rdt.py"), ""]
        lines += put_table(put_rows, repeats) + [""] + rdt_table(rdt_rows, repeats)
    finally:
        ray.shutdown()
    harness.save("\n".join(lines) + "\n", args.out)
    return 0


def put_table(rows: int, repeats: int) -> list[str]:
    td, _, _ = ppo_batch(rows, 1024, 1024)
    arrays = {k: t.numpy() for k, t in td.items()}
    plain, hooked = Reader.remote(), Reader.options(runtime_env=HOOK).remote()
    assert not ray.get(plain.installed.remote()) and ray.get(hooked.installed.remote())
    expected = read_all(td)

    def through(reader, value, install: bool):
        def run():
            if install:
                adp_td.install()
            try:
                assert ray.get(reader.read.remote(ray.put(value))) == expected
            finally:
                adp_td.uninstall()
        return run

    tasks = {
        "floor: bare numpy arrays": (through(plain, arrays, False), None),
        "ray.put(td), tensordict's pickling": (through(plain, td, False), None),
        "ray.put(td), install() (driver and actor)": (through(hooked, td, True), None),
    }
    timings = harness.interleaved(tasks, repeats)
    floor = timings["floor: bare numpy arrays"]
    lines = [
        f"## ray.put(td) -> actor reads every byte ({nbytes(td) / 2**20:.0f} MiB PPO TensorDict, {rows} rows)",
        "",
        "| path | seconds | x floor |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {harness.pair(t)} | {harness.ratio(t, floor, 2)} |" for name, t in timings.items()]
    return lines


def rdt_table(rows: int, repeats: int) -> list[str]:
    sender, reader = Sender.remote(rows), Reader.remote()
    create_collective_group([sender, reader], backend="torch_gloo")
    in_band, through_gloo = ray.get(sender.in_band_bytes.remote())
    expected = ray.get(reader.read.remote(sender.by_object_store.remote()))

    def via(method):
        def run():
            assert ray.get(reader.read.remote(method.remote())) == expected
        return run

    timings = harness.interleaved(
        {"object store (plain method)": (via(sender.by_object_store), None),
         "gloo (tensor_transport='gloo')": (via(sender.by_gloo), None)},
        repeats,
    )
    base = timings["object store (plain method)"]
    return [
        f"## DataProto returned by one actor, read whole by another ({through_gloo / 2**20:.0f} MiB, {rows} rows)",
        "",
        f"Direct transport: {through_gloo} bytes of tensors over gloo, {in_band} bytes in the object store.",
        "",
        "| path | seconds | x object store |",
        "|---|---:|---:|",
        *[f"| {name} | {harness.pair(t)} | {harness.ratio(t, base, 2)} |" for name, t in timings.items()],
    ]


if __name__ == "__main__":
    sys.exit(main())
