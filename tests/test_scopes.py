"""Local names: scopes.py resolves names as Python's compiler does (checked against
`symtable` on CPython's own modules), `minify --rename-locals` renames only what is safe, and
the check passes a consistent renaming and fails a capture, a collision or any other rename."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import symtable
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from recurnorm.cli.main import main
from recurnorm.codewrap import check, minify, same_program, wrap
from recurnorm.codewrap.scopes import CLASS, COMPREHENSION, FUNCTION, LAMBDA, Scopes
from recurnorm.codewrap.selfextract import Payload, make
from recurnorm.errors import DataError

STDLIB = ["functools.py", "inspect.py", "typing.py", "dataclasses.py", "argparse.py", "asyncio/base_events.py"]
STDLIB += ["email/_header_value_parser.py", "collections/__init__.py", "pydoc.py", "difflib.py", "enum.py"]


def _tables(source: str) -> dict[tuple[str, str, int], list[symtable.SymbolTable]]:
    out: dict = {}

    def walk(table):
        for child in table.get_children():
            out.setdefault(
                (str(child.get_type()).split(".")[-1].lower(), child.get_name(), child.get_lineno()), []
            ).append(child)
            walk(child)

    walk(symtable.symtable(source, "<src>", "exec"))
    return out


@pytest.mark.slow  # 11 stdlib modules, ~100k names
@pytest.mark.parametrize("name", STDLIB)
def test_names_resolve_as_the_compiler_does(name):
    """Every name in a function or class body: local there, an enclosing function's (free)
    or global, as CPython's own symbol table says."""
    source = (Path(sysconfig.get_paths()["stdlib"]) / name).read_text(encoding="utf-8")
    tables, scopes = _tables(source), Scopes(ast.parse(source))
    compared = 0
    for o in scopes.occurrences:
        s = o.scope
        # Dunders are mangled in classes, annotations have scopes of their own from Python
        # 3.14: neither is ever renamed.
        if s.kind not in (FUNCTION, CLASS) or o.name.startswith("__") or o.annotation:
            continue
        found = tables.get((s.kind, s.node.name, s.node.lineno), [])
        if len(found) != 1:  # two defs of one name on one line: no way to tell them apart
            continue
        symbol = found[0].lookup(o.name)
        got = scopes.resolve(o)
        if symbol.is_local() and not symbol.is_declared_global():
            assert got is s, (name, o.name, o.node.lineno)
        elif symbol.is_free():
            assert got is not None and got is not s and got.kind in (FUNCTION, LAMBDA, COMPREHENSION), (name, o.name)
        else:
            assert symbol.is_global() and got is None, (name, o.name, o.node.lineno)
        compared += 1
    assert compared > 500


def _renamed(source: str) -> str:
    return minify(textwrap.dedent(source), rename_locals=True)


def test_only_a_functions_own_assigned_locals_are_renamed():
    out = _renamed(
        """
        import os
        module_level = [row_name for row_name in os.environ]
        def f(param_name, *args_name, **kwargs_name):
            local_name = param_name + len(module_level)
            for loop_name in args_name:
                local_name += loop_name
            with open(os.devnull) as handle_name:
                pass
            try:
                pass
            except OSError as error_name:
                print(error_name)
            import json as json_name
            def nested_def():
                return local_name
            class NestedClass:
                class_attr = local_name
            del handle_name
            return local_name, json_name, nested_def, NestedClass, f"{local_name}!"
        """
    )
    for kept in ("module_level", "param_name", "args_name", "kwargs_name", "json_name", "nested_def", "NestedClass"):
        assert kept in out
    for renamed in ("row_name", "local_name", "loop_name", "handle_name", "error_name"):
        assert renamed not in out  # in the f-string too
    assert "class_attr" in out


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    value_name = 1\n    return locals()\n",  # read by name
        "def f():\n    value_name = 1\n    return eval('value_name')\n",
        "def f():\n    value_name = 1\n    def g():\n        return vars()\n    return g\n",
        "import sys\ndef f():\n    value_name = 1\n    return sys._getframe().f_locals\n",
        "def f():\n    value_name = 1\n    return f'{value_name=}'\n",  # printed with its name
        "def f():\n    value_name = int\n    def g(x: value_name): pass\n    return g\n",  # an annotation
        "def f():\n    value_name = 1\n    def g():\n        nonlocal value_name\n        value_name = 2\n    return g\n",
        "def f():\n    global value_name\n    value_name = 1\n",
        "def f():\n    __value_name = 1\n    return __value_name\n",  # mangled in a class
        "def f():\n    [value_name := 1]\n    def value_name(): pass\n",  # also a def
        "def f(value_name):\n    value_name = 1\n",
    ],
)
def test_names_that_code_can_reach_otherwise_keep_their_text(source):
    out = minify(source, rename_locals=True)
    assert "value_name" in out
    assert same_program(source, out, False, rename_locals=True) == (True, True)


def test_a_new_name_never_meets_a_name_its_scope_reads():
    source = textwrap.dedent(
        """
        a, b = 1, 2
        def f():
            outer_value = a
            def g():
                inner_value = outer_value + b
                return inner_value, len([inner_value])
            return g
        result = f()()
        """
    )
    out = minify(source, rename_locals=True)
    f = ast.parse(out).body[1]
    outer, inner = f.body[0].targets[0].id, f.body[1].body[0].targets[0].id
    assert outer not in {"a", "b", "len", "g"} and inner not in {outer, "b", "len"}  # what each scope reads
    assert len(outer) == len(inner) == 1
    assert same_program(source, out, False, rename_locals=True) == (True, True)
    ran, want = {}, {}
    exec(out, ran)
    exec(source, want)
    assert ran["result"] == want["result"] == (3, 1)


# --- the check --------------------------------------------------------------------------

SOURCE = textwrap.dedent(
    """
    limit = 10
    def count(values):
        total_sum = 0
        for item in sorted(values):
            if item < limit:
                total_sum += item
        return total_sum
    print(count([1, 5, 20]))
    """
)
UNSAFE = {
    "a capture of a global the function reads": ("total_sum", "limit"),
    "a capture of a builtin": ("total_sum", "sorted"),
    "a collision of two locals": ("total_sum", "item"),
    "a parameter renamed": ("values", "vals"),
    "a global renamed": ("limit", "lim"),
}


def _rename(source: str, old: str, new: str) -> str:
    return source.replace(old, new)


def test_check_passes_a_consistent_renaming_and_says_so():
    renamed = _rename(_rename(SOURCE, "total_sum", "t"), "item", "i")
    assert same_program(SOURCE, renamed, False, rename_locals=True) == (True, True)
    assert not same_program(SOURCE, renamed, False)[0]  # without the option: a difference
    proof = check(make(Payload((("<prog.py>", renamed),), "lzma")), SOURCE, "prog.py")
    assert "local names" in proof.transformations and proof.line_numbers_kept
    proof = check(wrap(SOURCE, "prog.py", rename_locals=True).data, SOURCE, "prog.py")
    assert "local names" in proof.transformations
    assert (
        "local names" not in check(wrap(SOURCE, "prog.py", rename_locals=False).data, SOURCE, "prog.py").transformations
    )


@pytest.mark.parametrize("what", list(UNSAFE))
def test_check_fails_an_unsafe_renaming(tmp_path, what):
    unsafe = _rename(SOURCE, *UNSAFE[what])
    assert not same_program(SOURCE, unsafe, False, rename_locals=True)[0]
    data = make(Payload((("<prog.py>", unsafe),), "lzma"))
    with pytest.raises(DataError, match="their code differs"):
        check(data, SOURCE, "prog.py")
    (tmp_path / "prog.py").write_text(SOURCE)
    (tmp_path / "out.py").write_bytes(data)
    r = CliRunner().invoke(main, ["wrap", "--check", str(tmp_path / "out.py"), str(tmp_path / "prog.py")])
    assert r.exit_code == 1 and "their code differs" in r.output


def test_check_fails_a_rename_the_renamer_would_refuse():
    source = "def f():\n    value = 1\n    return f'{value=}', locals()\n"
    assert not same_program(source, source.replace("value", "v"), False, rename_locals=True)[0]
    source = "def f():\n    value = 1\n    return locals()\n"  # the same text, other names: not proven
    assert not same_program(source, source.replace("value", "v"), False, rename_locals=True)[0]
    source = "def f():\n    value = 1\n    def g():\n        return value\n    return g\n"
    half = "def f():\n    v = 1\n    def g():\n        return value\n    return g\n"  # the closure not followed
    assert not same_program(source, half, False, rename_locals=True)[0]


def test_cli_renames_on_request(tmp_path):
    src, out = tmp_path / "prog.py", tmp_path / "out.py"
    src.write_text(SOURCE)
    r = CliRunner().invoke(main, ["wrap", str(src), "-o", str(out), "--rename-locals", "--json"])
    assert r.exit_code == 0, r.output
    assert '"rename_locals": true' in r.output
    r = CliRunner().invoke(main, ["wrap", "--check", str(out), str(src)])
    assert r.exit_code == 0 and "local names" in r.output


CPYTHON_SUITES = {"textwrap": "test.test_textwrap", "shlex": "test.test_shlex", "fractions": "test.test_fractions"}
CPYTHON_SUITES |= {"configparser": "test.test_configparser", "ipaddress": "test.test_ipaddress"}


@pytest.mark.slow  # five of CPython's own test suites, in one process
def test_cpython_test_suites_pass_on_their_modules_with_locals_renamed(tmp_path):
    """Code we did not write, run by tests we did not write: each module minified with its
    locals renamed, in front of the standard library on sys.path."""
    if importlib.util.find_spec("test.test_textwrap") is None:
        pytest.skip("this Python has no test package (Debian: libpython3-testsuite)")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for module in CPYTHON_SUITES:
        source = (stdlib / f"{module}.py").read_text(encoding="utf-8")
        renamed = minify(source, rename_locals=True)
        assert not same_program(source, renamed, False)[0]  # names did change
        (tmp_path / f"{module}.py").write_text(renamed, encoding="utf-8")
    probe = "import sys, " + ", ".join(CPYTHON_SUITES) + "; print(all(m.__file__.startswith(sys.argv[1]) for m in ["
    probe += ", ".join(CPYTHON_SUITES) + "]))"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, env=env)
    assert run.stdout.strip() == "True", run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "unittest", "-q", *CPYTHON_SUITES.values()],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"Ran \d{3,} tests", run.stderr)
