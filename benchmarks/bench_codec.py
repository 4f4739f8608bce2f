"""Encode and decode cost, ours against the rivals, side by side in one run.

For every path, *encode* is what the sender does before bytes can move (the
rival's own encode plus ``pickle.dumps(protocol=5, buffer_callback=...)``, which
is what Ray does), and *decode* is what the receiver does to hold tensors again
(``pickle.loads`` plus the rival's decode). Out-of-band buffers are handed over
as they are, as Ray hands them over, so no transport cost is included here.

    python benchmarks/bench_codec.py            # seed batch (1 GiB), PPO batch, two small PPO batches
    python benchmarks/bench_codec.py --small    # the two small PPO batches only (with verl installed:
                                                # where verl's class under install() skips Arrow)
    python benchmarks/bench_codec.py --quick    # small sizes, a smoke run

Prints a table with ratios against our zero-copy path; a full run also writes
it to ``benchmarks/results/codec.md`` (``--out`` to choose another file).
"""

from __future__ import annotations

import gc
import pickle

from batches import nbytes, ppo_batch, seed_batch
from harness import OursIpc, OursPickled, VerlInstalled, arguments, command, interleaved, pair, ratio, save
from rivals import all_rivals, verl_unavailable_reason

import arrow_dataproto as adp


def _pickled(obj):
    buffers: list = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return payload, buffers


def _tasks(path, td, non_tensor, meta) -> dict:
    """The encode and decode tasks of one path (decode reads a payload encoded once, untimed)."""
    payload, buffers = _pickled(path.encode(td, non_tensor, meta))

    def decode():
        with adp.receive_options(copy=getattr(path, "copy", True)):
            return path.decode(pickle.loads(payload, buffers=buffers))

    return {
        (path.name, "encode"): (lambda: _pickled(path.encode(td, non_tensor, meta)), None),
        (path.name, "decode"): (decode, None),
    }


def run(cases, repeats: int) -> list[tuple]:
    """Rows ``(batch, path, encode Timing, decode Timing)``; the paths take turns in every
    round, in reverse order every other round."""
    paths = [OursPickled(copy=False), OursPickled(copy=True), OursIpc(), *all_rivals()]
    if verl_unavailable_reason() is None:  # verl's own class under install(): small ones skip Arrow
        paths += [VerlInstalled(compact=True), VerlInstalled(compact=False)]
    rows = []
    for case_name, build in cases:
        td, non_tensor, meta = build()
        print(f"\n{case_name}: {nbytes(td) / 2**20:.0f} MiB of tensors", flush=True)
        tasks: dict = {}
        for path in paths:
            tasks.update(_tasks(path, td, non_tensor, meta))
        timings = interleaved(tasks, repeats, alternate=True)  # no path always follows the same neighbour
        for path in paths:
            encode, decode = timings[path.name, "encode"], timings[path.name, "decode"]
            rows.append((case_name, path.name, encode, decode))
            print(f"  {path.name:<34} encode {pair(encode, 2, 1e3)} ms   decode {pair(decode, 2, 1e3)} ms", flush=True)
        del td, non_tensor, meta, tasks
        gc.collect()
    return rows


def table(rows, command_line: str) -> str:
    lines = [
        "## Codec: encode and decode (`benchmarks/bench_codec.py`)",
        "",
        f"Command: `{command_line}`. Times: median (best) of the repeats after a warm-up round, the paths",
        "taking turns in each round (in reverse order every other round); ratios are medians against",
        "arrow_dataproto zero-copy (higher = slower than ours).",
        "",
        "| batch | path | encode ms | decode ms | encode x | decode x |",
        "|---|---|---:|---:|---:|---:|",
    ]
    baseline: dict = {}
    for case, name, encode, decode in rows:
        base_encode, base_decode = baseline.setdefault(case, (encode, decode))
        lines.append(
            f"| {case} | {name} | {pair(encode, 2, 1e3)} | {pair(decode, 2, 1e3)} | "
            f"{ratio(encode, base_encode)} | {ratio(decode, base_decode)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments(
        __doc__, "codec.md", repeats=5, quick="small batches",
        more=lambda p: p.add_argument("--small", action="store_true", help="only the two small PPO batches"),
    )
    small = [
        ("PPO 16x(256+256), small", lambda: ppo_batch(16, 256, 256)),
        ("PPO 256x(256+256), small", lambda: ppo_batch(256, 256, 256)),
    ]
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
            *small,
        ]
        if args.small:
            cases = small
        repeats = args.repeats
    rows = run(cases, repeats)
    save(table(rows, command("bench_codec.py")), args.out)


if __name__ == "__main__":
    main()
