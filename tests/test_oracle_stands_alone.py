"""The oracle stands alone: it imports nothing of the planner and repeats none of its passages.

The promise users rely on most is that ``verify_plan`` shares no logic with the planner, so a
reasoning bug cannot hide in both. Two ways that promise erodes without anyone noticing, and a
check for each:

- **Imports.** A harmless-looking import (a type, a constant, a file loader) pulls in a module
  that imports the planner's validation. So the static import closure of ``refplan.oracle`` is
  computed from the source (``ast``, following refplan's own imports, at module level and inside
  functions; not ``if TYPE_CHECKING:`` blocks, which never run) and must not reach ``frames``,
  ``regions``, ``requests``, ``check``, ``policies`` or ``planner``. (Python also runs
  ``refplan/__init__.py`` when any submodule is imported; that is the package's public face, not
  code the oracle calls, so the closure starts at the oracle's own modules.)
- **Copies.** Code copied from the planner and renamed passes the import check. So every
  window of six consecutive code lines of the oracle, normalized so that names, numbers and
  strings do not matter, must not occur in the planner's modules. (The same comparison the
  ``duplicates`` tool makes; this one runs everywhere the tests run.)

The trusted base both sides may share is ``box`` (and ``maps``, ``plan``'s types, ``limits``,
``errors``): ``proofs/theorem3.md`` names it.
"""

from __future__ import annotations

import ast
import io
import keyword
import tokenize
from pathlib import Path

import refplan

PACKAGE = Path(refplan.__file__).resolve().parent
ORACLE = PACKAGE / "oracle"
PLANNER_MODULES = ("frames", "regions", "requests", "check", "policies", "planner")
WINDOW = 6


def _module_file(name: str) -> Path | None:
    """The file of refplan module ``name`` (dotted, without the ``refplan.`` prefix), if any."""
    base = PACKAGE.joinpath(*name.split(".")) if name else PACKAGE
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _name_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, imports inside functions included (they run when the function does), except
    the bodies of ``if TYPE_CHECKING:`` blocks, which never run."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(path: Path) -> set[str]:
    """refplan-internal modules ``path`` imports, as dotted names below ``refplan``."""
    here = _name_of(path).split(".") if _name_of(path) else []
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "refplan" or alias.name.startswith("refplan."):
                    found.add(alias.name.removeprefix("refplan").removeprefix("."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else list(package)
                module = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and (node.module == "refplan" or node.module.startswith("refplan.")):
                module = node.module.removeprefix("refplan").removeprefix(".")
            else:
                continue
            for alias in node.names:  # ``from .. import limits`` imports a submodule, not the package
                sub = f"{module}.{alias.name}" if module else alias.name
                found.add(sub if _module_file(sub) is not None else module)
    return {name for name in found if _module_file(name) is not None}


def oracle_import_closure() -> set[str]:
    """Every refplan module the oracle's modules import, directly or through others."""
    todo = [_name_of(p) for p in sorted(ORACLE.glob("*.py"))]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        assert path is not None, name
        todo.extend(_imports(path) - seen)
    return seen


def test_the_oracle_imports_nothing_of_the_planner() -> None:
    closure = oracle_import_closure()
    assert "oracle.judge" in closure and "box" in closure  # the walk really followed imports
    reached = sorted(m for m in closure if m.split(".")[0] in PLANNER_MODULES)
    assert not reached, f"the oracle's import closure reaches the planner: {reached}"
    assert closure <= {
        "oracle", "oracle.verdict", "oracle.layout", "oracle.segments", "oracle.judge", "oracle.stream",
        "oracle.small", "box", "maps", "plan", "limits", "errors", "_gc", "formats", "endpoints",
    }, sorted(closure)


def test_the_closure_walk_sees_the_planner_where_it_is_imported() -> None:
    """Non-vacuity: the same walk, started at ``planner``, does reach frames and check."""
    todo, seen = ["planner"], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            path = _module_file(name)
            assert path is not None
            todo.extend(_imports(path))
    assert {"frames", "regions", "requests", "check", "policies"} <= seen


def _normalized_lines(path: Path) -> list[str]:
    """Code lines with names, numbers and strings replaced by placeholders; lines that are only
    punctuation, keywords, imports or docstrings are dropped (they repeat everywhere)."""
    lines: dict[int, list[str]] = {}
    skip: set[int] = set()
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
            node.value.value, str
        )
        if isinstance(node, (ast.Import, ast.ImportFrom)) or docstring:
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.start[0] in skip:
            continue
        if tok.type == tokenize.NAME:
            text = tok.string if keyword.iskeyword(tok.string) else "N"
        elif tok.type == tokenize.NUMBER:
            text = "0"
        elif tok.type == tokenize.STRING or tok.type in getattr(tokenize, "FSTRING_TYPES", ()):
            text = "S"
        else:
            text = tok.string
        lines.setdefault(tok.start[0], []).append(text)
    out = []
    for number in sorted(lines):
        tokens = lines[number]
        if any(t == "N" for t in tokens) and len(tokens) > 2:
            out.append(" ".join(tokens))
    return out


def _windows(path: Path) -> set[tuple[str, ...]]:
    lines = _normalized_lines(path)
    return {tuple(lines[i: i + WINDOW]) for i in range(len(lines) - WINDOW + 1)}


def test_no_passage_of_the_oracle_repeats_one_of_the_planners() -> None:
    planner: dict[tuple[str, ...], str] = {}
    for name in PLANNER_MODULES:
        path = _module_file(name)
        assert path is not None
        files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
        for file in files:
            for window in _windows(file):
                planner.setdefault(window, name)
    repeated = []
    for path in sorted(ORACLE.glob("*.py")):
        for window in _windows(path):
            if window in planner:
                repeated.append(f"{path.name} ~ {planner[window]}.py: {window[0]} ...")
    assert not repeated, "the oracle repeats the planner:\n" + "\n".join(sorted(repeated)[:10])


def test_the_window_comparison_finds_a_renamed_copy(tmp_path: Path) -> None:
    """Non-vacuity: a planner function pasted with other names is found."""
    source = (PACKAGE / "frames.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_common_frame")
    body = "\n".join(source.splitlines()[func.lineno - 1: func.end_lineno])
    copy = tmp_path / "copy.py"
    copy.write_text(body.replace("piece", "item").replace("shard", "slot"), encoding="utf-8")
    assert _windows(copy) & _windows(PACKAGE / "frames.py")
