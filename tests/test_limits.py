"""Limits: a dense tensor over 2 GiB and a jagged tensor of more than 2**31 values round-trip
bit for bit through IPC, pickle, Arrow files and Ray.

Both tensors are int8, so each is about 2 GiB. Every scenario runs in a fresh interpreter
(this file doubles as the script: ``python tests/test_limits.py KIND PATH TMPDIR``), so that
its memory is returned to the system when it ends and its peak RSS is its own; the test
asserts that peak stays under :data:`PEAK_LIMIT` (the original tensor, one encoded or decoded
copy, and the interpreter). Decoded data is compared in full with the original (no extra
copy: both are in memory anyway) and, at sampled positions, with the formula that generated
it, so that an error affecting both (an offset wrapped at 2**31) shows too.

Ray runs in the scenario's own interpreter with a 3.5 GiB object store (the session
fixture's 3 GiB store is too small for two of these objects at once).
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import arrow_dataproto as adp
from arrow_dataproto import files

GiB = 1024**3
ROWS, WIDTH = 2**21 + 1, 1024  # dense int8 [ROWS, WIDTH]: 2 GiB + 1 KiB
LENGTHS = [2**29 + 3, 2**29 + 5, 2**29 + 7, 2**29 + 9]  # jagged int8 rows: 2**31 + 24 values in all
PEAK_LIMIT = 5.5 * GiB
PERIOD = 251  # value i is i % 251 (as int8): a prime period, so a shifted read shows


def _pattern(n: int) -> torch.Tensor:
    """``n`` int8 values, value ``i`` = ``i % PERIOD``, filled by doubling copies (no temporary)."""
    values = torch.empty(n, dtype=torch.int8)
    filled = min(n, PERIOD * 4096)
    values[:filled] = (torch.arange(filled) % PERIOD).to(torch.int8)
    while filled < n:  # filled stays a multiple of PERIOD, so copies keep the pattern
        step = min(filled, n - filled)
        values[filled : filled + step] = values[:step]
        filled += step
    return values


def _offsets() -> torch.Tensor:
    return torch.tensor([0, *LENGTHS]).cumsum(0)


def _big(kind: str) -> adp.DataProto:
    if kind == "dense":
        td = TensorDict({"big": _pattern(ROWS * WIDTH).view(ROWS, WIDTH)}, batch_size=[ROWS])
    else:
        big = torch.nested.nested_tensor_from_jagged(_pattern(sum(LENGTHS)), _offsets())
        td = TensorDict({"big": big}, batch_size=[len(LENGTHS)])
    return adp.DataProto(td, meta_info={"kind": kind})


def _check(decoded: adp.DataProto, kind: str) -> None:
    """Bit-exact against the generating pattern, in full, chunk by chunk (no 2 GiB temporary)."""
    big = decoded.batch["big"]
    assert big.dtype == torch.int8 and decoded.meta_info == {"kind": kind}
    if kind == "dense":
        assert big.shape == (ROWS, WIDTH)
        flat = big.reshape(-1)
    else:
        assert big.is_nested and big.layout == torch.jagged and torch.equal(big.offsets(), _offsets())
        flat = big.values()
    chunk = PERIOD * 2**16  # a multiple of the period: every chunk starts like the tile
    tile = _pattern(chunk)
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        assert torch.equal(part, tile[: part.numel()]), f"values differ in [{start}, {start + chunk})"


# ---------------------------------------------------------------- scenarios (run in a child process)


def _ipc(kind: str, tmp: Path) -> dict:
    payload = adp.to_ipc(_big(kind))  # the original is freed once encoded
    _check(adp.from_ipc(payload), kind)  # zero-copy: views the payload
    return {"stream_bytes": payload.size}


def _pickle(kind: str, tmp: Path) -> dict:
    dp = _big(kind)
    buffers: list = []
    head = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)  # out of band, as Ray does
    _check(pickle.loads(head, buffers=buffers), kind)  # the default: the receiver copies
    inline = pickle.dumps(dp, protocol=5)  # buffers in band
    del dp, buffers
    with adp.receive_options(copy=False):  # views the buffer unpickling made
        _check(pickle.loads(inline), kind)
    return {"pickle_bytes": len(inline)}


def _file(kind: str, tmp: Path) -> dict:
    path = tmp / "big.arrow"
    files.write_file(path, _big(kind))
    try:
        _check(files.read_file(path), kind)  # memory-mapped
        return {"file_bytes": path.stat().st_size}
    finally:
        path.unlink()


def _ray(kind: str, tmp: Path) -> dict:
    import ray

    ray.init(address="local", num_cpus=1, object_store_memory=int(3.5 * GiB), include_dashboard=False, log_to_driver=False)
    try:
        # The task decodes zero-copy (a copy would add 2 GiB to the worker) and checks every value.
        @ray.remote(runtime_env={"env_vars": {"ARROW_DATAPROTO_COPY": "0"}})
        def check_in_worker(received: adp.DataProto) -> int:
            _check(received, kind)
            return os.getpid()

        ref = ray.put(_big(kind))  # the original is freed once it is in the object store
        assert ray.get(check_in_worker.remote(ref)) != os.getpid()
        with adp.receive_options(copy=False):
            _check(ray.get(ref), kind)
        return {"object_store_bytes": int(ray.cluster_resources()["object_store_memory"])}
    finally:
        ray.shutdown()


SCENARIOS = {"ipc": _ipc, "pickle": _pickle, "file": _file, "ray": _ray}


def main(kind: str, path: str, tmp: str) -> None:
    started = time.perf_counter()
    sizes = SCENARIOS[path](kind, Path(tmp))
    report = {
        "kind": kind,
        "path": path,
        "values": ROWS * WIDTH if kind == "dense" else sum(LENGTHS),
        **sizes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report))


# ---------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.parametrize("path", list(SCENARIOS))
@pytest.mark.parametrize("kind", ["dense", "jagged"])
def test_over_2_gib_round_trips(kind, path, tmp_path):
    if path == "ray":
        pytest.importorskip("ray", reason="ray is not installed (pip install arrow-dataproto[ray])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, __file__, kind, path, str(tmp_path)], capture_output=True, text=True, env=env, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["values"] > 2**31
    assert report["peak_rss_bytes"] < PEAK_LIMIT, report


if __name__ == "__main__":
    main(*sys.argv[1:])
