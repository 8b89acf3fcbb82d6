"""plan: the artifact size a model config would pack to (and the largest that fits a budget)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..display import echo
from .pack_cmd import CAP, PolicyCommand, budget_options, policy_from_options, policy_options, say_notes


@click.command(cls=PolicyCommand)
@click.option(
    "--like",
    "like",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    metavar="CKPT",
    help="scale this checkpoint's shapes (any names; GQA, tied embeddings and control tensors as they "
    "are): --d, --depth and --vocab-size set the new sizes, its own packed bytes give the prediction",
)
@click.option("--scheme", default=None, help="specialization scheme [default: shared]")
@click.option("--preset", default=None, help="take the model shape from a training preset (tiny, small, golf, ...)")
@click.option("--d", "d_model", type=click.IntRange(min=1), default=None, help="d_model")
@click.option("--depth", type=click.IntRange(min=1), default=None, help="block applications (--like: numbered blocks)")
@click.option(
    "--n-heads",
    type=click.IntRange(min=1),
    default=None,
    help="attention heads (--like --fit: width steps of 8 x heads)",
)
@click.option("--vocab-size", type=click.IntRange(min=1), default=None, help="vocabulary size")
@click.option("--mlp-ratio", type=float, default=None, help="MLP width / d_model")
@policy_options
@click.option(
    "--max-bytes",
    type=CAP,
    default=None,
    help="byte cap the prediction is counted against, with --code and --loader [default: --fit's BYTES, else 16000000]",
)
@budget_options
@click.option(
    "--fit",
    "fit_bytes",
    type=click.IntRange(min=1),
    default=None,
    metavar="BYTES",
    help="find the largest width (or --vary depth) whose artifact + code (+ loader) fits BYTES",
)
@click.option(
    "--vary", type=click.Choice(["d_model", "depth"]), default="d_model", show_default=True, help="what --fit grows"
)
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def plan(
    like,
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
    max_bytes,
    code_files,
    loader,
    fit_bytes,
    vary,
    as_json,
):
    """Predict the artifact size of a model under an export policy, before training it.

    \b
    --like CKPT: any checkpoint (a Parameter Golf train_gpt.py state dict, a Hugging
    Face model, ...) is packed once; its shapes are scaled in width (every dimension
    proportional to d_model, KV heads included), depth (numbered blocks) and vocabulary,
    and each scaled tensor takes its source's measured bytes per element.
    Otherwise a fresh recurnorm model of the config (--scheme, --preset golf, ...) is
    packed and its code bytes grown by the ratio measured on trained checkpoints.

    Code is counted as pack counts it (--code, --loader). With --fit, the largest
    d_model (or --vary depth) that fits.
    """
    from ..budget.cap import DEFAULT_MAX_BYTES, Budget
    from ..export.plan import fit_size, predict_size

    if fit_bytes is not None and max_bytes is not None and fit_bytes > max_bytes:
        raise click.UsageError(f"--fit {fit_bytes:,} is over --max-bytes {max_bytes:,}")
    budget = Budget(max_bytes or fit_bytes or DEFAULT_MAX_BYTES, list(code_files), loader)
    budget.code_total()  # a bad --code: a usage error, up front
    policy = policy_from_options(quant, policy_file, keep_float, quantize_controls, keep_float_max_numel)
    fit = None if fit_bytes is None else budget.with_cap(fit_bytes)
    if like is not None:
        for flag, value in (("--scheme", scheme), ("--preset", preset), ("--mlp-ratio", mlp_ratio)):
            if value is not None:
                raise click.UsageError(f"{flag} describes a recurnorm model; --like takes the checkpoint's shapes")
        from ..export.like import plan_like

        result, notes = plan_like(
            like,
            policy,
            budget,
            d_model=d_model,
            depth=depth,
            vocab_size=vocab_size,
            fit=fit,
            vary=vary,
            n_heads=n_heads,
        )
        _show(result, fit_bytes, vary, as_json, notes, budget)
        return
    config: dict = {}
    if preset is not None:
        from ..train.presets import get_preset

        config.update(get_preset(preset).model)
    given = {
        "scheme": scheme or (None if preset else "shared"),
        "d_model": d_model,
        "depth": depth,
        "n_heads": n_heads,
        "vocab_size": vocab_size,
        "mlp_ratio": mlp_ratio,
    }
    config.update({k: v for k, v in given.items() if v is not None})
    config.setdefault("scheme", "shared")
    result = predict_size(config, policy, budget) if fit is None else fit_size(config, policy, fit, vary=vary)
    _show(result, fit_bytes, vary, as_json, [], budget)


def _show(result, fit_bytes, vary, as_json, notes, budget) -> None:
    if as_json:
        echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return
    say_notes(notes, budget)
    echo(result.lines())
    if fit_bytes is not None:
        echo(f"fits {fit_bytes:,} B: {vary} {result.config[vary]} (headroom {result.cap['headroom_bytes']:,} B)")
