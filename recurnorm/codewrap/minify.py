"""Python source made smaller without changing what it does.

`minify` works on the source's tokens, not on an unparsed AST: comments, docstrings and
other literal statements (and asserts, when asked) go, each block is indented one space a
level, and spaces stay only where two tokens would otherwise merge. Every line break stays
by default, so line numbers in tracebacks are the source's own; runs of empty lines cost
almost nothing once compressed. `rename` is the loader's extra step (short private names);
it needs an AST, so its output is unparsed and then minified with lines joined.
"""

from __future__ import annotations

import ast
import bisect
import io
import itertools
import keyword
import re
import tokenize
from collections.abc import Iterable

from ..errors import DataError
from .scopes import Occurrence, Unsupported, local_renames, short_names

_FSTRING_START = getattr(tokenize, "FSTRING_START", None)  # Python >= 3.12 splits f-strings
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def normalize_newlines(source: str) -> str:
    """CRLF and CR as LF: what Python itself does to a source file before tokenizing."""
    return source.replace("\r\n", "\n").replace("\r", "\n")


def parse(source: str, filename: str) -> ast.Module:
    """The source's AST; DataError naming the file and line when it does not parse."""
    try:
        return ast.parse(source, filename)
    except SyntaxError as exc:
        raise DataError(f"{filename}: line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:  # a NUL byte
        raise DataError(f"{filename}: {exc}") from None


def removable(node: ast.stmt, remove_asserts: bool) -> bool:
    """A statement the minifier drops: a literal on its own (docstrings included), or an
    assert when asked. The same rule normalizes both sides of `check`."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True
    return remove_asserts and isinstance(node, ast.Assert)


def blocks(tree: ast.AST) -> Iterable[list[ast.stmt]]:
    """Every statement list of the tree (bodies, else and finally blocks), to edit in place."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _dropped(tree: ast.Module, remove_asserts: bool) -> tuple[list[tuple], set[tuple]]:
    """The spans ((line, col), (end_line, end_col)) of the statements to drop, and the
    starts of those that must leave a placeholder `0` (their block would be empty)."""
    spans, placeholders = [], set()
    for block in blocks(tree):
        gone = [s for s in block if removable(s, remove_asserts)]
        for s in gone:
            spans.append(((s.lineno, s.col_offset), (s.end_lineno, s.end_col_offset)))
        if gone and len(gone) == len(block):
            placeholders.add((gone[0].lineno, gone[0].col_offset))
    return sorted(spans), placeholders


def _units(source: str):
    """(type, text, start, end) per token, an f-string (split into parts from 3.12) as one
    unit whose text is the source's own: its insides are never respaced."""
    lines = source.splitlines(keepends=True)
    offsets = [0, *itertools.accumulate(len(x) for x in lines)]
    depth, start = 0, None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == _FSTRING_START:
            depth += 1
            start = start or tok.start
            continue
        if depth:
            if tok.type == _FSTRING_END:
                depth -= 1
                if not depth:
                    a = offsets[start[0] - 1] + start[1]
                    b = offsets[tok.end[0] - 1] + tok.end[1]
                    yield tokenize.STRING, source[a:b], start, tok.end
                    start = None
            continue
        yield tok.type, tok.string, tok.start, tok.end


def _word(c: str) -> bool:
    return ("_" + c).isidentifier()  # a character that continues a name or a number


def _needs_space(prev: tuple, text: str) -> bool:
    """Whether two tokens written side by side would read as different tokens."""
    ptype, ptext = prev[0], prev[1]
    if _word(ptext[-1]) and (_word(text[0]) or text[0] in "'\""):
        return True  # two names, a keyword and a number, a name and a prefixed string
    return ptype == tokenize.NUMBER and (text[0] == "." or _word(text[0]))  # `1 .real`, `1. if`


def _number(text: str) -> str:
    """The shortest spelling of the same number: `0.0` -> `.0`, `1e-06` -> `1e-6`, no `_`."""
    t = text.replace("_", "")
    if t[-1] in "jJ":
        return t
    value = ast.literal_eval(t)
    spellings = [t, str(value) if isinstance(value, int) else repr(value)]
    if isinstance(value, float):
        for x in list(spellings):
            x = re.sub(r"e([+-]?)0+(?=\d)", r"e\1", x).replace("e+", "e")
            x = x[1:] if x.startswith("0.") else x  # `0.0` -> `.0`, kept: `.` alone is no number
            spellings += [x, x[:-1] if x.endswith(".0") else x]
    return min((x for x in spellings if _reads_as(x, value)), key=len)


def _reads_as(text: str, value: object) -> bool:
    try:
        got = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        return False
    return type(got) is type(value) and got == value


def _string(text: str, quote: str) -> str:
    """The string with `quote` as its delimiter where only the delimiter changes (no quote
    inside, not triple-quoted, not an f-string, whose insides are code)."""
    head = len(text) - len(text.lstrip("bBrRuUfF"))
    body, q = text[head + 1 : -1], text[head]
    if q == quote or "f" in text[:head].lower() or text[head : head + 3] == q * 3 or quote in body:
        return text
    return text[:head] + quote + body + quote


# The first tokens of compound statements (`match` and `case` also start simple ones, e.g.
# `match = ...`: those lines are only left unjoined).
_COMPOUND = {"if", "elif", "else", "for", "while", "try", "except", "finally", "with", "def", "class", "async", "@"}
_COMPOUND |= {"match", "case"}
_NOT_CALLS = set(keyword.kwlist) | {"match", "case", "_", "type"}  # a name whose `(` may open a tuple


def _lines(source: str, remove_asserts: bool, keep_lines: bool, quote: str, filename: str, rename_locals: bool):
    """The program's logical lines as (first row, block depth, text, kind), comments and
    dropped statements gone, tokens respaced. A line's text keeps its own line breaks
    (inside brackets, after a backslash, inside strings) at the source's rows, or only
    those inside strings without keep_lines; kind is
    "simple", "header" (ends with its block's colon) or "compound" (anything else that
    cannot take a `;` after it: a one-line block, a decorator)."""
    tree = parse(source, filename)
    spans, placeholders = _dropped(tree, remove_asserts)
    renames = _renames(source, tree) if rename_locals else {}
    indent, span_i = 0, 0
    out: list[str] = []  # the current line's pieces
    units: list[tuple] = []  # its (type, text, index in out)
    brackets: list[list] = []  # per open bracket: [commas at its level, is a call's]
    row = first = 0
    for ttype, text, start, end in _units(source):
        if ttype == tokenize.INDENT:
            indent += 1
        elif ttype == tokenize.DEDENT:
            indent -= 1
        elif ttype == tokenize.NEWLINE and units:
            if units[-1][1] == ";":
                out[units[-1][2]] = ""  # a dropped statement after the last kept one left it
            head = units[0][1]
            kind = "header" if units[-1][1] == ":" else "compound" if head in _COMPOUND else "simple"
            yield first, indent, "".join(out), kind
            out, units = [], []
        if ttype in _SKIP:
            continue
        while span_i < len(spans) and spans[span_i][1] <= start:
            span_i += 1
        if span_i < len(spans) and spans[span_i][0] <= start:  # inside a dropped statement
            if start == spans[span_i][0] and start in placeholders:
                ttype, text = tokenize.NUMBER, "0"
            else:
                continue
        if text == ";" and (not units or units[-1][1] in (";", ":")):
            continue  # the statement before or after it was dropped
        if not units:
            row = first = start[0]
        elif start[0] > row and keep_lines:  # a statement's own line breaks: in brackets, or a backslash's
            out.append(("\n" if brackets else "\\\n") * (start[0] - row))
            row = start[0]
        elif _needs_space(units[-1], text):
            out.append(" ")
        if ttype == tokenize.OP and text in ")]}" and units[-1][1] == "," and (brackets[-1][0] > 1 or brackets[-1][1]):
            out[units[-1][2]] = ""  # a trailing comma that makes no tuple
        if ttype == tokenize.NAME:
            text = renames.get(start, (text, text))[1]
        elif ttype == tokenize.NUMBER:
            text = _number(text)
        elif ttype == tokenize.STRING:
            text = _string(_renamed_inside(text, start, end, renames), quote)
        units.append((ttype, text, len(out)))
        out.append(text)
        row = max(row, end[0])  # a string over several lines
        if ttype == tokenize.OP:
            if text in "([{":
                prev = units[-2] if len(units) > 1 else (None, "")
                call = text == "(" and (prev[0] == tokenize.NAME and prev[1] not in _NOT_CALLS or prev[1] in (")", "]"))
                brackets.append([0, call])
            elif text in ")]}":
                brackets.pop()
            elif text == "," and brackets:
                brackets[-1][0] += 1


def minify(
    source: str,
    *,
    keep_lines: bool = True,
    remove_asserts: bool = False,
    rename_locals: bool = False,
    quote: str | None = None,
    filename: str = "<source>",
) -> str:
    """The same program, smaller: no comments, docstrings or literal statements (nor asserts
    with remove_asserts), one space a block level, spaces only where needed, numbers in
    their shortest spelling and strings between one kind of quote (`quote`, by default the
    source's more common one; the same AST). keep_lines keeps every line where it was
    (tracebacks name the source's line numbers); without it the statements of a block
    share lines (`a;b`, `if x:a;b`), pyminify's single-line form. rename_locals gives
    functions' and comprehensions' own locals short names (scopes.py says which are safe;
    parameters, globals, attributes and anything read by name keep theirs)."""
    source = normalize_newlines(source)
    quote = quote or ('"' if source.count('"') >= source.count("'") else "'")
    lines = list(_lines(source, remove_asserts, keep_lines, quote, filename, rename_locals))
    if keep_lines:
        out, row = [], 1
        for first, indent, text, _ in lines:
            out.append("\n" * (first - row) + " " * indent + text)
            row = first + text.count("\n")
        return "".join(out) + "\n" if out else ""
    return "".join(_joined(lines))


def _renames(source: str, tree: ast.Module) -> dict[tuple[int, int], tuple[str, str]]:
    """Token start (row, column) -> (name, new name) for every occurrence of a renamed
    local. Each occurrence is found among the tokens (or inside an f-string, whose code
    stays text); a local with an occurrence that is not where its node says keeps its name."""
    lines = source.splitlines(keepends=True)
    units = [(start, ttype, text) for ttype, text, start, _ in _units(source)]
    starts = [u[0] for u in units]
    keep: set[tuple[int, str]] = set()
    while True:
        kept = len(keep)
        try:
            plan = local_renames(tree, keep)
        except Unsupported:
            return {}
        out = {}
        for key, (new, occurrences) in plan.items():
            where = [_position(o, lines, units, starts) for o in occurrences]
            if None in where:
                keep.add(key)
            out.update((pos, (key[1], new)) for pos in where)
        if len(keep) == kept:
            return out


def _position(o: Occurrence, lines: list[str], units: list[tuple], starts: list[tuple]) -> tuple[int, int] | None:
    """Where the occurrence's name starts, as (row, column in characters); None when the
    tokens there are not that name."""
    node, name = o.node, o.name
    if isinstance(node, ast.ExceptHandler):  # `except E as name`: the name after `as`
        i = bisect.bisect_left(starts, (node.lineno, 0))
        while i < len(units) and not (units[i][1] == tokenize.NAME and units[i][2] == "as"):
            i += 1
        ok = i + 1 < len(units) and units[i + 1][1] == tokenize.NAME and units[i + 1][2] == name
        return units[i + 1][0] if ok else None
    line = lines[node.lineno - 1]
    pos = (node.lineno, len(line.encode("utf-8")[: node.col_offset].decode("utf-8", "replace")))
    i = bisect.bisect_right(starts, pos) - 1
    if i < 0:
        return None
    start, ttype, text = units[i]
    if start == pos:
        return pos if ttype == tokenize.NAME and text == name else None
    if ttype != tokenize.STRING or not _fstring(text):
        return None
    at = _offset_in(text, start, pos)
    ok = (
        text[at : at + len(name)] == name
        and not _word(text[at - 1])
        and not _word(text[at + len(name) : at + len(name) + 1] or " ")
    )
    return pos if ok else None


def _fstring(text: str) -> bool:
    return "f" in text[: len(text) - len(text.lstrip("bBrRuUfF"))].lower()


def _offset_in(text: str, start: tuple[int, int], pos: tuple[int, int]) -> int:
    """The index in a token's text of source position `pos` (the token starts at `start`)."""
    rows = text.split("\n")
    if pos[0] == start[0]:
        return pos[1] - start[1]
    if pos[0] - start[0] >= len(rows):
        return len(text)
    return sum(len(r) + 1 for r in rows[: pos[0] - start[0]]) + pos[1]


def _renamed_inside(text: str, start: tuple[int, int], end: tuple[int, int], renames: dict) -> str:
    """An f-string's text with the renamed names inside its expressions replaced."""
    if not renames or not _fstring(text):
        return text
    inside = [(_offset_in(text, start, p), old, new) for p, (old, new) in renames.items() if start < p < end]
    for at, old, new in sorted(inside, reverse=True):
        text = text[:at] + new + text[at + len(old) :]
    return text


def _joined(lines: list[tuple]):
    """Logical lines with the statements of each block on one line where Python allows it:
    simple statements side by side, and a block of only simple statements after its header."""
    i = 0
    while i < len(lines):
        _, indent, text, kind = lines[i]
        j = i + 1
        if kind == "header":  # its block, when it is simple statements only
            while j < len(lines) and lines[j][1] > indent and lines[j][3] == "simple" and lines[j][1] == indent + 1:
                j += 1
            if j == i + 1 or (j < len(lines) and lines[j][1] > indent):
                j = i + 1
            else:
                text += ";".join(x[2] for x in lines[i + 1 : j])
                kind = "compound"
        if kind == "simple":
            while j < len(lines) and lines[j][1] == indent and lines[j][3] == "simple":
                text += ";" + lines[j][2]
                j += 1
        yield " " * indent + text + "\n"
        i = j


# --- renaming: the loader's last bytes --------------------------------------------------


def rename(tree: ast.Module, public: set[str], foreign_attrs: set[str]) -> None:
    """Shorten the names a reader never sees: module-level private definitions, the fields
    this program stores on its own objects (unless a foreign object, e.g. a numpy array, has
    an attribute of that name), then each top-level function's or class's parameters and
    locals (one scope each, so short names are reused). `public` functions and their
    parameters, imports, keyword arguments of calls and strings keep their text."""
    imported = {a.asname or a.name for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    exposed = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in public]
    kept = imported | public | {"self"} | {a.arg for n in exposed for a in n.args.args + n.args.kwonlyargs}
    module, fresh = {}, short_names(kept)
    for node in tree.body:  # module level: functions, classes, constants
        names = (
            [node.name]
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            else [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        )
        module.update((n, next(fresh)) for n in names if n not in kept)
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    stored = sorted(
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        - foreign_attrs
    )
    fields = dict(zip(stored, short_names(attrs | foreign_attrs), strict=False))
    for node in tree.body:
        local, fresh = {}, short_names(kept | set(module.values()))
        for n in ast.walk(node):
            name = (
                n.id
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                else (n.arg if isinstance(n, ast.arg) else n.name if isinstance(n, ast.ExceptHandler) else None)
            )
            if name and name not in kept and name not in module and name not in local:
                local[name] = next(fresh)
        mapping = {**module, **local}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in mapping:
                n.id = mapping[n.id]
            elif isinstance(n, ast.arg) and n.arg in mapping:
                n.arg = mapping[n.arg]
            elif isinstance(n, ast.ExceptHandler) and n.name in mapping:
                n.name = mapping[n.name]
            elif isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in mapping:
                n.name = mapping[n.name]
            elif isinstance(n, ast.Attribute) and n.attr in fields:
                n.attr = fields[n.attr]


def minify_renamed(source: str, public: set[str], foreign_attrs: set[str] = frozenset()) -> str:
    """`minify` plus `rename`, and the leading plain imports as one `import a, b, c`: the
    smallest form, for code whose tracebacks nobody reads by line (the loader)."""
    tree = parse(normalize_newlines(source), "<source>")
    rename(tree, public, set(foreign_attrs))
    plain = [n for n in tree.body if isinstance(n, ast.Import) and all(a.asname is None for a in n.names)]
    if len(plain) > 1:
        plain[0].names = [a for n in plain for a in n.names]
        tree.body = [n for n in tree.body if n not in plain[1:]]
    return minify(ast.unparse(tree), keep_lines=False, quote='"')  # most programs' quote, in a shared payload
