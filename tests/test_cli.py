"""The command group: every registered command resolves, and --help lists them all."""

from __future__ import annotations

import click
from click.testing import CliRunner

from recurnorm.cli.main import COMMANDS, main


def test_every_command_resolves_and_is_listed():
    ctx = click.Context(main)
    for name in COMMANDS:
        assert isinstance(main.get_command(ctx, name), click.Command), name
    out = CliRunner().invoke(main, ["--help"]).output
    assert all(f"  {name} " in out for name in COMMANDS), out


def test_the_program_freezes_its_objects_once_main_is_done(monkeypatch):
    """run() (the installed `recurnorm`) freezes the collector's objects after main, however main
    ends (click's own exit is a SystemExit): the interpreter's exit then skips walking them."""
    import sys

    import pytest

    from recurnorm.cli import main as cli_main

    calls = []
    monkeypatch.setattr(cli_main, "main", lambda: (calls.append("main"), sys.exit(3)))
    monkeypatch.setattr(cli_main.gc, "freeze", lambda: calls.append("freeze"))
    with pytest.raises(SystemExit) as exit_:
        cli_main.run()
    assert exit_.value.code == 3 and calls == ["main", "freeze"]


def test_the_installed_program_is_run():
    from importlib.metadata import entry_points

    (program,) = [e for e in entry_points(group="console_scripts") if e.name == "recurnorm"]
    assert program.value == "recurnorm.cli.main:run"
