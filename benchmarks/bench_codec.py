"""Encode and decode cost, ours against the rivals, side by side in one run.

For every path, *encode* is what the sender does before bytes can move (the
rival's own encode plus ``pickle.dumps(protocol=5, buffer_callback=...)``, which
is what Ray does), and *decode* is what the receiver does to hold tensors again
(``pickle.loads`` plus the rival's decode). Out-of-band buffers are handed over
as they are, as Ray hands them over, so no transport cost is included here.

    python benchmarks/bench_codec.py            # seed batch (1 GiB) and PPO batch
    python benchmarks/bench_codec.py --quick    # small sizes, a smoke run

Prints a table with ratios against our zero-copy path; a full run also writes
it to ``benchmarks/results/codec.md`` (``--out`` to choose another file).
"""

from __future__ import annotations

import argparse
import gc
import pickle
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batches import nbytes, ppo_batch, seed_batch  # noqa: E402
from rivals import all_rivals  # noqa: E402

import arrow_dataproto as adp  # noqa: E402


def _median_time(fn, repeats: int) -> tuple[float, object]:
    """Median wall time of ``repeats`` calls after one untimed warm-up call, and the last result."""
    fn()
    times, result = [], None
    for _ in range(repeats):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _pickled(obj):
    buffers: list = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return payload, buffers


class Ours:
    """arrow_dataproto: DataProto pickled through Arrow; decode with the given receive options."""

    def __init__(self, copy: bool):
        self.copy = copy
        self.name = f"arrow_dataproto ({'copy' if copy else 'zero-copy'})"

    def encode(self, td, non_tensor, meta):
        return adp.DataProto(td, non_tensor, meta)

    def decode(self, payload):
        return payload  # already rebuilt by pickle.loads under receive_options


class OursIpc:
    """arrow_dataproto as one Arrow IPC stream: ``to_ipc`` (one copy) and ``from_ipc`` (zero-copy views)."""

    name = "arrow_dataproto IPC stream"

    def encode(self, td, non_tensor, meta):
        return adp.to_ipc(adp.DataProto(td, non_tensor, meta))

    def decode(self, payload):
        return adp.from_ipc(payload)


def _measure(path, td, non_tensor, meta, repeats: int) -> tuple[float, float]:
    encode_s, (payload, buffers) = _median_time(lambda: _pickled(path.encode(td, non_tensor, meta)), repeats)

    def decode():
        with adp.receive_options(copy=getattr(path, "copy", True)):
            return path.decode(pickle.loads(payload, buffers=buffers))

    decode_s, _ = _median_time(decode, repeats)
    return encode_s, decode_s


def run(cases, repeats: int) -> list[tuple]:
    paths = [Ours(copy=False), Ours(copy=True), OursIpc(), *all_rivals()]
    rows = []
    for case_name, build in cases:
        td, non_tensor, meta = build()
        size = nbytes(td)
        print(f"\n{case_name}: {size / 2**20:.0f} MiB of tensors", flush=True)
        results = {}
        for path in paths:
            encode_s, decode_s = _measure(path, td, non_tensor, meta, repeats)
            results[path.name] = (encode_s, decode_s)
            print(f"  {path.name:<34} encode {encode_s * 1e3:10.2f} ms   decode {decode_s * 1e3:10.2f} ms", flush=True)
        base_encode, base_decode = results[paths[0].name]
        for name, (encode_s, decode_s) in results.items():
            rows.append((case_name, name, encode_s, decode_s, encode_s / base_encode, decode_s / base_decode))
        del td, non_tensor, meta
        gc.collect()
    return rows


def table(rows, command: str) -> str:
    lines = [
        "## Codec: encode and decode (`benchmarks/bench_codec.py`)",
        "",
        f"Command: `{command}`. Median of the repeats; ratios are against arrow_dataproto zero-copy "
        "(higher = slower than ours).",
        "",
        "| batch | path | encode ms | decode ms | encode x | decode x |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for case, name, e, d, er, dr in rows:
        lines.append(f"| {case} | {name} | {e * 1e3:.2f} | {d * 1e3:.2f} | {er:.1f} | {dr:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="where to write the table (default: results/codec.md on a full run)")
    args = parser.parse_args()
    if args.quick:
        cases = [
            ("seed 64x20480 int64", lambda: (seed_batch(64, 20480), {}, {})),
            ("PPO 64x(256+256)", lambda: ppo_batch(64, 256, 256)),
        ]
        repeats = 1
    else:
        cases = [
            ("seed 6400x20480 int64 (1 GiB)", lambda: (seed_batch(), {}, {})),
            ("PPO 2560x(1024+1024)", lambda: ppo_batch()),
        ]
        repeats = args.repeats
    rows = run(cases, repeats)
    text = table(rows, "python " + " ".join(["benchmarks/bench_codec.py", *sys.argv[1:]]))
    print("\n" + text)
    out = args.out or (None if args.quick else HERE / "results" / "codec.md")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)


if __name__ == "__main__":
    main()
