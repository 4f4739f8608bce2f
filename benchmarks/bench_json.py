"""The JSON tier of object columns against pickling the same column (issue 10's speed target).

For the object columns a verl rollout carries (``samples.verl_rollout``: ``extra_info``,
``tools_kwargs``, ``raw_prompt``, multi-turn ``messages``, ``scores``, ``ground_truth``,
``multi_modal_data``; none of them native Arrow, all JSON), at 2,560 and 8,192 rows, this
measures in one run, interleaved:

- encoding: ``encode_column`` as it ships (the native attempt where it may succeed, then
  JSON), the ``Pickle`` kind alone (one ``pickle.dumps`` per row into ``large_binary``), and
  the path before the JSON tier (the native attempt, ``pa.array`` + ``to_pylist`` + an
  exact comparison, then pickle when it fails);
- decoding: ``decode_column`` of the JSON column and of the pickled column.

Ratios are against pickle (higher = slower than pickle); ``old path`` is what encoding these
columns cost before the JSON tier.

    python benchmarks/bench_json.py            # writes benchmarks/results/json.md
    python benchmarks/bench_json.py --quick    # 256 rows, one repeat, prints only
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import torch

from harness import Timing, arguments, command, interleaved, pair, save

from arrow_dataproto._json import same
from arrow_dataproto._objects import Pickle, decode_column, encode_column
from arrow_dataproto.testing.samples import verl_rollout

COLUMNS = ["extra_info", "tools_kwargs", "raw_prompt", "messages", "scores", "ground_truth", "multi_modal_data"]


def old_path(name: str, values: np.ndarray) -> pa.Array:
    """Before the JSON tier: pyarrow's inferred type if it gives every row back, else pickle."""
    rows = values.tolist()
    try:
        array = pa.array(rows)
        if all(map(same, rows, array.to_pylist())):
            return array
    except (pa.ArrowException, TypeError, ValueError):
        pass
    return Pickle.encode(name, values)


def measure(rows: int, repeats: int) -> dict[str, dict[str, Timing]]:
    non_tensor = verl_rollout(rows=rows, prompt=1, response=1, seed=0)[1]
    results = {}
    for name in COLUMNS:
        values = non_tensor[name]
        json_array, json_meta = encode_column(name, values)
        assert json_meta["adp.kind"] == "json", (name, json_meta)
        pickled, pickle_meta = Pickle.encode(name, values), {**json_meta, "adp.kind": "pickle"}
        results[name] = interleaved(
            {
                "encode json": (lambda: encode_column(name, values), None),
                "encode pickle": (lambda: Pickle.encode(name, values), None),
                "encode old path": (lambda: old_path(name, values), None),
                "decode json": (lambda: decode_column(name, json_array, json_meta, allow_pickle=False), None),
                "decode pickle": (lambda: decode_column(name, pickled, pickle_meta, allow_pickle=True), None),
            },
            repeats,
        )
        results[name]["bytes"] = (json_array.nbytes, pickled.nbytes)  # type: ignore[assignment]
    return results


def _total(results: dict, task: str) -> Timing:
    return Timing(*(sum(getattr(r[task], f) for r in results.values()) for f in ("median", "best")))


def report(cmd: str, by_rows: dict[int, dict]) -> str:
    lines = [
        "# JSON tier vs pickle: encoding and decoding verl's object columns",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {os.cpu_count()} cores, torch {torch.__version__}, pyarrow {pa.__version__}. "
        "Milliseconds, median (best) of the repeats; `x` = the median over pickle's (higher = slower than pickle). "
        "`old path` = encoding before the JSON tier (native attempt, then pickle).",
        "",
        "| rows | column | JSON / pickle bytes | encode json | encode pickle | encode old path | json x | old x "
        "| decode json | decode pickle | json x |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rows, results in by_rows.items():
        names = [*results, "all seven"]
        for name in names:
            if name == "all seven":
                t = {task: _total(results, task) for task in next(iter(results.values())) if task != "bytes"}
                sizes = tuple(sum(r["bytes"][i] for r in results.values()) for i in (0, 1))
            else:
                t, sizes = results[name], results[name]["bytes"]
            ej, ep, eo, dj, dp = (t[k] for k in ("encode json", "encode pickle", "encode old path", "decode json", "decode pickle"))
            label = f"**{name}**" if name == "all seven" else name
            lines.append(
                f"| {rows:,} | {label} | {sizes[0] / 1e6:.2f} / {sizes[1] / 1e6:.2f} MB | {pair(ej, 2, 1e3)} | "
                f"{pair(ep, 2, 1e3)} | {pair(eo, 2, 1e3)} | {ej.median / ep.median:.1f} | {eo.median / ep.median:.1f} | "
                f"{pair(dj, 2, 1e3)} | {pair(dp, 2, 1e3)} | {dj.median / dp.median:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments(__doc__, "json.md", repeats=7, quick="256 rows")
    sizes = [256] if args.quick else [2560, 8192]
    repeats = 1 if args.quick else args.repeats
    by_rows = {rows: measure(rows, repeats) for rows in sizes}
    save(report(command("bench_json.py"), by_rows), args.out)


if __name__ == "__main__":
    main()
