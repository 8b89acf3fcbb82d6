"""wrap and check: a program (and modules it imports) as one self-extracting file, and the
proof that a wrapped file holds a given source modulo the documented transformations."""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass

from ..errors import ConfigError, DataError
from . import selfextract
from .minify import blocks, minify, normalize_newlines, parse, removable
from .scopes import Unsupported, canonical_locals

# Names through which a program may find and read its own file: any use counts (a path kept
# for later, os.path.dirname(__file__) alike), so a latin-1 file is never read as UTF-8.
_SELF = {"__file__", "__loader__", "__spec__", "argv"}


@dataclass
class Wrapped:
    """A wrapped file's bytes and what went into them."""

    data: bytes
    codec: str
    encoding: str
    source_bytes: int  # the program as given (UTF-8)
    minified_bytes: int  # everything in the payload, before compression
    keep_lines: bool
    remove_asserts: bool
    rename_locals: bool
    modules: list[str]
    seconds: float

    def to_dict(self) -> dict:
        return {
            "bytes": len(self.data),
            "codec": self.codec,
            "encoding": self.encoding,
            "source_bytes": self.source_bytes,
            "minified_bytes": self.minified_bytes,
            "keep_lines": self.keep_lines,
            "remove_asserts": self.remove_asserts,
            "rename_locals": self.rename_locals,
            "modules": self.modules,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Checked:
    """What `check` proved: the program equals the source modulo `transformations`."""

    program: str
    codec: str
    encoding: str
    transformations: list[str]
    line_numbers_kept: bool
    modules: list[str]

    def to_dict(self) -> dict:
        return {
            "ok": True,
            "program": self.program,
            "codec": self.codec,
            "encoding": self.encoding,
            "transformations": self.transformations,
            "line_numbers_kept": self.line_numbers_kept,
            "modules": self.modules,
        }


def _normalized(tree: ast.Module, remove_asserts: bool) -> ast.Module:
    """The tree without the statements minify may drop (blocks left empty stay empty)."""
    for block in list(blocks(tree)):
        block[:] = [s for s in block if not removable(s, remove_asserts)]
    return tree


def same_program(
    a: str, b: str, remove_asserts: bool, names: tuple[str, str] = ("a", "b"), rename_locals: bool = False
) -> tuple[bool, bool]:
    """Whether two sources are one program modulo minify's transformations, and whether
    every statement and expression sits on the same line in both. With rename_locals,
    functions' renamable locals (scopes.py) compare by their scope and order of first use,
    so a consistent renaming passes and a capture or a collision does not."""
    ta = _normalized(parse(normalize_newlines(a), names[0]), remove_asserts)
    tb = _normalized(parse(normalize_newlines(b), names[1]), remove_asserts)
    if rename_locals:  # (equal trees have equal canonical forms: one comparison serves)
        try:
            ta, tb = canonical_locals(ta), canonical_locals(tb)  # in place: the line walk below still pairs nodes
        except Unsupported:
            pass
    if ast.dump(ta) != ast.dump(tb):
        return False, False
    pairs = zip(ast.walk(ta), ast.walk(tb), strict=True)  # the same trees: the same walk
    lines = all(getattr(x, "lineno", None) == getattr(y, "lineno", None) for x, y in pairs)
    return True, lines


def _refuse_relative_imports(tree: ast.Module, filename: str) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            what = "." * node.level + (node.module or "")
            raise DataError(
                f"{filename}: line {node.lineno}: relative import from {what!r}: a wrapped file runs on its own, "
                "outside any package; import it absolutely (and ship it), or paste it into the program"
            )


def _past_zero(index: ast.expr) -> bool:
    """`argv[1]`, `argv[2:]`: an index that never reaches argv[0], the program's path."""
    bound = index.lower if isinstance(index, ast.Slice) else index
    return isinstance(bound, ast.Constant) and type(bound.value) is int and bound.value >= 1


def self_reads(tree: ast.Module) -> list[int]:
    """Lines that may read the program's own file: every use of `__file__`, `__loader__`,
    `__spec__`, or `argv` other than `argv[1:]`/`argv[n]` with n >= 1 (conservative: most
    only build a path; a reader is not told apart)."""
    args = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Subscript) and _past_zero(n.slice)}
    lines = {
        n.lineno
        for n in ast.walk(tree)
        if (isinstance(n, ast.Name) and n.id in _SELF or isinstance(n, ast.Attribute) and n.attr in _SELF)
        and id(n) not in args
    }
    return sorted(lines)


def _refuse_latin1(tree: ast.Module, filename: str, error: type[Exception]) -> None:
    lines = self_reads(tree)
    if lines:
        raise error(
            f"{filename}: line{'s' * (len(lines) > 1)} {', '.join(map(str, lines[:5]))}{' ...' * (len(lines) > 5)} "
            "may read the program's own file (__file__, argv[0], __spec__, __loader__): a latin-1 wrapper is not "
            "UTF-8 and would crash it; wrap it as UTF-8 (the default)"
        )


def _imports(tree: ast.Module, module: str) -> bool:
    return any(
        isinstance(n, ast.Import)
        and any(a.name.split(".")[0] == module for a in n.names)
        or isinstance(n, ast.ImportFrom)
        and (n.module or "").split(".")[0] == module
        and not n.level
        for n in ast.walk(tree)
    )


def program_name(filename: str) -> str:
    """The name a wrapped program is compiled under (tracebacks show it): `<filename>`."""
    return f"<{filename}>"


def wrap(
    source: str,
    filename: str = "train_gpt.py",
    *,
    modules: list[tuple[str, str]] = (),
    codec: str = "auto",
    keep_lines: bool = True,
    remove_asserts: bool = False,
    rename_locals: bool = True,
    encoding: str = "utf8",
) -> Wrapped:
    """`source` (a program named `filename`) minified, compressed and written as one Python
    file that runs it. `modules` are (name, source) pairs, already minified, that the file
    puts in sys.modules first. codec "auto" is lzma, or brotli when the program imports
    brotli and it is smaller; "cm" (asked for by name: its decoder is Python, ~20 s at
    start-up on the records' programs) is smaller still. encoding (selfextract.ENCODINGS): utf8, ascii, or latin1, which
    is refused for a program that may read its own file. The result is checked against the
    source (`check`, the same proof) before it returns."""
    t0 = time.perf_counter()
    source = normalize_newlines(source)
    tree = parse(source, filename)
    _refuse_relative_imports(tree, filename)
    if encoding not in selfextract.ENCODINGS:
        raise ConfigError(f"unknown encoding {encoding!r} (one of {', '.join(selfextract.ENCODINGS)})")
    if encoding == "latin1":
        _refuse_latin1(tree, filename, ConfigError)
    program = minify(
        source, keep_lines=keep_lines, remove_asserts=remove_asserts, rename_locals=rename_locals, filename=filename
    )
    allowed = ["lzma", "brotli"] if _imports(tree, "brotli") else ["lzma"]
    if codec == "cm" and encoding != "latin1":  # the standard library alone: any program, on request
        allowed.append("cm")
    if codec not in ("auto", *selfextract.CODECS):
        raise DataError(f"unknown codec {codec!r} (auto, {', '.join(selfextract.CODECS)})")
    if codec not in ("auto", *allowed):
        raise DataError(f"{filename} does not import {codec}: the wrapped file could not count on it (use lzma)")
    choices = allowed if codec == "auto" else [codec]
    # `<name>`: Python before 3.13 prints a traceback's lines from the file of that name when
    # it finds one, ignoring linecache: the wrapper itself, were it named so (its second line
    # is the compressed bytes). A name in angle brackets is never looked up on disk.
    files = (*((n, t) for n, t in modules), (program_name(filename), program))
    data = min(
        (selfextract.make(selfextract.Payload(files, c, encoding)) for c in choices),
        key=len,
    )
    try:  # minify's bug, never the user's: refuse to write it
        proof = check(data, source, filename, dict(modules))
    except DataError as exc:
        raise DataError(f"{filename}: the wrapped file fails its check ({exc}); please report this") from None
    if keep_lines and not proof.line_numbers_kept:
        raise DataError(f"{filename}: the minified program moved lines; please report this")
    return Wrapped(
        data=data,
        codec=proof.codec,
        encoding=encoding,
        source_bytes=len(source.encode("utf-8")),
        minified_bytes=sum(len(t.encode("utf-8")) for _, t in files),
        keep_lines=keep_lines,
        remove_asserts=remove_asserts,
        rename_locals=rename_locals,
        modules=[n for n, _ in modules],
        seconds=time.perf_counter() - t0,
    )


def check(data: bytes, source: str, filename: str = "the source", modules: dict[str, str] | None = None) -> Checked:
    """Prove that the wrapped file `data` runs `source`: its stub is exactly the one wrap
    writes, and its program's AST equals the source's once comments, layout and literal
    statements are set aside (and asserts, when the payload has none left; and functions'
    own local names, compared by scope and order of first use, when they differ). `modules`
    (name -> expected source) are compared the same way. DataError says what differs."""
    payload, _ = selfextract.read(data)  # UTF-8 (or declared latin-1), and exactly wrap's stub
    name, program = payload.program
    transformations = ["comments", "blank space", "docstrings and other literal statements"]
    # the fewest transformations that explain the payload: asserts, then local names
    for asserts, local_names in ((False, False), (True, False), (False, True), (True, True)):
        ok, lines = same_program(source, program, asserts, (filename, "the payload"), local_names)
        if ok:
            transformations += ["asserts"] * asserts + ["local names"] * local_names
            break
    else:
        raise DataError(f"the wrapped program ({name}) is not {filename}: their code differs")
    tree = parse(normalize_newlines(source), filename)
    if payload.encoding == "latin1":  # a file the program reads as UTF-8 would crash it
        _refuse_latin1(tree, filename, DataError)
    if payload.codec == "brotli" and not _imports(tree, payload.codec):  # it would fail where the source runs
        raise DataError(f"the wrapped file needs {payload.codec}, which {filename} does not import")
    for mod, text in payload.files[:-1]:
        want = (modules or {}).get(mod)
        if want is None:
            raise DataError(f"the wrapped file carries a module {mod!r} this check was not given")
        if not same_program(want, text, False, (mod, "the payload"))[0]:
            raise DataError(f"the wrapped module {mod!r} differs from this recurnorm's {mod}")
    return Checked(name, payload.codec, payload.encoding, transformations, lines, [m for m, _ in payload.files[:-1]])
