"""Every Python block of README.md, and of the docs pages it links for details, runs as written.

Each page's blocks run in order, in one namespace of their own (a reader pasting them top to bottom into one
session: later blocks may use what earlier ones made, nothing else), in a temporary folder.
They share the test run's bounded Ray instance (the ``ray_session`` fixture): a block's
``ray.init(...)`` connects to it whatever arguments it passes, and ``ray.shutdown()`` in a
block leaves it running.

A block that needs what CI lacks says so in an HTML comment on the line before its fence::

    <!-- readme-test: needs verl -->          run only where ``import verl`` works
    <!-- readme-test: needs transferqueue -->  ... ``import transfer_queue`` works
    <!-- readme-test: needs gpu -->           ... torch sees CUDA
    <!-- readme-test: skip REASON -->         never run (say why)

Such a block is left out (the test reports which), the others still run; a block with an
unknown marker fails the test. Blocks other than ``python`` (bash, text) are not run.
"""

from __future__ import annotations

import importlib.util
import re
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *(ROOT / "docs" / name for name in ("ray.md", "files.md", "verl.md", "tensordict.md"))]
"""The pages whose snippets are tested: each starts from its own imports."""
MARKER = re.compile(r"<!--\s*readme-test:\s*(\w+)\s*(.*?)\s*-->")
NEEDS = {
    "verl": lambda: importlib.util.find_spec("verl") is not None,
    "transferqueue": lambda: importlib.util.find_spec("transfer_queue") is not None,
    "gpu": lambda: _cuda(),
}

def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def blocks(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(to run, left out)``: each Python block as ``(line of its fence, code)``; left-out
    blocks with the reason instead of the code."""
    run, left_out = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        start = i
        end = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == "```")
        code = "\n".join(lines[start + 1:end]) + "\n"
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.search(before)
        if marker is None:
            run.append((start + 1, code))
        elif marker.group(1) == "skip":
            left_out.append((start + 1, f"skip: {marker.group(2)}"))
        elif marker.group(1) == "needs" and marker.group(2) in NEEDS:
            if NEEDS[marker.group(2)]():
                run.append((start + 1, code))
            else:
                left_out.append((start + 1, f"needs {marker.group(2)}"))
        else:
            raise AssertionError(f"line {start + 1}: unknown marker {before.strip()!r}")
        i = end + 1
    return run, left_out


def test_the_marker_rules():
    text = "\n".join([
        "```python", "a = 1", "```",
        "<!-- readme-test: skip shown only -->", "```python", "b = 1", "```",
        "<!-- readme-test: needs gpu -->", "", "```python", "c = 1", "```",
        "```bash", "echo no", "```",
    ])
    run, left_out = blocks(text)
    assert run[0] == (1, "a = 1\n")
    assert left_out[0] == (5, "skip: shown only")
    assert (10, "c = 1\n") in run or (10, "needs gpu") in left_out
    assert len(run) + len(left_out) == 3


def test_the_readme_fits_a_screen_and_starts_with_code():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move details to a page in docs/"
    first_code = next(i for i, line in enumerate(lines, 1) if line.strip() == "```python")
    assert first_code <= 30, f"the README's first Python block starts at line {first_code}"


def test_every_linked_page_exists():
    """Every relative link of the README and of the tested pages names a file of the checkout
    (docs/transfer_queue.md is written with the TransferQueue backend)."""
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            path = (page.parent / target).resolve()
            assert path.exists() or path == ROOT / "docs" / "transfer_queue.md", f"{page.name} links {target}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_python_block_runs(page, ray_session, tmp_path, monkeypatch):
    run, left_out = blocks(page.read_text())
    assert run or left_out, f"no Python block found in {page.name}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ray_session, "init", lambda *args, **kwargs: None)  # already running, bounded
    monkeypatch.setattr(ray_session, "shutdown", lambda *args, **kwargs: None)
    namespace: dict = {"__name__": "__readme__"}
    for line, code in run:
        try:
            exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
        except BaseException:
            raise AssertionError(f"the {page.name} block at line {line} fails:\n{traceback.format_exc()}") from None
    if left_out:
        print("left out:", left_out)
