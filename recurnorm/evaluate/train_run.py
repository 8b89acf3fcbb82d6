"""One training run as `recurnorm train` does it: corpus, model config, size estimate, train, score.

The command only parses its options into a TrainRequest and prints what
``train_run`` returns, so a library caller gets the very run the CLI gets.
It sits in evaluate/ because it uses every stage below: train/ (the loop, QAT),
export/ (the size estimate) and evaluate/ (the validation loss).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, OutputExistsError
from ..train.config import DEFAULT, TrainConfig


@dataclass(frozen=True)
class TrainRequest:
    """What to train: a model shape (a preset's, with overrides), its TrainConfig, data and output."""

    out: Path
    hp: TrainConfig = DEFAULT  # the preset's (train.presets.get_preset(name).hp) with overrides
    preset: str = "tiny"  # the model shape, and the name the summary records
    scheme: str = "shared"
    scheme_options: dict = field(default_factory=dict)
    model_overrides: dict = field(default_factory=dict)  # ModelConfig fields over the preset's
    data: str = "default"  # train.data.load_corpus's spelling
    tokenizer: str | None = None
    resume: bool = False
    force: bool = False
    device: str = "auto"
    progress: bool = True
    qat: Any = None  # a train.qat.QATSpec: QAT from scratch

    def check(self, world: int) -> None:
        """Refuse before any work: an existing --out without force or resume, QAT over ranks."""
        if Path(self.out).exists() and not (self.force or self.resume):
            raise OutputExistsError(f"{self.out} exists; pass --force to overwrite it or --resume")
        if world > 1 and self.qat is not None:
            raise ConfigError("--qat runs in one process (its guard log is written per rank)")


@dataclass
class TrainStart:
    """What is known before the first step: the model config, the size estimate, notes."""

    config: Any  # a ModelConfig
    corpus: Any  # a train.corpus.Corpus
    size: Any  # export.plan's estimate under the default int8 export (main rank only, else None)
    notes: list[str]
    main_rank: bool


@dataclass
class TrainRun:
    """The finished run: the loop's TrainResult, the final validation loss, the summary record."""

    result: Any  # train.loop.TrainResult
    final: Any  # evaluate.loss.LossResult
    summary: dict
    main_rank: bool


def train_run(request: TrainRequest, on_start: Callable[[TrainStart], None] | None = None) -> TrainRun:
    """Train what request asks for on this rank (under torchrun: one of several) and score it.

    ``on_start(start)`` runs once the config and size estimate are known, before training.
    """
    from ..model import ModelConfig
    from ..train.data import load_corpus
    from ..train.distributed import env_world
    from ..train.presets import get_preset

    rank, world, _ = env_world()
    request.check(world)
    shape = get_preset(request.preset).model
    corpus = load_corpus(request.data, tokenizer=request.tokenizer)
    overrides = {k: v for k, v in request.model_overrides.items() if v is not None}
    config = ModelConfig.from_dict(
        {
            **shape,
            "vocab_size": corpus.vocab_size,
            "scheme": request.scheme,
            "scheme_options": request.scheme_options,
            **overrides,
        }
    )
    start = TrainStart(config, corpus, None, [], rank == 0)
    if start.main_rank:
        from ..export.plan import predict_size
        from ..export.spec import build_policy

        # What `recurnorm plan` predicts for this config under the default int8 export.
        start.size = predict_size(config, build_policy("int8"))
        if config.vocab_size != shape.get("vocab_size", config.vocab_size):
            start.notes.append(
                f"{request.preset} is sized for vocab {shape['vocab_size']}; this corpus "
                f"has {config.vocab_size} (pass --data shards:DIR --tokenizer MODEL)"
            )
    if on_start is not None:
        on_start(start)
    result, final = _train_and_score(request, config, corpus)
    summary = {
        "scheme": request.scheme,
        "preset": request.preset,
        "steps": result.steps,
        "val_bpb": final.bits_per_byte,
        "val_nats_per_token": final.nats_per_token,
        "val_tokens": final.tokens,
        "final_train_loss": result.final_loss,
        "params": result.model.param_counts(),
        "train_s": result.elapsed_s,
        "tokens_per_s": result.tokens_per_s,
        "data": corpus.source,
        "optimizer": request.hp.optimizer,
        "estimated_artifact_bytes": start.size.predicted_bytes if start.size is not None else None,
        "ranks": world,
        "out": str(request.out),
        "config": config.to_dict(),
    }
    return TrainRun(result, final, summary, start.main_rank)


def _train_and_score(request: TrainRequest, config, corpus):
    """(TrainResult, final LossResult): train (or QAT-train) with validation passes, then score."""
    from ..train.distributed import device_of
    from ..train.loop import train
    from .loss import loss

    last = {}

    def evaluate(model):
        # Split over the ranks; under bf16 autocast on a GPU, as training ran (the FineWeb
        # validation split is 62M tokens: fp32 would cost minutes of a ten-minute budget).
        on_gpu = device_of(model).type == "cuda"
        last["loss"] = loss(model, corpus, distributed=True, bf16=on_gpu)
        return last["loss"]

    run = dict(
        out_dir=Path(request.out),
        resume=request.resume,
        force=request.force,
        eval_fn=evaluate,
        progress=request.progress,
        device=request.device,
    )
    if request.qat is not None:  # QAT from scratch: fake quant hooked in before the optimizer
        from ..train.qat import train_qat

        result = train_qat(config, corpus, request.qat, request.hp, **run)
    else:
        result = train(config, corpus, request.hp, **run)
    final = last.get("loss") or evaluate(result.model)  # resumed a finished run
    return result, final


def under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun job (the launcher is not)."""
    return "WORLD_SIZE" in os.environ
