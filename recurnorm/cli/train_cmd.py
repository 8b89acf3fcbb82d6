"""`recurnorm train`: train one shared-depth model from a preset, print its summary.

With ``--nproc N`` the same arguments run on N ranks under torchrun
(recurnorm.train.launch); each rank runs this command as
``python -m recurnorm.train``, and only rank 0 prints.
"""

from __future__ import annotations

import json
import os

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
@click.option("--seed", type=int, default=0, show_default=True, help="Initialization seed.")
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
    seed: int,
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

    from ..errors import ConfigError, OutputExistsError
    from ..evaluate import loss
    from ..model import ModelConfig
    from ..train.data import load_corpus
    from ..train.distributed import device_of, env_world
    from ..train.loop import train as run_training
    from ..train.presets import get_preset

    out_dir = Path(out)
    if out_dir.exists() and not (force or resume):
        raise OutputExistsError(f"{out_dir} exists; pass --force to overwrite it or --resume")
    p = get_preset(preset).with_overrides(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        optimizer=optimizer,
        micro_batch=micro_batch,
        log_every=log_every,
        eval_every=eval_every,
        save_every=save_every,
        muon_lr_mult=muon_lr_mult,
    )
    rank, world, _ = env_world()
    if nproc > 1 and "WORLD_SIZE" not in os.environ:  # the launcher, not a rank
        if qat_format is not None:
            raise ConfigError("--qat runs in one process (its guard log is written per rank)")
        from ..train.launch import launch

        launch(_without_nproc(click.get_current_context().meta["raw_args"]), nproc)
        return
    if world > 1 and qat_format is not None:
        raise ConfigError("--qat runs in one process (its guard log is written per rank)")
    main_rank = rank == 0
    corpus = load_corpus(data, tokenizer=tokenizer)
    overrides = {"depth": depth, "d_model": d_model, "n_heads": heads, "seq_len": seq_len, "norm": norm}
    config = ModelConfig.from_dict(
        {
            **p.model,
            "vocab_size": corpus.vocab_size,
            "scheme": scheme,
            "scheme_options": scheme_options,
            **{k: v for k, v in overrides.items() if v is not None},
        }
    )

    size = None
    if main_rank:
        from ..export.plan import predict_size
        from ..export.spec import build_policy

        # What `recurnorm plan` predicts for this config under the default int8 export.
        size = predict_size(config, build_policy("int8"))
    if main_rank and not as_json:
        echo(f"{preset} preset, {config.scheme}: {size.line()}", err=True)
        if config.vocab_size != p.model.get("vocab_size", config.vocab_size):
            echo(
                f"note: {preset} is sized for vocab {p.model['vocab_size']}; this corpus "
                f"has {config.vocab_size} (pass --data shards:DIR --tokenizer MODEL)",
                err=True,
            )
    last = {}

    def evaluate(model):
        # Split over the ranks; under bf16 autocast on a GPU, as training ran (the FineWeb
        # validation split is 62M tokens: fp32 would cost minutes of a ten-minute budget).
        on_gpu = device_of(model).type == "cuda"
        last["loss"] = loss(model, corpus, distributed=True, bf16=on_gpu)
        return last["loss"]

    run = dict(
        seed=seed,
        batch_seed=batch_seed,
        out_dir=out_dir,
        resume=resume,
        force=force,
        eval_fn=evaluate,
        progress=not no_progress,
        device=device,
        **p.train_kwargs(),
    )
    if qat_format is not None:  # QAT from scratch: fake quant hooked in before the optimizer
        from ..train.qat import QATSpec, train_qat

        spec = QATSpec(format=qat_format, ramp=qat_ramp, act_quant=act_quant, noise=qat_noise)
        result = train_qat(config, corpus, spec, **run)
    else:
        result = run_training(config, corpus, compile=compile_model, **run)
    final = last.get("loss") or evaluate(result.model)  # resumed a finished run
    if not main_rank:
        return
    summary = {
        "scheme": scheme,
        "preset": preset,
        "steps": result.steps,
        "val_bpb": final.bits_per_byte,
        "val_nats_per_token": final.nats_per_token,
        "val_tokens": final.tokens,
        "final_train_loss": result.final_loss,
        "params": result.model.param_counts(),
        "train_s": result.elapsed_s,
        "tokens_per_s": result.tokens_per_s,
        "data": corpus.source,
        "optimizer": p.optimizer,
        "estimated_artifact_bytes": size.predicted_bytes,
        "ranks": world,
        "out": str(out_dir),
        "config": config.to_dict(),
    }
    if as_json:
        echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    pc = summary["params"]
    speed = f"{result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else "already complete"
    echo(f"trained {scheme} ({preset}) for {result.steps} steps in {result.elapsed_s:.1f} s ({speed})")
    echo(
        f"val bpb {final.bits_per_byte:.4f} ({final.nats_per_token:.4f} nats/token "
        f"over {final.tokens:,} tokens of {corpus.source})"
    )
    echo(
        f"params: shared {pc['shared']:,} | step-specific {pc['step_specific']:,} | "
        f"embedding {pc['embedding']:,} | total {pc['total']:,}"
    )
    echo(f"wrote {out_dir}/model.safetensors, config.json, train_log.jsonl")
