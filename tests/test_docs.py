"""The docs that restate code: exit-code tables and the README's CLI reference, checked against it."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from recurnorm.cli import exitcodes
from recurnorm.cli.main import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
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


# -- the README's CLI reference ----------------------------------------------------


def _reference_rows() -> dict[str, list[str]]:
    rows = {}
    for line in _between(README.read_text(encoding="utf-8"), "cli-options").splitlines()[2:]:
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


def test_every_command_line_in_the_readme_names_real_commands_and_options():
    commands = _commands()
    everything = set().union(*map(_options, commands.values())) | {"--version"}
    text = README.read_text(encoding="utf-8").split("<!-- cli-options:begin -->")[0]
    text += README.read_text(encoding="utf-8").split("<!-- cli-options:end -->")[1]
    seen = 0
    for line, owner in _command_lines(text):
        if owner is None:  # `recurnorm CMD ...`
            words = line.split()
            if words[1] in ("COMMAND", "--version"):
                continue
            assert words[1] in commands, f"README names no such command: {line}"
            known = _options(commands[words[1]])
            rest = " ".join(words[2:])
        else:
            known = everything if owner == "*" else _options(commands[owner])
            rest = line.split()[0]
        for opt in OPTION.findall(rest):
            assert opt.split("=")[0] in known, f"README: {opt} is no option of {line!r}"
        seen += 1
    assert seen > 20  # the parser still finds the command lines


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
