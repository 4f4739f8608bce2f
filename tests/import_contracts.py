"""An import-linter contract type: no module uses another module's underscored names.

import-linter checks the import graph between modules (its ``layers`` contract
keeps the package free of cycles); this contract adds the one rule the graph
cannot show: ``from arrow_dataproto.x import _name`` or ``x._name`` in a module
other than ``x``. Importing a private *module* (``from . import _codec``) from
within its package is allowed: that is what the underscore on a module means.
Configured in ``pyproject.toml`` (``[tool.importlinter]``); run by ``lint-imports``
from ``scripts/test.sh``.
"""

from __future__ import annotations

import ast
import importlib.util

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(module: str, is_package: bool, target: str | None, level: int) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def private_name_uses(module: str, modules: set[str]) -> list[str]:
    """Every use in ``module`` of an underscored name of another module in ``modules``."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return []
    is_package = spec.submodule_search_locations is not None
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read(), spec.origin)
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> one of our modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source_module = _absolute(module, is_package, node.module, node.level)
            if source_module not in modules or source_module == module:
                continue
            for alias in node.names:
                submodule = f"{source_module}.{alias.name}"
                if submodule in modules:
                    aliases[alias.asname or alias.name] = submodule
                elif _is_private(alias.name):
                    found.append(f"{module}:{node.lineno} imports {source_module}.{alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != module
            and _is_private(node.attr)
        ):
            found.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return found


class PrivateNamesContract(Contract):
    """Modules of ``containers`` use no underscored name of another module of theirs."""

    type_name = "private_names"

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        modules = set(graph.modules)
        violations: list[str] = []
        for container in self.containers:  # type: ignore[attr-defined]
            for module in sorted(m for m in modules if m == container or m.startswith(f"{container}.")):
                violations += private_name_uses(module, modules)
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for violation in check.metadata["violations"]:
            output.print_error(violation, bold=False)
            output.new_line()
