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
