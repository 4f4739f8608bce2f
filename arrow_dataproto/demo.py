"""The demo: build a realistic PPO batch, round-trip it every way, print what happened.

Run ``python -m arrow_dataproto.demo`` (``--rows``/``--prompt``/``--response`` to
resize, ``--no-ray`` to skip the Ray actor round trip, which starts a local Ray).
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time

import torch

from . import DataProto, from_ipc, receive_options, to_arrow, to_ipc
from .files import open_file, write_file
from .testing.samples import ppo_batch


def _timed(label: str, fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    print(f"  {label:<44} {1000 * (time.perf_counter() - start):9.2f} ms")
    return result


def _check(label: str, original: DataProto, other: DataProto) -> None:
    same = list(original.batch.keys()) == list(other.batch.keys()) and all(
        torch.equal(original.batch[k], other.batch[k]) for k in original.batch.keys()
    )
    same = same and all((original.non_tensor_batch[k] == other.non_tensor_batch[k]).all() for k in original.non_tensor_batch)
    same = same and original.meta_info == other.meta_info
    print(f"  {label:<44} {'exact' if same else 'MISMATCH'}")
    if not same:
        raise SystemExit(f"demo: {label} did not round-trip exactly")


def _ray_round_trip(data: DataProto) -> None:
    try:
        import ray
    except ImportError:
        print("  ray is not installed: skipping the actor round trip")
        return

    @ray.remote
    class Learner:
        def update(self, batch: DataProto) -> DataProto:
            batch.batch["advantages"].mul_(2)  # the default receive mode copies: safe to write
            return batch.select(batch_keys=["advantages"], non_tensor_batch_keys=["uid"])

    start = time.perf_counter()
    ray.init(num_cpus=1, object_store_memory=2 * 1024**3, include_dashboard=False, log_to_driver=False)
    print(f"  {'ray.init':<44} {1000 * (time.perf_counter() - start):9.2f} ms")
    try:
        learner = Learner.remote()
        ray.get(learner.update.remote(data[:2]))  # warm-up: the worker imports torch and this library once
        ref = _timed("ray.put (one copy into the object store)", ray.put, data)
        result = _timed("actor.update(ref) and ray.get of its result", lambda: ray.get(learner.update.remote(ref)))
        with receive_options(copy=False):
            _timed("ray.get(ref) zero-copy (read-only views)", ray.get, ref)
        ok = torch.equal(result.batch["advantages"], data.batch["advantages"] * 2)
        ok = ok and (result.non_tensor_batch["uid"] == data.non_tensor_batch["uid"]).all()
        print(f"  {'actor saw and returned exact data':<44} {'yes' if ok else 'NO'}")
        if not ok:
            raise SystemExit("demo: the actor round trip was not exact")
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2560)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--response", type=int, default=1024)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray actor round trip")
    args = parser.parse_args(argv)

    batch, non_tensor, meta_info = ppo_batch(args.rows, args.prompt, args.response)
    data = DataProto(batch, non_tensor, meta_info)
    tensor_bytes = sum(t.nbytes for t in batch.values())
    print(f"PPO batch: {len(data)} rows x ({args.prompt} prompt + {args.response} response) tokens")
    print(f"  {len(batch.keys())} tensor columns, {tensor_bytes / 2**20:.1f} MiB; non-tensor {list(non_tensor)}")
    print(f"  meta_info keys {list(meta_info)}\n")

    print("Codec (tensor bytes are never copied by encode or decode):")
    to_arrow(data[:2])  # warm-up: pyarrow's first conversions initialise its type machinery
    record_batch = _timed("to_arrow", to_arrow, data)
    print(f"  {'':<44} {record_batch.num_columns} columns, {record_batch.num_rows} rows")
    buffer = _timed("to_ipc (one copy into one IPC buffer)", to_ipc, data)
    decoded = _timed("from_ipc (zero-copy views of that buffer)", from_ipc, buffer)
    _check("from_ipc(to_ipc(batch))", data, decoded)

    print("\nPickle protocol 5 (what Ray uses):")
    buffers: list = []
    payload = _timed("pickle.dumps with out-of-band buffers", pickle.dumps, data, protocol=5, buffer_callback=buffers.append)
    oob = sum(b.raw().nbytes for b in buffers)
    print(f"  {'':<44} in-band {len(payload) / 1024:.1f} KiB, out-of-band {oob / 2**20:.1f} MiB in {len(buffers)} buffers")
    unpickled = _timed("pickle.loads (copy policy: one copy)", pickle.loads, payload, buffers=buffers)
    _check("pickle round trip", data, unpickled)

    print("\nArrow file on disk:")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.arrow")
        _timed("write_file", write_file, path, data)
        with open_file(path) as reader:
            from_disk = _timed("read_batch (memory-mapped, no byte read)", reader.read_batch, 0)
            _check("file round trip", data, from_disk)
            columns = _timed("read_batch with two columns", reader.read_batch, 0, ["advantages", "uid"])
            print(f"  {'':<44} {list(columns.batch.keys())} + {list(columns.non_tensor_batch)}")

    if not args.no_ray:
        print("\nRay: driver -> actor -> driver:")
        _ray_round_trip(data)
    print("\ndone")


if __name__ == "__main__":
    main()
