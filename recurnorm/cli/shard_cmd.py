"""`recurnorm shard`: tokenize a text corpus into Parameter Golf FineWeb shard files."""

from __future__ import annotations

import json

import click

from ..display import echo


@click.command()
@click.option(
    "--data",
    "data",
    default="default",
    show_default=True,
    help="Corpus: 'default' (pydoc topics), a text file (blank-line separated documents) or a directory of .txt files.",
)
@click.option(
    "--tokenizer",
    "tokenizer",
    required=True,
    metavar="MODEL",
    help="SentencePiece .model file (or 'byte' for raw UTF-8 bytes, no BOS).",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False),
    help="Output directory for fineweb_{train,val}_NNNNNN.bin.",
)
@click.option(
    "--shard-tokens",
    type=click.IntRange(1, 2**31 - 1),
    default=100_000_000,
    show_default=True,
    help="Maximum tokens per shard file.",
)
@click.option("--prefix", default="fineweb", show_default=True, help="Shard file name prefix.")
@click.option("--force", is_flag=True, help="Overwrite (and remove stale) shards in --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def shard(
    data: str,
    tokenizer: str,
    out: str,
    shard_tokens: int,
    prefix: str,
    force: bool,
    as_json: bool,
) -> None:
    """Write train/validation token shards (each document starts with BOS).

    The train/validation split is the one `recurnorm train --data` uses: every
    10th document (sorted order) is validation.
    """
    from ..train.shards import shard_corpus

    report = shard_corpus(data, tokenizer, out, prefix=prefix, shard_tokens=shard_tokens, force=force)
    if as_json:
        echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
        return
    echo(
        f"wrote {len(report.train_files)} train shard(s) ({report.train_tokens:,} tokens, "
        f"{report.train_docs} docs) and {len(report.val_files)} val shard(s) "
        f"({report.val_tokens:,} tokens, {report.val_docs} docs) to {report.out_dir}"
    )
    if report.val_bytes:
        echo(f"validation: {report.val_bytes:,} bytes, {report.val_bytes / max(report.val_tokens, 1):.3f} bytes/token")
