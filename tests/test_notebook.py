"""The quick-start notebook runs top to bottom and draws its plot, so it never rots."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install arrow-dataproto[test])")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install arrow-dataproto[test])")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install arrow-dataproto[test])")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install arrow-dataproto[test])")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


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


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_notebook_runs_and_plots(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        km=this_interpreter_kernel(tmp_path),
        timeout=300,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the plot cell drew nothing"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "round trip exact: True" in text
