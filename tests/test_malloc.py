"""A process that receives without copying raises glibc's heap thresholds once, as a
copying receiver does by freeing its copies (``arrow_dataproto._malloc``): otherwise
glibc gives the heap back after every step and the next step's temporaries fault in
fresh pages. Each glibc case runs in a fresh interpreter, whose thresholds are glibc's
starting ones."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

from arrow_dataproto import DataProto, _malloc, pickling, receive_options

GLIBC = pytest.mark.skipif(_malloc._glibc() is None, reason="glibc's thresholds: this C library is not a 64-bit glibc")

PROBE = """
import ctypes, importlib.util, json, sys

spec = importlib.util.spec_from_file_location("probed", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)

libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mapped(n):
    # whether malloc serves n bytes with a mapping of their own (freeing it raises the threshold to n)
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(n)
    own = libc.mallinfo2().hblkhd - before >= n
    libc.free(block)
    return own

first = mapped(24 << 20)
calls = [module.raise_thresholds() for _ in range(int(sys.argv[2]))]
print(json.dumps({"first": first, "calls": calls, "after": mapped(28 << 20)}))
"""


def probe(calls: int, **env: str) -> dict:
    """Run :data:`PROBE` in a fresh interpreter: is a 24 MiB block mapped, then ``calls``
    calls of ``raise_thresholds``, then is a 28 MiB block mapped."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, _malloc.__file__, str(calls)],
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@GLIBC
def test_without_it_a_block_above_the_last_freed_one_is_mapped():
    """The control: the threshold follows the largest mapped block freed so far (24 MiB)."""
    assert probe(0) == {"first": True, "calls": [], "after": True}


@GLIBC
def test_it_raises_the_threshold_once_per_process():
    """After it, 28 MiB come from the heap; a second call does nothing."""
    assert probe(2) == {"first": True, "calls": [True, False], "after": False}


@GLIBC
def test_thresholds_the_user_set_stay_as_set():
    """With a threshold set (here the trim threshold), glibc keeps the mmap threshold fixed at 128 KiB."""
    assert probe(1, MALLOC_TRIM_THRESHOLD_=str(64 << 20)) == {"first": True, "calls": [True], "after": True}


@pytest.mark.parametrize("copy, raises", [("on_write", True), (False, True), (True, False)])
def test_receives_that_do_not_copy_raise_them(monkeypatch, copy, raises):
    calls = []
    monkeypatch.setattr(pickling._malloc, "raise_thresholds", lambda: calls.append(1) or True)
    data = DataProto.from_dict({"x": torch.arange(6).reshape(3, 2)})
    with receive_options(copy=copy):
        back = pickle.loads(pickle.dumps(data, protocol=5))
    assert torch.equal(back.batch["x"], data.batch["x"])
    assert calls == ([1] if raises else [])


class NotGlibc:
    """A C library without ``gnu_get_libc_version`` (musl, macOS's libSystem)."""


@pytest.mark.parametrize(
    "loaded", [OSError("no such library"), TypeError("LoadLibrary() argument 1 must be str, not None"), NotGlibc()]
)
def test_no_glibc_means_nothing_to_do(monkeypatch, loaded):
    """Where the process's C library cannot be loaded by name (Windows' ``CDLL(None)``) or is
    not glibc, it does nothing."""

    def load(*args, **kwargs):
        if isinstance(loaded, Exception):
            raise loaded
        return loaded

    monkeypatch.setattr(_malloc.ctypes, "CDLL", load)
    monkeypatch.setattr(_malloc, "_done", False)
    assert _malloc._glibc() is None
    assert _malloc.raise_thresholds() is False
