"""Per-object cost of the pickled (wire) form, against bare bytes, side by side in one process.

For one PPO batch (12 tensors x (256+256) tokens, 3 object columns, ``meta_info``) the cost of
one object is ``pickle.dumps(protocol=5, buffer_callback=...)`` (what Ray does) plus
``pickle.loads`` of that payload with its out-of-band buffers, decoded zero-copy
(``copy=False``: no transport and no copy is counted). The paths:

- ``floor``: the same tensors as a dict of numpy arrays, the object columns and ``meta_info``
  pickled as they are (bare bytes: what any form must at least do);
- ``our DataProto``: :class:`arrow_dataproto.DataProto` (the Arrow form);
- ``verl + install()``: verl's own ``DataProto`` under ``integrations.verl.install()`` (only
  where verl imports: the compat venv);
- ``compact form``: our DataProto pickled as ``install()`` pickles verl's plain batches today
  (``_compact``: each tensor's dtype, shape and bytes, object columns pickled as they are),
  for the same batch where verl is not installed.

The paths take turns in every round (in reverse order every other round); times are the
median (best) of the rounds in milliseconds, ratios the median over the floor's::

    PYTHONPATH=$PWD python benchmarks/bench_wire.py                 # 16, 256 rows; 2 and 64 MiB
    PYTHONPATH=$PWD python benchmarks/bench_wire.py --gib           # and 1 GiB (about 4 GiB of memory)
    PYTHONPATH=$PWD python benchmarks/bench_wire.py --quick         # 16 and 256 rows, print only
    PYTHONPATH=$PWD python benchmarks/bench_wire.py --rollout       # a verl rollout's object columns alone

``--rollout``: the object columns of ``samples.verl_rollout`` (8,192 rows), the same way: as a
DataProto without tensors (the Arrow form: native, JSON or pickled columns) against the numpy
object arrays pickled whole (the floor; what the compact form does with them).
"""

from __future__ import annotations

import gc
import pickle

from batches import nbytes, ppo_batch
from harness import RESULTS, arguments, command, interleaved, pair, ratio, save
from rivals import verl_unavailable_reason

import arrow_dataproto as adp

def _dumps(obj) -> tuple[bytes, list]:
    buffers: list = []
    return pickle.dumps(obj, protocol=5, buffer_callback=buffers.append), buffers


def _floor(td, non_tensor, meta) -> dict:
    tensors = {} if td is None else {k: v.numpy() for k, v in td.items()}
    return {"tensors": tensors, "non_tensor_batch": non_tensor, "meta_info": meta}


def _paths(td, non_tensor, meta) -> dict:
    """Each path's object, built once (the timing is of pickling it, not of building it)."""
    ours = adp.DataProto(td, non_tensor, meta)
    paths = {"floor": _floor(td, non_tensor, meta), "our DataProto": ours, "compact form": _Compact(ours)}
    if verl_unavailable_reason() is None:
        from verl.protocol import DataProto

        from arrow_dataproto.integrations import verl

        verl.install()
        paths["verl + install()"] = DataProto(batch=td, non_tensor_batch=non_tensor, meta_info=meta)
    return paths


class _Compact:
    """Our DataProto pickled in the compact form (``integrations.verl.rebuild_compact``)."""

    def __init__(self, data):
        self.data = data

    def __reduce_ex__(self, protocol):
        from arrow_dataproto import _compact
        from arrow_dataproto.integrations import verl

        return verl.rebuild_compact, (adp.DataProto, _compact.state(self.data))


def _round_trip(obj):
    payload, buffers = _dumps(obj)
    with adp.receive_options(copy=False):
        return pickle.loads(payload, buffers=buffers)


def run(cases, repeats: int) -> list[tuple]:
    """Rows ``(case, path, Timing of dumps + loads)``."""
    rows = []
    for case_name, build in cases:
        td, non_tensor, meta = build()
        print(f"\n{case_name}: {0 if td is None else nbytes(td) / 2**20:.1f} MiB of tensors", flush=True)
        paths = _paths(td, non_tensor, meta)
        timings = interleaved({name: (lambda o=o: _round_trip(o), None) for name, o in paths.items()}, repeats, alternate=True)
        for name, timing in timings.items():
            rows.append((case_name, name, timing))
            print(f"  {name:<20} {pair(timing, 3, 1e3)} ms   x{ratio(timing, timings['floor'], 2)}", flush=True)
        del td, non_tensor, meta, paths
        gc.collect()
    return rows


def table(rows, command_line: str) -> str:
    lines = [
        "## Wire form: per-object cost against bare bytes (`benchmarks/bench_wire.py`)",
        "",
        f"Command: `{command_line}`. One object: `pickle.dumps(protocol=5)` with out-of-band buffers plus",
        "`pickle.loads` under `copy=False`. Median (best) of the rounds in ms, the paths taking turns",
        "(in reverse order every other round); x: median over the floor's (a dict of numpy arrays).",
        "",
        "| batch | path | dumps + loads ms | x floor |",
        "|---|---|---:|---:|",
    ]
    floors = {case: timing for case, name, timing in rows if name == "floor"}
    for case, name, timing in rows:
        lines.append(f"| {case} | {name} | {pair(timing, 3, 1e3)} | {ratio(timing, floors[case], 2)} |")
    return "\n".join(lines) + "\n"


def _rows_for(mib: int) -> int:
    td, _, _ = ppo_batch(16, 256, 256)
    return max(1, round(mib * 2**20 * 16 / nbytes(td)))


def main() -> None:
    args = arguments(
        __doc__, "wire.md", repeats=200, quick="16 and 256 rows",
        more=lambda p: (
            p.add_argument("--gib", action="store_true", help="also a 1 GiB batch"),
            p.add_argument("--rollout", action="store_true", help="a verl rollout's object columns alone"),
        ),
    )
    if args.rollout:
        from arrow_dataproto.testing.samples import verl_rollout

        def rollout():
            _, non_tensor, meta = verl_rollout(8192, 16, 16)
            return None, {k: v for k, v in non_tensor.items() if v.dtype == object}, meta

        rows = run([("verl rollout, object columns, 8192 rows", rollout)], 3 if args.quick else max(5, args.repeats // 20))
        save(table(rows, command("bench_wire.py")), None if args.quick else RESULTS / "wire_rollout.md")
        return
    cases = [
        ("PPO 16x(256+256)", lambda: ppo_batch(16, 256, 256)),
        ("PPO 256x(256+256)", lambda: ppo_batch(256, 256, 256)),
    ]
    repeats = 3 if args.quick else args.repeats
    rows = run(cases, repeats)
    if not args.quick:
        big = [(f"PPO {_rows_for(m)}x(256+256), {m} MiB", lambda m=m: ppo_batch(_rows_for(m), 256, 256)) for m in (2, 64)]
        rows += run(big[:1], max(5, repeats // 4)) + run(big[1:], max(5, repeats // 20))
        if args.gib:
            rows += run([(f"PPO {_rows_for(1024)}x(256+256), 1 GiB", lambda: ppo_batch(_rows_for(1024), 256, 256))], 5)
    save(table(rows, command("bench_wire.py")), args.out)


if __name__ == "__main__":
    main()
