"""Layout rules: the library core never imports the tools.

``refplan/cli/`` holds the ``refplan`` command and the tools that sit beside the library: bench,
show, sync, demo and the conformance corpus generator. The library core is every other module of
``refplan/`` except ``refplan/conformance/`` (a suite with its own runner) and
``refplan/__main__.py`` (which *is* the command: ``python -m refplan``). Installed as a library,
the core needs only numpy; a tool may import torch, matplotlib or a peer, and may change from one
release to the next. So the core must not import ``refplan.cli``, directly or through any other
module, not even inside a function.

The check is static: the import closure is computed from the source with ``ast``, following every
import statement (module level, inside functions, and under ``if TYPE_CHECKING:`` too: the rule is
that the core does not name the tools at all), the packages an import runs (importing
``refplan.a.b`` runs ``refplan/__init__.py`` and ``refplan/a/__init__.py``), and
``importlib.import_module("refplan....")`` / ``__import__`` calls with a literal name. The same
function runs on synthetic module sets, one import injected each, to show it would catch one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import pytest

import refplan

PACKAGE = Path(refplan.__file__).resolve().parent
TOOLS = "refplan.cli"
NOT_CORE = ("refplan.cli", "refplan.conformance", "refplan.__main__")


class Module(NamedTuple):
    source: str
    is_package: bool


def package_modules(root: Path = PACKAGE) -> dict[str, Module]:
    """Every module of the package at ``root``, by dotted name (``refplan.cli.main``)."""
    out: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = Module(path.read_text(encoding="utf-8"), is_package)
    return out


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _literal_import(node: ast.Call) -> str | None:
    """The module a call ``importlib.import_module("x")``, ``import_module("x")`` or
    ``__import__("x")`` imports, when it is written as a literal."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def imports_of(name: str, module: Module, known: Mapping[str, Module]) -> set[str]:
    """The modules of ``known`` that importing ``name`` may import, directly: every import
    statement anywhere in its source, with the packages each one runs."""
    package = name.split(".") if module.is_package else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(module.source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            where = ".".join([*base, *([node.module] if node.module else [])])
            targets.add(where)
            # ``from x import y`` imports the submodule x.y when there is one.
            targets.update(f"{where}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            literal = _literal_import(node)
            if literal is not None:
                targets.add(literal)
    found: set[str] = set()
    for target in targets:
        parts = target.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # the packages it runs
    found.discard(name)
    return found & set(known)


def import_closure(modules: Mapping[str, Module], roots: Iterable[str]) -> dict[str, str | None]:
    """Every module reachable from ``roots``, each with the module that first imported it (None for
    a root): enough to print the chain that leads to a module."""
    parent: dict[str, str | None] = dict.fromkeys(roots)
    todo = list(parent)
    while todo:
        name = todo.pop(0)
        for child in sorted(imports_of(name, modules[name], modules)):
            if child not in parent:
                parent[child] = name
                todo.append(child)
    return parent


def chain(parent: Mapping[str, str | None], name: str) -> list[str]:
    out = [name]
    while (up := parent[out[-1]]) is not None:
        out.append(up)
    return out[::-1]


def core(modules: Mapping[str, Module]) -> list[str]:
    return sorted(name for name in modules if not any(_within(name, other) for other in NOT_CORE))


def tool_imports(modules: Mapping[str, Module]) -> list[list[str]]:
    """Each import chain from a core module into ``refplan.cli`` (empty when the rule holds)."""
    parent = import_closure(modules, core(modules))
    return [chain(parent, name) for name in sorted(parent) if _within(name, TOOLS)]


def test_the_core_never_imports_the_tools() -> None:
    modules = package_modules()
    roots = core(modules)
    # The walk really covered the core and followed imports into subpackages.
    assert {"refplan", "refplan.planner", "refplan.verify", "refplan.execute", "refplan.oracle.judge"} <= set(roots)
    assert {"refplan.cli.main", "refplan.cli.bench", "refplan.cli.generate_corpus"} <= set(modules)
    assert not tool_imports(modules), "\n".join(" -> ".join(c) for c in tool_imports(modules))


def test_the_conformance_suite_never_imports_the_tools() -> None:
    """``refplan.conformance`` is outside the core (its runner is a command too), but it is also a
    library API (``run_conformance``), so the same rule holds for it: the corpus generator that
    writes its cases is a tool, and the suite only reads them."""
    modules = package_modules()
    roots = [name for name in modules if _within(name, "refplan.conformance")]
    assert {"refplan.conformance.runner", "refplan.conformance.peers"} <= set(roots)
    parent = import_closure(modules, roots)
    found = [chain(parent, name) for name in sorted(parent) if _within(name, TOOLS)]
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_the_walk_follows_imports_from_the_tools_into_the_core() -> None:
    """Non-vacuity: the same walk, started at bench, reaches its package (and through it the
    command), the planner, the oracle, and ``sync`` and the peers, which bench imports only inside
    functions."""
    modules = package_modules()
    reached = import_closure(modules, ["refplan.cli.bench"])
    assert {"refplan", "refplan.cli", "refplan.cli.main", "refplan.cli.sync", "refplan.planner",
            "refplan.verify", "refplan.conformance.peers"} <= set(reached)
    assert chain(reached, "refplan.cli.sync") == ["refplan.cli.bench", "refplan.cli.sync"]


# One import of the tools, written each way the walk must see, injected into a copy of the real
# package: (module it goes into, a line appended to that module's source).
INJECTIONS = {
    "module level, absolute": ("refplan.errors", "import refplan.cli.sync"),
    "inside a function, relative": ("refplan.box", "def _late():\n    from .cli import demo\n    return demo"),
    "the package itself": ("refplan.limits", "from . import cli"),
    "two levels up, from the oracle": ("refplan.oracle.judge", "from ..cli.show import plan_svg"),
    "under TYPE_CHECKING": ("refplan.maps", "if TYPE_CHECKING:\n    from refplan.cli.bench import SCENARIOS"),
    "a literal import_module": ("refplan.frames", "import importlib\n_m = importlib.import_module('refplan.cli')"),
    "__import__": ("refplan.plan", "_m = __import__('refplan.cli')"),
    "the package's __init__": ("refplan", "from .cli import main as _main"),
}


@pytest.mark.parametrize("how", sorted(INJECTIONS))
def test_the_guard_catches_an_injected_import(how: str) -> None:
    where, line = INJECTIONS[how]
    modules = package_modules()
    modules[where] = Module(modules[where].source + "\n\n" + line + "\n", modules[where].is_package)
    found = tool_imports(modules)
    assert found, f"an import of the tools in {where} ({how}) went unseen"
    # The chain names how the core gets there: from a core module, through ``where``, into the tools.
    first = next(c for c in found if where in c)
    assert first[0] in core(modules) and _within(first[-1], TOOLS), first


def test_the_guard_catches_an_import_through_another_module() -> None:
    """A core module imports a new helper module; the helper imports a tool."""
    modules = package_modules()
    modules["refplan._helper"] = Module("from .cli.demo import demo_batch\n", False)
    modules["refplan.simulate"] = Module(modules["refplan.simulate"].source + "\nfrom . import _helper\n", False)
    assert tool_imports(modules)
    reached = import_closure(modules, ["refplan.simulate"])
    assert chain(reached, "refplan.cli.demo") == ["refplan.simulate", "refplan._helper", "refplan.cli.demo"]


def test_the_guard_ignores_what_only_looks_like_an_import() -> None:
    """A name in a docstring or a comment, or an attribute that happens to be called ``cli``, is no
    import: the rule must not fire on text."""
    modules = package_modules()
    text = '"""Run ``python -m refplan.cli.generate_corpus``."""\n# import refplan.cli\ncli = None\nx = cli\n'
    modules["refplan._notes"] = Module(text, False)
    modules["refplan.simulate"] = Module(modules["refplan.simulate"].source + "\nfrom . import _notes\n", False)
    assert not tool_imports(modules)
