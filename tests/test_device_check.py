"""scripts/device_check.sh without CUDA: says so, lists what it would run, exits 0."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the whole device check: run it directly")
def test_without_cuda_it_lists_the_plan_and_exits_0():
    done = subprocess.run(
        ["bash", str(SCRIPT)], env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "no CUDA device here" in out and f"torch {torch.__version__}" in out
    for step in ("pip install --no-index", "-m pytest -m gpu", "benchmarks/bench_device.py", "device-check.md"):
        assert step in out, step
