"""Write the golden payloads of the current format version: ``tests/data/golden-v<MAJOR>.<MINOR>-*``.

``tests/test_golden.py`` decodes every golden payload ever committed and compares it with
the DataProto rebuilt here, so a change that stops this version from reading data written
by an earlier one fails the test suite. Golden payloads are written once per format
version and never regenerated: when ``FORMAT_VERSION`` changes, run this script to add the
new version's files next to the old ones (it refuses to overwrite a version's files unless
``--force``).

Each DataProto of :data:`GOLDEN` is written three ways (``V`` is the format version):

- ``golden-vV-<name>.arrows``: an Arrow IPC stream (``to_ipc``);
- ``golden-vV-<name>.pkl``: ``pickle.dumps(dp, protocol=5)`` without a ``buffer_callback``,
  so the Arrow buffers are inline (what a plain pickle or ``torch.save`` of a DataProto holds);
- ``golden-vV-<name>.arrow``: an Arrow file of two batches (``files.write_file`` of ``dp.array_split(2)``;
  since 1.3 with ``checksums=True``, so that every later reader verifies them too).

``golden-vV.json`` records the format version, the library and dependency versions that
wrote the files, and each file's size and SHA-256.

The builders in :data:`GOLDEN` (and ``sample_dataproto`` in :mod:`arrow_dataproto.testing`, which one of
them calls) define what the committed payloads must decode to: do not change them; add a new
builder for new content.

Usage::

    python tests/golden.py            # tests/data/golden-v1.0-* (refuses if they exist)
    python tests/golden.py --force    # overwrite: only before a version's files are committed
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import tensordict
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.testing import sample_dataproto

DATA = Path(__file__).resolve().parent / "data"


def kinds_dataproto() -> adp.DataProto:
    """Every column kind the PPO sample lacks, without pickles: 1-D bool and uint8 tensors,
    a 3-D float16 tensor, complex64, a strided nested tensor, a jagged int16 tensor with an
    inner dimension; int32, 2-D float64, datetime64, str, bytes and list-of-dict non-tensor
    columns; nested JSON meta_info."""
    g = torch.Generator().manual_seed(7)
    rng = np.random.default_rng(7)
    rows = 4
    td = TensorDict(
        {
            "flags": torch.rand(rows, generator=g) > 0.5,
            "u8": torch.randint(0, 255, (rows,), dtype=torch.uint8, generator=g),
            "half": torch.randn(rows, 2, 3, generator=g).half(),
            "cplx": torch.randn(rows, 3, dtype=torch.complex64, generator=g),
            "strided": torch.nested.nested_tensor([torch.randn(i + 1, 2, generator=g) for i in range(rows)]),
            "pairs": torch.nested.nested_tensor(
                [torch.randint(-9, 9, (i + 2, 2), dtype=torch.int16, generator=g) for i in range(rows)],
                layout=torch.jagged,
            ),
        },
        batch_size=[rows],
        device="cpu",
    )
    messages = np.empty(rows, dtype=object)
    messages[:] = [[{"role": "user", "content": "q" * i}] for i in range(rows)]
    non_tensor = {
        "score": np.arange(rows, dtype=np.int32),
        "vec": rng.random((rows, 3)),
        "when": np.arange(rows).astype("datetime64[ns]"),
        "name": np.array(["a", "bb", "ccc", "dddd"]),
        "blob": np.array([b"x", b"yy", b"zzz", b""]),
        "messages": messages,
    }
    return adp.DataProto(td, non_tensor, {"nested": {"a": [1, 2.5, None, "s"]}, "flag": True})


def pickled_dataproto() -> adp.DataProto:
    """A pickled non-tensor column (2-D object array) and a pickled ``meta_info`` (a tuple
    is not JSON); reading them needs ``allow_pickle=True``."""
    grid = np.empty((3, 2), dtype=object)
    grid[:] = [[(1, 2), {3}], [None, 1.5], ["x", b"y"]]
    td = TensorDict({"ids": torch.arange(6).view(3, 2)}, batch_size=[3])
    return adp.DataProto(td, {"grid": grid}, {"step": (1, 2)})


def json_dataproto() -> adp.DataProto:
    """Since 1.2: object columns of the JSON kind, as a verl rollout holds them (dict keys that
    vary by row, ``1.0``/``0``/``None`` and ``"7"``/``7`` mixed, chat messages with an extra
    ``tool_calls: None``, nested dicts, ``None`` rows, non-ASCII text), one whose lone
    surrogate makes the column ASCII-escaped, next to a native struct column."""

    def column(*rows: object) -> np.ndarray:
        out = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            out[i] = row
        return out

    system = {"role": "system", "content": "be brief"}
    non_tensor = {
        "extra_info": column(
            {"index": 0, "split": "train", "answer": "#### 7"},
            {"index": 1, "split": "train", "tools_kwargs": {"calc": {"create_kwargs": {"ground_truth": "7"}}}},
            {"index": 2, "split": "test", "question": "¿cuántos? 几个?"},
            None,
        ),
        "tools_kwargs": column({}, {"calc": {"create_kwargs": {"ground_truth": "7"}}}, {}, {"x": [1, 2.5, True, None]}),
        "raw_prompt": column(
            [system, {"role": "user", "content": "1+1?"}],
            [system, {"role": "user", "content": "2+2?", "tool_calls": None}],
            [],
            [{"role": "user", "content": "emoji 🎲", "tool_calls": None}],
        ),
        "scores": column(1.0, 0, None, -0.0),
        "ground_truth": column("7", 7, "7.0", 2**63 - 1),
        "escaped": column("lone \ud800 surrogate", {"k": "\udfff"}, None, ["ok"]),
        "reward_model": column(*({"ground_truth": str(i), "style": "rule"} for i in range(4))),
    }
    td = TensorDict({"ids": torch.arange(8).view(4, 2)}, batch_size=[4])
    return adp.DataProto(td, non_tensor, {"metrics": [{"reward/mean": 0.5}], "global_steps": 3})


def meta_tensors_dataproto() -> adp.DataProto:
    """Since 1.3: tensors in meta_info (``json+tensors``): bfloat16 with a NaN, bool, a 0-d
    int64, an empty 2-D float32, complex64, inside dicts and lists."""
    td = TensorDict({"ids": torch.arange(6).view(3, 2)}, batch_size=[3])
    meta = {
        "temperature": 0.7,
        "ref": torch.tensor([1.5, float("nan"), -0.0], dtype=torch.bfloat16),
        "stats": {"mask": torch.tensor([True, False]), "step": torch.tensor(7)},
        "list": [torch.zeros(2, 0), torch.tensor([1 + 2j], dtype=torch.complex64), "text"],
    }
    return adp.DataProto(td, {"uid": np.array(["a", "b", "c"])}, meta)


GOLDEN = {
    "sample": lambda: sample_dataproto(seed=1234),
    "kinds": kinds_dataproto,
    "pickled": pickled_dataproto,
    "json": json_dataproto,
    "meta_tensors": meta_tensors_dataproto,
}
"""The golden DataProtos by name; each builder is deterministic."""


def prefix(version: tuple[int, int] = adp.FORMAT_VERSION) -> str:
    """``golden-v1.0``: the start of every golden file name of ``version``."""
    return "golden-v%d.%d" % version


def write(out: Path = DATA) -> dict:
    """Write every golden payload of this format version into ``out``; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    stem = prefix()
    paths = []
    for name, build in GOLDEN.items():
        dp = build()
        paths += [out / f"{stem}-{name}.{ext}" for ext in ("arrows", "pkl", "arrow")]
        paths[-3].write_bytes(adp.to_ipc(dp).to_pybytes())
        paths[-2].write_bytes(pickle.dumps(dp, protocol=5))
        files.write_file(paths[-1], dp.array_split(2), checksums=adp.FORMAT_VERSION >= (1, 3))
    manifest = {
        "format_version": "%d.%d" % adp.FORMAT_VERSION,
        "written_by": {
            "arrow_dataproto": adp.__version__,
            "pyarrow": pa.__version__,
            "torch": torch.__version__,
            "tensordict": tensordict.__version__,
            "numpy": np.__version__,
        },
        "files": {
            p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in paths
        },
    }
    (out / f"{stem}.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="overwrite this version's folder")
    args = parser.parse_args(argv)
    existing = sorted(DATA.glob(f"{prefix()}*"))
    if existing and not args.force:
        print(f"{existing[0]} exists: golden payloads are written once per format version (--force to overwrite)")
        return 1
    manifest = write()
    for name, entry in manifest["files"].items():
        print(f"{DATA / name}: {entry['bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
