"""`recurnorm train`: train one shared-depth model from a preset, print its summary.

The options become a TrainRequest (a preset's TrainConfig with the options given
replacing its values); recurnorm.evaluate.train_run does the run.

With ``--nproc N`` the same arguments run on N ranks under torchrun
(recurnorm.train.launch); each rank runs this command as
``python -m recurnorm.train``, and only rank 0 prints.
"""

from __future__ import annotations

import json

import click

from ..display import echo
from .options import parse_key_values


class _KeepArgs(click.Command):
    """A command that remembers its raw arguments (--nproc passes them on to torchrun)."""

    def parse_args(self, ctx, args):
        ctx.meta["raw_args"] = list(args)
        return super().parse_args(ctx, args)


def _without_nproc(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


@click.command(cls=_KeepArgs)
@click.option(
    "--scheme",
    default="shared",
    show_default=True,
    help="Specialization scheme (shared, norm, norm_gate, unique, lora, ...).",
)
@click.option(
    "--preset",
    default="tiny",
    show_default=True,
    help="Preset: tiny (CPU demo), small, golf (fills a 16 MB artifact; one GPU, ~10 min).",
)
@click.option("--steps", type=click.IntRange(min=1), help="Training steps (optimizer updates).")
@click.option("--depth", type=click.IntRange(min=1), help="Block applications per forward pass.")
@click.option("--d-model", type=click.IntRange(min=1), help="Model width.")
@click.option("--heads", type=click.IntRange(min=1), help="Attention heads.")
@click.option("--seq-len", type=click.IntRange(min=1), help="Training window length in tokens.")
@click.option("--norm", type=click.Choice(["pre", "peri"]), help="Normalization placement.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), help="Peak learning rate.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Windows per step.")
@click.option("--seed", type=int, help="Initialization seed (default: the preset's; 0 in every preset).")
@click.option("--batch-seed", type=int, help="Batch-order seed (default: --seed).")
@click.option(
    "--data",
    default="default",
    show_default=True,
    help="Corpus: default (pydoc topics), a text file, a directory of .txt, or shards:GLOB.",
)
@click.option("--tokenizer", metavar="MODEL", help="SentencePiece model (default: bytes).")
@click.option(
    "--scheme-option",
    "scheme_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=parse_key_values,
    help="Scheme option, repeatable (e.g. rank=4).",
)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--resume", is_flag=True, help="Continue the run saved in --out (same options).")
@click.option("--force", is_flag=True, help="Overwrite an existing --out.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option(
    "--optimizer",
    type=click.Choice(["adamw", "muon"]),
    help="adamw, or muon for weight matrices with adamw for the rest (default: the preset's).",
)
@click.option(
    "--muon-lr-mult",
    type=click.FloatRange(min=0, min_open=True),
    help="--optimizer muon: the matrices' learning rate over --lr (default: preset's).",
)
@click.option(
    "--micro-batch",
    type=click.IntRange(min=1),
    help="Windows per forward pass on a rank; the rest of the batch is accumulated.",
)
@click.option("--compile", "compile_model", is_flag=True, help="Run the model under torch.compile.")
@click.option("--log-every", type=click.IntRange(min=1), help="Steps between log records.")
@click.option("--eval-every", type=click.IntRange(min=0), help="Steps between validation passes (0: only at the end).")
@click.option(
    "--save-every", type=click.IntRange(min=1), help="Steps between resume states (default: at each validation pass)."
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes (one per GPU) via torchrun; gloo on CPU, nccl on GPU.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--qat", "qat_format", metavar="FORMAT", help="Quantization-aware training from scratch (ternary, int4, int6, ...)."
)
@click.option("--qat-noise", is_flag=True, help="QAT with ±½-step weight noise instead of rounding.")
@click.option(
    "--qat-ramp",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Fraction of the steps over which the QAT λ ramps 0 -> 1.",
)
@click.option("--act-quant", is_flag=True, help="QAT: 8-bit absmax fake quant of projection inputs.")
def train(
    scheme: str,
    preset: str,
    steps: int | None,
    depth: int | None,
    d_model: int | None,
    heads: int | None,
    seq_len: int | None,
    norm: str | None,
    lr: float | None,
    batch_size: int | None,
    seed: int | None,
    batch_seed: int | None,
    data: str,
    tokenizer: str | None,
    scheme_options: dict,
    out: str,
    resume: bool,
    force: bool,
    device: str,
    as_json: bool,
    no_progress: bool,
    qat_format: str | None = None,
    qat_noise: bool = False,
    qat_ramp: float = 0.5,
    act_quant: bool = False,
    optimizer: str | None = None,
    micro_batch: int | None = None,
    compile_model: bool = False,
    nproc: int = 1,
    log_every: int | None = None,
    eval_every: int | None = None,
    save_every: int | None = None,
    muon_lr_mult: float | None = None,
) -> None:
    """Train a model and write model.safetensors, config.json and train_log.jsonl to --out.

    \b
    Several processes (DistributedDataParallel, --batch-size is the global batch):
      recurnorm train --nproc 8 --preset golf --data shards:DIR --tokenizer SP.model --out R
      torchrun --nproc_per_node=8 -m recurnorm.train --preset golf ... (the same)
    --resume continues a run on any number of processes.
    """
    from pathlib import Path

    from ..evaluate.train_run import TrainRequest, train_run, under_torchrun
    from ..train.presets import get_preset

    hp = (
        get_preset(preset)
        .with_overrides(
            steps=steps,
            lr=lr,
            batch_size=batch_size,
            optimizer=optimizer,
            micro_batch=micro_batch,
            log_every=log_every,
            eval_every=eval_every,
            save_every=save_every,
            muon_lr_mult=muon_lr_mult,
            seed=seed,
            batch_seed=batch_seed,
            compile=compile_model or None,
        )
        .hp
    )
    qat = None
    if qat_format is not None:
        from ..train.qat import QATSpec

        qat = QATSpec(format=qat_format, ramp=qat_ramp, act_quant=act_quant, noise=qat_noise)
    request = TrainRequest(
        out=Path(out),
        hp=hp,
        preset=preset,
        scheme=scheme,
        scheme_options=scheme_options,
        model_overrides={"depth": depth, "d_model": d_model, "n_heads": heads, "seq_len": seq_len, "norm": norm},
        data=data,
        tokenizer=tokenizer,
        resume=resume,
        force=force,
        device=device,
        progress=not no_progress,
        qat=qat,
    )
    if nproc > 1 and not under_torchrun():  # the launcher, not a rank
        from ..train.launch import launch

        request.check(nproc)
        launch(_without_nproc(click.get_current_context().meta["raw_args"]), nproc)
        return

    def announce(start) -> None:
        if start.main_rank and not as_json:
            echo(f"{preset} preset, {start.config.scheme}: {start.size.line()}", err=True)
            for note in start.notes:
                echo(f"note: {note}", err=True)

    run = train_run(request, on_start=announce)
    if not run.main_rank:
        return
    summary = run.summary
    if as_json:
        echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    result, final = run.result, run.final
    pc = summary["params"]
    speed = f"{result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else "already complete"
    echo(f"trained {scheme} ({preset}) for {result.steps} steps in {result.elapsed_s:.1f} s ({speed})")
    echo(
        f"val bpb {final.bits_per_byte:.4f} ({final.nats_per_token:.4f} nats/token "
        f"over {final.tokens:,} tokens of {summary['data']})"
    )
    echo(
        f"params: shared {pc['shared']:,} | step-specific {pc['step_specific']:,} | "
        f"embedding {pc['embedding']:,} | total {pc['total']:,}"
    )
    echo(f"wrote {request.out}/model.safetensors, config.json, train_log.jsonl")
