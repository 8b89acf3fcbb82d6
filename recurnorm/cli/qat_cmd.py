"""`recurnorm finetune`: quantization-aware fine-tuning of a trained checkpoint."""

from __future__ import annotations

import json

import click

from ..display import echo
from .options import parse_key_values


@click.command()
@click.argument("ckpt", type=click.Path(exists=True))
@click.option("--quant", "-q", required=True, help="QAT format: ternary, int4, int6, int8, ...")
@click.option(
    "--quant-option",
    "quant_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=parse_key_values,
    help="Quantizer option, repeatable (e.g. group=64).",
)
@click.option("--steps", type=click.IntRange(min=1), default=200, show_default=True, help="Fine-tuning steps.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), help="Peak lr (default: preset).")
@click.option(
    "--ramp",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Fraction of the steps over which λ ramps 0 -> 1.",
)
@click.option("--stepwise", is_flag=True, help="Untied blocks reach λ=1 one after another.")
@click.option("--act-quant", is_flag=True, help="8-bit absmax fake quant of projection inputs.")
@click.option("--noise", is_flag=True, help="Train with ±½-step uniform noise instead of rounding.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Windows per step (default: preset).")
@click.option("--eval-every", type=click.IntRange(min=0), help="Evaluate (and guard) every N steps.")
@click.option("--preset", default="tiny", show_default=True, help="Preset for the optimizer settings.")
@click.option("--data", default="default", show_default=True, help="Corpus spec (as for train).")
@click.option("--tokenizer", metavar="MODEL", help="SentencePiece model (default: bytes).")
@click.option("--seed", type=int, default=0, show_default=True, help="Batch-order seed.")
@click.option(
    "--export",
    "export_path",
    type=click.Path(dir_okay=False),
    help="Also write the artifact (exactly the codes training saw) here.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing --out / --export.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def finetune(
    ckpt: str,
    quant: str,
    quant_options: dict,
    steps: int,
    out: str,
    lr: float | None,
    ramp: float,
    stepwise: bool,
    act_quant: bool,
    noise: bool,
    batch_size: int | None,
    eval_every: int | None,
    preset: str,
    data: str,
    tokenizer: str | None,
    seed: int,
    export_path: str | None,
    force: bool,
    device: str,
    as_json: bool,
    no_progress: bool,
) -> None:
    """QAT-fine-tune CKPT; writes a checkpoint whose config.json records qat, and train_log.jsonl."""
    from dataclasses import replace
    from pathlib import Path

    from ..errors import OutputExistsError
    from ..evaluate import loss
    from ..export.pack import export_qat
    from ..io import atomic_write_bytes, check_writable
    from ..model import load_checkpoint
    from ..train.data import load_corpus
    from ..train.presets import get_preset
    from ..train.qat import QATSpec, fine_tune_warmup, remove_qat, train_qat

    out_dir = Path(out)
    if out_dir.exists() and not force:
        raise OutputExistsError(f"{out_dir} exists; pass --force to overwrite it")
    if export_path is not None:
        from ..io import check_distinct
        from ..model.checkpoint import CONFIG_FILE, WEIGHTS_FILE
        from ..train.loop import LOG_NAME, RESUME_NAME

        check_writable(Path(export_path), force)
        run_files = {f"--out's {name}": out_dir / name for name in (WEIGHTS_FILE, CONFIG_FILE, LOG_NAME, RESUME_NAME)}
        check_distinct({"--export": export_path, **run_files})
    spec = QATSpec(format=quant, options=quant_options, ramp=ramp, act_quant=act_quant, noise=noise, stepwise=stepwise)
    model = load_checkpoint(ckpt)
    remove_qat(model)  # a QAT checkpoint is fine-tuned from its latent float weights
    corpus = load_corpus(data, tokenizer=tokenizer)
    preset_hp = get_preset(preset).with_overrides(lr=lr, batch_size=batch_size).hp
    hp = replace(
        preset_hp,
        steps=steps,
        seed=seed,
        warmup=fine_tune_warmup(preset_hp.warmup, steps),
        eval_every=eval_every if eval_every is not None else max(steps // 4, 1),
    )
    before = loss(model, corpus)

    result = train_qat(
        model,
        corpus,
        spec,
        hp,
        out_dir=out_dir,
        force=force,
        device=device,
        eval_fn=lambda m: loss(m, corpus),
        progress=not no_progress,
    )
    model = result.model.to("cpu")
    after = loss(model, corpus)
    summary = {
        "checkpoint": str(ckpt),
        "out": str(out_dir),
        "qat": model.config.qat,
        "steps": steps,
        "val_bpb_before": before.bits_per_byte,
        "val_bpb": after.bits_per_byte,
        "guard": result.qat_guard,
        "train_s": result.elapsed_s,
        "data": corpus.source,
    }
    if export_path is not None:
        data_bytes = export_qat(model)
        atomic_write_bytes(Path(export_path), data_bytes, exclusive=not force)
        summary.update(artifact=str(export_path), artifact_bytes=len(data_bytes))
    if as_json:
        echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    echo(f"QAT {quant} fine-tune of {ckpt}: {steps} steps in {result.elapsed_s:.1f} s")
    echo(f"val bpb {before.bits_per_byte:.4f} (float) -> {after.bits_per_byte:.4f} (QAT model, fake quant at λ=1)")
    echo(f"guard: logit gap {result.qat_guard['logit_gap']:.3g} from the float weights")
    echo(f"wrote {out_dir}/model.safetensors, config.json (qat recorded), train_log.jsonl")
    if export_path is not None:
        echo(f"wrote {export_path} ({summary['artifact_bytes']:,} bytes)")
