"""The two pickled forms of a verl DataProto under ``install()``, through Ray, side by side, by size.

A verl DataProto of plain content pickles as its tensors' bytes (``arrow_dataproto._compact``);
this compares, for one object sent from the driver to one actor that reads every tensor:

- ``compact, copied``: that form, copied on receipt (what the default does up to
  ``_compact.COPY_UP_TO`` bytes of tensors);
- ``compact, on write``: that form, received as copy-on-write views of Ray's store (the
  default above ``COPY_UP_TO``);
- ``Arrow``: the same object pickled through Arrow (``to_arrow``), received as copy-on-write
  views (the form of content the compact state does not take).

Per size and form: the driver's encode (``pickle.dumps`` with out-of-band buffers), the
actor's ``ray.get``, the CPU time of the actor's thread for the get and the read of every
tensor, and the process's CPU time from a short pause before the get to one after the read
(with the background release of a copy-on-write lease, and Ray's own threads: in this
script about 5 ms an object whatever the form, so it tells the forms apart less well). After an untimed round of each form, the actor takes each form's objects
in turn, 12 of them at a time; the forms take turns by size. Medians in milliseconds. Needs verl (the compat venv)::

    PYTHONPATH=$PWD .venv-compat/bin/python benchmarks/bench_verl_forms.py [--sizes 1,4,8,64] [--repeats 12]
    PYTHONPATH=$PWD .venv-compat/bin/python benchmarks/bench_verl_forms.py --quick   # 1 and 8 MiB, 3 objects, print only
"""

from __future__ import annotations

import pickle
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

import harness  # noqa: E402

FORMS = {"compact, copied": 1 << 62, "compact, on write": 0, "Arrow": 0}
"""Each form and the ``_compact.COPY_UP_TO`` its receiver runs with."""


def make(mib: int):
    """A verl DataProto of ``mib`` MiB of tensors: two float32 columns of 1024 values a row, an
    int64 score and a uid string column."""
    import numpy as np
    import torch
    from verl.protocol import DataProto

    rows = mib * 128
    g = torch.Generator().manual_seed(mib)
    return DataProto.from_dict(
        {"advantages": torch.randn(rows, 1024, generator=g), "returns": torch.randn(rows, 1024, generator=g),
         "score": torch.arange(rows)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)},
        meta_info={"global_steps": 3},
    )


def sent(form: str, data):
    """What the driver puts for ``form``: the DataProto itself, or it pickled through Arrow."""
    return harness.ArrowOnly(data) if form == "Arrow" else data


def reader():
    import ray

    @ray.remote(num_cpus=1)
    class Reader:
        def receive(self, refs: list, copy_up_to: int) -> tuple[float, float, float]:
            """Median milliseconds per object of ``ray.get``, of this thread's CPU for the get and
            the read, and of the process's CPU, copying up to ``copy_up_to`` bytes."""
            from arrow_dataproto import _compact

            _compact.COPY_UP_TO = copy_up_to  # type: ignore[misc]
            gets, threads, cpus = [], [], []
            for [ref] in refs:
                time.sleep(0.02)  # the previous object's lease is released in the background meanwhile
                cpu, thread, start = time.process_time(), time.thread_time(), time.perf_counter()
                data = ray.get(ref)
                gets.append(time.perf_counter() - start)
                sum(float(t.float().sum()) for t in data.batch.values())  # read every tensor
                threads.append(time.thread_time() - thread)
                del data
                time.sleep(0.02)
                cpus.append(time.process_time() - cpu)
            return statistics.median(gets) * 1e3, statistics.median(threads) * 1e3, statistics.median(cpus) * 1e3

    return Reader.remote()


def main() -> None:
    def sizes(parser) -> None:
        parser.add_argument("--sizes", default="1,2,4,8,16,64", help="MiB of tensors, comma-separated")

    args = harness.arguments(__doc__, "verl_forms.md", repeats=12, quick="1 and 8 MiB, 3 objects", more=sizes)
    if args.quick:
        args.sizes, args.repeats = "1,8", 3
    import ray

    from arrow_dataproto.integrations import verl as adp_verl

    adp_verl.install()
    ray.init(num_cpus=2, object_store_memory=2**30, include_dashboard=False,
             runtime_env={"worker_process_setup_hook": "arrow_dataproto.integrations.verl.install"})
    actor = reader()
    ray.get(actor.__ray_ready__.remote())
    warm = make(1)  # untimed: each form once, so that no timed object pays for first imports
    for form, copy_up_to in FORMS.items():
        ray.get(actor.receive.remote([[ray.put(sent(form, warm))] for _ in range(3)], copy_up_to))
    header = "| MiB | form | encode ms | get ms | get x Arrow | get+read, thread CPU ms | process CPU ms |"
    lines = [header, "|---:|---|---:|---:|---:|---:|---:|"]
    for mib in (int(s) for s in args.sizes.split(",")):
        data = make(mib)
        found = {}
        for form, copy_up_to in FORMS.items():
            payload = sent(form, data)
            encode = []
            for _ in range(max(args.repeats, 5)):
                start = time.perf_counter()
                pickle.dumps(payload, protocol=5, buffer_callback=[].append)
                encode.append(time.perf_counter() - start)
            refs = [[ray.put(payload)] for _ in range(args.repeats)]
            found[form] = (statistics.median(encode) * 1e3, *ray.get(actor.receive.remote(refs, copy_up_to)))
            del refs
        for form in FORMS:
            enc, get, thread, cpu = found[form]
            lines.append(f"| {mib} | {form} | {enc:.2f} | {get:.2f} | {get / found['Arrow'][1]:.2f} | {thread:.2f} | {cpu:.2f} |")
    ray.shutdown()
    text = "\n".join([
        "## verl DataProto forms through Ray (`benchmarks/bench_verl_forms.py`)", "",
        f"Command: `{harness.command('bench_verl_forms.py')}`; {args.repeats} objects per size and form, medians.", "",
        *lines, "",
    ])
    harness.save(text, args.out)


if __name__ == "__main__":
    main()
