"""The sdist and the wheel: license metadata, py.typed, and an sdist whose tests can run.

Both are built from a copy of the source tree with setuptools' build backend (no network:
the backend of this interpreter is used, as ``python -m build --no-isolation`` would).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist", ".pytest_cache",
                                 ".hypothesis", ".ipynb_checkpoints", "*.arrow")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, str]:
    setuptools = pytest.importorskip("setuptools", reason="setuptools is not installed (pip install arrow-dataproto[test])")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 cannot build an SPDX license expression")
    tree = tmp_path_factory.mktemp("src") / "arrow-dataproto"
    shutil.copytree(ROOT, tree, ignore=IGNORED)
    for name in (ROOT / "tests" / "data").iterdir():  # golden files are *.arrow too: keep them
        shutil.copy(name, tree / "tests" / "data" / name.name)
    code = (
        "import setuptools.build_meta as backend\n"
        "sdist = backend.build_sdist('dist')\n"
        "wheel = backend.build_wheel('dist')\n"
        "print('BUILT', sdist, wheel)\n"
    )
    result = subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=tree, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (built_line,) = [line for line in result.stdout.splitlines() if line.startswith("BUILT ")]
    _, sdist_name, wheel_name = built_line.split()
    return tree / "dist" / sdist_name, tree / "dist" / wheel_name, result.stderr


def test_the_build_warns_about_nothing_deprecated(built):
    _, _, log = built
    assert "Deprecat" not in log, log[-3000:]


def test_the_wheel_carries_license_metadata_and_py_typed(built):
    _, wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(metadata_name).decode()
    assert "arrow_dataproto/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "Classifier: Typing :: Typed" in metadata
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]


def test_the_sdist_holds_a_complete_test_tree(built):
    sdist, _, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    tracked_tests = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*") if p.is_file()
                     and "__pycache__" not in p.parts}
    assert tracked_tests <= names, sorted(tracked_tests - names)
    for needed in ("LICENSE", "pyproject.toml", "constraints.txt", "tests/fuzz.py", "tests/golden.py", "SECURITY.md",
                   "notebooks/quickstart.ipynb", "arrow_dataproto/py.typed"):
        assert needed in names
    assert not [n for n in names if "__pycache__" in n or n.startswith(".venv")]
