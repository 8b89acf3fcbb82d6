"""Option parsers shared by several commands."""

from __future__ import annotations

import json

import click


def parse_key_values(ctx, param, values: tuple[str, ...]) -> dict:
    """key=value pairs; values are read as JSON (numbers, true/false, null) or kept as text."""
    options = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {item!r}", ctx=ctx, param=param)
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options
