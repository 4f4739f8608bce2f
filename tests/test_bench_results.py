"""``benchmarks/RESULTS.md`` holds what it says it holds: its body is exactly the ``cat`` of the
result files its introduction names, and every result file it points to exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
RECIPE = re.compile(r"`cat benchmarks/results/\{([\w,]+)\}\.md`")


def test_the_body_is_what_its_recipe_rebuilds():
    text = RESULTS.read_text()
    recipe = RECIPE.search(text)
    assert recipe is not None, "RESULTS.md no longer names the files its body is made of"
    body = text[text.index("\n#", recipe.end()) + 1:]  # from the first heading after the recipe
    rebuilt = "".join((ROOT / "benchmarks" / "results" / f"{name}.md").read_text() for name in recipe.group(1).split(","))
    assert body == rebuilt, "RESULTS.md's body differs from its result files: rerun its cat recipe"


def test_every_result_file_it_points_to_exists():
    named = set(re.findall(r"results/(\w+\.(?:md|png))", RESULTS.read_text()))
    assert named, "RESULTS.md points to no result file"
    missing = sorted(n for n in named if not (ROOT / "benchmarks" / "results" / n).exists())
    assert not missing, f"RESULTS.md points to result files that do not exist: {missing}"
