"""Which names in a program are a function's own locals, resolved as Python's compiler does.

Renaming a local is safe when every occurrence that refers to it changes together and no
occurrence starts or stops referring to it. `Scopes` finds, for each occurrence of a name
(a `Name` node, or the `as` name of an `except`), the scope whose binding it refers to:
the function or comprehension that binds it, a class body, or none (a global or builtin).
Both `minify`'s `--rename-locals` and `check` use it: the check replaces each renamable
local by its scope's index and order of first use, on both sides, so two programs that
differ by a consistent renaming compare equal, and a capture (a local renamed to a global
it also reads) or a collision (two locals made one) does not.

Renamable: a name that a function or comprehension binds only by assignment (`=`, `for`,
`with ... as`, `:=`, `del`) or `except ... as`, that is not a parameter (callers may pass
it by keyword), not declared global or nonlocal anywhere on its way, not a dunder (name
mangling), never in an annotation (strings under `from __future__ import annotations`) or a nested
`nonlocal` statement,
in a scope whose code cannot read locals by name (`locals()`, `vars()`, `dir()`, `eval`,
`exec`, frame objects anywhere inside it).
"""

from __future__ import annotations

import ast
import builtins
import itertools
import keyword
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, field

FUNCTION, LAMBDA, COMPREHENSION, CLASS, MODULE = "function", "lambda", "comprehension", "class", "module"
# Ways code reads a scope's locals by name: a function that uses any of them keeps its names.
_DYNAMIC_NAMES = {"locals", "vars", "dir", "eval", "exec", "breakpoint"}
_DYNAMIC_ATTRS = {"f_locals", "f_back", "_getframe", "currentframe"}  # frames: f_locals reads them
_RENAMABLE_BINDINGS = {"assign", "except"}


_HANDLERS = {
    ast.Name: "_name",
    ast.Attribute: "_attribute",
    ast.FunctionDef: "_function",
    ast.AsyncFunctionDef: "_function",
    ast.Lambda: "_function",
    ast.ClassDef: "_class",
    **dict.fromkeys((ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp), "_comprehension"),
    ast.NamedExpr: "_walrus",
    ast.ExceptHandler: "_handler",
    ast.Import: "_import",
    ast.ImportFrom: "_import",
    ast.Global: "_global",
    ast.Nonlocal: "_nonlocal",
    ast.AnnAssign: "_annassign",
    **dict.fromkeys((ast.MatchAs, ast.MatchStar, ast.MatchMapping), "_match"),
    **({ast.TypeAlias: "_unsupported"} if hasattr(ast, "TypeAlias") else {}),  # Python >= 3.12
}


class Unsupported(Exception):
    """A construct this analysis does not model (PEP 695 type parameters): rename nothing."""


@dataclass(eq=False)
class Scope:
    kind: str
    parent: Scope | None
    index: int
    node: ast.AST | None
    bindings: dict[str, set[str]] = field(default_factory=dict)  # name -> {"assign", "param", ...}
    declared_global: set[str] = field(default_factory=set)
    declared_nonlocal: set[str] = field(default_factory=set)  # and a comprehension's `:=` targets
    dynamic: bool = False  # its code, or code nested in it, may read locals by name
    spelled: set[str] = field(default_factory=set)  # every name its code and nested code spell

    def bind(self, name: str, how: str) -> None:
        self.bindings.setdefault(name, set()).add(how)
        self.spelled.add(name)


@dataclass(eq=False)
class Occurrence:
    node: ast.AST  # ast.Name (field id) or ast.ExceptHandler (field name)
    scope: Scope  # where it is written
    annotation: bool  # inside an annotation

    @property
    def name(self) -> str:
        return self.node.id if isinstance(self.node, ast.Name) else self.node.name

    @name.setter
    def name(self, value: str) -> None:
        if isinstance(self.node, ast.Name):
            self.node.id = value
        else:
            self.node.name = value


class Scopes:
    """The scopes of `tree` and every occurrence of a name in it, in a fixed walk order
    that depends on the tree's shape only (never on its names)."""

    def __init__(self, tree: ast.Module):
        self.scopes: list[Scope] = []
        self.occurrences: list[Occurrence] = []
        self._annotation = 0
        self._nonlocal_statements: list[tuple[Scope, str]] = []
        module = self._new(MODULE, None)
        self._body(tree.body, module)
        for scope in reversed(self.scopes):  # children come after their parents
            if scope.parent is not None:
                scope.parent.spelled |= scope.spelled
        self._renamable: dict[tuple[int, str], bool] = {}
        # Names an annotation or a `nonlocal` statement spells out: their text would not follow.
        fixed = {(self.resolve(o), o.name) for o in self.occurrences if o.annotation}
        fixed |= {(self.lookup(s, name), name) for s, name in self._nonlocal_statements}
        for o in self.occurrences:
            target = self.resolve(o)
            key = (target.index if target else -1, o.name)
            if key not in self._renamable:
                self._renamable[key] = target is not None and self._may_rename(target, o.name, fixed)

    # --- resolution ------------------------------------------------------------------

    def resolve(self, occurrence: Occurrence) -> Scope | None:
        """The scope whose binding this occurrence refers to; None for a global or builtin."""
        return self.lookup(occurrence.scope, occurrence.name)

    @staticmethod
    def lookup(scope: Scope, name: str) -> Scope | None:
        if name in scope.declared_global or scope.kind == MODULE:
            return None
        if name in scope.bindings and name not in scope.declared_nonlocal:
            return scope  # a class body's own names too (they are read from its dict)
        p = scope.parent
        while p is not None and p.kind != MODULE:  # free: enclosing functions, never class bodies
            if p.kind != CLASS:
                if name in p.declared_global:
                    return None
                if name in p.bindings and name not in p.declared_nonlocal:
                    return p
            p = p.parent
        return None

    def renamable(self, occurrence: Occurrence) -> Scope | None:
        """The function or comprehension whose renamable local this occurrence is, else None."""
        target = self.resolve(occurrence)
        if target is None or not self._renamable.get((target.index, occurrence.name), False):
            return None
        return target

    @staticmethod
    def _may_rename(scope: Scope, name: str, fixed: set) -> bool:
        return (
            scope.kind in (FUNCTION, COMPREHENSION)
            and not scope.dynamic
            and scope.bindings.get(name, set()) <= _RENAMABLE_BINDINGS
            and name not in scope.declared_global | scope.declared_nonlocal
            and not name.startswith("__")
            and (scope, name) not in fixed
        )

    # --- the walk --------------------------------------------------------------------

    def _new(self, kind: str, parent: Scope | None, node: ast.AST | None = None) -> Scope:
        scope = Scope(kind, parent, len(self.scopes), node)
        self.scopes.append(scope)
        return scope

    def _body(self, nodes, scope: Scope) -> None:
        for node in nodes:
            self._visit(node, scope)

    def _annotation_of(self, node: ast.AST | None, scope: Scope) -> None:
        if node is not None:
            self._annotation += 1
            self._visit(node, scope)
            self._annotation -= 1

    def _params(self, args: ast.arguments, outer: Scope, inner: Scope, annotations: bool) -> None:
        self._body(args.defaults, outer)
        self._body([d for d in args.kw_defaults if d is not None], outer)
        for a in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg):
            if a is not None:
                inner.bind(a.arg, "param")
                if annotations:
                    self._annotation_of(a.annotation, outer)

    def _visit(self, node: ast.AST, scope: Scope) -> None:
        getattr(self, _HANDLERS.get(type(node), "_generic"))(node, scope)

    def _name(self, node: ast.Name, scope: Scope) -> None:
        if isinstance(node.ctx, ast.Load):
            scope.spelled.add(node.id)
            if node.id in _DYNAMIC_NAMES:
                self._mark_dynamic(scope)
        else:  # Store, Del
            scope.bind(node.id, "assign")
        self.occurrences.append(Occurrence(node, scope, self._annotation > 0))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, scope: Scope) -> None:
        lam = isinstance(node, ast.Lambda)
        if not lam:
            if getattr(node, "type_params", None):
                raise Unsupported("type parameters")
            scope.bind(node.name, "def")
            self._body(node.decorator_list, scope)
        inner = self._new(LAMBDA if lam else FUNCTION, scope, node)
        self._params(node.args, scope, inner, not lam)
        if lam:
            self._visit(node.body, inner)
        else:
            self._annotation_of(node.returns, scope)
            self._body(node.body, inner)

    def _class(self, node: ast.ClassDef, scope: Scope) -> None:
        if getattr(node, "type_params", None):
            raise Unsupported("type parameters")
        scope.bind(node.name, "def")
        self._body([*node.decorator_list, *node.bases, *node.keywords], scope)
        self._body(node.body, self._new(CLASS, scope, node))

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp, scope: Scope) -> None:
        self._visit(node.generators[0].iter, scope)  # evaluated where the comprehension is
        inner = self._new(COMPREHENSION, scope, node)
        for i, gen in enumerate(node.generators):
            self._visit(gen.target, inner)
            if i:
                self._visit(gen.iter, inner)
            self._body(gen.ifs, inner)
        self._body([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt], inner)

    def _walrus(self, node: ast.NamedExpr, scope: Scope) -> None:
        self._visit(node.value, scope)
        target, name = scope, node.target.id
        scope.spelled.add(name)
        while target.kind == COMPREHENSION:  # `:=` binds in the first enclosing non-comprehension
            target.declared_nonlocal.add(name)
            target = target.parent
        target.bind(name, "assign")
        self.occurrences.append(Occurrence(node.target, scope, self._annotation > 0))

    def _handler(self, node: ast.ExceptHandler, scope: Scope) -> None:
        if node.type is not None:
            self._visit(node.type, scope)
        if node.name is not None:
            scope.bind(node.name, "except")
            self.occurrences.append(Occurrence(node, scope, False))
        self._body(node.body, scope)

    def _import(self, node: ast.Import | ast.ImportFrom, scope: Scope) -> None:
        for alias in node.names:
            scope.bind(alias.asname or alias.name.split(".")[0], "import")
            scope.spelled.update(alias.name.split("."))

    def _global(self, node: ast.Global, scope: Scope) -> None:
        scope.declared_global.update(node.names)
        scope.spelled.update(node.names)

    def _nonlocal(self, node: ast.Nonlocal, scope: Scope) -> None:
        scope.declared_nonlocal.update(node.names)
        scope.spelled.update(node.names)
        self._nonlocal_statements += [(scope, name) for name in node.names]

    def _annassign(self, node: ast.AnnAssign, scope: Scope) -> None:
        self._visit(node.target, scope)
        self._annotation_of(node.annotation, scope)
        if node.value is not None:
            self._visit(node.value, scope)

    def _match(self, node: ast.MatchAs | ast.MatchStar | ast.MatchMapping, scope: Scope) -> None:
        name = node.rest if isinstance(node, ast.MatchMapping) else node.name
        if name is not None:
            scope.bind(name, "match")
        self._generic(node, scope)

    def _attribute(self, node: ast.Attribute, scope: Scope) -> None:
        if node.attr in _DYNAMIC_ATTRS:
            self._mark_dynamic(scope)
        self._visit(node.value, scope)

    def _unsupported(self, node: ast.AST, scope: Scope) -> None:
        raise Unsupported(type(node).__name__)

    def _generic(self, node: ast.AST, scope: Scope) -> None:
        for child in ast.iter_child_nodes(node):
            self._visit(child, scope)

    @staticmethod
    def _mark_dynamic(scope: Scope) -> None:
        s = scope
        while s is not None:  # the scope and every one around it: a closure's cells are its locals
            s.dynamic = True
            s = s.parent


def canonical_locals(tree: ast.Module) -> ast.Module:
    """`tree` with every renamable local replaced by `<scope index>:<order of first use>`
    (not an identifier, so it meets no real name): the same for any consistent renaming."""
    scopes = Scopes(tree)
    seen: dict[tuple[int, str], str] = {}
    count: dict[int, int] = {}
    for o in scopes.occurrences:
        target = scopes.renamable(o)
        if target is None:
            continue
        key = (target.index, o.name)
        if key not in seen:
            seen[key] = f"{target.index}:{count.get(target.index, 0)}"
            count[target.index] = count.get(target.index, 0) + 1
        o.name = seen[key]
    return tree


def short_names(taken: set[str]) -> Iterator[str]:
    """a, b, ..., Z, aa, ab, ... skipping `taken`, keywords and builtins."""
    for size in itertools.count(1):
        for chars in itertools.product(string.ascii_letters, repeat=size):
            name = "".join(chars)
            if name not in taken and not keyword.iskeyword(name) and not hasattr(builtins, name):
                yield name


def _debug_fstring_names(tree: ast.Module) -> set[str]:
    """Names an f-string prints by their text (`f"{x=}"`): renaming them would change output."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            for part in n.values:
                if isinstance(part, ast.Constant) and isinstance(part.value, str) and part.value.rstrip().endswith("="):
                    out.update(re.findall(r"[A-Za-z_]\w*", part.value))
    return out


def local_renames(tree: ast.Module, keep: set[tuple[int, str]] = frozenset()) -> dict[tuple[int, str], tuple]:
    """(scope index, name) -> (new name, its occurrences) for each renamable local but those
    in `keep`: one scope at a time, its most used local first, each taking the shortest name
    that no code of its scope spells and no enclosing scope gave out; a local keeps its name
    when that is no longer. Scopes that do not nest reuse the same short names."""
    scopes = Scopes(tree)
    printed = _debug_fstring_names(tree)
    uses: dict[tuple[int, str], list[Occurrence]] = {}
    for o in scopes.occurrences:
        target = scopes.renamable(o)
        if target is not None and (target.index, o.name) not in keep and o.name not in printed:
            uses.setdefault((target.index, o.name), []).append(o)
    given: dict[int, set[str]] = {}
    out = {}
    for scope in scopes.scopes:
        names = sorted((n for i, n in uses if i == scope.index), key=lambda n: -len(uses[scope.index, n]))
        if not names:
            continue
        taken = set(scope.spelled)
        p = scope.parent
        while p is not None:
            taken |= given.get(p.index, set())
            p = p.parent
        fresh = short_names(taken)
        candidate = next(fresh)
        given[scope.index] = set()
        for name in names:
            new = name
            if len(candidate) < len(name):
                new, candidate = candidate, next(fresh)
                out[scope.index, name] = new, uses[scope.index, name]
            given[scope.index].add(new)
    return out
