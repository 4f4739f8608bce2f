"""Decode onto a CUDA device: exactness on the device and time against the bare H2D copy.

Run by ``scripts/device_check.sh`` on a machine with CUDA (``python benchmarks/bench_device.py``);
without CUDA it says so and exits 0. Checks, each printed PASS/FAIL:

- bit-exactness on the device of every float8 dtype, bfloat16, float16, bool, complex and a
  jagged and a strided nested tensor, decoded with ``device="cuda"`` from IPC and from Ray;
- times (median and best, interleaved): the H2D floor (``tensor.to("cuda")`` of the same
  bytes from pageable memory, and from pinned host staging with ``non_blocking=True``)
  against ``from_ipc(buf, device="cuda")`` and ``ray.get`` under
  ``receive_options(device="cuda")``: the decode's only copy is the H2D transfer, so the
  ratios to the pageable floor should be near 1.

Results: ``benchmarks/results/device.md`` (``--out`` elsewhere); exit status 1 if a check fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import arrow_dataproto as adp  # noqa: E402
from arrow_dataproto.testing import assert_dataproto_equal  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks.batches import nbytes, ppo_batch  # noqa: E402

FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)]


def every_dtype(rows: int = 64) -> adp.DataProto:
    """One column per exotic dtype (random bits, NaN patterns included) plus jagged and strided nested tensors."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 256, (rows, 32), dtype=torch.uint8, generator=g)
    columns = {f"fp8_{i}": bits.view(dtype) for i, dtype in enumerate(FP8)}
    columns["bf16"] = bits.view(torch.bfloat16)
    columns["f16"] = bits.view(torch.float16)
    columns["c64"] = bits.view(torch.complex64)
    columns["bool"] = bits % 2 == 0
    columns["jagged"] = torch.nested.nested_tensor(
        [torch.randn(i % 7 + 1, generator=g).bfloat16() for i in range(rows)], layout=torch.jagged
    )
    columns["strided"] = torch.nested.nested_tensor([torch.full((i % 3 + 1, 2), float(i)) for i in range(rows)])
    from tensordict import TensorDict

    return adp.DataProto(TensorDict(columns, batch_size=[rows]), {}, {"step": 1})


def check(name: str, ok_fn) -> tuple[str, bool, str]:
    try:
        ok_fn()
        return name, True, ""
    except Exception as e:  # a check reports, it does not stop the others
        return name, False, f"{type(e).__name__}: {e}"[:300]


def exact_on_device(decoded: adp.DataProto, expected: adp.DataProto) -> None:
    leaves = list(decoded.batch.values(include_nested=True, leaves_only=True))
    devices = {t.device.type for t in leaves}
    assert devices == {"cuda"}, f"tensors on {devices}"
    assert_dataproto_equal(decoded.to("cpu"), expected)


def main() -> int:
    args = harness.arguments(__doc__, "device.md", repeats=5, quick="a 16 MiB batch")
    if not torch.cuda.is_available():
        print("bench_device: no CUDA device here (torch.cuda.is_available() is False): nothing to measure")
        return 0
    import ray

    ray.init(num_cpus=2, object_store_memory=2 * 2**30, include_dashboard=False)
    try:
        sample = every_dtype()
        sample_buf = adp.to_ipc(sample)
        sample_ref = ray.put(sample)

        def from_ray():
            with adp.receive_options(device="cuda"):
                return ray.get(sample_ref)

        checks = [
            check("exact on cuda from IPC (fp8, bf16, f16, complex, bool, jagged, strided)",
                  lambda: exact_on_device(adp.from_ipc(sample_buf, device="cuda"), sample)),
            check("exact on cuda from Ray (same columns)", lambda: exact_on_device(from_ray(), sample)),
            check("receive_mode says copy on cuda", lambda: _mode_is_copy()),
        ]

        rows = 160 if args.quick else 1280  # ~16 MiB or ~116 MiB of PPO tensors
        td, non_tensor, meta = ppo_batch(rows, 1024, 1024)
        dp = adp.DataProto(td, non_tensor, meta)
        size = nbytes(td)
        buf = adp.to_ipc(dp)
        ref = ray.put(dp)
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in td.values(include_nested=True, leaves_only=True)])
        pinned = flat.pin_memory()

        def synced(fn):
            def run():
                out = fn()
                torch.cuda.synchronize()
                return out
            return run

        def ray_get_cuda():
            with adp.receive_options(device="cuda"):
                return ray.get(ref)

        tasks = {
            "H2D floor (pageable .to)": (synced(lambda: flat.to("cuda")), None),
            "H2D pinned staging (non_blocking)": (synced(lambda: pinned.to("cuda", non_blocking=True)), None),
            "from_ipc(device=cuda)": (synced(lambda: adp.from_ipc(buf, device="cuda")), None),
            "ray.get, receive_options(device=cuda)": (synced(ray_get_cuda), None),
        }
        timings = harness.interleaved(tasks, 1 if args.quick else args.repeats)
        floor = timings["H2D floor (pageable .to)"]
        checks.append(check("decoded PPO batch exact on cuda", lambda: exact_on_device(ray_get_cuda(), dp)))
    finally:
        ray.shutdown()

    lines = [
        f"# Device benchmark ({torch.cuda.get_device_name(0)}, torch {torch.__version__})",
        "",
        harness.command("benchmarks/bench_device.py"),
        "",
        f"PPO batch: {rows} rows, {size / 2**20:.0f} MiB of tensors. Seconds: median (best); ratio to the pageable H2D floor.",
        "",
        "| path | seconds | x floor | GB/s |",
        "|---|---:|---:|---:|",
    ]
    for name, timing in timings.items():
        lines.append(f"| {name} | {harness.pair(timing)} | {harness.ratio(timing, floor, 2)} | {size / timing.median / 1e9:.1f} |")
    lines += ["", "| check | result |", "|---|---|"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL ' + why} |" for name, ok, why in checks]
    harness.save("\n".join(lines) + "\n", args.out)
    return 0 if all(ok for _, ok, _ in checks) else 1


def _mode_is_copy() -> None:
    with adp.receive_options(device="cuda"):
        mode = adp.receive_mode()
    assert mode.mode == "copy", mode


if __name__ == "__main__":
    sys.exit(main())
