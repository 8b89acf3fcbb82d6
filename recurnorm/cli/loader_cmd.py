"""loader: write the standalone artifact loader that ships inside counted code."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..display import echo


@click.command()
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("rnpk_load.py"),
    show_default=True,
    help="where to write the loader",
)
@click.option(
    "--compact",
    is_flag=True,
    help="minified and self-extracting (lzma in a latin-1 literal, as `recurnorm wrap --encoding latin1` writes): "
    "the same loader in the fewest bytes, for the cap",
)
@click.option("--force", is_flag=True, help="overwrite OUT")
@click.option("--json", "as_json", is_flag=True, help="print {path, bytes, compact} as JSON")
def loader(out, compact, force, as_json):
    """Write rnpk_load.py: one Python file that loads recurnorm artifacts with the standard
    library and numpy alone (torch only to hand back tensors).

    \b
    Use it in shipped code:
      from rnpk_load import load
      state_dict = load("model.rnpk")   # {name: torch.Tensor}, hashes checked
    and count it against the cap: recurnorm pack/verify ... --loader rnpk_load.py.
    It reads what `recurnorm pack` writes by default (format 3, portable codecs); an
    artifact of an earlier format: pack it again, or ship the loader that came with it.
    """
    from ..budget.loader import compact_loader, loader_source
    from ..io import atomic_write_bytes, check_writable

    check_writable(out, force)
    data = compact_loader() if compact else loader_source().encode("utf-8")
    atomic_write_bytes(out, data, exclusive=not force)
    size = len(data)
    if as_json:
        echo(json.dumps({"path": str(out), "bytes": size, "compact": compact}, sort_keys=True))
    else:
        echo(
            f"wrote {out} ({size:,} bytes{', compact' if compact else ''}); "
            f"count it with --loader {out} on pack and verify"
        )
