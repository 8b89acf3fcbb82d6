"""plan: the artifact size a model config would pack to (and the largest that fits a budget)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .pack_cmd import policy_from_options, policy_options


@click.command()
@click.option("--scheme", default="shared", show_default=True, help="specialization scheme")
@click.option("--preset", default=None, help="take the model shape from a training preset (tiny, small, ...)")
@click.option("--d", "d_model", type=click.IntRange(min=1), default=None, help="d_model")
@click.option("--depth", type=click.IntRange(min=1), default=None, help="block applications")
@click.option("--n-heads", type=click.IntRange(min=1), default=None, help="attention heads")
@click.option("--vocab-size", type=click.IntRange(min=1), default=None, help="vocabulary size")
@click.option("--mlp-ratio", type=float, default=None, help="MLP width / d_model")
@policy_options
@click.option(
    "--code",
    "code_files",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="code file counted with the artifact",
)
@click.option(
    "--fit",
    "fit_bytes",
    type=click.IntRange(min=1),
    default=None,
    metavar="BYTES",
    help="find the largest width (or --vary depth) whose artifact + code fits BYTES",
)
@click.option(
    "--vary", type=click.Choice(["d_model", "depth"]), default="d_model", show_default=True, help="what --fit grows"
)
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def plan(
    scheme,
    preset,
    d_model,
    depth,
    n_heads,
    vocab_size,
    mlp_ratio,
    quant,
    policy_file,
    keep_float,
    quantize_controls,
    keep_float_max_numel,
    code_files,
    fit_bytes,
    vary,
    as_json,
):
    """Predict the artifact size of a model config under an export policy, before training.

    A fresh model of the config is packed through the real packer; each
    quantized tensor's code bytes are scaled by the growth measured on trained
    checkpoints. With --fit, the largest d_model (multiple of 2·n_heads) or depth
    of the scheme that fits.
    """
    from ..budget.cap import code_bytes
    from ..export.plan import fit_size, predict_size

    config: dict = {}
    if preset is not None:
        from ..train.presets import get_preset

        config.update(get_preset(preset).model)
    given = {
        "scheme": scheme,
        "d_model": d_model,
        "depth": depth,
        "n_heads": n_heads,
        "vocab_size": vocab_size,
        "mlp_ratio": mlp_ratio,
    }
    config.update({k: v for k, v in given.items() if v is not None})
    policy = policy_from_options(quant, policy_file, keep_float, quantize_controls, keep_float_max_numel)
    n_code = code_bytes(list(code_files))
    if fit_bytes is None:
        result = predict_size(config, policy, n_code)
    else:
        result = fit_size(config, policy, fit_bytes, vary=vary, code_bytes=n_code)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return
    click.echo(result.lines())
    if fit_bytes is not None:
        click.echo(
            f"fits {fit_bytes:,} B: {vary} {result.config[vary]} (headroom {fit_bytes - result.total_bytes:,} B)"
        )
