"""wrap: a program as one small self-extracting file (the counted code), and its check."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..display import echo
from ..errors import DataError

# The counted code of a submission is tens of KB; minifying and proving takes ~10 s a MB.
MAX_SOURCE_BYTES = 1_000_000


def _read(path: Path, what: str) -> bytes:
    from ..io import read_input

    return read_input(path, MAX_SOURCE_BYTES, what, DataError)


def _read_source(path: Path) -> str:
    from ..io import python_text

    data = _read(path, "source")
    try:
        return python_text(data)
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        raise DataError(f"{path}: {exc}") from None


@click.command()
@click.argument("src", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="the wrapped file to write")
@click.option(
    "--check",
    "check_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="instead of writing: prove that this wrapped file runs SRC: it is UTF-8 (or latin-1 and SRC never "
    "reads its own file), its stub is exactly wrap's, and its payload is SRC modulo the documented "
    "transformations (compares ASTs; exit 1 when it is not)",
)
@click.option(
    "--loader",
    is_flag=True,
    help="put the standalone loader in the same payload: `import rnpk_load` works with no second file",
)
@click.option(
    "--codec",
    type=click.Choice(["auto", "lzma", "brotli", "cm"]),
    default="auto",
    show_default=True,
    help="auto: lzma, or brotli when SRC imports brotli and it is smaller. cm: context mixing, ~8% smaller than "
    "brotli-11 on the records' programs, its decoder (plain Python, standard library) in the file; but the "
    "wrapped program then spends 10-30 s and ~200 MB decoding itself at start-up (wrap and --check as long)",
)
@click.option(
    "--join-lines",
    is_flag=True,
    help="put each block's statements on one line (`a;b`): smaller, but tracebacks' line numbers are no longer SRC's",
)
@click.option("--remove-asserts", is_flag=True, help="drop assert statements (as `python -O` would)")
@click.option(
    "--rename-locals/--keep-locals",
    default=True,
    show_default=True,
    help="give functions' own local variables short names (never parameters, globals, attributes, or names "
    "read by locals()/eval/f'{x=}'; --check proves the renaming consistent). --keep-locals for a program whose "
    "frames are read by name from outside (sys._getframe(1).f_locals) or whose error messages must name them",
)
@click.option(
    "--encoding",
    type=click.Choice(["utf8", "ascii", "latin1"]),
    default="utf8",
    show_default=True,
    help="how the compressed bytes are written: utf8, 7.1 bits a byte (+12.6%) in a file any tool reads; ascii, "
    "the same in pure ASCII (+15%); latin1, +1.2% but the file is not UTF-8: a program that reads its own "
    "file as UTF-8 crashes (refused when SRC uses __file__, argv[0], __spec__ or __loader__), and linters, "
    "inspect.getsource and UTF-8 diff views fail on it",
)
@click.option("--force", is_flag=True, help="overwrite OUT")
@click.option("--json", "as_json", is_flag=True, help="print what was written (or checked) as JSON")
def wrap(src, out, check_path, loader, codec, join_lines, remove_asserts, rename_locals, encoding, force, as_json):
    """Write SRC as one self-extracting Python file that runs exactly SRC: the counted code
    of a Parameter Golf submission, in as few bytes as the standard library allows.
    SRC and a --check file may hold at most 1,000,000 bytes (a submission's code is ~50 KB).

    \b
    recurnorm wrap train_gpt.py --loader -o submission/train_gpt.py
    recurnorm wrap --check submission/train_gpt.py train_gpt.py
    recurnorm verify final_model.rnpk --code submission/train_gpt.py

    Comments, docstrings and other literal statements and blank space go (and asserts with
    --remove-asserts; functions' local names unless --keep-locals); every line stays where
    it was unless --join-lines. The result is
    compressed (lzma; brotli when SRC imports it) into one UTF-8 string literal and run
    with SRC's `__name__`, sys.argv and `__file__` (the wrapped file's path); tracebacks
    name `<SRC>` and SRC's line numbers. Relative imports are refused. The written file is
    checked against SRC before this command returns; --check repeats that proof later.
    """
    from ..budget.loader import MODULE, minified_loader
    from ..codewrap import check, wrap
    from ..io import atomic_write_bytes, check_writable

    source = _read_source(src)
    if check_path is not None:
        if out is not None:
            raise click.UsageError("--check reads a wrapped file; it writes nothing (drop -o)")
        try:
            result = check(_read(check_path, "--check"), source, src.name, {MODULE: minified_loader()})
        except RecursionError:
            raise DataError(f"{src}: nests too deeply to compare (expressions or blocks thousands deep)") from None
        except DataError as exc:
            if as_json:
                echo(json.dumps({"ok": False, "error": str(exc)}, sort_keys=True))
                click.get_current_context().exit(exc.exit_code)
            raise DataError(f"{check_path}: {exc}") from None
        if as_json:
            echo(json.dumps(result.to_dict(), sort_keys=True))
            return
        echo(
            f"{check_path} runs {src}: the same program modulo {', '.join(result.transformations)}; "
            f"line numbers {'kept' if result.line_numbers_kept else 'not kept'}; {result.codec}, {result.encoding}"
            + (f"; modules {', '.join(result.modules)} (this recurnorm's)" if result.modules else "")
        )
        return
    if out is None:
        raise click.UsageError("give -o OUT (the wrapped file), or --check OUT to check one")
    check_writable(out, force, [src])
    try:
        result = wrap(
            source,
            src.name,
            modules=[(MODULE, minified_loader())] if loader else [],
            codec=codec,
            keep_lines=not join_lines,
            remove_asserts=remove_asserts,
            rename_locals=rename_locals,
            encoding=encoding,
        )
    except RecursionError:  # Python's own parser and compiler recurse on deep nesting too
        raise DataError(f"{src}: nests too deeply to wrap (expressions or blocks thousands deep)") from None
    atomic_write_bytes(out, result.data, exclusive=not force)
    if as_json:
        echo(json.dumps({"path": str(out), **result.to_dict()}, sort_keys=True))
        return
    echo(
        f"wrote {out} ({len(result.data):,} bytes: {src} {result.source_bytes:,} bytes, minified "
        f"{result.minified_bytes:,}{' with ' + ', '.join(result.modules) if result.modules else ''}, {result.codec}"
        f", {encoding}; line numbers {'joined' if join_lines else 'kept'}"
        f"{'; locals renamed' if rename_locals else ''}; "
        f"checked against {src.name}); count it with --code {out} on pack and verify"
    )
