"""recurnorm wrap: a wrapped program prints, returns and fails as its source does; the
wrapped file is UTF-8 and its literal survives every byte value (as does the opt-in latin-1
one); --check proves the payload and catches damage, edits and a latin-1 file the program
would read."""

from __future__ import annotations

import ast
import json
import os
import random
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import IMPORT_BLOCKER

from recurnorm.cli.main import main
from recurnorm.codewrap import check, cm, minify, same_program, wrap
from recurnorm.codewrap.selfextract import (
    Payload,
    latin1_literal,
    make,
    pack_text,
    read,
    unpack_text,
    words_in,
    words_out,
)
from recurnorm.errors import ConfigError, DataError

SCRIPTS = {
    "main_guard": '''
        """Module docstring."""
        import sys

        print("name", __name__)  # a comment
        print("argv", sys.argv[1:])
        if __name__ == "__main__":
            print("main")
    ''',
    "classes": '''
        import functools
        import pickle
        from dataclasses import dataclass, field


        def deco(f):
            @functools.wraps(f)
            def inner(*a, **k):
                "inner doc"
                return ("deco", f(*a, **k))

            return inner


        @dataclass
        class P:
            x: int
            y: float = 2.5
            tags: list = field(default_factory=list)


        class Base:
            """doc"""

            def who(self):
                return type(self).__name__


        class Child(Base, ):
            def who(self, ):
                return "child of " + super().who()


        @deco
        def add(a, b=1, *args, c, **kw,):
            return a + b + c + sum(args) + len(kw)


        print(P(1), P(2, 3.0, ["a"]), Child().who(), add(1, 2, 3, c=4, z=5))
        print(pickle.loads(pickle.dumps(P(7))), P.__module__)
    ''',
    "strings": r'''
        x, w = 3.14159, 10
        name = "world"
        print(f"{x:.2f} {x!r:>{w}} {{braces}} {name=}", f'{"nested " + f"{name}"}', rf"\d{x}")
        print(b"bytes\x00", "tab\tsep", 'it''s', "a" "b", '\\', "\N{BULLET}", r'\n', u"u")
        print(f"""multi
        line {name}   # not a comment
        """)
        s = """keep
           this    spacing  # not a comment
        """
        print(s, "# not a comment either")
        print(1 if x else 2, 0x1F, 1_000_000, 1e-3, 1.0.real, 1 .real, 1j, .5, 5., 0o17, 0b101)
    ''',
    "file": """
        import os
        import sys

        print(os.path.basename(__file__), os.path.isfile(__file__), os.path.basename(sys.argv[0]))
        print(sorted(k for k in globals() if not k.startswith("__")))
    """,
    "control": '''
        import asyncio


        def gen():
            yield from range(3)


        total = 0
        for i in gen():
            if i % 2: continue
            total += i
        else:
            total += 100
        while total > 0:
            total -= 7
            if total < 50:
                break
        try:
            1 / 0
        except ZeroDivisionError as e:
            print("caught", type(e).__name__)
        finally:
            print("finally")


        def outer():
            n = 0

            def inner():
                nonlocal n
                n += 1; "a literal statement"; return n

            return inner() + inner()


        G = 1


        def setg():
            global G
            G = 2


        setg()


        async def agen():
            for i in range(2):
                yield i


        async def co():
            await asyncio.sleep(0)
            return [x async for x in agen()]


        print(total, outer(), G, asyncio.run(co()), (y := 5), [z for z in range(3) if z])
        print({k: v for k, v in zip("ab", (1, 2),)}, (1,), [1,], {1,}, (), x[0,] if (x := {(0,): 9}) else 0)
        value = 1 + \\
            2
        match value:
            case 3:
                print("three")
            case _:
                print("other")
        if True: "docstring-ish"
        if value:
            """only a literal"""


        class Empty:
            "only a doc"


        def f():
            ...


        print(Empty.__name__, f(), Empty.__doc__)
        try:
            assert value == 4, "asserted"
        except AssertionError as e:
            print("assert", e)
    ''',
    "getsource": """
        import inspect


        def target(a):
            return a + 1  # a comment


        src = inspect.getsource(target)
        print(src.startswith("def target"), "return" in src, "comment" in src)
    """,
    "fails": """
        def helper(x):
            # a comment on its own line


            return 1 / x


        print("before")
        helper(0)
    """,
    "exit_code": """
        import sys

        print("exiting")
        sys.exit(3)
    """,
    # Python's scope rules, where renaming locals could go wrong (test_scopes.py: which names).
    "scopes": """
        counter_total = 100


        def closures(values, scale=2):
            running_total = 0
            squares = [each_value * each_value for each_value in values if (last_seen := each_value)]

            def add(amount):
                nonlocal running_total
                running_total += amount * scale
                return running_total

            def peek():
                return running_total + counter_total + last_seen

            class Holder:
                held_value = len(squares)  # a class attribute keeps its name; `squares` is closures'
                doubled = [len(squares) * 2 for _ in range(1)]  # the class's names are not the comprehension's

            for item_value in values:
                add(item_value)
            try:
                1 / 0
            except ZeroDivisionError as problem:
                kind_of_problem = type(problem).__name__
            return squares, peek(), Holder.held_value, kind_of_problem, f"{scale=} {running_total=}"


        def global_writer():
            global counter_total
            local_only = 5
            counter_total += local_only
            return counter_total


        def dynamic():
            hidden_value = 42
            return sorted(k for k in locals()), eval("hidden_value")


        def shadows(print_width=3):
            len_of_list = len([1, 2, 3])  # the builtin `len` stays reachable
            text_value = "x" * len_of_list * print_width
            del len_of_list
            return text_value


        def generator_locals(limit):
            current_index = 0
            while current_index < limit:
                yield current_index
                current_index += 1


        match_value = None
        print(closures([1, 2, 3]))
        print(global_writer(), dynamic(), shadows(), list(generator_locals(3)))
    """,
}
# What a wrapped program cannot keep: docstrings (Empty.__doc__) and comments (getsource).
DOCUMENTED = {
    "control": ("Empty None only a doc", "Empty None None"),
    "getsource": ("True True True", "True True False"),
}
MODES = {
    "default": {},
    "joined": {"keep_lines": False, "remove_asserts": True},
    "ascii": {"encoding": "ascii"},
    "locals kept": {"rename_locals": False},
}


def _run(args, cwd, **kw):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env, **kw)


def _wrap_to(tmp_path, name, source, **opts) -> tuple[Path, Path]:
    """SRC at src/prog.py and the wrapped file at out/prog.py: the same base name."""
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    src, out = tmp_path / "src" / "prog.py", tmp_path / "out" / "prog.py"
    src.write_text(source, encoding="utf-8")
    out.write_bytes(wrap(source, "prog.py", **opts).data)
    return src, out


def _lines(text: str) -> list[int]:
    return [int(n) for n in re.findall(r'File "[^"]*prog\.py>?", line (\d+)', text)]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_wrapped_program_behaves_as_its_source(tmp_path, name, mode):
    source = textwrap.dedent(SCRIPTS[name]).lstrip()
    opts = MODES[mode]
    src, out = _wrap_to(tmp_path, name, source, **opts)
    out.read_bytes().decode("ascii" if opts.get("encoding") == "ascii" else "utf-8")  # any tool reads it
    # Without asserts the source's twin is `python -O`.
    want = _run([*(["-O"] if opts.get("remove_asserts") else []), str(src), "a", "b"], tmp_path)
    got = _run([str(out), "a", "b"], tmp_path)
    assert got.returncode == want.returncode, got.stderr
    for w, g in zip(want.stdout.splitlines(), got.stdout.splitlines(), strict=True):
        assert w.replace(*DOCUMENTED.get(name, ("", ""))) == g  # only what the documented transformations change
    if want.returncode == 1:  # a traceback: the same exception, and SRC's line numbers
        assert want.stderr.splitlines()[-1] == got.stderr.splitlines()[-1]
        assert 'File "<prog.py>"' in got.stderr and "'''" not in got.stderr  # never the compressed bytes
        if opts.get("keep_lines", True):
            assert _lines(got.stderr)[-2:] == _lines(want.stderr)[-2:] == [9, 5]


def test_python_m_runpy_and_import_run_the_wrapped_file(tmp_path):
    source = "import sys\nprint(__name__, sys.argv[1:])\n"
    (tmp_path / "wrapped_mod.py").write_bytes(wrap(source, "wrapped_mod.py").data)
    assert _run(["-m", "wrapped_mod", "x"], tmp_path).stdout == "__main__ ['x']\n"
    run = _run(["-c", "import runpy; runpy.run_path('wrapped_mod.py', run_name='__main__')"], tmp_path)
    assert run.stdout == "__main__ []\n"
    assert _run(["-c", "import wrapped_mod"], tmp_path).stdout == "wrapped_mod []\n"


@pytest.mark.slow  # torchrun starts two ranks
def test_torchrun_launches_the_wrapped_file(tmp_path):
    # Each rank writes a file of its own: the ranks' prints share one pipe and may interleave.
    source = (
        "import os, sys\nif __name__ == '__main__':\n"
        "    open(f\"rank{os.environ['RANK']}.txt\", 'w').write(repr(sys.argv[1:]))\n"
    )
    (tmp_path / "prog.py").write_bytes(wrap(source, "prog.py").data)
    run = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "prog.py", "x"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["['x']", "['x']"]


def test_relative_imports_are_refused_with_the_line():
    with pytest.raises(DataError, match=r"prog\.py: line 2: relative import from '\.util'.*runs on its own"):
        wrap("import os\nfrom .util import helper\n", "prog.py")
    with pytest.raises(DataError, match=r"line 3: relative import from '\.\.'"):
        wrap("def f():\n    pass\n    from .. import x\n", "prog.py")


def test_a_source_that_does_not_parse_names_its_line():
    with pytest.raises(DataError, match=r"prog\.py: line 2"):
        wrap("x = 1\ndef (:\n", "prog.py")


# --- the literal: UTF-8 by default, ASCII, or latin-1 ----------------------------------


def _hostile(seed: int) -> str:
    """A program whose compressed form is close to random bytes: every value appears."""
    data = random.Random(seed).randbytes(6000)
    return f"import hashlib\nDATA = {data!r}\nprint(hashlib.sha256(DATA).hexdigest())\n"


@pytest.mark.parametrize(
    "codec,encoding", [("lzma", "utf8"), ("brotli", "utf8"), ("lzma", "ascii"), ("lzma", "latin1"), ("cm", "utf8")]
)
def test_every_byte_value_survives_in_the_literal(tmp_path, codec, encoding):
    source = _hostile(1) + ("import brotli\n" if codec == "brotli" else "")
    wrapped = wrap(source, "prog.py", codec=codec, encoding=encoding)
    payload, blob = read(wrapped.data)
    assert set(blob) == set(range(256))  # CR, LF, NUL, both quotes and the backslash among them
    assert payload.program == ("<prog.py>", minify(source, rename_locals=True)) and (
        payload.codec,
        payload.encoding,
    ) == (codec, encoding)
    assert b"\r" not in wrapped.data and b"\0" not in wrapped.data  # escaped: CR would read as LF, NUL is refused
    if encoding != "latin1":
        wrapped.data.decode(encoding)
        value = ast.parse(wrapped.data.decode("utf-8")).body[0].value.value
        assert unpack_text(value, len(blob), encoding) == blob
        wide = {c for c in value if ord(c) >= 128}  # 2-byte characters: U+0080-U+07FF, none in ascii
        assert (len(wide) > 100 and max(map(ord, wide)) < 0x800) if encoding == "utf8" else not wide
    (tmp_path / "hostile.py").write_bytes(wrapped.data)
    (tmp_path / "src.py").write_text(source)
    want = _run(["src.py"], tmp_path).stdout
    assert len(want) == 65
    assert _run(["-W", "error", "hostile.py"], tmp_path).stdout == want  # no warning about escapes either
    assert _run(["-c", "import hostile"], tmp_path).stdout == want
    assert _run(["-m", "hostile"], tmp_path).stdout == want


@pytest.mark.parametrize(
    "blob",
    [
        bytes(range(256)),
        bytes(range(255, -1, -1)),
        b"'''",
        b"'",
        b"''",
        b"x''",
        b"'" * 7,
        b'"""' + b"'''",
        b'"' * 5 + b"'" * 5,
        b"\\'\"",
        b"\0" + b"01234567",
        b"\0\0" + b"8",
        b"\r\n\r",
        b"\r\r\n\n",
        b"\\",
        b"",
    ],
)
def test_latin1_literal_reads_back_as_its_bytes(tmp_path, blob):
    literal = latin1_literal(blob)
    source = b"#coding:latin1\nx=" + literal + b"\nprint(x.encode('l1').hex())\n"
    (tmp_path / "lit.py").write_bytes(source)
    assert _run(["-W", "error", "lit.py"], tmp_path).stdout.strip() == blob.hex()
    assert b"\r" not in literal and b"\0" not in literal
    assert len(literal) <= len(blob) * 2 + 6


@pytest.mark.parametrize("encoding", ["utf8", "ascii"])
@pytest.mark.parametrize(
    "blob",
    [
        bytes(range(256)),
        bytes(range(255, -1, -1)),
        b"\0" * 9,
        b"\xff" * 9,
        b"\0" * 1024 + b"\xff" * 1024 + b"\0",  # a block's leading zero bytes; a last block of one byte
        b"'''\\\r\n\0",
        b"\\",
        b"\xff" * 1023 + b"\x00",
        random.Random(3).randbytes(3000),
    ],
)
def test_utf8_literal_reads_back_as_its_bytes(tmp_path, blob, encoding):
    text = "_='''" + pack_text(blob, encoding) + f"'''\nprint({len(blob)}, _.encode('utf-8').hex())\n"
    (tmp_path / "lit.py").write_text(text, encoding="utf-8")
    n, value = _run(["-W", "error", "lit.py"], tmp_path).stdout.split()
    assert unpack_text(bytes.fromhex(value).decode("utf-8"), int(n), encoding) == blob
    assert "\r" not in text and "\0" not in text and (encoding == "utf8" or text.isascii())
    assert all(0 < ord(c) < 0x800 for c in text)  # 1 byte, or 2


def test_every_character_of_the_alphabet_reads_back_as_itself(tmp_path):
    """The 124 ASCII and 1,920 2-byte characters pack_text writes: Python's reader keeps each
    (no escape, no line-break translation, no warning)."""
    alphabet = sorted(set(pack_text(random.Random(5).randbytes(200_000))))
    assert len(alphabet) == 124 + 1920 and ord(alphabet[0]) == 1 and ord(alphabet[-1]) == 0x7FF
    assert not {"\r", "'", "\\"} & set(alphabet)
    value = "".join(alphabet)
    (tmp_path / "abc.py").write_text(f"_='''{value}'''\nprint(ascii(_))\n", encoding="utf-8")
    assert _run(["-W", "error", "abc.py"], tmp_path).stdout.strip() == ascii(value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "self.weight self.weight self.weight\0prog\0print(self.weight)",
        "s = '\u2581\u2014\x01\x80' + name_of_it + name_of_it + name_of_it + name_of_it\n",
        "".join(map(chr, range(1, 0x800))) + " alpha_beta" * 50,
    ],
)
def test_frequent_words_become_single_bytes_and_come_back(text):
    data = text.encode("utf-8")
    out = words_out(data)
    assert words_in(out) == data
    held, words, coded = out.split(b"\1", 2)
    assert set(held) == {b for b in data if b >= 128}  # a source's own bytes are never codes
    if b"alpha_beta" in data or b"name_of_it" in data:
        assert len(coded) < len(data) and (b"alpha_beta" in words.split() or b"name_of_it" in words.split())


def test_a_program_with_other_characters_and_control_bytes_runs_wrapped(tmp_path):
    source = "mark = '\u2581\u2014\x01\x7f\x80'\nfor weight_name in [mark] * 3:\n    print(weight_name == mark, ascii(mark))\n"
    src, out = _wrap_to(tmp_path, "other", source)
    assert (
        _run([str(out)], tmp_path).stdout
        == _run([str(src)], tmp_path).stdout
        == "True '\\u2581\\u2014\\x01\\x7f\\x80'\n" * 3
    )


def test_what_each_literal_costs():
    blob = random.Random(2).randbytes(100_000)
    assert len(latin1_literal(blob)) < 1.015 * len(blob)  # 3/256 escaped: 1.2%
    assert len(pack_text(blob).encode("utf-8")) < 1.127 * len(blob)  # 7.105 bits a byte (7 bits: 1.143)
    assert len(pack_text(blob, "ascii")) < 1.151 * len(blob)  # log2(124) bits a byte


def test_escapes_land_on_whichever_quote_is_rarer():
    assert latin1_literal(b"'''a")[:3] == b'"""'
    assert latin1_literal(b'"""a')[:3] == b"'''"


# --- check ------------------------------------------------------------------------------


def _source() -> str:
    return textwrap.dedent(SCRIPTS["control"]).lstrip()


def test_check_proves_the_program_and_reports_the_transformations():
    source = _source()
    proof = check(wrap(source, "prog.py").data, source, "prog.py")
    assert proof.line_numbers_kept and "asserts" not in proof.transformations and proof.codec == "lzma"
    proof = check(wrap(source, "prog.py", keep_lines=False, remove_asserts=True).data, source, "prog.py")
    assert not proof.line_numbers_kept and "asserts" in proof.transformations


def test_check_fails_on_an_altered_payload():
    source = _source()
    for encoding in ("utf8", "ascii", "latin1"):
        data = wrap(source, "prog.py", encoding=encoding).data
        start, end = data.index(b"_=") + 5, data.index(b"'''\n", 10)
        header = 16  # .lzma's header: properties, dictionary size, length (not the program); 7/8 a byte in utf8
        for at in range(start + header, end, max(1, (end - start) // 60)):
            damaged = bytearray(data)
            damaged[at] ^= 0x20 if data[at] not in b"'\\" else 0x01  # one byte: a 2-byte character's, too
            with pytest.raises(DataError):
                check(bytes(damaged), source, "prog.py")


def test_check_fails_on_another_program_or_an_edited_stub():
    source = _source()
    data = wrap(source, "prog.py").data
    with pytest.raises(DataError, match="their code differs"):
        check(data, source.replace("total -= 7", "total -= 6"), "prog.py")
    with pytest.raises(DataError, match="stub"):
        check(data + b"print('extra')\n", source, "prog.py")
    with pytest.raises(DataError, match="stub"):
        check(data.replace(b"exec(", b"print(", 1), source, "prog.py")
    with pytest.raises(DataError, match="stub"):  # code added before the exec
        check(data.replace(b"\nexec(", b"\nimport os;os.system('true')\nexec(", 1), source, "prog.py")
    with pytest.raises(DataError, match="stub"):
        check(data.replace(b"\nexec(", b"\n__builtins__.print=id;exec(", 1), source, "prog.py")
    with pytest.raises(DataError, match="needs brotli, which prog.py does not import"):
        check(make(Payload((("<prog.py>", minify(source)),), "brotli")), source, "prog.py")
    with pytest.raises(DataError, match="not a file written by recurnorm wrap"):
        check(b"print('hello')\n", source, "prog.py")
    # A module it carries must be the one the check expects.
    with_module = make(Payload((("helper", "X=1\n"), ("<prog.py>", minify(source))), "lzma"))
    assert check(with_module, source, "prog.py", {"helper": "X = 1"}).modules == ["helper"]
    with pytest.raises(DataError, match="module 'helper' differs"):
        check(with_module, source, "prog.py", {"helper": "X = 2"})


def test_a_program_that_reads_its_own_file_runs_and_latin1_is_refused_for_it(tmp_path):
    source = (
        "from pathlib import Path\nimport sys\ntext = Path(__file__).read_text(encoding='utf-8')\n"
        "print(text == open(sys.argv[0], encoding='utf-8').read(), len(text.encode()))\n"
    )
    data = wrap(source, "prog.py").data
    (tmp_path / "a.py").write_bytes(data)
    assert _run(["a.py"], tmp_path).stdout == f"True {len(data)}\n"  # the wrapped file's text
    with pytest.raises(ConfigError, match=r"prog\.py: lines 3, 4 may read the program's own file"):
        wrap(source, "prog.py", encoding="latin1")
    latin1 = make(Payload((("<prog.py>", minify(source)),), "lzma", "latin1"))  # as another tool might
    (tmp_path / "b.py").write_bytes(latin1)
    assert "UnicodeDecodeError" in _run(["b.py"], tmp_path).stderr  # what the check refuses
    with pytest.raises(DataError, match="may read the program's own file"):
        check(latin1, source, "prog.py")
    for conservative in ("import os\nprint(os.path.dirname(__file__))\n", "import sys\nprint(sys.argv[0])\n"):
        with pytest.raises(ConfigError):
            wrap(conservative, "prog.py", encoding="latin1")
    for plain in ("print(1)\n", "import sys\nprint(sys.argv[1:], sys.argv[2])\n"):
        assert check(wrap(plain, "prog.py", encoding="latin1").data, plain, "prog.py").encoding == "latin1"


def test_a_file_that_is_not_utf8_fails_the_check():
    source = "print(1)\n"
    data = wrap(source, "prog.py").data
    with pytest.raises(DataError, match="not UTF-8"):
        check(data.replace(b"_=", b"_=\xff", 1), source, "prog.py")


# --- minify -----------------------------------------------------------------------------


def test_minify_keeps_every_line_and_joins_when_asked():
    source = _source()
    small = minify(source)
    assert same_program(source, small, False) == (True, True)
    assert small.count("\n") == source.count("\n") and "only a" not in small and "a literal statement" not in small
    joined = minify(source, keep_lines=False)
    assert same_program(source, joined, False)[0] and joined.count("\n") < small.count("\n") / 2
    assert "1,2)" in minify("f(1, 2, )\n") and "(1,)" in minify("x = (1, )\n") and "[0,]" in minify("x[0, ]\n")
    assert minify("(a,) = f()\n") == "(a,)=f()\n"  # a statement's first bracket is no call's


def test_numbers_take_their_shortest_spelling():
    source = "x = (0.0, 1.0, 0.50, 1e-06, 100.0, 1_000.0, 0.0001, 2.5e-05, 1e+20, 3.14, 0x10, 1e999, 2j)\n"
    assert minify(source) == "x=(.0,1.,.5,1e-6,100.,1000.,.0001,2.5e-5,1e20,3.14,16,1e999,2j)\n"
    assert same_program(source, minify(source), False) == (True, True)


STDLIB = [
    "argparse.py",
    "ast.py",
    "dataclasses.py",
    "enum.py",
    "functools.py",
    "inspect.py",
    "pathlib.py",
    "subprocess.py",
    "tokenize.py",
    "typing.py",
    "email/_header_value_parser.py",
    "asyncio/base_events.py",
    "json/decoder.py",
    "unittest/mock.py",
]


@pytest.mark.slow  # 14 stdlib modules, three forms each
@pytest.mark.parametrize("name", STDLIB)
def test_minify_on_code_we_did_not_write(name):
    """CPython's own modules: the same program, line for line, joined, and with its
    functions' locals renamed."""
    path = Path(sysconfig.get_paths()["stdlib"]) / name
    source = path.read_text(encoding="utf-8")
    assert same_program(source, minify(source), False) == (True, True)
    assert same_program(source, minify(source, keep_lines=False, remove_asserts=True), True)[0]
    renamed = minify(source, rename_locals=True)
    assert same_program(source, renamed, False, rename_locals=True) == (True, True)
    assert not same_program(source, renamed, False)[0]  # something was renamed
    assert len(minify(source).encode()) < 0.8 * len(source.encode())


# --- the command ------------------------------------------------------------------------


def test_cli_wraps_checks_and_refuses_to_clobber(tmp_path):
    runner = CliRunner()
    src, out = tmp_path / "prog.py", tmp_path / "out.py"
    src.write_text(_source(), encoding="utf-8")
    r = runner.invoke(main, ["wrap", str(src), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["bytes"] == out.stat().st_size and doc["codec"] == "lzma" and doc["keep_lines"]
    assert runner.invoke(main, ["wrap", str(src), "-o", str(out)]).exit_code == 2  # no clobber
    r = runner.invoke(main, ["wrap", str(src), "-o", str(out), "--force", "--join-lines", "--remove-asserts"])
    assert r.exit_code == 0 and "line numbers joined" in r.output
    r = runner.invoke(main, ["wrap", "--check", str(out), str(src)])
    assert r.exit_code == 0 and "asserts" in r.output and "line numbers not kept" in r.output
    damaged = bytearray(out.read_bytes())
    damaged[len(damaged) // 2] ^= 0x20
    out.write_bytes(bytes(damaged))
    r = runner.invoke(main, ["wrap", "--check", str(out), str(src), "--json"])
    assert r.exit_code == 1 and json.loads(r.output)["ok"] is False
    r = runner.invoke(main, ["wrap", "--check", str(out), str(src)])
    assert r.exit_code == 1 and str(out) in r.output
    assert runner.invoke(main, ["wrap", str(src)]).exit_code == 2  # neither -o nor --check
    assert runner.invoke(main, ["wrap", "--check", str(out), str(src), "-o", str(out)]).exit_code == 2
    reader = tmp_path / "reader.py"
    reader.write_text("print(open(__file__, encoding='utf-8').read()[:2])\n")
    r = runner.invoke(main, ["wrap", str(reader), "-o", str(tmp_path / "r1.py"), "--encoding", "latin1"])
    assert r.exit_code == 2 and "may read the program's own file" in r.output and not (tmp_path / "r1.py").exists()
    (tmp_path / "r2.py").write_bytes(make(Payload((("<reader.py>", minify(reader.read_text())),), "lzma", "latin1")))
    r = runner.invoke(main, ["wrap", "--check", str(tmp_path / "r2.py"), str(reader)])
    assert r.exit_code == 1 and "may read the program's own file" in r.output
    r = runner.invoke(main, ["wrap", str(reader), "-o", str(tmp_path / "r3.py")])
    assert r.exit_code == 0 and "utf8" in r.output and _run(["r3.py"], tmp_path).stdout == "_=\n"
    (tmp_path / "rel.py").write_text("from . import x\n")
    r = runner.invoke(main, ["wrap", str(tmp_path / "rel.py"), "-o", str(tmp_path / "rel_out.py")])
    assert r.exit_code == 1 and "relative import" in r.output


def test_wrap_loader_ships_the_loader_inside_and_pack_verify_count_it(tmp_path):
    """--loader: `import rnpk_load` works from the one file, recurnorm blocked; pack and
    verify --code count the wrapped file's bytes (latin-1 and all)."""
    import torch
    from safetensors.torch import save_file

    ckpt = tmp_path / "ckpt.safetensors"
    save_file({"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(0))}, str(ckpt))
    program = tmp_path / "train_gpt.py"
    program.write_text(
        "import sys\nimport rnpk_load\n\n\nif __name__ == '__main__':\n"
        "    sd = rnpk_load.load(sys.argv[1])\n    print('loaded', float(sd['w'].float().abs().sum()))\n"
    )
    out = tmp_path / "submission" / "train_gpt.py"
    runner = CliRunner()
    r = runner.invoke(main, ["wrap", str(program), "--loader", "-o", str(out)])
    assert r.exit_code == 0, r.output
    art = tmp_path / "a.rnpk"
    r = runner.invoke(main, ["pack", str(ckpt), "-o", str(art), "--code", str(out), "--json", "-q", "int8"])
    assert r.exit_code == 0, r.output
    cap = json.loads(r.output[r.output.index("{") :])
    assert cap["code_bytes"] == out.stat().st_size and cap["total_bytes"] == art.stat().st_size + out.stat().st_size
    limit = art.stat().st_size + out.stat().st_size
    assert runner.invoke(main, ["verify", str(art), "--code", str(out), "--max-bytes", str(limit)]).exit_code == 0
    assert runner.invoke(main, ["verify", str(art), "--code", str(out), "--max-bytes", str(limit - 1)]).exit_code == 3
    script = IMPORT_BLOCKER + (
        f"import runpy; sys.argv = ['train_gpt.py', {str(art)!r}]; "
        f"runpy.run_path({str(out)!r}, run_name='__main__')\nimport recurnorm"
    )
    run = _run(["-c", script], tmp_path / "submission")
    assert "loaded" in run.stdout and "blocked: recurnorm" in run.stderr, run.stderr[-2000:]
    from recurnorm import load

    want = float(load(art)["w"].float().abs().sum())
    assert np.isclose(float(run.stdout.split()[-1]), want)
    r = runner.invoke(main, ["wrap", "--check", str(out), str(program)])
    assert r.exit_code == 0 and "rnpk_load" in r.output


# --- --codec cm: context mixing, its decoder in the file ---------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0",
        bytes(range(256)),
        b"abcabcabc" * 300 + bytes(range(255, -1, -1)),  # the match model, then its miss
        random.Random(7).randbytes(3000),
        b"def f(x):\n return x\n" * 200,
    ],
)
def test_cm_reads_back_every_byte_value(data):
    coded = cm.compress(data)
    assert cm.decompress(coded, len(data)) == data
    if len(data) > 2000 and data.isascii():
        assert len(coded) < len(data) / 20  # repeats cost next to nothing


def test_a_program_wrapped_with_cm_runs_and_check_proves_it(tmp_path):
    source = _source()
    _, out = _wrap_to(tmp_path, "cm", source, codec="cm")
    data = out.read_bytes()
    data.decode("utf-8")
    (tmp_path / "plain.py").write_bytes(wrap(source, "prog.py").data)  # docstrings go either way
    assert _run([str(out), "x"], tmp_path).stdout == _run(["plain.py", "x"], tmp_path).stdout != ""
    assert check(data, source, "prog.py").codec == "cm"
    start, end = data.index(b"_='''") + 5, data.index(b"'''\n", 10)
    for at in range(start + 16, end, max(1, (end - start) // 12)):  # the decoder's bytes, then the coded ones
        damaged = bytearray(data)
        damaged[at] ^= 0x20 if data[at] not in b"'\\" else 0x01
        with pytest.raises(DataError):
            check(bytes(damaged), source, "prog.py")
    with pytest.raises(DataError):  # the stub's decoder call, edited
        check(data.replace(b"g['D'](o[", b"g['D'](o[:0]+o[", 1), source, "prog.py")
    size = re.search(rb"g\['D'\]\(o\[\d+:\],(\d+)\)", data)[1]
    with pytest.raises(DataError, match="claims"):  # a size that would keep the decoder busy for hours
        check(data.replace(b"," + size + b")", b",9" + size * 4 + b")", 1), source, "prog.py")


def test_cm_is_asked_for_by_name_and_never_in_latin1():
    source = _source()
    assert wrap(source, "prog.py").codec == "lzma"  # auto never picks it: start-up costs seconds
    with pytest.raises((ConfigError, DataError)):
        wrap(source, "prog.py", codec="cm", encoding="latin1")
