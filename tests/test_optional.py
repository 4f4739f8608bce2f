"""A missing optional package is a MissingDependencyError that names the extra and an
install line that works from a checkout (tests/missing_extras.py tries every optional path)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import arrow_dataproto as adp
from arrow_dataproto import files
from arrow_dataproto.testing.samples import ppo_batch

SCRIPT = Path(__file__).resolve().parent / "missing_extras.py"


def _paths(block: str) -> dict[str, dict]:
    out = subprocess.run([sys.executable, str(SCRIPT), "--block", block], capture_output=True, text=True, timeout=300)
    results = {r["path"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert out.returncode == 0, out.stdout + out.stderr
    return results


def test_every_optional_path_names_its_extra_when_its_package_is_missing():
    found = _paths("pandas,polars,tqdm,xxhash,omegaconf")
    assert {path: r["missing"] for path, r in found.items()} == {
        "import arrow_dataproto.pandas": "pandas",
        "DataProto.to_pandas": "pandas",
        "import arrow_dataproto.polars": "polars",
        "adp.ray_data": "pandas",  # Ray Data needs pandas, which the ray extra does not bring
        "import arrow_dataproto.integrations.transfer_queue": "omegaconf",
        "read_file(progress=True)": "tqdm",
        "write_file(checksums=True)": "xxhash",
    }
    assert 'pip install -c constraints.txt -e ".[interop]"' in found["adp.ray_data"]["error"]


def test_without_ray_every_ray_path_names_the_ray_extra():
    found = _paths("ray")
    assert set(found) == {"adp.ray_data", "transport.get", "integrations.tensordict.install",
                          "import arrow_dataproto.integrations.transfer_queue"}
    assert "RayNotFoundError" in found["integrations.tensordict.install"]["error"]
    assert '-e ".[transfer-queue]"' in found["import arrow_dataproto.integrations.transfer_queue"]["error"]


def test_the_error_is_an_import_error_of_the_library(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.delitem(sys.modules, "tqdm.auto", raising=False)
    path = tmp_path / "two.arrow"
    dp = adp.DataProto(*ppo_batch(rows=4, prompt=2, response=2))
    files.write_file(path, [dp, dp])
    with pytest.raises(adp.MissingDependencyError) as info:
        files.read_file(path, progress=True)
    assert isinstance(info.value, ModuleNotFoundError) and isinstance(info.value, adp.DataProtoError)
    assert info.value.name in ("tqdm", "tqdm.auto")  # the module whose import failed
    assert str(info.value).startswith("progress=True needs tqdm, which is not installed")
    assert str(info.value).endswith(
        "install the 'progress' extra: pip install -c constraints.txt -e \".[progress]\" in a checkout of "
        "arrow-dataproto (once it is on PyPI: pip install \"arrow-dataproto[progress]\")"
    )
    assert files.read_file(path).batch["responses"].shape == (8, 2)  # without a bar: no tqdm needed
