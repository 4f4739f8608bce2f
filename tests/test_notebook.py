"""The notebooks are committed executed (outputs and plots visible in the repository), and they
still run top to bottom here, so they never rot.

After changing a notebook or what it shows, re-execute them in place and commit the result:

    bash scripts/setup.sh compat && .venv-compat/bin/python tests/test_notebook.py [notebooks/NAME.ipynb ...]

The compat venv has verl, so the cell on verl's own class shows its real output; any interpreter
with the test extras runs them too (that cell then says verl is missing). The kernel is this
interpreter, whatever Jupyter kernels are installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install arrow-dataproto[test])")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install arrow-dataproto[test])")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install arrow-dataproto[test])")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install arrow-dataproto[test])")

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"
QUICKSTART = FOLDER / "quickstart.ipynb"
DATA = FOLDER / "rollouts_for_data_people.ipynb"
# What each notebook must show: the number of plots it draws and text its outputs contain.
EXPECTED = {
    QUICKSTART: (2, ["IPC round trip: exact", "ray.get: exact", "differs in: advantages", "uids in order: True",
                     "rows 250..260 exact: True", "from_pandas: exact", "compression zstd", "f32[128]", "mean_score"]),
    DATA: (0, ["compression zstd", "mean_length", "mean_answer"]),
}


def this_interpreter_kernel(tmp_path: Path):
    """A kernel manager that starts an IPython kernel on this very interpreter (``sys.executable``).

    Its kernelspec is written to ``tmp_path`` and is the only one looked at, so neither a
    missing kernelspec in a fresh virtualenv nor a user-level ``python3`` spec pointing at
    another Python changes which interpreter runs the notebook. Nothing is installed.
    """
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    kernels = tmp_path / "kernels"
    write_kernel_spec(kernels / "python3")
    specs = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=specs)


def _outputs(notebook) -> list:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


def _text(outputs: list) -> str:
    parts = [o.get("text", "") for o in outputs if o.output_type == "stream"]
    parts += [o.get("data", {}).get("text/plain", "") for o in outputs if o.output_type != "stream"]
    return "\n".join(parts)


def _check(notebook, path: Path) -> None:
    outputs = _outputs(notebook)
    assert not [o for o in outputs if o.output_type == "error"]
    plots, texts = EXPECTED[path]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == plots, f"{path.name} drew {len(images)} plots, expected {plots}"
    text = _text(outputs)
    assert [t for t in texts if t not in text] == []
    assert "is_fx_tracing" not in text  # torch's notice about torch.fx, which the library silences


@pytest.mark.parametrize("path", list(EXPECTED), ids=lambda p: p.stem)
def test_notebook_is_committed_executed(path):
    """Every code cell ran once, in order, and its outputs (plots included) are in the file."""
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    _check(notebook, path)


def execute(path: Path, workdir: Path):
    """``path``'s notebook executed from scratch by this interpreter in ``workdir``; raises
    ``CellExecutionError``, naming the cell, if any cell fails."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    client = nbclient.NotebookClient(
        notebook,
        km=this_interpreter_kernel(workdir),
        timeout=300,
        record_timing=False,  # no timestamps in committed cells
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return notebook


@pytest.mark.parametrize("path", list(EXPECTED), ids=lambda p: p.stem)
def test_notebook_runs(tmp_path, path):
    _check(execute(path, tmp_path), path)


if __name__ == "__main__":
    import sys
    import tempfile

    for name in sys.argv[1:] or [str(p) for p in EXPECTED]:
        with tempfile.TemporaryDirectory() as tmp:
            nbformat.write(execute(Path(name).resolve(), Path(tmp)), name)
        print("executed", name)
