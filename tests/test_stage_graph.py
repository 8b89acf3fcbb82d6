"""The stage graph of docs/DESIGN.md, drawn from the imports themselves.

Every ``.py`` under ``recurnorm/`` is parsed (never imported): every ``import`` and
``from ... import`` at any depth (inside functions too), relative ones resolved, plus the
two lazy forms the package uses (a package facade's ``_LAZY`` table of module names and
``importlib.import_module("literal")``). The test fails on an import the table in
docs/DESIGN.md does not allow, and on any circle of files, inside a package or across.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "recurnorm"


@dataclass(frozen=True)
class Import:
    """One import of one module by another: where it is written, so a failure can point at it."""

    source: str  # importing module, dotted
    target: str  # imported module, dotted (the longest prefix that is a module of the package)
    path: str  # the importing file, relative to the root
    line: int


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__) for every .py under root/recurnorm."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def native_modules(root: Path) -> set[str]:
    """Dotted names of compiled extensions (budget's rANS kernel): its C source or a built
    library. They import nothing of ours; ``from . import _ransc`` is no import of the package."""
    found = set()
    for path in (root / PACKAGE).rglob("*"):
        if path.suffix in (".c", ".so", ".pyd"):
            parts = path.relative_to(root).parts
            found.add(".".join([*parts[:-1], path.name.split(".")[0]]))
    return found


def _longest_module(name: str, known: dict, native: set[str] = frozenset()) -> str | None:
    """The module a dotted name lands in (``a.b.attr`` -> ``a.b``); None outside the package
    or for a compiled extension."""
    if (name != PACKAGE and not name.startswith(PACKAGE + ".")) or name in native:
        return None
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in known else None


def _from_targets(module: str, is_package: bool, node: ast.ImportFrom, known) -> list[str]:
    """Dotted names a ``from X import a, b`` reaches: X.a where that is a module, else X."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]


def _lazy_table_names(tree: ast.Module, module: str) -> list[tuple[str, int]]:
    """Module names in a package facade's ``_LAZY = {...}`` (absolute, or relative to it)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            for const in ast.walk(node.value):
                if isinstance(const, ast.Constant) and isinstance(const.value, str):
                    name = const.value
                    out.append((name if name.startswith(PACKAGE) else f"{module}.{name}", const.lineno))
    return out


def _is_import_module_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__")
    )


def imports(root: Path) -> list[Import]:
    """Every import between modules of the package, at any depth."""
    known, native = modules(root), native_modules(root)
    names_of_modules = set(known) | native
    found = []
    for module, (path, is_package) in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names: list[tuple[str, int]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [(a.name, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names += [(n, node.lineno) for n in _from_targets(module, is_package, node, names_of_modules)]
            elif _is_import_module_call(node):
                names.append((str(node.args[0].value), node.lineno))
        if is_package:
            names += [(n, line) for n, line in _lazy_table_names(tree, module) if n in known]
        rel = str(path.relative_to(root))
        for name, line in names:
            target = _longest_module(name, known, native)
            if target is not None and target != module:
                found.append(Import(module, target, rel, line))
    return found


def stage_of(module: str) -> str:
    """``recurnorm.export.pack`` -> export, ``recurnorm.io`` -> io, the package itself ->
    recurnorm; a ``__main__`` is a command (cli)."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return "cli"
    return parts[1] if len(parts) > 1 else PACKAGE


def stage_table(design_text: str) -> dict[str, set[str]]:
    """The "Stage graph" table of docs/DESIGN.md: stage -> the stages it may import."""
    section = design_text.split("\n## Stage graph\n", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            stage = re.match(r"`([^`]+)`", cells[0]).group(1)
            table[stage] = set(re.findall(r"`([^`]+)`", cells[1]))
    return table


def forbidden(found: list[Import], table: dict[str, set[str]]) -> list[str]:
    """One line per import that the table does not allow (or by a stage the table lacks)."""
    problems = []
    for imp in found:
        src, dst = stage_of(imp.source), stage_of(imp.target)
        if src == dst:
            continue
        if src not in table:
            problems.append(f"{imp.path}:{imp.line}: stage {src!r} is not in docs/DESIGN.md's stage table")
        elif dst not in table[src]:
            problems.append(
                f"{imp.path}:{imp.line}: {imp.source} imports {imp.target} ({src} -> {dst}), "
                f"which docs/DESIGN.md does not allow ({src} may import: {', '.join(sorted(table[src])) or 'nothing'})"
            )
    return problems


def cycles(found: list[Import]) -> list[str]:
    """One line per strongly connected set of modules: a concrete circle, each step with the
    file and line that imports."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in found:
        edges.setdefault(imp.source, {}).setdefault(imp.target, imp)
    # Tarjan's strongly connected components, iteratively (no recursion limit to meet).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_describe_circle(sorted(c), edges) for c in components]


def _describe_circle(component: list[str], edges: dict[str, dict[str, Import]]) -> str:
    """The shortest circle through the component's first module, step by step."""
    first, members = component[0], set(component)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(set(edges.get(node, {})) & members):
                if child == first:
                    steps = paths[node] + [first]
                    return (
                        "circle: "
                        + " -> ".join(
                            f"{a} ({edges[a][b].path}:{edges[a][b].line})"
                            for a, b in zip(steps, steps[1:], strict=False)
                        )
                        + f" -> {first}"
                    )
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no circle found in {component}")  # a component of > 1 always has one


# -- the repository ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph():
    return imports(ROOT), stage_table((ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8"))


def test_every_import_is_allowed_by_the_stage_table(graph):
    found, table = graph
    problems = forbidden(found, table)
    assert not problems, "imports against docs/DESIGN.md's stage graph:\n" + "\n".join(problems)


def test_no_circle_of_files(graph):
    found, _ = graph
    circles = cycles(found)
    assert not circles, "import circles (function-level imports count):\n" + "\n".join(circles)


def test_the_table_names_every_stage_and_is_itself_one_way(graph):
    found, table = graph
    stages = {stage_of(m) for m in modules(ROOT)}
    assert stages == set(table), f"stages in code but not the table: {stages - set(table)}; " + (
        f"in the table but not the code: {set(table) - stages}"
    )
    for stage, allowed in table.items():
        assert allowed <= set(table), f"{stage}'s row names unknown stages {allowed - set(table)}"
    # The table itself has no circle: otherwise two stages could import each other.
    rows = [Import(f"{PACKAGE}.{a}", f"{PACKAGE}.{b}", "docs/DESIGN.md", 0) for a in table for b in table[a]]
    assert not cycles(rows), cycles(rows)


def test_the_walk_sees_what_it_must(graph):
    """Function-level, relative and lazy imports are all seen (or the checks above prove little)."""
    found, _ = graph
    pairs = {(i.source, i.target) for i in found}
    assert ("recurnorm.export.ship", "recurnorm.model.factory") in pairs  # inside a function, relative
    assert ("recurnorm.budget", "recurnorm.budget.api") in pairs  # the facade's _LAZY table
    assert ("recurnorm", "recurnorm.export.pack") in pairs  # the top package's _LAZY table
    assert ("recurnorm.train.__main__", "recurnorm.cli.train_cmd") in pairs  # a command (cli)
    assert len(found) > 500


# -- the checker on a package made to break it --------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_a_lazy_upward_import_and_a_lazy_circle_are_named(tmp_path):
    _write(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "",
            "low/a.py": """
                def f():
                    from ..high.b import g  # upward, inside a function
                    from . import c
            """,
            "low/c.py": """
                def h():
                    from .a import f  # back to a: a circle
            """,
            "high/__init__.py": "",
            "high/b.py": "def g():\n    pass\n",
        },
    )
    found = imports(tmp_path)
    table = {"low": set(), "high": {"low"}, PACKAGE: set()}
    problems = forbidden(found, table)
    assert len(problems) == 1 and "recurnorm/low/a.py:3: recurnorm.low.a imports recurnorm.high.b" in problems[0]
    circles = cycles(found)
    assert len(circles) == 1
    assert (
        "recurnorm.low.a (recurnorm/low/a.py:4) -> recurnorm.low.c (recurnorm/low/c.py:3) -> recurnorm.low.a"
        in (circles[0])
    )


def test_the_table_is_read_from_markdown():
    text = "intro\n\n## Stage graph\n\n| stage | may import |\n|---|---|\n| `a` | nothing |\n| `b` | `a` |\n\n## next\n"
    assert stage_table(text) == {"a": set(), "b": {"a"}}
