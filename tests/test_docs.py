"""The docs that restate code: exit-code tables, docs/CLI.md's option reference and the README's
command lines, checked against it; and the README's end-to-end flow, run as written at a tiny size."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from recurnorm.cli import exitcodes
from recurnorm.cli.main import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CLI_DOC = REPO / "docs" / "CLI.md"
# The docs whose `recurnorm ...` lines are checked against the click app.
COMMAND_DOCS = ("README.md", "docs/CLI.md", "docs/BENCHMARKS.md", "docs/SHIP.md", "docs/POLICY.md")
SPAN = re.compile(r"`([^`\n]+)`")
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def _between(text: str, name: str) -> str:
    begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"one {begin.strip()} ... {end} block"
    return text.split(begin)[1].split(end)[0]


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(main)
    return {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}


def _options(cmd: click.Command) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        if isinstance(p, click.Option):
            names |= set(p.opts) | set(p.secondary_opts)
    return names


# -- exit codes ------------------------------------------------------------------


def test_every_exit_code_in_use_has_a_meaning():
    codes = {v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    from recurnorm import errors

    kinds = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, errors.RecurnormError)]
    assert codes == set(exitcodes.MEANING) and {k.exit_code for k in kinds} <= codes
    table = exitcodes.markdown_table()
    assert [int(row.split("|")[1]) for row in table.splitlines()[2:]] == sorted(exitcodes.MEANING)


@pytest.mark.parametrize("doc", ["README.md", "docs/CI.md"])
def test_exit_code_tables_are_the_generated_one(doc):
    text = (REPO / doc).read_text(encoding="utf-8")
    assert _between(text, "exit-codes") == exitcodes.markdown_table(), (
        f"{doc}: paste the output of "
        "python -c 'from recurnorm.cli.exitcodes import markdown_table; print(markdown_table(), end=\"\")'"
    )


# -- docs/CLI.md's option reference ----------------------------------------------------


def _reference_rows() -> dict[str, list[str]]:
    rows = {}
    for line in _between(CLI_DOC.read_text(encoding="utf-8"), "cli-options").splitlines()[2:]:
        cells = line.split("|")
        name = SPAN.fullmatch(cells[1].strip()).group(1)
        assert name not in rows, f"{name} listed twice"
        rows[name] = SPAN.findall(cells[2])
    return rows


def test_reference_lists_every_command_and_nothing_else():
    assert sorted(_reference_rows()) == sorted(_commands())


@pytest.mark.parametrize("name", sorted(_commands()))
def test_reference_lists_every_option_and_argument_of(name):
    cmd = _commands()[name]
    listed = _reference_rows().get(name, [])
    options = {o for t in listed if t.startswith("-") for o in t.split("/")}
    arguments = {t.rstrip("…") for t in listed if not t.startswith("-")}
    assert options == _options(cmd) - {"--help"}
    assert arguments == {p.human_readable_name for p in cmd.params if isinstance(p, click.Argument)}


def _command_lines(text: str):
    """(command line, the command its bare options belong to or None) for every `recurnorm X ...`
    in a code span or code block, and every bare option span (in a Commands row: of that row)."""
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            if line.startswith("recurnorm "):
                yield line, None
            continue
        spans = SPAN.findall(line)
        row_cmd = None
        if line.startswith("| `recurnorm "):
            row_cmd = spans[0].split()[1]
        for span in spans:
            if span.startswith("recurnorm "):
                yield span, None
            elif span.startswith("-"):
                yield span, row_cmd or "*"


@pytest.mark.parametrize("doc", COMMAND_DOCS)
def test_every_command_line_in_the_docs_names_real_commands_and_options(doc):
    commands = _commands()
    everything = set().union(*map(_options, commands.values())) | {"--version"}
    text = (REPO / doc).read_text(encoding="utf-8")
    if "<!-- cli-options:begin -->" in text:  # the reference table has its own tests
        text = text.split("<!-- cli-options:begin -->")[0] + text.split("<!-- cli-options:end -->")[1]
    seen = 0
    for line, owner in _command_lines(text):
        if owner is None:  # `recurnorm CMD ...`
            words = line.split()
            if words[1] in ("COMMAND", "--version"):
                continue
            assert words[1] in commands, f"{doc} names no such command: {line}"
            known = _options(commands[words[1]])
            rest = " ".join(words[2:])
        else:
            known = everything if owner == "*" else _options(commands[owner])
            rest = line.split()[0]
        for opt in OPTION.findall(rest):
            assert opt.split("=")[0] in known, f"{doc}: {opt} is no option of {line!r}"
        seen += 1
    assert seen > 5  # the parser still finds the command lines


def test_the_readme_names_only_what_the_repository_has():
    """Paths, make targets and benchmark scripts the README names exist; links stay inside the
    repository (or are web addresses); no document cites one the repository lacks."""
    text = README.read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    for target in re.findall(r"\bmake ([a-z][\w-]*)", text):
        assert target in targets, f"README: no make target {target!r}"
    for path in re.findall(r"\b((?:docs|recurnorm|benchmarks|examples|tests)/[\w./-]*\w)", text):
        assert (REPO / path).exists(), f"README names {path}, which the repository lacks"
    for doc in [README, *sorted((REPO / "docs").glob("*.md"))]:
        body = doc.read_text(encoding="utf-8")
        for link in re.findall(r"\]\(([^)\s]+)\)", body):
            if not link.startswith(("http://", "https://", "#")):
                assert (doc.parent / link.split("#")[0]).exists(), f"{doc.name}: broken link {link}"
        for outside in ("reference §", "../shared", "the four questions (reference"):
            assert outside not in body, f"{doc.name} cites {outside!r}, which is not in the repository"


def test_the_readme_is_a_short_guide_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.split()) <= 1500, f"README.md has {len(text.split())} words (at most 1,500)"
    assert "```\nmake demo\nmake test\n```" in text
    assert "https://github.com/openai/parameter-golf" in text


# -- the README's end-to-end flow and library snippet, run ------------------------------

# The README's flow trains the tiny preset (minutes); the test trains a 2-step, 2-block,
# d=32 model instead (options given last win in click), and runs every other line as written.
TINY_TRAIN = ["--steps", "2", "--d-model", "32", "--depth", "2", "--no-progress"]


def _code_blocks(text: str, after: str) -> list[str]:
    """The fenced code blocks of the section whose heading starts with `after`."""
    section = text.split(f"\n## {after}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\w*\n(.*?)```", section, re.S)


@pytest.mark.slow  # trains a model and runs five commands in child processes (~25 s)
def test_the_readme_flow_and_library_snippet_run_as_written(tmp_path):
    text = README.read_text(encoding="utf-8")
    (flow,) = _code_blocks(text, "End to end")
    (snippet,) = _code_blocks(text, "Library")
    example = tmp_path / "examples" / "parameter_golf"
    example.mkdir(parents=True)  # "from the clone's root": the example program it wraps
    (example / "train_gpt.py").write_bytes((REPO / "examples/parameter_golf/train_gpt.py").read_bytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    lines = [ln for ln in flow.splitlines() if ln.strip()]
    assert [ln.split()[:2] for ln in lines if ln.startswith("recurnorm ")] == [
        ["recurnorm", c] for c in ("train", "wrap", "pack", "verify", "loader")
    ]
    for line in lines:
        argv = shlex.split(line)
        if argv[0] == "recurnorm":
            argv = [sys.executable, "-m", "recurnorm.cli.main", *argv[1:]]
            if argv[3] == "train":
                argv += TINY_TRAIN
        else:
            assert argv[0] == "python", line
            argv[0] = sys.executable
        run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{line}\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    assert run.stdout.split() == ["12", "tensors"]  # the loader alone read every tensor back
    assert (tmp_path / "submission" / "model.rnpk").stat().st_size > 0
    code = compile(snippet, "README.md (Library)", "exec")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        scope: dict = {}
        exec(code, scope)
    finally:
        os.chdir(cwd)
    assert (tmp_path / "ng6.rnpk").read_bytes() == scope["blob"]
    assert scope["model"].state_dict().keys() == scope["weights"].keys()


def test_ci_doc_describes_every_verify_option():
    """docs/CI.md's synopsis and option table of `recurnorm verify`, against the command."""
    text = (REPO / "docs" / "CI.md").read_text(encoding="utf-8")
    verify = _commands()["verify"]
    synopsis = text.split("```\nrecurnorm verify ", 1)[1].split("```", 1)[0]
    table = text.split("| option | meaning |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    in_table = {OPTION.findall(row.split("|")[1])[0] for row in table.splitlines() if OPTION.findall(row.split("|")[1])}
    expected = _options(verify) - {"--help"}
    assert set(OPTION.findall(synopsis)) == expected
    assert in_table == expected


# -- formats and policies (docs/POLICY.md, --help) -----------------------------------------


def test_policy_doc_formats_table_is_the_generated_one():
    from recurnorm.quant.registry import formats_markdown

    text = (REPO / "docs" / "POLICY.md").read_text(encoding="utf-8")
    assert _between(text, "formats") == formats_markdown(), (
        "docs/POLICY.md: paste the output of python -c "
        "'from recurnorm.quant.registry import formats_markdown; print(formats_markdown(), end=\"\")'"
    )


def test_every_option_of_every_format_is_documented_and_in_help():
    from click.testing import CliRunner

    from recurnorm.quant.registry import _REGISTRY, available

    for name in available():
        cls = _REGISTRY.type_of(name)
        assert set(cls.option_help) == set(cls.defaults), f"{name}: option_help must cover every option"
    for command in ("pack", "inspect", "plan"):
        text = " ".join(CliRunner().invoke(main, [command, "--help"]).output.split())
        for name in available():
            assert name in text, (command, name)
            for option in _REGISTRY.type_of(name).defaults:
                assert f"{option}=" in text, (command, name, option)


def test_the_documented_policy_file_is_what_pack_reads(tmp_path):
    from recurnorm.export import build_policy

    text = (REPO / "docs" / "POLICY.md").read_text(encoding="utf-8")
    toml = re.search(r"```toml\n(.*?)```", text, re.S)[1]
    (tmp_path / "p.toml").write_text(toml)
    policy = build_policy(None, policy_file=tmp_path / "p.toml")
    assert policy.quantizer == "int6" and policy.options == {"clip": "sigma:12.85"}
    assert policy.embedding == ("int8", {"clip": "sigma:20"}) and len(policy.rules) == 3


def test_the_documented_policy_line_is_what_the_baseline_gets():
    from pg_model import baseline_state

    from recurnorm.export import build_policy

    text = (REPO / "docs" / "POLICY.md").read_text(encoding="utf-8")
    line = re.search(r"`-q '([^']+)'`:\n\n```\n(export policy: [^\n]+)\n```", text)
    policy = build_policy(line[1])
    state = baseline_state(dim=64, vocab=128)  # the counts depend on the names, not the sizes
    assert policy.summary(policy.plan(state)) == line[2]
