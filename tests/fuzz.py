"""Mutation fuzzer for the arrow-dataproto decoders.

Every case takes a valid payload made from a seed DataProto, mutates it, and
decodes it in a worker subprocess, so that a segfault or a hang is caught and
reported with the input that caused it. Targets:

``ipc``, ``ipc-lz4``, ``ipc-zstd``
    ``from_ipc(bytes)`` on an Arrow IPC stream (uncompressed / compressed),
    as from an untrusted peer: ``allow_pickle=False``.
``ipc-portable``
    ``from_ipc(bytes)`` on a stream of the portable view (``to_arrow(portable=True)``):
    a widened value that no longer narrows must be a ``DecodeError``, never another value.
``state``
    ``pickling.rebuild_dataproto(*state)``: the state a DataProto pickles to
    (schema bytes, row count, one ``(length, null_count, offset, buffers,
    children)`` tree per column). A pickle is trusted by design (unpickling runs
    code), so raw pickle bytes are not fuzzed; what is fuzzed is the state the
    unpickler hands to the library, which must not let a lying length, offset
    or buffer read outside the buffers. Seeds with pickled columns are left out
    of this target (it decodes with ``allow_pickle=True``).
``file``, ``file-zstd``
    ``files.read_file(path)`` on an Arrow file of two batches (uncompressed /
    compressed), ``allow_pickle=False``.
``file-reader``
    ``open_file`` and every reader method (``column_info``, ``batch_rows``,
    ``column_nbytes``, ``meta_info_encoding``, ``read_meta_info``, ``read_batch``,
    ``read_rows``, ``read_all`` of a column subset), judged by ``read_all()``.
``file-verify``
    a file written with ``checksums=True``, read with ``verify=True`` and ``verify()``:
    a flipped bit in any buffer must be a ``DecodeError``, never a different value.
``file-copy``, ``file-recover``, ``dataset``
    ``copy_file`` (a zstd file, copied to lz4), ``recover_file`` and ``open_dataset``
    of the file's folder (with ``column_nbytes``), judged by reading the result; the
    dataset's folder also holds the file as an older minor version wrote it
    (``adp.version`` 1.0), which must read as the file does.
``cli``
    ``inspect --json``, ``head`` and ``convert`` through ``cli.main`` inside the
    worker (a crash or hang still shows; an exit status of 1 with its error line is
    the library's own error), judged by reading the converted file.
``json-text``
    ``from_ipc`` of a stream whose JSON columns' texts were edited (a duplicate key, a
    number no double holds, surrogate escapes, bytes that are not UTF-8, junk): a decoded
    row must be what the text says by the book (``_reference_json``), else a finding
    ``unexpected:SilentWrong``.
``foreign-types``
    ``from_ipc`` of a random table of other tools' types (dictionary, run-end encoded,
    sparse and dense unions, maps with duplicate keys, list_view, string_view / binary_view,
    decimal32..256, fixed_shape_tensor with permutations and dim_names, an extension type
    with parameters, an unregistered one, arrow.json, nesting up to 63 levels), checked
    column by column against pyarrow's rows (permutations applied by the oracle); and
    ``from_arrow`` of tables nested 64-2,063 levels deep, built in memory.
``pandas``
    ``from_pandas`` of a ``to_pandas`` frame whose ``attrs`` record (schema level or
    one column's: kind, dtype, shape, row shape, ragged_idx, device) was edited, or
    whose columns or attrs were dropped: what parquet hands back is believed no more
    than IPC metadata.
``writer-fsize``, ``writer-kill``
    a ``FileWriter`` writing a plan of five batches (the second on fewer rows, a promotion
    rewrite at the third, a refused fourth; a finished checksummed file must verify) under an ``RLIMIT_FSIZE`` drawn anywhere up to past the final size, or in
    a forked child that SIGKILLs itself after a drawn number of bytes: a batch whose write
    returned and is in neither the file nor what ``recover_file`` reads from a partial file,
    or a refused write that changed a partial file, is a finding (``unexpected:AssertionError``).
``compact``
    ``integrations.verl.rebuild_compact(cls, state)``: the compact state a verl
    DataProto of plain content pickles to under ``install()`` (``arrow_dataproto._compact``: per tensor a
    name, dtype, shape and bytes; jagged offsets or the index of the column whose offsets
    it shares). Trusted like ``state``; a lying shape, byte count, offset, dtype, batch size
    or version must be a ``DecodeError``, never a read outside the buffers.
``compact-views``
    the same, decoded as a state over ``_compact.COPY_UP_TO`` is (its buffers through
    ``_shm.private_views`` before any check: views or copies of them).
``views``
    a TensorDict drawn per case (conjugate and negative views, a conjugate jagged tensor,
    jagged columns on one sliced offsets tensor, lazy stacks with different keys or shapes,
    a tensorclass, a TensorDict subclass, nested or not) through the tensordict
    integration's serializer, a verl-like class under ``install()`` and our DataProto's
    pickle: given back exactly or refused with the library's error (strict).
``file-flip``, ``file-flip-zstd``, ``file-flip-portable``
    one byte anywhere in a checksummed file XORed with 1..255, read with ``verify=True``,
    ``verify()`` and ``read_all``: strict, so a decode that differs from the seed is a finding
    (``silent:wrong-values``) -- every flip must be detected or harmless.

Mutations: bit flips, interesting bytes and integers (biased towards the
flatbuffer metadata), truncation, deletion, insertion and splices from other
seeds' payloads; IPC message recombination (another seed's schema or batch,
a duplicated or missing batch); edits of the schema and field metadata
(format name, version, batch size, tree, device, dtype, shape, ragged_idx,
kind, row shape, meta_info; swapped or renamed fields); for files, the same
edits of the footer schema or of one batch's metadata; for ``state``, lying
lengths, null counts, offsets, truncated/flipped/missing buffers and
children, swapped or dropped columns. Structure-aware edits of the record batch
messages (streams and files): a value inside one buffer (list offsets, lengths,
values), a buffer's offset or length and a field node's length or null count in
the message header, and for compressed payloads the compression frame (the
recorded decoded length of a buffer: huge, negative, short; or the frame's first
bytes). Metadata values include non-ASCII digits (``"²"``, ``"١"``), 5,000-digit
numbers, duplicate and colliding tree keys, string widths of 10**8, devices torch
cannot load (``privateuseone``) and ``adp.offsets_of`` references. One case is one structural or byte
mutation, sometimes followed by one or two byte (or state) mutations.

Seeds (:data:`SEEDS`): the PPO sample of :mod:`arrow_dataproto.testing`, a chunk of one,
the golden ``kinds`` and ``pickled`` batches of ``tests/golden.py``
(every column kind), a nested TensorDict alone, zero-size dimensions, and a
batch without tensors.

Outcomes. Allowed:

``exact``
    the decode is bit-equal to the seed (``arrow_dataproto.testing.assert_dataproto_equal``);
``valid``
    the decode differs (the mutation produced another valid payload, e.g. a
    flipped bit in tensor data: Arrow IPC carries no checksum) and is
    self-consistent: re-encoding it with ``to_ipc`` and decoding that gives a
    bit-equal DataProto (which reads every byte of every tensor);
``error:<Class>``
    a subclass of ``DataProtoError``.

Findings: ``unexpected:<Class>`` (any other exception from the decoder),
``inconsistent:<Class>`` (a decode that fails the self-consistency check),
``crash:<signal>`` (the worker died) and ``hang`` (no answer within the
per-case timeout). Each finding's input is saved for replay (as a pickle
of ``(target, seed, payload)`` next to a JSON note).

The summary also gives, per target, the largest input and the largest rise of
the worker's peak RSS that one case caused (what a small input made the decoder
allocate).

The worker runs with one torch thread and an 8 GiB address-space limit, so
that a payload asking for a huge allocation fails (``MemoryError``, which is
a finding unless the library turns it into its own error) instead of
swamping the machine.

Usage::

    python tests/fuzz.py --cases 100000 --jobs 2       # writes benchmarks/results/fuzz.md
    python tests/fuzz.py --replay 1234                 # rerun case 1234 here, with a traceback

The run is deterministic: case ``n`` of a given ``--seed`` and ``--targets``
is always the same input.
"""

from __future__ import annotations

import argparse
import base64
import copy
import importlib.util
import json
import math
import multiprocessing
import os
import pickle
import platform
import random
import re
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from golden import kinds_dataproto, pickled_dataproto  # tests/golden.py, next to this file
from tensordict import TensorDict, tensorclass

import arrow_dataproto as adp
from arrow_dataproto import files as adp_files
from arrow_dataproto import pandas as adp_pandas
from arrow_dataproto import _compact, _dtypes, pickling, verl_api
from arrow_dataproto import _format as adp_format
from arrow_dataproto.integrations import verl as adp_verl
from arrow_dataproto.testing import assert_dataproto_equal, sample_dataproto, strict_equal

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
CASE_TIMEOUT_S = 20.0
WORKER_START_TIMEOUT_S = 180.0
WORKER_MEMORY_LIMIT = 8 * 1024**3  # address space: an allocation bomb fails instead of swamping the machine


# ---------------------------------------------------------------- seeds


def _tensors_only() -> adp.DataProto:
    """A TensorDict two levels deep, no non-tensor columns and no meta_info."""
    inner = TensorDict({"x": torch.arange(10, dtype=torch.float64).view(5, 2)}, batch_size=[5, 2])
    td = TensorDict({"a": torch.arange(5), "sub": TensorDict({"inner": inner}, batch_size=[5])}, batch_size=[5])
    return adp.DataProto(td)


def _edge_shapes() -> adp.DataProto:
    """Zero-size dimensions: an empty dense row shape, jagged rows of length 0 and with an empty
    inner dimension, strided rows with no values."""
    td = TensorDict(
        {
            "empty": torch.zeros(2, 0, 3),
            "ragged": torch.nested.nested_tensor([torch.zeros(0), torch.arange(3.0)], layout=torch.jagged),
            "hollow": torch.nested.nested_tensor([torch.zeros(0, 2), torch.zeros(0, 3)], layout=torch.jagged),
            "flat": torch.nested.nested_tensor([torch.zeros(0, 2), torch.ones(1, 0)]),
        },
        batch_size=[2],
    )
    return adp.DataProto(td, {"n": np.zeros((2, 0), dtype=np.int64)})


def _no_batch() -> adp.DataProto:
    return adp.DataProto(None, {"uid": np.array(["u1", "u2", "u3"], dtype=object)}, {"k": 1})


SEEDS: dict[str, Callable[[], adp.DataProto]] = {
    "ppo": lambda: sample_dataproto(seed=0),
    "ppo-chunk": lambda: sample_dataproto(rows=9, seed=1).chunk(3)[1],
    "kinds": kinds_dataproto,
    "tensors-only": _tensors_only,
    "edge-shapes": _edge_shapes,
    "no-batch": _no_batch,
    "pickled": pickled_dataproto,
}


# ---------------------------------------------------------------- targets


def _plain_state(value: Any) -> Any:
    """A pickling state with every ``pa.Buffer`` turned into ``bytes`` and tuples into lists."""
    if isinstance(value, pa.Buffer):
        return value.to_pybytes()
    if isinstance(value, (list, tuple)):
        return [_plain_state(v) for v in value]
    return value


def _decode_state(state: list) -> adp.DataProto:
    schema_bytes, num_rows, columns = state
    return pickling.rebuild_dataproto(schema_bytes, num_rows, columns)


def _compact_payload(dp: adp.DataProto) -> tuple:
    """The compact state of ``dp`` (a seed it takes), every ``PickleBuffer`` as ``bytes``."""
    state = _compact.state(dp)
    assert state is not None, "a seed of the compact target that it does not take"
    *head, columns, non_tensor, meta_info = state
    plain = [tuple(bytes(c.raw()) if isinstance(c, pickle.PickleBuffer) else c for c in column) for column in columns]
    return (*head, plain, non_tensor, meta_info)


def _rebuild_compact(state: tuple) -> adp.DataProto:
    return adp_verl.rebuild_compact(adp.DataProto, state)


def _rebuild_compact_through_views(state: tuple) -> adp.DataProto:
    """:func:`_rebuild_compact` with ``_compact.COPY_UP_TO`` at 0: the buffers of every state
    go through ``_shm.private_views`` first, as those of a state over it do."""
    copy_up_to = _compact.COPY_UP_TO
    _compact.COPY_UP_TO = 0  # type: ignore[misc]
    try:
        return _rebuild_compact(state)
    finally:
        _compact.COPY_UP_TO = copy_up_to  # type: ignore[misc]


def _compact_dtypes() -> adp.DataProto:
    """Every dtype, a jagged tensor ragged at 2 and one sharing another's offsets: the compact target's seed."""
    g = torch.Generator().manual_seed(5)
    tensors = {}
    for dtype in sorted(_dtypes.STORAGE, key=str):
        raw = torch.randint(0, 256, (3 * 2 * dtype.itemsize,), dtype=torch.uint8, generator=g)
        tensors[str(dtype)] = (raw % 2 if dtype == torch.bool else raw).view(dtype).view(3, 2)
    a = torch.nested.nested_tensor([torch.ones(2, n) for n in (1, 0, 4)], layout=torch.jagged)
    a = torch.nested.nested_tensor_from_jagged(a.values(), a.offsets(), jagged_dim=2)
    b = torch.nested.nested_tensor_from_jagged(a.values() * 2, a.offsets(), jagged_dim=2)
    return adp.DataProto(TensorDict({**tensors, "a": a, "b": b}, batch_size=[3]), {"uid": np.array(["x", "y", "z"], dtype=object)})


def _reorder_columns(columns: list, rng: random.Random) -> str:
    """Swap two of a state's columns, drop one or duplicate one, in place; returns which."""
    i, j = rng.randrange(len(columns)), rng.randrange(len(columns))
    kind = rng.choice(["swap", "drop", "duplicate"])
    if kind == "swap":
        columns[i], columns[j] = columns[j], columns[i]
    elif kind == "drop":
        columns.pop(i)
    else:
        columns.insert(i, copy.deepcopy(columns[j]))
    return kind


def _mutate_compact(state: tuple, rng: random.Random, corpus: Corpus, target: Target) -> tuple[tuple, str]:
    """One lie in a compact state: its version, batch size or device, the column list, or one
    column's name, dtype, shape, bytes, offsets or ragged dimension."""
    version, batch_size, device, columns, non_tensor, meta_info = state
    columns = [list(c) for c in columns]
    op = rng.random()
    if op < 0.08 or not columns:
        version = rng.choice([0, 2, None, "1", 1.0, True])
        desc = "version"
    elif op < 0.18:
        rows = batch_size[0] if isinstance(batch_size, tuple) and batch_size and type(batch_size[0]) is int else 0
        batch_size = rng.choice([(), None, [rows], (rows + 1,), (rows - 1,), (-1,), (rows, 2), (2**62,), ("3",), (rows, 0)])
        desc = "batch_size"
    elif op < 0.22:
        device = rng.choice(["cuda:0", "meta", 3, "cpu", ""])
        desc = "device"
    elif op < 0.3:
        desc = f"columns:{_reorder_columns(columns, rng)}"
    else:
        column = rng.choice(columns)
        part = rng.choice(["name", "dtype", "shape", "shape", "data", "data", "offsets", "offsets", "ragged", "length"])
        if len(column) != 6:  # an earlier mutation's: only the length is edited again
            part = "length"
        if part == "name":
            column[0] = rng.choice([columns[0][0] if columns[0] else "x", "", 3, None])
        elif part == "dtype":
            column[1] = rng.choice(sorted(_dtypes.dtype_name(d) for d in _dtypes.STORAGE) + ["float128", "", 3])
        elif part == "shape":
            shape = list(column[2]) if isinstance(column[2], (tuple, list)) else []
            if shape and rng.random() < 0.7:
                shape[rng.randrange(len(shape))] = rng.choice(INTERESTING_INTS)
            else:
                shape = rng.choice([[], shape + [1], shape[:-1], [2**31] * 3])
            column[2] = tuple(shape) if rng.random() < 0.9 else shape
        elif part == "data":
            other = rng.choice(columns)
            donor = other[3] if len(other) > 3 and isinstance(other[3], bytes) else b""
            data = column[3] if isinstance(column[3], bytes) and column[3] else b"\0"
            column[3] = _mutate_bytes(data, rng, donor or data)[0] if rng.random() < 0.8 else rng.choice([None, 3, "x"])
        elif part == "offsets":
            if isinstance(column[4], bytes) and rng.random() < 0.6:
                values = list(struct.unpack(f"<{len(column[4]) // 8}q", column[4]))
                if values:
                    values[rng.randrange(len(values))] = rng.choice([v for v in INTERESTING_INTS if -(2**63) <= v < 2**63])
                column[4] = struct.pack(f"<{len(values)}q", *values)
            else:
                column[4] = rng.choice([None, 0, 1, 2, -1, len(columns), b"", b"\0" * 8, "x"])
        elif part == "ragged":
            column[5] = rng.choice(INTERESTING_INTS + [None, "1"])
        else:
            column[:] = column[: rng.randrange(len(column) + 1)] if rng.random() < 0.5 else column + [None]
        desc = f"column:{part}"
    return (version, batch_size, device, [tuple(c) for c in columns], non_tensor, meta_info), f"compact:{desc}"


def _as_verl_holds(dp: adp.DataProto) -> adp.DataProto:
    """``dp`` as verl's numpy mode holds it: no nested TensorDicts, no batch device."""
    from tensordict import TensorDict, is_tensor_collection

    if dp.batch is not None:
        leaves = {k: v for k, v in dp.batch.items() if not is_tensor_collection(v)}
        dp = adp.DataProto(TensorDict(leaves, batch_size=dp.batch.batch_size), dp.non_tensor_batch, dp.meta_info)
    return dp


def _encode_verl_pickle(dp: adp.DataProto) -> bytes:
    """The seed as verl's numpy-mode ``save_to_disk`` writes it (built without verl; seeds of
    :func:`_as_verl_holds`): ``copyreg.__newobj__(verl.protocol.DataProto)`` + BUILD state."""
    batch = None if dp.batch is None else verl_api.serialize_tensordict(dp.batch)
    body = pickle.dumps((batch, dp.non_tensor_batch, dp.meta_info), protocol=2)[2:-1]  # the state's opcodes
    return b"\x80\x02cverl.protocol\nDataProto\n)\x81" + body + b"b."


def _load_verl_pickle(path: str, out: str) -> adp.DataProto:
    return adp.DataProto.load_from_disk(path, allow_pickle=True)


def _encode_file(dp: adp.DataProto, compression: str | None, checksums: bool = False) -> bytes:
    """An Arrow file of the seed in two batches (one if it has a single row)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "seed.arrow")
        adp_files.write_file(path, dp.array_split(min(2, len(dp))), compression=compression, checksums=checksums)
        return Path(path).read_bytes()


def _decode_file(payload: bytes) -> adp.DataProto:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.arrow")
        Path(path).write_bytes(payload)
        return adp_files.read_file(path)


def _in_folder(payload: bytes, use: Callable[[str, str], Any]) -> Any:
    """``use(path, out)`` with ``payload`` written to ``<tmp>/data/case.arrow`` (``out``: a path next to it)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.mkdir(os.path.join(tmp, "data"))
        path = os.path.join(tmp, "data", "case.arrow")
        Path(path).write_bytes(payload)
        return use(path, os.path.join(tmp, "out.arrow"))


def _every_reader_method(path: str, out: str) -> adp.DataProto:
    """``open_file`` and each reader method; the whole file is what is judged."""
    with adp_files.open_file(path) as reader:
        reader.column_info()
        reader.batch_rows
        reader.column_nbytes()
        if reader.num_batches:
            reader.meta_info_encoding(0)
            if reader.meta_info_encoding(0) != "pickle":
                reader.read_meta_info(0)
            reader.read_batch(-1)
            reader.read_rows(1, 3)
            if reader.columns and not reader.pickled_columns:
                reader.read_all(reader.columns[:1])
        return reader.read_all()


def _verified(path: str, out: str) -> adp.DataProto:
    with adp_files.open_file(path, verify=True) as reader:
        reader.verify()
        return reader.read_all()


def _copied(path: str, out: str) -> adp.DataProto:
    adp_files.copy_file(path, out, compression="lz4")
    return adp_files.read_file(out)


def _recovered(path: str, out: str) -> adp.DataProto:
    adp_files.recover_file(path, out)
    return adp_files.read_file(out)


_VERSION_VALUE = b"\x03\x00\x00\x00" + adp_format.version_text().encode()  # adp.version's flatbuffer string


def _dataset(path: str, out: str) -> adp.DataProto:
    """``open_dataset`` of the file's folder, which also holds a copy of the file written by an
    older minor version (its ``adp.version`` values set to ``1.0``, as they lie): the two must
    read alike (format.md: a reader accepts every minor of its major; issue 48)."""
    data = Path(path).read_bytes()
    Path(path).with_name("older.arrow").write_bytes(data.replace(_VERSION_VALUE, b"\x03\x00\x00\x001.0"))
    with adp_files.open_dataset(os.path.dirname(path)) as reader:
        reader.column_nbytes()
        reader.read_all()
        got = [reader.read_batch(i) for i in range(reader.num_batches)]
    with adp_files.open_file(path) as alone:
        assert len(got) == 2 * alone.num_batches, (len(got), alone.num_batches)
        for i in range(alone.num_batches):  # case.arrow, then older.arrow
            assert_dataproto_equal(alone.read_batch(i), got[i])
            assert_dataproto_equal(got[i], got[alone.num_batches + i])
        return alone.read_all()


class CommandFailed(adp.DecodeError):
    """The command line answered with an error line and exit status 1 (the library's own error)."""


def _commands(path: str, out: str) -> adp.DataProto:
    """The CLI in the worker process (a crash or hang still shows): inspect, head, convert."""
    from arrow_dataproto import cli

    for argv in (["inspect", path, "--json"], ["head", path, "-n", "3"], ["convert", path, out]):
        status = cli.main(argv)
        if status != 0:
            raise CommandFailed(f"{argv[0]} exited with {status}")
    return adp_files.read_file(out)


def _decode_frame(frame) -> adp.DataProto:
    return adp_pandas.from_pandas(frame)


@dataclass(frozen=True)
class Target:
    """A decoder under test: how a seed becomes a payload, how a payload is decoded and mutated.

    ``strict``: a decode that differs from the seed is a finding (``silent``), not ``valid``
    (a checksummed file: every flipped byte must be detected or harmless). ``stack``: whether
    more byte or state mutations may follow the target's own (not for the writer targets,
    whose payload is a plan, nor for the single-byte flips)."""

    name: str
    encode: Callable[[adp.DataProto], Any]
    decode: Callable[[Any], adp.DataProto]
    mutate: Callable[[Any, random.Random, "Corpus", "Target"], tuple[Any, str]]
    seeds: tuple[str, ...] = tuple(SEEDS)
    strict: bool = False
    stack: bool = True


# ---------------------------------------------------------------- writer and integrity targets
#
# ``writer-fsize``: a FileWriter writes a plan of batches (the seed five times, with an object
# column of ints, ints on fewer rows, rows that promote it to JSON at the third batch, a refused
# batch of tuples at the fourth and JSON-compatible strings at the fifth) under an RLIMIT_FSIZE drawn anywhere between
# 0 and past the final size, so that the limit hits every call: the first write, a plain
# write, the promotion rewrite, close. ``writer-kill``: the same plan in a forked child that
# SIGKILLs itself once it has written a drawn number of bytes (during the promotion rewrite
# in about half the cases). Both check the rule of issue 19: every batch whose write returned
# is in the final file or, when the writer failed or was killed, in what ``recover_file`` reads
# from a partial file; a refused write leaves the partial files byte for byte as they were. A
# loss is an AssertionError (``unexpected``: a finding); once the rule held they return the
# seed (``exact``) when the writer finished, and report ``error:DecodeError`` when it failed or
# was killed and everything was recovered. ``file-flip``: one byte of a
# checksummed file (plain, zstd or portable) XORed with 1..255 anywhere (footer, schema,
# message headers, padding, buffers): ``open_file(verify=True)``, ``verify()`` and
# ``read_all`` must fail with the library's error or give the seed back exactly.


def _evolving(dp: adp.DataProto) -> list[adp.DataProto]:
    """The writer plan of a seed: five batches whose ``evolve`` column is kept, kept on fewer
    rows, promoted (rewriting two batches of different row counts: their checksums must cover
    each one's own metadata, issue 48), refused, kept."""
    n = len(dp)

    def column(make: Callable[[int], Any]) -> np.ndarray:
        out = np.empty(n, dtype=object)
        for i in range(n):
            out[i] = make(i)
        return out

    values = [column(lambda i: i), column(lambda i: i + 1), column(lambda i: {"k": i}), column(lambda i: (i, i)), column(lambda i: f"s{i}")]
    plan = [adp.DataProto(dp.batch, {**dp.non_tensor_batch, "evolve": v}, dp.meta_info) for v in values]
    if n > 1:
        plan[1] = plan[1][: n - 1]
    return plan


def _plan_size(batches: list[adp.DataProto], options: dict) -> int:
    """The final file's size of the plan without a limit (the limits are drawn up to past it)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.arrow")
        _write_plan(path, batches, options)
        return os.path.getsize(path)


def _write_plan(path: str, batches: list[adp.DataProto], options: dict, on_return: Callable[[int], None] | None = None):
    """Write ``batches`` with a FileWriter of ``options``; returns (indices whose write returned,
    refused indices with the partial files' bytes before and after, whether close returned)."""
    returned: list[int] = []
    refusals: list[tuple[int, dict, dict]] = []
    folder = os.path.dirname(path)

    def partials() -> dict[str, bytes]:
        return {name: Path(folder, name).read_bytes() for name in sorted(os.listdir(folder)) if name.endswith(".partial")}

    writer = adp_files.FileWriter(path, **options)
    failed = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, dp in enumerate(batches):
            before = partials()
            try:
                writer.write(dp)
            except (adp.EncodeError, adp.SchemaMismatchError):
                refusals.append((i, before, partials()))
                if writer._failed:
                    failed = True
                    break
                continue
            returned.append(i)
            if on_return is not None:
                on_return(i)
    closed = False
    if not failed:
        try:
            writer.close()
            closed = True
        except adp.EncodeError:
            pass
    return returned, refusals, closed


def _expected(batches: list[adp.DataProto], returned: list[int]) -> adp.DataProto | None:
    return adp.DataProto.concat([batches[i] for i in returned]) if returned else None


def _recovered_from(folder: str, expected: adp.DataProto | None, also: list[adp.DataProto] = ()) -> adp.DataProto:
    """What some partial file in ``folder`` recovers, which must be ``expected`` (or one of ``also``:
    with a batch whose write was cut by a kill before it returned)."""
    partials = sorted(p for p in os.listdir(folder) if p.endswith(".partial"))
    tried = []
    for name in partials:
        out = os.path.join(folder, "recovered.arrow")
        try:
            adp_files.recover_file(os.path.join(folder, name), out)
            got = adp_files.read_file(out, allow_pickle=True)
        except adp.DecodeError as e:
            tried.append(f"{name}: {e}"[:200])
            continue
        for want in (expected, *also):
            if want is None:
                continue
            try:
                assert_dataproto_equal(want, got)
                return got
            except AssertionError:
                pass
        tried.append(f"{name}: recovers {len(got)} rows")
    if expected is None:
        return adp.DataProto()
    raise AssertionError(f"data loss: no partial file recovers the {len(expected)} rows written; {tried}")


def _writer_payload(dp: adp.DataProto) -> dict:
    """The unmutated case: the plan without a limit (``sizes`` caches the plan's file sizes)."""
    return {"batches": _evolving(dp), "sizes": {}, "options": {}, "limit": None}


class _Cut(adp.DecodeError):
    """Reported as ``error:DecodeError``: the writer failed (or was killed) and the rule held."""


_Cut.__name__ = "DecodeError"


def _seed_of(case: dict) -> adp.DataProto:
    """What a writer target returns once the rule held: the seed (its first batch without ``evolve``)."""
    first = case["batches"][0]
    return adp.DataProto(first.batch, {k: v for k, v in first.non_tensor_batch.items() if k != "evolve"}, first.meta_info)


def _mutate_writer(payload: dict, rng: random.Random, kill: bool) -> tuple[dict, str]:
    options = {"compression": rng.choice([None, "zstd"]), "checksums": rng.random() < 0.5 and _HAVE_XXHASH,
               "portable": rng.random() < 0.25}
    key = tuple(sorted(options.items()))
    if key not in payload["sizes"]:
        payload["sizes"][key] = _plan_size(payload["batches"], options)
    full = payload["sizes"][key]
    # a killed child writes the rewrite's bytes too: up to about twice the final size
    top = 2 * full if kill else full
    limit = rng.randint(0, top + 2048) if rng.random() < 0.9 else rng.choice([0, 8, 64, full - 1, full, full + 1, top + 1])
    case = {"batches": payload["batches"], "options": options, "limit": max(limit, 0)}
    at = "the end" if limit >= full else f"byte {limit} of {full}"
    return case, f"{'kill' if kill else 'rlimit-fsize'}: at {at}, {options}"


def _run_writer_fsize(case: dict) -> adp.DataProto:
    batches, options, limit = case["batches"], case["options"], case["limit"]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.arrow")
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            returned, refusals, closed = _write_plan(path, batches, options)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        for i, before, after in refusals:
            if before != after:
                raise AssertionError(f"the refused batch {i} changed the partial files: {list(before)} -> {list(after)}")
        expected = _expected(batches, returned)
        if closed:
            got = _read_written(path, options)
            assert_dataproto_equal(expected if expected is not None else adp.DataProto(), got)
            return _seed_of(case)
        if os.path.exists(path):
            raise AssertionError("close failed, yet the target path was written")
        _recovered_from(folder, expected)
        raise _Cut(f"the writer failed at {limit} bytes; recover_file gave back all {len(returned)} returned batch(es)")


def _read_written(path: str, options: dict) -> adp.DataProto:
    """What a finished writer wrote, verified against its checksums if it recorded them (a
    refusal of an intact file is a finding: ``unexpected:AssertionError``)."""
    if not options.get("checksums"):
        return adp_files.read_file(path, allow_pickle=True)
    try:
        with adp_files.open_file(path, verify=True, allow_pickle=True) as reader:
            reader.verify()
            return reader.read_all()
    except adp.DecodeError as e:
        raise AssertionError(f"the writer's own file fails its checksums: {e}") from e


class _KillingFile:
    """A binary file that SIGKILLs its process once ``budget`` bytes were written to all of them."""

    written = 0
    budget = 0

    def __init__(self, path: str, mode: str = "wb"):
        self.file = open(path, "wb", buffering=0)  # unbuffered: the writer reads its partial file back
        self.closed = False

    def write(self, data) -> int:
        n = len(memoryview(data).cast("B"))
        if _KillingFile.written + n > _KillingFile.budget:
            keep = _KillingFile.budget - _KillingFile.written
            self.file.write(memoryview(data).cast("B")[:keep])
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        _KillingFile.written += n
        return self.file.write(data)

    def tell(self) -> int:
        return self.file.tell()

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.closed = True
        self.file.close()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


def _run_writer_kill(case: dict) -> adp.DataProto:
    batches, options = case["batches"], case["options"]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.arrow")
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: write until killed
            try:
                os.close(read_end)
                _KillingFile.budget = 2**62 if case["limit"] is None else case["limit"]
                adp_files.writer.pa.OSFile = lambda p, mode="wb": pa.PythonFile(_KillingFile(p), mode="w")  # this child only
                _write_plan(path, batches, options, on_return=lambda i: os.write(write_end, bytes([i])))
                os.write(write_end, b"c")
            finally:
                os._exit(0)
        os.close(write_end)
        report = b""
        while chunk := os.read(read_end, 64):
            report += chunk
        os.close(read_end)
        os.waitpid(pid, 0)
        returned = [b for b in report if b != ord("c")]
        if report.endswith(b"c") and os.path.exists(path):  # finished: the file has every returned batch
            got = _read_written(path, options)
            expected = _expected(batches, returned)
            assert_dataproto_equal(expected if expected is not None else adp.DataProto(), got)
            return _seed_of(case)
        later = range(max(returned, default=-1) + 1, len(batches))
        _recovered_from(folder, _expected(batches, returned), [_expected(batches, returned + [i]) for i in later])
        raise _Cut(f"killed after {case['limit']} bytes; recover_file gave back all {len(returned)} returned batch(es)")


def _flip(payload: bytes, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.125:  # a control: the file as written must read back exactly
        return payload, "flip-control: none"
    at, mask = rng.randrange(len(payload)), rng.randint(1, 255)
    out = bytearray(payload)
    out[at] ^= mask
    return bytes(out), f"flip: byte {at} of {len(payload)} ^= {mask:#04x}"


def _checksummed(dp: adp.DataProto, options: dict) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "seed.arrow")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            adp_files.write_file(path, dp.array_split(min(2, len(dp))), checksums=True, **options)
        return Path(path).read_bytes()


def _verified_all(path: str, out: str) -> adp.DataProto:
    with adp_files.open_file(path, verify=True) as reader:
        reader.verify()
        return reader.read_all()


_HAVE_XXHASH = importlib.util.find_spec("xxhash") is not None


def writer_targets() -> list[Target]:
    """The writer targets and the byte flips of checksummed files (see the comment above)."""
    unpickled = tuple(s for s in SEEDS if s != "pickled")  # the writer reads back with allow_pickle: no refusal to see
    found = [
        Target("writer-fsize", encode=_writer_payload, decode=_run_writer_fsize,
               mutate=lambda payload, rng, corpus, target: _mutate_writer(payload, rng, kill=False),
               seeds=unpickled, stack=False),
        Target("writer-kill", encode=_writer_payload, decode=_run_writer_kill,
               mutate=lambda payload, rng, corpus, target: _mutate_writer(payload, rng, kill=True),
               seeds=unpickled, stack=False),
    ]
    if _HAVE_XXHASH:
        for suffix, options in (("", {}), ("-zstd", {"compression": "zstd"}), ("-portable", {"portable": True})):
            found.append(Target(
                f"file-flip{suffix}", encode=lambda dp, o=options: _checksummed(dp, o),
                decode=lambda payload: _in_folder(payload, _verified_all),
                mutate=lambda payload, rng, corpus, target: _flip(payload, rng), strict=True, stack=False,
                seeds=unpickled,  # it would only be refused
            ))
    return found


def _ipc_target(compression: str | None) -> Target:
    name = "ipc" if compression is None else f"ipc-{compression}"
    return Target(
        name,
        encode=lambda dp: adp.to_ipc(dp, compression=compression).to_pybytes(),
        decode=adp.from_ipc,
        mutate=lambda payload, rng, corpus, target: _mutate_stream(payload, rng, corpus, target, compression),
    )


def _portable_ipc(dp: adp.DataProto) -> bytes:
    """An IPC stream of the portable view of ``dp`` (``to_arrow(portable=True)``)."""
    record_batch = adp.to_arrow(dp, portable=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, record_batch.schema) as writer:
        writer.write_batch(record_batch)
    return sink.getvalue().to_pybytes()


def targets() -> dict[str, Target]:
    """The targets available in this checkout, by name."""
    found = [_ipc_target(None), _ipc_target("lz4"), _ipc_target("zstd")]
    found.append(
        Target(
            "state",
            encode=lambda dp: _plain_state(pickling.batch_state(adp.to_arrow(dp))),
            decode=_decode_state,
            mutate=lambda payload, rng, corpus, target: _mutate_state(payload, rng, corpus),
            seeds=tuple(s for s in SEEDS if s != "pickled"),
        )
    )
    for compression in (None, "zstd"):
        found.append(
            Target(
                "file" if compression is None else f"file-{compression}",
                encode=lambda dp, c=compression: _encode_file(dp, c),
                decode=_decode_file,
                mutate=lambda payload, rng, corpus, target, c=compression: _mutate_file(payload, rng, corpus, target, c),
            )
        )
    checksummed = [] if importlib.util.find_spec("xxhash") is None else [  # checksums need xxhash
        Target(
            "file-verify",
            encode=lambda dp: _encode_file(dp, None, checksums=True),
            decode=lambda payload: _in_folder(payload, _verified),
            mutate=lambda payload, rng, corpus, target: _mutate_file(payload, rng, corpus, target, None),
        )
    ]
    found += checksummed
    for name, use, compression in (
        ("file-reader", _every_reader_method, None),
        ("file-copy", _copied, "zstd"),
        ("file-recover", _recovered, None),
        ("dataset", _dataset, "lz4"),
        ("cli", _commands, None),
    ):
        found.append(
            Target(
                name,
                encode=lambda dp, c=compression: _encode_file(dp, c),
                decode=lambda payload, use=use: _in_folder(payload, use),
                mutate=lambda payload, rng, corpus, target, c=compression: _mutate_file(payload, rng, corpus, target, c),
                # `convert` refuses a pickled file outright (exit 1): left out, as for "state"
                seeds=tuple(s for s in SEEDS if s != "pickled") if name == "cli" else tuple(SEEDS),
            )
        )
    found.append(
        Target(
            "pandas",
            encode=lambda dp: adp_pandas.to_pandas(dp),
            decode=_decode_frame,
            mutate=lambda payload, rng, corpus, target: _mutate_frame(payload, rng),
            seeds=tuple(s for s in SEEDS if s != "pickled"),  # a frame holds the objects themselves: nothing to refuse
        )
    )
    found.append(
        Target(
            "ipc-portable",
            encode=_portable_ipc,
            decode=adp.from_ipc,
            mutate=lambda payload, rng, corpus, target: _mutate_stream(payload, rng, corpus, target, None),
        )
    )
    found += writer_targets()
    found += _json_foreign_targets()
    for name, decode in (("compact", _rebuild_compact), ("compact-views", _rebuild_compact_through_views)):
        found.append(
            Target(
                name,
                encode=_compact_payload,
                decode=decode,
                mutate=lambda payload, rng, corpus, target: _mutate_compact(payload, rng, corpus, target),
                seeds=("verl-ppo", "compact-dtypes", "no-batch", "json"),
            )
        )
    found.append(
        Target(
            "views", encode=_views_payload, decode=_views_round_trip,
            mutate=lambda payload, rng, corpus, target: _mutate_views(payload, rng),
            seeds=("no-batch",), strict=True, stack=False,
        )
    )
    found.append(
        Target(  # damaged verl pickles (load_from_disk(allow_pickle=True)): DecodeError, never a crash
            "verl-pickle",
            encode=_encode_verl_pickle,
            decode=lambda payload: _in_folder(payload, _load_verl_pickle),
            mutate=lambda payload, rng, corpus, target: _mutate_bytes(payload, rng, corpus.donor(target, rng)),
            seeds=("verl-ppo", "verl-kinds", "no-batch"),  # what verl's numpy mode holds; nothing to refuse
        )
    )
    return {t.name: t for t in found}


class Corpus:
    """Seed DataProtos and their encoded payloads per target (built once per process)."""

    def __init__(self, target_names: list[str] | None = None):
        available = targets()
        self.targets = [available[n] for n in (target_names or list(available))]
        self.seeds = {name: build() for name, build in {**SEEDS, **OWN_SEEDS}.items()}
        self.payloads = {(t.name, s): t.encode(self.seeds[s]) for t in self.targets for s in t.seeds}

    def target(self, name: str) -> Target:
        return next(t for t in self.targets if t.name == name)

    def donor(self, target: Target, rng: random.Random) -> Any:
        return self.payloads[target.name, rng.choice(target.seeds)]


# ---------------------------------------------------------------- metadata edits

INTERESTING_INTS = [
    0, 1, -1, 2, 3, 7, 8, 16, 255, 256, 2**15, 2**16, 2**31 - 1, 2**31, -(2**31), 2**32,
    2**53, 2**62, 2**63 - 1, -(2**63), 2**63, 2**64, 10**30,
]
JSON_JUNK = ["", "{", "null", "[]", "{}", '"x"', "[" * 100_000 + "]" * 100_000, "1e999", "NaN"]
SCHEMA_VALUES = {
    "adp.format": ["arrow-dataproto", "arrow-dataprot0", ""],
    "adp.version": ["1.0", "1.99", "1.1", "2.0", "0.9", "1", "1.", ".1", "1.0.0", "01.0", "\u0661.0", "-1.0", "1.x",
                    "99999999999999999999.0", "1.\u00b2", "\u00b2.0", "1." + "0" * 5000, "1" * 5000 + ".0", " 1.0"],
    "adp.batch_size": ["null", "[]", "[0]", "[1]", "[-1]", "[6, 2]", "[6.0]", '["6"]', "[true]",
                       "[9223372036854775807]", "[18446744073709551616]", "6", "{}"],
    "adp.device": ["null", '"cpu"', '"cuda"', '"cuda:0"', '"meta"', '"bogus"', '"cpu:1"', "5", "[]",
                   '"privateuseone"', '"privateuseone:0"', '"cuda:99999999999999999999"', '"\u00e9"', '"cpu\u0000"'],
    "adp.tree": ["[]", "null", '[["x", [6], null, []]]', "[1]", '[["x"]]', '["x", "x"]', '[["x", [], null, "y"]]',
                 '["a", ["a", [6], null, ["c"]]]', '["a.c", ["a", [6], null, ["c"]]]', '[["a", [6], "privateuseone", []]]'],
    "adp.meta_info.encoding": ["json", "pickle", "yaml", ""],
    "adp.meta_info": ["[]", "gASVAAAAAAAAAAAu", base64.b64encode(b"\x80\x05junk").decode(), "!!"],
}
FIELD_VALUES = {
    "adp.kind": ["tensor", "jagged", "strided", "numeric", "string", "object", "json", "pickle", ""],
    "adp.dtype": ["int8", "uint8", "int64", "float32", "bfloat16", "complex64", "complex128", "bool", "float8_e4m3fn",
                  "bits16", "quint8", "bogus", "<i8", "<f4", "|b1", "|O", "<U5", "|S3", ">i4", "<M8[ns]", "<c8", "V8",
                  '[["a", "<i4"]]', "<U99999999999", "<U1000000000", "[garbage", "<U100000000", "|S100000000",
                  "<U1", "|S1", "<M8[as]", "<m8[fs]", "<M8", "<m8", "<U0"],
    "adp.ragged_idx": ["0", "1", "2", "3", "-1", "", "x", "99999999999999999999", "1.5", "\u0662", "\u00b2",
                       "1" * 5000, " 1", "+1"],
    "adp.device": ["cpu", "cuda", "cuda:0", "meta", "bogus", "cpu:1", "", "privateuseone", "privateuseone:0",
                   "cuda:99999999999999999999", "\u00e9", "None", "cpu:-1"],
    "adp.offsets_of": ["", "x", "input_ids", "responses", "a", "ragged", "hollow", "\u00e9"],
}
SHAPE_ITEMS = [0, 1, 2, 3, 7, -1, None, 2**31, 2**32, 2**62, 2**63, 2**64, 1.5, "a", [1], True]


def _decoded(meta: dict[bytes, bytes] | None) -> dict[str, str]:
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in (meta or {}).items()}


def _flip_char(text: str, rng: random.Random) -> str:
    data = bytearray(text.encode())
    if not data:
        return chr(rng.randrange(32, 127))
    i = rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(7)
    return data.decode("utf-8", "replace")


def _edit_shape(text: str, rng: random.Random) -> str:
    try:
        shape = json.loads(text)
    except ValueError:
        shape = []
    if not isinstance(shape, list):
        shape = []
    op = rng.randrange(4)
    if op == 0 and shape:
        shape[rng.randrange(len(shape))] = rng.choice(SHAPE_ITEMS)
    elif op == 1:
        shape.insert(rng.randrange(len(shape) + 1), rng.choice(SHAPE_ITEMS))
    elif op == 2 and shape:
        shape.pop(rng.randrange(len(shape)))
    else:
        rng.shuffle(shape)
    return json.dumps(shape)


def _edit_tree(text: str, rng: random.Random) -> str:
    try:
        tree = json.loads(text)
    except ValueError:
        return text
    if not isinstance(tree, list) or not tree:
        return rng.choice(SCHEMA_VALUES["adp.tree"])
    op = rng.randrange(4)
    i = rng.randrange(len(tree))
    if op == 0:
        rng.shuffle(tree)
    elif op == 1:
        tree.pop(i)
    elif op == 2:
        tree.insert(i, tree[i])
    elif isinstance(tree[i], str) and rng.random() < 0.5:
        tree[i] = [tree[i], [rng.choice(INTERESTING_INTS)], None, [tree[i]]]
    elif isinstance(tree[i], str):  # a colliding key: a nested TensorDict named like a leaf
        tree.append([tree[i], [6], None, ["c"]])
    else:
        tree[i] = tree[i][0]
    return json.dumps(tree)


def _edit_value(key: str, value: str, pool: dict[str, list[str]], rng: random.Random) -> str | None:
    """A new value for metadata ``key`` (``None``: delete the key)."""
    op = rng.randrange(10)
    if op == 0:
        return None
    if op == 1:
        return _flip_char(value, rng)
    if op == 2:
        return rng.choice(JSON_JUNK)
    if key in ("adp.shape", "adp.row_shape", "adp.batch_size"):
        return _edit_shape(value, rng)
    if key == "adp.tree" and op < 6:
        return _edit_tree(value, rng)
    if key in pool:
        return rng.choice(pool[key])
    return _flip_char(value, rng)


def _set(meta: dict[str, str], key: str, value: str | None) -> dict[str, str]:
    meta = dict(meta)
    if value is None:
        meta.pop(key, None)
    else:
        meta[key] = value
    return meta


def edit_schema(schema: pa.Schema, rng: random.Random) -> tuple[pa.Schema, str]:
    """One edit of the schema's or a field's metadata, or of the field names."""
    fields = list(schema)
    op = rng.choice(["schema", "schema", "version", "field", "field", "field", "swap-meta", "rename"])
    if op in ("schema", "version"):
        meta = _decoded(schema.metadata)
        key = "adp.version" if op == "version" else rng.choice(sorted(set(meta) | set(SCHEMA_VALUES)))
        value = rng.choice(SCHEMA_VALUES[key]) if op == "version" else _edit_value(key, meta.get(key, ""), SCHEMA_VALUES, rng)
        return schema.with_metadata(_set(meta, key, value)), f"meta:{key}"
    if not fields:
        return schema, "meta:none"
    i = rng.randrange(len(fields))
    if op == "field":
        meta = _decoded(fields[i].metadata)
        key = rng.choice(sorted(set(meta) | {"adp.kind", "adp.dtype", "adp.device", "adp.ragged_idx", "adp.offsets_of"}))
        fields[i] = fields[i].with_metadata(_set(meta, key, _edit_value(key, meta.get(key, ""), FIELD_VALUES, rng)))
        return pa.schema(fields, metadata=schema.metadata), f"field:{key}"
    j = rng.randrange(len(fields))
    if op == "swap-meta":
        fields[i], fields[j] = fields[i].with_metadata(fields[j].metadata), fields[j].with_metadata(fields[i].metadata)
        return pa.schema(fields, metadata=schema.metadata), "field:swap-metadata"
    fields[i] = fields[i].with_name(rng.choice([fields[j].name, "", fields[i].name + "x"]))
    return pa.schema(fields, metadata=schema.metadata), "field:rename"


# ---------------------------------------------------------------- byte mutations


@lru_cache(maxsize=64)
def _stream_messages(payload: bytes) -> tuple[tuple[int, int, int], ...]:
    """``(start, metadata_end, end)`` of each message of a valid IPC stream (the end-of-stream marker excluded)."""
    spans, pos = [], 0
    while pos + 8 <= len(payload):
        length = struct.unpack_from("<i", payload, pos + 4)[0]
        if length == 0:
            break
        message = pa.ipc.read_message(pa.py_buffer(payload[pos:]))
        body = message.body.size if message.body is not None else 0
        spans.append((pos, pos + 8 + length, pos + 8 + length + body))
        pos += 8 + length + body
    return tuple(spans)


def _file_metadata_spans(payload: bytes) -> list[tuple[int, int]]:
    """Where an Arrow file keeps its metadata: the embedded stream's message headers and the footer."""
    footer_length = struct.unpack_from("<i", payload, len(payload) - 10)[0]
    spans = [(len(payload) - 10 - footer_length, len(payload))]
    try:
        spans += [(start + 8, end) for start, end, _ in _stream_messages(payload[8:])]
    except pa.ArrowException:
        pass
    return spans


def _mutate_file(payload: bytes, rng: random.Random, corpus: Corpus, target: Target, compression) -> tuple[bytes, str]:
    """One mutation of an Arrow file: an edit of the footer schema or of one batch's metadata, or bytes."""
    if rng.random() < 0.3:
        reader = pa.ipc.open_file(payload)
        parts = [reader.get_batch_with_custom_metadata(i) for i in range(reader.num_record_batches)]
        schema, footer = reader.schema, reader.metadata
        i = rng.randrange(len(parts) + 1)
        if i == len(parts):  # the footer schema, which every batch must match
            schema, desc = edit_schema(schema, rng)
            desc = f"footer-{desc}"
        else:
            batch, custom = parts[i]
            edited, desc = edit_schema(pa.schema([], metadata=custom), rng)
            parts[i] = (batch, edited.metadata)
            desc = f"batch-{desc}"
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression=compression, allow_64bit=True)
        with pa.ipc.new_file(sink, schema, options=options, metadata=footer) as writer:
            for batch, custom in parts:
                writer.write_batch(pa.RecordBatch.from_arrays(batch.columns, schema=schema), custom_metadata=custom)
        return sink.getvalue().to_pybytes(), desc
    if rng.random() < 0.3:
        mutated = _mutate_body(payload, rng, 8)
        if mutated is not None:
            return mutated
    return _mutate_bytes(payload, rng, corpus.donor(target, rng), _file_metadata_spans(payload))


def _position(payload: bytes, rng: random.Random, spans: list[tuple[int, int]]) -> int:
    """A random offset in ``payload``: half the time inside the metadata spans."""
    if spans and rng.random() < 0.5:
        start, end = rng.choice(spans)
        return rng.randrange(start, max(start + 1, min(end, len(payload))))
    return rng.randrange(max(1, len(payload)))


def _mutate_bytes(payload: bytes, rng: random.Random, donor: bytes, spans=()) -> tuple[bytes, str]:
    """One byte-level mutation of ``payload``; ``donor`` supplies splices, ``spans`` the metadata to favour."""
    data = bytearray(payload)
    if not data:
        return rng.randbytes(rng.randrange(1, 64)), "bytes:random"
    op = rng.choice(["bitflip", "bitflip", "byte", "int", "int", "digits", "truncate", "delete", "insert", "splice"])
    pos = _position(data, rng, spans)
    if op == "digits":  # a number inside JSON metadata (shapes, batch sizes, extension shapes), same length
        runs = [m.span() for m in re.finditer(rb"\d+", bytes(data))]
        if runs:
            start, end = rng.choice(runs)
            n = end - start  # str() of an int refuses more than 4,300 digits (a long run of digit bytes)
            random_digits = str(rng.randrange(10**n)) if n <= 4000 else "".join(rng.choices("0123456789", k=n))
            digits = rng.choice(["0" * n, "9" * n, random_digits])
            data[start:end] = digits.rjust(end - start, "0").encode()
    elif op == "bitflip":
        for _ in range(rng.randrange(1, 9)):
            data[_position(data, rng, spans)] ^= 1 << rng.randrange(8)
    elif op == "byte":
        data[pos] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)])
    elif op == "int":
        width = rng.choice([4, 8])
        pos -= pos % width
        if pos + width <= len(data):
            old = int.from_bytes(data[pos : pos + width], "little", signed=True)
            value = rng.choice(INTERESTING_INTS + [old + 1, old - 1, old * 2, old + 8, -old])
            data[pos : pos + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    elif op == "truncate":
        del data[pos:]
    elif op == "delete":
        del data[pos : pos + rng.choice([1, 4, 8, rng.randrange(1, 256)])]
    elif op == "insert":
        data[pos:pos] = rng.randbytes(rng.choice([1, 4, 8, rng.randrange(1, 64)]))
    else:
        start = rng.randrange(len(donor))
        chunk = donor[start : start + rng.randrange(1, 512)]
        data[pos : pos + (len(chunk) if rng.random() < 0.5 else 0)] = chunk
    return bytes(data), f"bytes:{op}"


def _mutate_body(payload: bytes, rng: random.Random, base: int) -> tuple[bytes, str] | None:
    """A structure-aware edit of one record batch message of the IPC stream at ``payload[base:]``:
    a value inside one buffer (list offsets, lengths, values; for a compressed payload the
    compression frame: its recorded decoded length or its first bytes), a buffer's offset or
    length in the header, or a field node's length or null count. None if there is no batch."""
    from arrow_dataproto._ipc import FlatTable  # the bounds-checked flatbuffer reader

    batches = []
    for start, meta_end, end in _stream_messages(payload[base:]):
        metadata = payload[base + start + 8 : base + meta_end]
        message = FlatTable.root(metadata)
        if message.scalar(1, "<B", 0) == 3 and message.table(2) is not None:
            batches.append((base + start + 8, base + meta_end, message.table(2)))
    if not batches:
        return None
    meta_start, body_start, header = rng.choice(batches)
    compressed = header.table(3) is not None
    buffers = header.structs(2, 16)
    nodes = header.structs(1, 16)
    data = bytearray(payload)

    def put(pos: int, value: int, width: int = 8) -> None:
        data[pos : pos + width] = (value % (1 << (8 * width))).to_bytes(width, "little")

    op = rng.choice(["value", "value", "value", "frame" if compressed else "value", "buffer", "node"])
    if op in ("value", "frame") and buffers:
        at = rng.choice(buffers)
        offset, length = (int.from_bytes(header.data[at + k : at + k + 8], "little", signed=True) for k in (0, 8))
        if length < 8:
            return None
        if op == "frame":  # the int64 decoded length that starts each compressed buffer, or the frame after it
            if rng.random() < 0.6:
                put(body_start + offset, rng.choice(INTERESTING_INTS + [length, length * 1000, 2**40]))
            else:
                data[body_start + offset + 8 + rng.randrange(min(8, length - 8) or 1)] ^= 1 << rng.randrange(8)
            return bytes(data), "body:frame"
        width = rng.choice([4, 8])
        pos = body_start + offset + rng.randrange(max(1, length // width)) * width
        old = int.from_bytes(data[pos : pos + width], "little", signed=True)
        put(pos, rng.choice(INTERESTING_INTS + [old + 1, old - 1, old * 2, -old, old + 1000]), width)
        return bytes(data), "body:value"
    if op == "buffer" and buffers:
        at = meta_start + rng.choice(buffers) + rng.choice([0, 8])
        put(at, rng.choice(INTERESTING_INTS + [8, 16, 64]))
        return bytes(data), "body:buffer-header"
    if nodes:
        at = meta_start + rng.choice(nodes) + rng.choice([0, 8])
        put(at, rng.choice(INTERESTING_INTS))
        return bytes(data), "body:node"
    return None


def _write_stream(batches: list[pa.RecordBatch], schema: pa.Schema, compression: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression, allow_64bit=True)
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _read_stream(payload: bytes) -> pa.RecordBatch:
    return pa.ipc.open_stream(payload).read_next_batch()


def _mutate_stream(payload: bytes, rng: random.Random, corpus: Corpus, target: Target, compression) -> tuple[bytes, str]:
    """One mutation of an IPC stream: a metadata edit, a message recombination, or a byte mutation."""
    op = rng.random()
    if op < 0.3:
        batch = _read_stream(payload)
        schema, desc = edit_schema(batch.schema, rng)
        if rng.random() < 0.2 and batch.num_columns > 1:  # schema/body mismatch: swap two columns, fields and all
            i, j = rng.sample(range(batch.num_columns), 2)
            order = list(range(batch.num_columns))
            order[i], order[j] = j, i
            swapped = pa.schema([schema.field(k) for k in order], metadata=schema.metadata)
            batch = pa.RecordBatch.from_arrays([batch.column(k) for k in order], schema=swapped)
            return _write_stream([batch], swapped, compression), "columns:swap"
        return _write_stream([pa.RecordBatch.from_arrays(batch.columns, schema=schema)], schema, compression), desc
    if op < 0.45:
        return _recombine(payload, rng, corpus, target)
    if op < 0.65:
        mutated = _mutate_body(payload, rng, 0)
        if mutated is not None:
            return mutated
    spans = [(start, meta_end) for start, meta_end, _ in _stream_messages(payload)]
    return _mutate_bytes(payload, rng, corpus.donor(target, rng), spans)


EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _recombine(payload: bytes, rng: random.Random, corpus: Corpus, target: Target) -> tuple[bytes, str]:
    """Rebuild a stream from whole messages: another seed's schema or batch, a batch twice, none, no end marker."""
    (schema, batch) = [payload[s:e] for s, _, e in _stream_messages(payload)]
    donor = corpus.donor(target, rng)
    donor_schema, donor_batch = [donor[s:e] for s, _, e in _stream_messages(donor)]
    op = rng.choice(["donor-schema", "donor-batch", "batch-twice", "two-batches", "no-batch", "no-eos"])
    parts = {
        "donor-schema": [donor_schema, batch, EOS],
        "donor-batch": [schema, donor_batch, EOS],
        "batch-twice": [schema, batch, batch, EOS],
        "two-batches": [schema, batch, donor_batch, EOS],
        "no-batch": [schema, EOS],
        "no-eos": [schema, batch],
    }[op]
    return b"".join(parts), f"messages:{op}"


# ---------------------------------------------------------------- DataFrame attrs mutations

RECORD_VALUES = {
    "version": ["1.0", "1.1", "2.0", "1.\u00b2", "1" * 5000 + ".0", 1, None],
    "batch_size": [[6], [0], [-1], [2**63], [10**30], None, "6", [6, 2]],
    "device": [None, "cpu", "privateuseone", "cuda:99999999999999999999", "\u00e9", 5],
    "tree": [[], ["x", "x"], ["a", ["a", [6], None, ["c"]]], None, [1]],
    "kind": ["tensor", "jagged", "strided", "numeric", "string", "object", "json", "pickle", "bogus", None],
    "dtype": ["int64", "float32", "bfloat16", "<i8", "<U100000000", "|S100000000", "<U1", "<M8[as]", "<M8",
              "|O", "bogus", 5],
    "shape": [[2**62, 2**62], [10**30], [2**40, 2**40, 2**40], [None], [], [-1], [3], "x", None],
    "row_shape": [[2**62, 2**62], [10**30], [2**40, 2**40, 2**40], [], [3], [-1], None],
    "ragged_idx": ["1", "2", "\u00b2", "1" * 5000, 1, None],
}


def _mutate_frame(frame, rng: random.Random) -> tuple[Any, str]:
    """One edit of what ``from_pandas`` believes: a value of the ``attrs`` record (schema level
    or one column's), or the frame's own columns (a dropped or renamed one)."""
    frame = frame.copy(deep=True)
    record = frame.attrs.get("arrow_dataproto")
    if not isinstance(record, dict) or rng.random() < 0.15:
        if len(frame.columns) and rng.random() < 0.5:
            return frame.drop(columns=[rng.choice(list(frame.columns))]), "frame:drop-column"
        frame.attrs = {} if rng.random() < 0.5 else frame.attrs
        return frame, "frame:no-attrs"
    columns = record.get("columns") or {}
    if columns and rng.random() < 0.7:
        name = rng.choice(sorted(columns))
        key = rng.choice(["kind", "dtype", "shape", "row_shape", "ragged_idx", "device"])
        if rng.random() < 0.1:
            columns[name].pop(key, None)
        else:
            columns[name][key] = copy.deepcopy(rng.choice(RECORD_VALUES.get(key, RECORD_VALUES["device"])))
        return frame, f"attrs:column-{key}"
    key = rng.choice(["version", "batch_size", "device", "tree"])
    record[key] = copy.deepcopy(rng.choice(RECORD_VALUES[key]))
    return frame, f"attrs:{key}"


# ---------------------------------------------------------------- state mutations


def _nodes(columns: list) -> list[list]:
    """Every array state in ``columns``, children included (each a mutable 5-item list)."""
    found = []
    for node in columns:
        found.append(node)
        found.extend(_nodes(node[4]))
    return found


def _mutate_buffer(data: bytes | None, rng: random.Random) -> tuple[bytes | None, str]:
    if data is None:
        return rng.randbytes(rng.choice([1, 8, 64])), "buffer:fill"
    op = rng.choice(["truncate", "truncate", "flip", "flip", "int", "none", "grow"])
    if op == "truncate":
        return data[: rng.randrange(len(data) + 1)], "buffer:truncate"
    if op == "none":
        return None, "buffer:none"
    if op == "grow":
        return data + bytes(rng.choice([1, 8, 4096])), "buffer:grow"
    buf = bytearray(data)
    if buf and op == "flip":
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif len(buf) >= 8:
        pos = rng.randrange(len(buf) // 8) * 8
        buf[pos : pos + 8] = (rng.choice(INTERESTING_INTS) % 2**64).to_bytes(8, "little")
    return bytes(buf), f"buffer:{op}"


def _mutate_state(state: list, rng: random.Random, corpus: Corpus) -> tuple[list, str]:
    """One mutation of a pickling state: its schema, row count, or one array node."""
    schema_bytes, num_rows, columns = copy.deepcopy(state)
    op = rng.random()
    if op < 0.15:
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
        except (pa.ArrowException, OSError):  # already mutated beyond reading: mutate its bytes instead
            op = 0.2
        else:
            schema, desc = edit_schema(schema, rng)
            return [schema.serialize().to_pybytes(), num_rows, columns], desc
    if op < 0.25:
        mutated, desc = _mutate_bytes(schema_bytes, rng, corpus.donor(corpus.target("state"), rng)[0])
        return [mutated, num_rows, columns], f"schema-{desc}"
    if op < 0.3:
        donor = corpus.donor(corpus.target("state"), rng)
        return [donor[0], num_rows, columns], "schema:donor"
    if op < 0.35:
        return [schema_bytes, rng.choice(INTERESTING_INTS + [None, "3"]), columns], "num_rows"
    if op < 0.4 and columns:
        return [schema_bytes, num_rows, columns], f"columns:{_reorder_columns(columns, rng)}"
    nodes = _nodes(columns)
    if not nodes:
        return [schema_bytes, num_rows, columns], "columns:empty"
    node = rng.choice(nodes)
    part = rng.choice(["length", "null_count", "offset", "buffers", "buffers", "buffers", "children"])
    if part in ("length", "null_count", "offset"):
        index = ("length", "null_count", "offset").index(part)
        near = [node[index] + 1, node[index] - 1] if isinstance(node[index], int) else []
        node[index] = rng.choice(INTERESTING_INTS + near + ["1", 1.0])
        return [schema_bytes, num_rows, columns], f"node:{part}"
    if part == "buffers" and node[3]:
        i = rng.randrange(len(node[3]))
        how = rng.random()
        if how < 0.1:
            node[3].pop(i)
            return [schema_bytes, num_rows, columns], "buffers:drop"
        if how < 0.15:
            node[3].append(node[3][i])
            return [schema_bytes, num_rows, columns], "buffers:extra"
        node[3][i], desc = _mutate_buffer(node[3][i], rng)
        return [schema_bytes, num_rows, columns], desc
    other = rng.choice(nodes)
    if node[4] and rng.random() < 0.5:
        node[4].pop(rng.randrange(len(node[4])))
        return [schema_bytes, num_rows, columns], "children:drop"
    node[4].append(copy.deepcopy(other))
    return [schema_bytes, num_rows, columns], "children:extra"


# ---------------------------------------------------------------- cases


@dataclass
class Case:
    number: int
    target: str
    seed: str
    mutation: str
    payload: Any


def make_case(number: int, base_seed: int, corpus: Corpus) -> Case:
    """Case ``number``: a target (round robin), a seed, and one to three stacked mutations."""
    rng = random.Random(f"{base_seed}:{number}")
    target = corpus.targets[number % len(corpus.targets)]
    seed = rng.choice(target.seeds)
    payload = corpus.payloads[target.name, seed]
    payload, desc = target.mutate(payload, rng, corpus, target)
    descs = [desc]
    for _ in range(rng.choice([0, 0, 0, 1, 2]) if target.stack else 0):  # stacked: structural ones need a valid payload
        if isinstance(payload, bytes):
            payload, desc = _mutate_bytes(payload, rng, corpus.donor(target, rng))
        elif target.name == "pandas":
            payload, desc = _mutate_frame(payload, rng)
        elif target.name in ("compact", "compact-views"):
            payload, desc = _mutate_compact(payload, rng, corpus, target)
        else:
            payload, desc = _mutate_state(payload, rng, corpus)
        descs.append(desc)
    return Case(number, target.name, seed, "+".join(descs), payload)


def check_consistent(dp: adp.DataProto) -> None:
    """Raise unless ``dp`` is a usable DataProto: it re-encodes, and decoding that is bit-equal to it."""
    dp.check_consistency()
    assert_dataproto_equal(dp, adp.from_ipc(adp.to_ipc(dp), allow_pickle=True))


def check_case(target: Target, original: adp.DataProto, payload: Any) -> tuple[str, str]:
    """Decode ``payload`` and classify the result (see the module docstring)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            decoded = target.decode(payload)
    except adp.DataProtoError as e:
        return f"error:{type(e).__name__}", str(e)[:300]
    except Exception as e:  # noqa: BLE001 -- any other exception is what we are looking for
        return f"unexpected:{type(e).__name__}", "".join(traceback.format_exception(e)[-6:])[-2000:]
    try:
        assert_dataproto_equal(original, decoded)
        return "exact", ""
    except Exception as e:  # noqa: BLE001 -- not equal (or not even comparable): judged by the check below
        if target.strict:  # a checksummed file read back as something else, unnoticed
            return "silent:wrong-values", str(e)[:2000]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_consistent(decoded)
    except Exception as e:  # noqa: BLE001
        return f"inconsistent:{type(e).__name__}", "".join(traceback.format_exception(e)[-6:])[-2000:]
    return "valid", ""


def is_finding(outcome: str) -> bool:
    return not (outcome in ("exact", "valid") or outcome.startswith("error:"))


# ---------------------------------------------------------------- JSON text and other tools' types
# (issue 19). Both targets judge a decode against an oracle of their own: a value that decodes
# but differs from what the payload says is a finding (``unexpected:SilentWrong``).


class SilentWrong(AssertionError):
    """A decode that returned something other than what the payload holds."""


def _json_seed() -> adp.DataProto:
    """Object columns of the JSON kind: dicts of other keys per row, nested lists, numbers of each type."""
    from arrow_dataproto.testing.samples import verl_rollout

    non_tensor = verl_rollout(rows=4, prompt=2, response=2, seed=3)[1]
    return adp.DataProto(None, {k: non_tensor[k] for k in ("extra_info", "messages", "scores", "ground_truth")}, {})


JSON_PIECES = [
    "1e999", "-1e400", "1e-400", "-2e-999", "0e-999", "0.0e400", "1.7976931348623159e308", "2.4703282292062328e-324",
    "123456789012345678901234567890", "-9223372036854775809", "18446744073709551615", "-0", "1E5", "NaN", "-Infinity",
    '"\\ud83d"', '"\\ude00"', '"\\ud83d\\ude00"', '"\\ud83d\\u0041"', '"\\u0000"', '"\\\\ud83d"', "true", "null", "[]", "{}",
    " ", "\n", ",", "]", "}", '"', "\\", "[" * 70 + "]" * 70, "[" * 2000,
]
JSON_BYTES = [b"\xed\xa0\xbd", b"\xed\xb8\x80", b"\xc0\xaf", b"\xff", b"\xf4\x90\x80\x80", b"\x00"]


def _mutate_json_text(text: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One JSON-aware edit of one row's text: a duplicate key, a number no double holds, a
    surrogate escape, bytes that are not UTF-8, whitespace, junk, a truncation."""
    op = rng.choice(["duplicate-key", "duplicate-key", "number", "number", "escape", "utf8", "piece", "truncate", "flip"])
    keys = [m for m in re.finditer(rb'[{,]("(?:[^"\\]|\\.)*"):', text)]
    if op == "duplicate-key" and keys:
        match = rng.choice(keys)
        value = rng.choice([b"1", b"null", b'"x"', b"[]", b"{}", b"2.5"])
        return text[: match.start() + 1] + match.group(1) + b":" + value + b"," + text[match.start() + 1 :], "json:duplicate-key"
    numbers = [m.span() for m in re.finditer(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text)]
    if op == "number" and numbers:
        start, end = rng.choice(numbers)
        piece = rng.choice(JSON_PIECES[:15]).encode()
        return text[:start] + piece + text[end:], "json:number"
    strings = [m.span() for m in re.finditer(rb'"(?:[^"\\]|\\.)*"', text)]
    if op == "escape" and strings:
        start, end = rng.choice(strings)
        escape = rng.choice([b"\\ud83d", b"\\ude00", b"\\ud83d\\ude00", b"\\udbff\\udfff", b"\\ud800\\ud800", b"\\u0000"])
        at = rng.randrange(start + 1, end)
        return text[:at] + escape + text[at:], "json:escape"
    pos = rng.randrange(len(text) + 1)
    if op == "utf8":
        return text[:pos] + rng.choice(JSON_BYTES) + text[pos:], "json:utf8"
    if op == "piece":
        return text[:pos] + rng.choice(JSON_PIECES).encode() + text[pos:], "json:piece"
    if op == "truncate":
        return text[:pos], "json:truncate"
    data = bytearray(text or b" ")
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data), "json:flip"


def _string_column(texts: list[bytes | None], large: bool) -> pa.Array:
    """A string column of exactly these bytes (valid UTF-8 or not)."""
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum([len(t or b"") for t in texts], out=offsets[1:])
    valid = np.array([t is not None for t in texts])
    bitmap = None if valid.all() else pa.array(valid).buffers()[1]
    kind = pa.large_string() if large else pa.string()
    offsets_buffer = pa.py_buffer(offsets if large else offsets.astype(np.int32))
    data = pa.py_buffer(b"".join(t or b"" for t in texts))
    return pa.Array.from_buffers(kind, len(texts), [bitmap, offsets_buffer, data], null_count=int((~valid).sum()))


def _mutate_json(payload: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Edit one to three rows' JSON texts of one column, keeping the column's storage."""
    batch = _read_stream(payload)
    names = [f.name for f in batch.schema if (f.metadata or {}).get(b"adp.kind") == b"json"]
    name = rng.choice(names)
    i = batch.schema.get_field_index(name)
    column = batch.column(i)
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    texts = [None if v is None else v.encode("utf-8", "surrogatepass") for v in storage.to_pylist()]
    descs = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        row = rng.randrange(len(texts))
        texts[row], desc = _mutate_json_text(texts[row] or b"", rng)
        descs.append(desc)
    new = _string_column(texts, storage.type == pa.large_string())
    if isinstance(column, pa.ExtensionArray):
        new = pa.ExtensionArray.from_storage(column.type, new)
    columns = list(batch.columns)
    columns[i] = new
    return _write_stream([pa.RecordBatch.from_arrays(columns, schema=batch.schema)], batch.schema, None), "+".join(descs)


def _reference_json(text: bytes) -> Any:
    """What a JSON text holds, by the book: UTF-8, no NaN/Infinity, no key twice in an
    object, no number a double cannot hold (beyond the largest, or nonzero but below the
    smallest); ints at any size; whitespace around the value allowed."""
    def pairs(items: list) -> dict:
        if len({k for k, _ in items}) != len(items):
            raise ValueError("duplicate key")
        return dict(items)

    def number(literal: str) -> float:
        value = float(literal)
        mantissa = literal.lower().split("e")[0]
        if math.isinf(value) or (value == 0.0 and mantissa.strip("-0.") != ""):
            raise ValueError("no double holds it")
        return value

    def constant(name: str) -> Any:
        raise ValueError(name)

    return json.loads(text.decode("utf-8"), object_pairs_hook=pairs, parse_float=number, parse_constant=constant)


def _decode_json_checked(payload: bytes) -> adp.DataProto:
    """``from_ipc``; every JSON column that decoded must hold what its texts say (:func:`_reference_json`)."""
    decoded = adp.from_ipc(payload)
    batch = pa.ipc.open_stream(payload).read_all().combine_chunks().to_batches()[0]
    for field, column in zip(batch.schema, batch.columns):
        if (field.metadata or {}).get(b"adp.kind") != b"json":
            continue
        storage = column.storage if isinstance(column, pa.ExtensionArray) else column
        for row, text in enumerate(storage.cast(pa.large_binary()).to_pylist()):
            try:
                expected = None if text is None else _reference_json(text)
            except (ValueError, RecursionError) as e:
                raise SilentWrong(f"column {field.name!r} row {row} decoded, but its text is not exact JSON ({e}): {text[:200]!r}")
            got = decoded.non_tensor_batch[field.name][row]
            if not strict_equal(np.array([expected, None], dtype=object)[:1], np.array([got, None], dtype=object)[:1]):
                raise SilentWrong(f"column {field.name!r} row {row}: {text[:200]!r} decoded as {got!r:.200}")
    return decoded


# Other tools' types: a random table of the types another tool writes, decoded by from_ipc
# and checked column by column against what pyarrow reads (tensors: element by element,
# fixed_shape_tensor permutations applied by the oracle itself).


class _ParamType(pa.ExtensionType):
    """An extension type with parameters (registered in the fuzz process: read as its storage)."""

    def __init__(self, scale: int):
        self.scale = scale
        super().__init__(pa.int32(), "adp-fuzz.param")

    def __arrow_ext_serialize__(self) -> bytes:
        return json.dumps({"scale": self.scale}).encode()

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls(json.loads(serialized)["scale"])


try:
    pa.register_extension_type(_ParamType(1))
except pa.ArrowKeyError:  # registered already (the module imported twice)
    pass


def _nested_type(depth: int, rng: random.Random) -> pa.DataType:
    kind = pa.int64()
    for _ in range(depth):
        kind = rng.choice([pa.list_, lambda t: pa.struct([("a", t)]), pa.large_list, lambda t: pa.list_(t, 1)])(kind)
    return kind


def _foreign_column(rng: random.Random, rows: int) -> tuple[str, pa.Array | pa.ChunkedArray]:
    ints = [rng.randrange(-5, 5) for _ in range(rows)]
    maybe = [None if rng.random() < 0.2 else v for v in ints]
    kind = rng.choice(["dictionary", "ree", "sparse-union", "dense-union", "map", "list_view", "large_list_view",
                       "string_view", "binary_view", "decimal", "tensor", "param", "unregistered", "nested", "json"])
    if kind == "dictionary":
        return kind, pa.array([rng.choice(["a", "b", None]) for _ in range(rows)]).dictionary_encode()
    if kind == "ree":
        return kind, pc.run_end_encode(pa.array(maybe if rng.random() < 0.5 else ints))
    if kind in ("sparse-union", "dense-union"):
        types = pa.array([rng.randrange(2) for _ in range(rows)], pa.int8())
        children = [pa.array(ints), pa.array([str(v) for v in ints])]
        if kind == "sparse-union":
            return kind, pa.UnionArray.from_sparse(types, children)
        return kind, pa.UnionArray.from_dense(types, pa.array(list(range(rows)), pa.int32()), children)
    if kind == "map":
        keys = [[("k", v), ("k" if rng.random() < 0.2 else "j", v)] for v in ints]
        return kind, pa.array(keys, pa.map_(pa.string(), pa.int64()))
    if kind in ("list_view", "large_list_view"):
        lists = [[v] * rng.choice([2, 2, rng.randrange(4)]) for v in ints]
        return kind, pa.array(lists, pa.list_view(pa.int64()) if kind == "list_view" else pa.large_list_view(pa.float32()))
    if kind in ("string_view", "binary_view"):
        texts = [None if v is None else "x" * rng.randrange(20) + str(v) for v in maybe]  # inline and out-of-line views
        if kind == "string_view":
            return kind, pa.array(texts, pa.string_view())
        return kind, pa.array([None if t is None else t.encode() for t in texts], pa.binary_view())
    if kind == "decimal":
        import decimal
        make = rng.choice([pa.decimal32(7, 2), pa.decimal64(12, 3), pa.decimal128(20, 4), pa.decimal256(40, 5)])
        return kind, pa.array([None if v is None else decimal.Decimal(v) / 4 for v in maybe], make)
    if kind == "tensor":
        ndim = rng.randrange(1, 4)
        shape = [rng.randrange(1, 4) for _ in range(ndim)]
        permutation = list(range(ndim))
        rng.shuffle(permutation)
        names = [f"d{i}" for i in range(ndim)] if rng.random() < 0.5 else None
        dtype = rng.choice([pa.int16(), pa.float32(), pa.float64(), pa.bool_()])
        kind_type = pa.fixed_shape_tensor(dtype, shape, permutation=permutation if rng.random() < 0.8 else None, dim_names=names)
        flat = np.arange(rows * math.prod(shape)) % 7
        values = pa.array(flat.astype(bool) if dtype == pa.bool_() else flat, dtype)
        storage = pa.FixedSizeListArray.from_arrays(values, math.prod(shape))
        return kind, pa.ExtensionArray.from_storage(kind_type, storage)
    if kind == "param":
        return kind, pa.ExtensionArray.from_storage(_ParamType(rng.randrange(9)), pa.array(ints, pa.int32()))
    if kind == "unregistered":  # another tool's extension this process does not know: read as its storage
        return kind, pa.array([{"x": v, "y": str(v)} for v in ints])
    if kind == "json":
        texts = [json.dumps({"v": v}) if rng.random() < 0.8 else rng.choice(JSON_PIECES) for v in ints]
        return kind, pa.ExtensionArray.from_storage(pa.json_(pa.string()), pa.array(texts))
    depth = rng.choice([1, 2, 31, 62, 63])
    if rng.random() < 0.3:
        return f"nested{depth}", pa.nulls(rows, _nested_type(depth, rng))
    array: pa.Array = pa.array(ints, pa.int64())
    for _ in range(depth):  # one value per list at every level
        array = rng.choice([
            lambda a: pa.ListArray.from_arrays(pa.array(range(rows + 1), pa.int32()), a),
            lambda a: pa.StructArray.from_arrays([a], ["a"]),
            lambda a: pa.FixedSizeListArray.from_arrays(a, 1),
        ])(array)
    return f"nested{depth}", array


def _foreign_table_bytes(rng: random.Random) -> tuple[bytes, str]:
    rows = rng.choice([0, 1, 3, 4])
    fields, arrays, kinds = [], [], []
    for i in range(rng.randrange(1, 4)):
        try:
            kind, array = _foreign_column(rng, rows)
        except (pa.ArrowException, ValueError, TypeError):  # a combination pyarrow cannot build: skip it
            continue
        kinds.append(kind)
        metadata = None
        if kind == "unregistered":
            metadata = {"ARROW:extension:name": "other.tool.point", "ARROW:extension:metadata": '{"unit": "m"}'}
        fields.append(pa.field(f"c{i}", array.type, metadata=metadata))
        arrays.append(array)
    if not arrays:
        fields, arrays, kinds = [pa.field("n", pa.int64())], [pa.array(list(range(rows)), pa.int64())], ["int64"]
    schema = pa.schema(fields, metadata={"tool": "other"} if rng.random() < 0.5 else None)
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    batches = [batch] if rows < 2 or rng.random() < 0.5 else [batch.slice(0, 1), batch.slice(1)]
    return _write_stream(batches, schema, rng.choice([None, None, "lz4"])), "foreign:" + ",".join(kinds)


def _logical_rows(column: pa.Array) -> list:
    """The rows of a column as the oracle reads them: a fixed_shape_tensor's logical tensors
    (the physical ones with their dimensions permuted), anything else as pyarrow gives it."""
    if isinstance(column.type, pa.FixedShapeTensorType):
        shape, permutation = list(column.type.shape), column.type.permutation
        flat = column.storage.flatten().to_numpy(zero_copy_only=False)
        physical = flat.reshape(len(column), *shape)
        if permutation is not None:
            physical = np.transpose(physical, [0] + [1 + p for p in permutation])
        return physical.tolist()
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column.to_pylist(maps_as_pydicts="lossy")


def _decoded_rows(value: Any) -> list:
    """A decoded batch entry's rows as pyarrow gives a column's: a tensor's rows as lists, a
    nested TensorDict's (what a struct of tensor columns decodes to) as dicts of its keys."""
    if isinstance(value, TensorDict):
        columns = {key: _decoded_rows(value[key]) for key in value.keys()}
        return [{key: rows[i] for key, rows in columns.items()} for i in range(value.batch_size[0])]
    return [t.tolist() for t in (value.unbind(0) if value.is_nested else value)]


def _decode_foreign_checked(payload: bytes) -> adp.DataProto:
    """``from_ipc`` of another tool's stream; every column it decoded holds pyarrow's rows."""
    decoded = adp.from_ipc(payload)
    table = pa.ipc.open_stream(payload).read_all()
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        expected = _logical_rows(column)
        if decoded.batch is not None and name in decoded.batch.keys():
            got = _decoded_rows(decoded.batch[name])
        elif name in decoded.non_tensor_batch:
            got = decoded.non_tensor_batch[name].tolist()
            if pa.types.is_timestamp(column.type) or pa.types.is_date(column.type) or pa.types.is_duration(column.type):
                continue
            if isinstance(column.type, pa.BaseExtensionType) and column.type.extension_name == "arrow.json":
                expected = [None if t is None else _reference_json(t.encode()) for t in column.storage.to_pylist()]
            elif pa.types.is_map(column.type):
                expected = column.to_pylist(maps_as_pydicts="strict")
        else:
            raise SilentWrong(f"column {name!r} missing from the decode")
        if not strict_equal(np.array(expected + [None], dtype=object)[:-1], np.array(got + [None], dtype=object)[:-1]):
            raise SilentWrong(f"column {name!r} ({column.type}): expected {expected!r:.300}, decoded {got!r:.300}")
    return decoded


def _deep_in_memory(payload: bytes) -> adp.DataProto:
    """A table nested 64 to 2,063 fields deep, deeper than IPC carries (built here, in memory), through from_arrow."""
    depth = 64 + sum(payload) % 2000
    kind = _nested_type(depth, random.Random(bytes(payload[:8])))
    return adp.from_arrow(pa.table({"deep": pa.nulls(2, kind), "n": [1, 2]}))


def _json_foreign_targets() -> list[Target]:
    return [
        Target(
            "json-text",
            encode=lambda dp: adp.to_ipc(dp).to_pybytes(),
            decode=_decode_json_checked,
            mutate=lambda payload, rng, corpus, target: _mutate_json(payload, rng),
            seeds=("json",),
        ),
        Target(
            "foreign-types",
            encode=lambda dp: _foreign_table_bytes(random.Random(0))[0],  # the seed is this table, decoded
            decode=lambda payload: _decode_foreign_checked(payload) if not payload.startswith(b"deep") else _deep_in_memory(payload),
            mutate=lambda payload, rng, corpus, target: (
                (b"deep" + rng.randbytes(8), "foreign:deep-in-memory") if rng.random() < 0.1 else _foreign_table_bytes(rng)
            ),
            seeds=("foreign",),
        ),
    ]


# ---------------------------------------------------------------- views and nested collections (issue 48)
#
# ``views``: a recipe drawn per case builds, from the seed's rows, a TensorDict holding some of:
# a conjugate complex view, a negative view, a conjugate jagged tensor, two jagged columns on one
# offsets tensor that is a slice of a longer one, a lazy stack of TensorDicts with different keys
# or shapes (on dim 0 or 1), a tensorclass and a TensorDict subclass, nested one level down or not.
# It goes through the verl integration (a verl-like class under install(), pickled with protocol
# 5: the compact state, or whatever replaces it), through our DataProto's pickle, and through the
# tensordict integration's serializer (what Ray calls): every path must give it back exactly
# (classes, stacking, keys, bits, one ragged structure where there was one), or refuse with the
# library's error; a serializer state cut short must be a DecodeError. A loss is
# ``unexpected:AssertionError``; the case then returns the seed.


@dataclass
class _VerlLike:
    """verl's DataProto in miniature (three fields), patched by ``integrations.verl.install``."""

    batch: Any = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return 0 if self.batch is None else self.batch.batch_size[0]


class _SubTD(TensorDict):
    pass


_VIEW_KINDS = ("conj", "neg", "conj-jagged", "sliced-offsets", "lazy-keys", "lazy-shapes", "lazy-dim1", "tensorclass", "subclass")


def _views_payload(dp: adp.DataProto) -> dict:
    return {"seed": dp, "recipe": None}


def _mutate_views(payload: dict, rng: random.Random) -> tuple[dict, str]:
    kinds = sorted(rng.sample(_VIEW_KINDS, rng.randint(1, 4)))
    recipe = {"kinds": kinds, "rows": rng.randint(1, 6), "seed": rng.getrandbits(32), "nest": rng.random() < 0.3,
              "cut": rng.randint(0, 5) if rng.random() < 0.15 else None}  # a serializer state cut short: refused
    return {"seed": payload["seed"], "recipe": recipe}, f"views: {recipe}"


@tensorclass
class _Observation:
    pixels: torch.Tensor
    step: torch.Tensor


def _views_batch(recipe: dict) -> tuple[TensorDict, bool]:
    """The TensorDict of a recipe, and whether it holds only what a DataProto carries (no lazy
    stack, tensorclass or subclass: those go through the tensordict integration alone)."""
    from tensordict import LazyStackedTensorDict

    n, g = recipe["rows"], torch.Generator().manual_seed(recipe["seed"])
    content: dict[str, Any] = {}
    lengths = torch.randint(0, 4, (n + 2,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = torch.randn(int(offsets[-1]) + 3, generator=g)
    for kind in recipe["kinds"]:
        if kind == "conj":
            content["conj"] = torch.complex(torch.randn(n, 2, generator=g), torch.randn(n, 2, generator=g)).conj()
        elif kind == "neg":
            content["neg"] = torch._neg_view(torch.randn(n, 3, generator=g))
        elif kind == "conj-jagged":
            content["jconj"] = torch.nested.nested_tensor_from_jagged(torch.complex(values, -values).conj(), offsets[: n + 1])
        elif kind == "sliced-offsets":
            sliced = offsets[1 : n + 2]
            content["a"] = torch.nested.nested_tensor_from_jagged(values, sliced)
            content["b"] = torch.nested.nested_tensor_from_jagged(values * 2, sliced)
        elif kind in ("lazy-keys", "lazy-shapes"):
            tds = [TensorDict({"obs": torch.randn(2, generator=g)}, []) for _ in range(n)]
            for i, td in enumerate(tds):
                if kind == "lazy-keys" and i % 2 == 0:
                    td["bonus"] = torch.arange(i + 1)
                if kind == "lazy-shapes":
                    td["v"] = torch.randn(i + 1, generator=g)
            content[kind] = LazyStackedTensorDict(*tds, stack_dim=0)
        elif kind == "lazy-dim1":
            tds = [TensorDict({"x": torch.randn(n, generator=g), **({"y": torch.ones(n)} if i else {})}, [n]) for i in range(2)]
            content[kind] = LazyStackedTensorDict(*tds, stack_dim=1)
        elif kind == "tensorclass":
            content[kind] = _Observation(pixels=torch.randn(n, 2, generator=g), step=torch.arange(n), batch_size=[n])
        elif kind == "subclass":
            content[kind] = _SubTD({"q": torch.randn(n, generator=g)}, [n])
    td = TensorDict(content, batch_size=[n])
    if recipe["nest"]:
        td = TensorDict({"outer": td, "t": torch.arange(n)}, batch_size=[n])
    plain = not any(k in recipe["kinds"] for k in ("lazy-keys", "lazy-shapes", "lazy-dim1", "tensorclass", "subclass"))
    return td, plain


def _resolved_rows(t: torch.Tensor) -> list[torch.Tensor]:
    if t.is_nested:
        offsets, values = t.offsets(), t.values()
        return [values[int(offsets[i]) : int(offsets[i + 1])].resolve_conj().resolve_neg() for i in range(len(offsets) - 1)]
    return list(t.resolve_conj().resolve_neg().unbind())


def _same_views(a: Any, b: Any, where: str = "") -> None:
    """``b`` is ``a``: classes, stacking, keys in order, leaves bit for bit (views resolved)."""
    from tensordict import LazyStackedTensorDict

    if type(a) is not type(b):
        raise AssertionError(f"{where}: {type(b).__name__}, sent a {type(a).__name__}")
    if isinstance(a, torch.Tensor):
        got, want = _resolved_rows(b), _resolved_rows(a)
        if len(got) != len(want) or not all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(got, want)):
            raise AssertionError(f"{where}: other values")
        return
    if a.batch_size != b.batch_size or list(a.keys()) != list(b.keys()):
        raise AssertionError(f"{where}: keys {list(b.keys())} {b.batch_size}, sent {list(a.keys())} {a.batch_size}")
    if isinstance(a, LazyStackedTensorDict):
        if a.stack_dim != b.stack_dim or len(a.tensordicts) != len(b.tensordicts):
            raise AssertionError(f"{where}: stacking lost")
        for i, (x, y) in enumerate(zip(a.tensordicts, b.tensordicts)):
            _same_views(x, y, f"{where}[{i}]")
        return
    for key in a.keys():
        _same_views(a.get(key), b.get(key), f"{where}.{key}")


def _check_shared(td: Any, where: str) -> None:
    inner = td["outer"] if "outer" in td.keys() else td
    if "a" in inner.keys():
        try:
            inner["a"] * inner["b"]
        except RuntimeError as e:
            raise AssertionError(f"{where}: the two jagged columns no longer share their offsets: {e}") from None


def _views_round_trip(payload: dict) -> adp.DataProto:
    from arrow_dataproto.integrations import tensordict as adp_td

    recipe = payload["recipe"]
    if recipe is not None:
        td, plain = _views_batch(recipe)
        state = pickle.loads(pickle.dumps(adp_td.serialize(td), protocol=5))
        if recipe.get("cut") is not None:
            state = state[: min(recipe["cut"], len(state) - 1)]
        back = adp_td.rebuild(state)
        _same_views(td, back, "tensordict integration")
        if plain:
            adp_verl.install(_VerlLike)
            for cls in (_VerlLike, adp.DataProto):
                original = cls(td, {}, {})
                for protocol in (2, 5):
                    got = pickle.loads(pickle.dumps(original, protocol=protocol)).batch
                    _same_views(td, got, f"{cls.__name__} protocol {protocol}")
                    _check_shared(got, f"{cls.__name__} protocol {protocol}")
    return payload["seed"]


OWN_SEEDS: dict[str, Callable[[], adp.DataProto]] = {  # seeds of one target each (not in SEEDS: no other target uses them)
    "json": _json_seed,
    "verl-ppo": lambda: _as_verl_holds(sample_dataproto(seed=0)),
    "verl-kinds": lambda: _as_verl_holds(kinds_dataproto()),
    "compact-dtypes": _compact_dtypes,
    "foreign": lambda: adp.from_ipc(_foreign_table_bytes(random.Random(0))[0]),
}


# ---------------------------------------------------------------- worker process


def _send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=5)
    os.write(fd, struct.pack("<Q", len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int) -> Any:
    """The next message on ``fd``; ``EOFError`` if the other side is gone."""
    header = _read_exact(fd, 8)
    return pickle.loads(_read_exact(fd, struct.unpack("<Q", header)[0]))


def _read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _selftest_decode(payload: Any) -> adp.DataProto:
    """The harness's own check: ``b"crash"`` kills the worker with SIGSEGV, ``b"hang"`` never returns."""
    if payload == b"crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    while payload == b"hang":
        time.sleep(1)
    raise ValueError("selftest payload")


def worker_main() -> None:
    """Decode cases read from stdin, answer ``(outcome, detail)`` on stdout, forever."""
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT, WORKER_MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    torch.set_num_threads(1)
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    corpus = Corpus()
    selftest = Target("selftest", encode=None, decode=_selftest_decode, mutate=None)
    _send(out_fd, ("ready", _peak_rss()))
    while True:
        try:
            target_name, seed, payload = _receive(0)
        except EOFError:
            return
        target = selftest if target_name == "selftest" else corpus.target(target_name)
        _send(out_fd, (*check_case(target, corpus.seeds.get(seed), payload), _peak_rss()))


def _peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Worker:
    """A decoder subprocess fed cases over a pipe; restarted after a crash or a hang."""

    def __init__(self, timeout: float = CASE_TIMEOUT_S):
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.baseline_rss = self.peak_rss = 0
        self.growth = 0
        """How far the last case raised the worker's peak RSS above where it started (bytes): an
        upper bound of what that case allocated when it set a new peak, else 0."""

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
            cwd=ROOT,
        )
        try:
            _, self.baseline_rss = self._wait(WORKER_START_TIMEOUT_S)  # ("ready", peak RSS)
            self.peak_rss = self.baseline_rss
        except (TimeoutError, EOFError):
            raise RuntimeError("the fuzz worker did not start: run `python tests/fuzz.py --worker` to see why") from None

    def _wait(self, timeout: float) -> Any:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError
        return _receive(self.proc.stdout.fileno())

    def _stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.proc = None
        self.restarts += 1
        return code

    def run(self, target: str, seed: str, payload: Any) -> tuple[str, str]:
        """``(outcome, detail)`` of one case; ``crash:<signal>`` or ``hang`` when the worker fails."""
        if self.proc is None:
            self._start()
        self.growth = 0
        try:
            _send(self.proc.stdin.fileno(), (target, seed, payload))
            outcome, detail, peak = self._wait(self.timeout)
            if peak > self.peak_rss:
                self.growth, self.peak_rss = peak - self.baseline_rss, peak
            return outcome, detail
        except TimeoutError:
            self._stop()
            return "hang", f"no answer within {self.timeout:.0f} s"
        except (EOFError, BrokenPipeError):
            code = self._stop()
            name = signal.Signals(-code).name if code < 0 else f"exit {code}"
            return f"crash:{name}", f"worker died ({name})"

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
            self.proc.stdout.close()
            self.proc = None


# ---------------------------------------------------------------- runs


@dataclass
class Summary:
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)  # (target, outcome) -> count
    mutations: Counter = field(default_factory=Counter)  # (first mutation, allowed outcome class) -> count
    findings: list[dict] = field(default_factory=list)
    restarts: int = 0
    largest_input: Counter = field(default_factory=Counter)  # target -> bytes of its largest input
    growth: Counter = field(default_factory=Counter)  # target -> largest rise of the worker's peak RSS (bytes)

    def add(self, other: "Summary") -> None:
        self.cases += other.cases
        self.outcomes.update(other.outcomes)
        self.mutations.update(other.mutations)
        self.findings.extend(other.findings)
        self.restarts += other.restarts
        for name in other.largest_input:
            self.largest_input[name] = max(self.largest_input[name], other.largest_input[name])
        for name in other.growth:
            self.growth[name] = max(self.growth[name], other.growth[name])


def save_finding(case: Case, outcome: str, detail: str, out_dir: Path) -> dict:
    """Write the case's input (``.pkl``: ``(target, seed, payload)``) and a note; return the record."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{case.target}-{case.number}"
    stem.with_suffix(".pkl").write_bytes(pickle.dumps((case.target, case.seed, case.payload), protocol=5))
    record = {"case": case.number, "target": case.target, "seed": case.seed, "mutation": case.mutation,
              "outcome": outcome, "detail": detail, "input": str(stem.with_suffix(".pkl"))}
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1))
    return record


def fuzz(numbers: range, base_seed: int = 0, target_names: list[str] | None = None,
         out_dir: Path = RESULTS / "fuzz_findings", timeout: float = CASE_TIMEOUT_S,
         progress: bool = False, worker: Worker | None = None) -> Summary:
    """Run cases ``numbers`` through one worker process (``worker``, or a new one closed at
    the end); findings are saved under ``out_dir``."""
    corpus = Corpus(target_names)
    own_worker = worker is None
    worker = worker or Worker(timeout)
    restarts = worker.restarts
    summary = Summary()
    started = time.time()
    try:
        for count, number in enumerate(numbers, 1):
            case = make_case(number, base_seed, corpus)
            outcome, detail = worker.run(case.target, case.seed, case.payload)
            summary.cases += 1
            summary.outcomes[case.target, outcome] += 1
            summary.largest_input[case.target] = max(summary.largest_input[case.target], _size(case.payload))
            summary.growth[case.target] = max(summary.growth[case.target], worker.growth)
            allowed = "finding" if is_finding(outcome) else ("decoded" if outcome in ("exact", "valid") else "error")
            summary.mutations[case.mutation.split("+")[0].split(":")[0], allowed] += 1
            if is_finding(outcome):
                summary.findings.append(save_finding(case, outcome, detail, out_dir))
            if progress and count % 2000 == 0:
                rate = count / (time.time() - started)
                print(f"[{numbers.start % numbers.step}] {count}/{len(numbers)} cases, {rate:.0f}/s, "
                      f"{len(summary.findings)} findings", flush=True)
    finally:
        if own_worker:
            worker.close()
    summary.restarts = worker.restarts - restarts
    return summary


def _size(payload: Any) -> int:
    """Bytes of a case's input (a pickling state or a DataFrame: its pickle)."""
    return len(payload) if isinstance(payload, bytes) else len(pickle.dumps(payload, protocol=5))


def _shard(args: tuple) -> Summary:
    numbers, base_seed, target_names, out_dir, timeout = args
    return fuzz(numbers, base_seed, target_names, out_dir, timeout, progress=True)


def replay(number: int, base_seed: int, target_names: list[str] | None) -> None:
    """Rebuild case ``number`` and decode it in this process, showing the full traceback."""
    corpus = Corpus(target_names)
    case = make_case(number, base_seed, corpus)
    print(f"case {number}: target {case.target}, seed {case.seed}, mutation {case.mutation}")
    decoded = corpus.target(case.target).decode(case.payload)
    print("decoded:", decoded)
    print(check_case(corpus.target(case.target), corpus.seeds[case.seed], case.payload))


def selftest(timeout: float = 5.0) -> dict[str, str]:
    """Check that the harness reports a crash and a hang (outcome per selftest input)."""
    worker = Worker(timeout)
    try:
        return {p.decode(): worker.run("selftest", "", p)[0] for p in (b"error", b"crash", b"hang")}
    finally:
        worker.close()


def write_summary(summary: Summary, path: Path, command: str, wall: float, jobs: int, names: list[str]) -> None:
    outcomes = sorted({o for _, o in summary.outcomes}, key=lambda o: (is_finding(o), o))
    lines = [
        "# Fuzzing the decoders",
        "",
        f"Command: `{command}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, pyarrow {pa.__version__}, "
        f"torch {torch.__version__}; {jobs} worker processes.  ",
        f"Cases: **{summary.cases}**, wall time **{wall:.0f} s** ({summary.cases / wall:.0f} cases/s), "
        f"worker restarts {summary.restarts}.  ",
        f"Findings (crashes, hangs, unexpected exceptions, inconsistent decodes): **{len(summary.findings)}**.",
        "",
        "Outcomes by target (see the docstring of `tests/fuzz.py` for their definitions):",
        "",
        "| target | " + " | ".join(outcomes) + " | total |",
        "|---|" + "---:|" * (len(outcomes) + 1),
    ]
    for name in names:
        counts = [summary.outcomes[name, o] for o in outcomes]
        lines.append(f"| {name} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
    lines += ["", "Memory: the largest input of each target, and the largest rise of the worker's peak RSS "
              "over its start that one case caused (an upper bound of what a case allocated; the worker "
              f"runs under an {WORKER_MEMORY_LIMIT >> 30} GiB address-space limit):", "",
              "| target | largest input | largest peak-RSS rise |", "|---|---:|---:|"]
    for name in names:
        lines.append(f"| {name} | {summary.largest_input[name] / 1024:.0f} KiB | {summary.growth[name] / 2**20:.1f} MiB |")
    lines += ["", "Outcome class by first mutation:", "", "| mutation | decoded | library error | finding |",
              "|---|---:|---:|---:|"]
    for kind in sorted({k for k, _ in summary.mutations}):
        row = [summary.mutations[kind, c] for c in ("decoded", "error", "finding")]
        lines.append(f"| {kind} | " + " | ".join(map(str, row)) + " |")
    if summary.findings:
        lines += ["", "## Findings", ""]
        for f in summary.findings:
            lines.append(f"- case {f['case']} ({f['target']}, seed {f['seed']}, {f['mutation']}): "
                         f"`{f['outcome']}`, input `{f['input']}`")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--start", type=int, default=0, help="first case number")
    parser.add_argument("--seed", type=int, default=0, help="base seed: case n of seed s is always the same input")
    parser.add_argument("--jobs", type=int, default=2, help="parallel worker processes")
    parser.add_argument("--targets", nargs="*", help=f"default: all of {list(targets())}")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case")
    parser.add_argument("--out", type=Path, default=RESULTS / "fuzz.md")
    parser.add_argument("--replay", type=int, help="rerun one case in this process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.replay is not None:
        replay(args.replay, args.seed, args.targets)
        return 0
    names = args.targets or list(targets())
    checks = selftest()
    if not (checks["crash"].startswith("crash:") and checks["hang"] == "hang"):
        raise SystemExit(f"the harness does not catch crashes and hangs: {checks}")
    started = time.time()
    end = args.start + args.cases
    shards = [(range(args.start + k, end, args.jobs), args.seed, names, RESULTS / "fuzz_findings", args.timeout)
              for k in range(args.jobs)]
    summary = Summary()
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for part in pool.map(_shard, shards):
            summary.add(part)
    wall = time.time() - started
    command = "python tests/fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_summary(summary, args.out, command.strip(), wall, args.jobs, names)
    print(args.out.read_text())
    return 1 if summary.findings else 0


if __name__ == "__main__":
    sys.exit(main())
