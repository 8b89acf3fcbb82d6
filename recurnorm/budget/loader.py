"""The standalone loader as shipped code: its readable source and a compact form for the cap.

`rnpk_load.py` (beside this file) reads artifacts with the standard library and numpy
alone, so it can live in the counted code of a submission. Its compact form is the
same program with docstrings and comments dropped, local and private names shortened,
then LZMA-compressed and base85-encoded inside a two-line wrapper that execs it:
the trick Parameter Golf competitors use for their own code, applied to ours.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import itertools
import keyword
import lzma
import string
import tokenize
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("rnpk_load.py")
LOADER_CODECS = ("raw", "deflate", "lzma", "rans")  # what rnpk_load decodes
PUBLIC = {"load", "decode"}  # the names a user calls, kept with their parameters
# .lzma ("alone") keeps the wrapper short: lzma.decompress finds the format and filter itself.
WRAPPER = "import lzma,base64\nexec(lzma.decompress(base64.b85decode('{payload}')))\n"
# pb=0, lc=1: Python source has no 2- or 4-byte structure; the smallest of the settings tried.
COMPACT_FILTERS = [{"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME, "pb": 0, "lc": 1, "lp": 0}]


def _drop_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]


def _short_names(taken: set[str]):
    """a, b, ..., Z, aa, ab, ... skipping every name the program already uses."""
    letters = string.ascii_letters
    for size in itertools.count(1):
        for chars in itertools.product(letters, repeat=size):
            name = "".join(chars)
            if name not in taken and not keyword.iskeyword(name) and not hasattr(builtins, name):
                yield name


def _rename(tree: ast.Module) -> None:
    """Shorten the names a reader never sees: module-level private definitions, the fields
    this program stores on its own objects, then each top-level function's or class's
    parameters and locals (one scope each, so short names are reused). Public functions
    and their parameters, imports, keyword arguments of calls and strings keep their text."""
    imported = {a.asname or a.name for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    public = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in PUBLIC]
    kept = imported | PUBLIC | {"self"} | {a.arg for n in public for a in n.args.args + n.args.kwonlyargs}
    module, fresh = {}, _short_names(kept)
    for node in tree.body:  # module level: functions, classes, constants
        names = (
            [node.name]
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            else [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        )
        module.update((n, next(fresh)) for n in names if n not in kept)
    # Fields this program stores (its own objects') get short names from their own pool,
    # unless a numpy array has that attribute (the same name may then be read off an array).
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    stored = sorted(
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        - set(dir(np.ndarray))
    )
    fields = dict(zip(stored, _short_names(attrs | set(dir(np.ndarray))), strict=False))
    for node in tree.body:
        local, fresh = {}, _short_names(kept | set(module.values()))
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


def minify(source: str) -> str:
    """The same program, smaller: no docstrings or comments, short private names."""
    tree = ast.parse(source)
    _drop_docstrings(tree)
    _rename(tree)
    # One `import a, b, c` for the leading plain imports.
    plain = [n for n in tree.body if isinstance(n, ast.Import) and all(a.asname is None for a in n.names)]
    if len(plain) > 1:
        plain[0].names = [a for n in plain for a in n.names]
        tree.body = [n for n in tree.body if n not in plain[1:]]
    return _tight(ast.unparse(tree))


def _tight(code: str) -> str:
    """The code with one space a block level and no spaces between tokens that do not need
    one (a space stays only between two names or numbers). Lines holding f-strings are kept
    as written: from Python 3.12 their insides are tokens too."""
    out, depth, line = [], 0, []
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            if line:
                out.append(" " * depth + _join(line))
            line = []
        elif tok.type != tokenize.COMMENT:
            line.append(tok)
    return "\n".join(out) + "\n"


def _join(tokens) -> str:
    if any(
        t.type == tokenize.STRING
        and "f" in t.string[: t.string.find(t.string[-1])].lower()
        or t.type == getattr(tokenize, "FSTRING_START", -1)
        for t in tokens
    ):
        return tokens[0].line.strip()
    text = tokens[0].string
    for prev, tok in zip(tokens, tokens[1:], strict=False):
        word = (prev.string[-1:].isalnum() or prev.string[-1:] == "_") and (
            tok.string[:1].isalnum() or tok.string[:1] in "_'\""
        )
        text += (" " if word else "") + tok.string
    return text


def loader_source(compact: bool = False) -> str:
    """The loader's Python source: readable, or compact (minified, LZMA2, base85, exec)."""
    source = SOURCE.read_text(encoding="utf-8")
    if not compact:
        return source
    packed = lzma.compress(minify(source).encode(), format=lzma.FORMAT_ALONE, filters=COMPACT_FILTERS)
    return WRAPPER.format(payload=base64.b85encode(packed).decode("ascii"))


def loader_problem(data: bytes, manifest: dict) -> str | None:
    """Why the standalone loader cannot read a (valid) artifact, or None when it can: it reads
    format 2 with portable compressors everywhere (header, streams, rans side data)."""
    from . import compress, format, rans

    _, version, flags, mlen, _ = format.HEADER.unpack_from(data, 0)
    if version != 2:
        return f"format version {version} (the loader reads 2: repack it)"
    if flags & format.MANIFEST_COMPRESSOR_MASK not in compress.PORTABLE:
        return "the manifest is zstd-compressed"
    payload = memoryview(data)[format.HEADER_SIZE + mlen :]
    for t in manifest["tensors"]:
        for kind, s in t.get("streams", {}).items():
            where = f"tensor {t['name']!r} {kind}"
            if s["codec"] not in LOADER_CODECS:
                return f"{where} uses the {s['codec']} codec"
            body = payload[s["offset"] : s["offset"] + s["length"]]
            if s["codec"] == "rans" and not set(rans.side_compressors(body)) <= set(compress.PORTABLE):
                return f"{where} has zstd-compressed rans side data"
    return None
