"""The demo runs from the repository root (as ``scripts/demo.sh`` runs it) and reports what it promises:
exact round trips, median and best timings, and the ratio table against verl's pickling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_runs_and_compares_with_the_rivals():
    command = [sys.executable, "-m", "arrow_dataproto.demo", "--rows", "16", "--prompt", "8", "--response", "8",
               "--repeats", "2", "--no-ray"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert out.count(" exact\n") == 3 and "MISMATCH" not in out
    assert "median" in out and "best" in out and "of 2 runs" in out
    table = out[out.index("encode x"):].splitlines()
    names = [line.split()[0] for line in table[1:] if line.strip()]
    assert {"verl_default_like", "verl_numpy_like", "numpy_floor"} <= set(names)
    assert "arrow_dataproto (zero-copy)" in table[1] and table[1].split()[-2:] == ["1.0", "1.0"]
    explained = {line.split(":")[0].strip() for line in table if ": " in line}
    assert {"verl_default_like", "verl_numpy_like", "td_consolidated", "numpy_floor"} <= explained
    assert "numpy_floor: the same bytes as bare numpy arrays, no codec" in out
    assert "read-only" not in out
    assert out.rstrip().endswith("docs/benchmarks.md (what each path costs).") and "\ndone. Next: README.md" in out


def test_demo_help_explains_every_option():
    result = subprocess.run([sys.executable, "-m", "arrow_dataproto.demo", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for option, text in [("--rows ROWS", "samples in the batch"), ("--prompt PROMPT", "prompt tokens per sample"),
                         ("--response RESPONSE", "response tokens per sample")]:
        assert f"{option}  " in result.stdout and text in result.stdout
