"""What every benchmark here shares: interleaved timing, median and best, ratio tables, our paths.

- :func:`interleaved`: one untimed warm-up round, then ``repeats`` rounds in which the
  tasks take turns, so that load from other processes hits every task alike; each
  task's :class:`Timing` is the median and the best of its rounds.
- :func:`pair` and :func:`ratio`: how a table shows a timing (``median (best)``) and a
  ratio against the baseline row (the path's median / the baseline's; higher = slower).
- :class:`OursPickled` and :class:`OursIpc`: arrow-dataproto as a codec path with the
  rivals' interface (``encode(td, non_tensor, meta) -> payload``, ``decode(payload)``).
- :func:`save`: print a report and write it under ``benchmarks/results/``.

Run from the repository root (``python benchmarks/bench_codec.py``); the benchmarks
import this module as ``harness`` (their own folder is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Hashable, NamedTuple

import arrow_dataproto as adp

RESULTS = Path(__file__).resolve().parent / "results"


class Timing(NamedTuple):
    """Seconds: the median and the best of the timed rounds."""

    median: float
    best: float


def interleaved(tasks: dict[Hashable, tuple[Callable[[], Any], Callable[[], Any] | None]], repeats: int,
                *, alternate: bool = False) -> dict:
    """The :class:`Timing` of each task ``name: (fn, setup)``: one untimed warm-up round, then
    ``repeats`` rounds running the tasks in turn; ``setup()`` (may be None) runs untimed
    before each call, and the garbage collector before each timed call. With ``alternate``,
    every other round runs the tasks in reverse order, so that no task always follows the
    same neighbour (whose garbage, dirty pages or cache state it would otherwise inherit)."""
    times: dict = {name: [] for name in tasks}
    for round_ in range(repeats + 1):
        order = list(tasks.items())
        if alternate and round_ % 2:
            order.reverse()
        for name, (fn, setup) in order:
            if setup is not None:
                setup()
            gc.collect()
            start = time.perf_counter()
            result = fn()
            elapsed = time.perf_counter() - start
            del result
            if round_:
                times[name].append(elapsed)
    return {name: Timing(statistics.median(t), min(t)) for name, t in times.items()}


def pair(timing: Timing, digits: int = 3, scale: float = 1.0) -> str:
    """``"median (best)"``, each multiplied by ``scale`` (1e3 for milliseconds)."""
    return f"{timing.median * scale:.{digits}f} ({timing.best * scale:.{digits}f})"


def ratio(timing: Timing, baseline: Timing, digits: int = 1) -> str:
    """The timing's median over the baseline's (higher = slower than the baseline)."""
    return f"{timing.median / baseline.median:.{digits}f}"


def command(script: str) -> str:
    """The command line that ran this benchmark, for its report."""
    return "python " + " ".join([f"benchmarks/{script}", *sys.argv[1:]])


def arguments(doc: str, results: str, *, repeats: int, quick: str,
              more: Callable[[argparse.ArgumentParser], Any] | None = None) -> argparse.Namespace:
    """The options every benchmark script takes: ``--quick`` (``quick`` says what it runs;
    one repeat, printed, not saved), ``--repeats`` (default ``repeats``) and ``--out``
    (resolved: ``benchmarks/results/<results>`` unless given or ``--quick``, then None);
    ``more`` adds a script's own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if more is not None:
        more(parser)
    parser.add_argument("--quick", action="store_true", help=f"{quick}, one repeat, print only")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", help=f"results file (default: benchmarks/results/{results} unless --quick)")
    args = parser.parse_args()
    args.out = args.out or (None if args.quick else RESULTS / results)
    return args


def save(text: str, out: str | Path | None) -> None:
    """Print the report; write it to ``out`` too unless ``out`` is None."""
    print("\n" + text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)


class OursPickled:
    """arrow_dataproto: a DataProto pickled through Arrow (every buffer out of band); the
    receiver decodes it with ``copy`` (the receive option)."""

    def __init__(self, copy: bool):
        self.copy = copy
        self.name = f"arrow_dataproto ({'copy' if copy else 'zero-copy'})"

    def encode(self, td, non_tensor, meta):
        return adp.DataProto(td, non_tensor, meta)

    def decode(self, payload):
        return payload  # already rebuilt by pickle.loads under receive_options(copy=self.copy)


class ArrowOnly:
    """A verl DataProto that pickles under ``install()`` through Arrow whatever its content
    (``integrations.verl.reduce_through_arrow``: the form of content the compact state does not take)."""

    def __init__(self, dataproto):
        self.dataproto = dataproto

    def __reduce_ex__(self, protocol):
        from arrow_dataproto.integrations import verl

        return verl.reduce_through_arrow(self.dataproto)


class VerlInstalled:
    """verl's own DataProto pickled by ``arrow_dataproto.integrations.verl.install()``: plain
    content as its tensors' bytes (``arrow_dataproto._compact``); ``compact=False``: through Arrow. Needs verl; installs on creation.
    Decoded under the default receive option (copy-on-write: buffers in ordinary memory, as here, are copied)."""

    copy = "on_write"  # the public option value, as bench_ray spells it

    def __init__(self, compact: bool):
        from arrow_dataproto.integrations import verl

        verl.install()
        self.compact = compact
        self.name = "verl + install()" + ("" if compact else ", Arrow only")

    def encode(self, td, non_tensor, meta):
        from verl.protocol import DataProto

        dataproto = DataProto(batch=td, non_tensor_batch=non_tensor, meta_info=meta)
        return dataproto if self.compact else ArrowOnly(dataproto)

    def decode(self, payload):
        return payload.batch, payload.non_tensor_batch, payload.meta_info


class OursIpc:
    """arrow_dataproto as one Arrow IPC stream: ``to_ipc`` (one copy) and ``from_ipc`` (zero-copy views)."""

    name = "arrow_dataproto IPC stream"
    copy = True

    def encode(self, td, non_tensor, meta):
        return adp.to_ipc(adp.DataProto(td, non_tensor, meta))

    def decode(self, payload):
        return adp.from_ipc(payload)
