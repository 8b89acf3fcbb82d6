"""The training loop: AdamW or Muon, warm-up + cosine, clipping, resumable, one or many ranks.

Every hyper-parameter comes in one TrainConfig (recurnorm.train.config), whose
defaults are those of ``recurnorm train`` with no options.

Reproducibility: ``hp.seed`` fixes the initial weights and ``hp.batch_seed`` (default:
``seed``) the batch order, drawn from its own numpy Generator. With
``pair_init`` the parameters a scheme shares with strict sharing start from
the very values the ``shared`` scheme would get, so schemes trained with one
seed differ only in what they add (compare schemes paired: in our own tiny-preset runs
seed noise was as large as the differences between schemes).

Scale-out: under ``torchrun`` (recurnorm.train.distributed) the model is wrapped
in DistributedDataParallel and every rank takes its slice of each step's
global batch, drawn from the same generator; gradient accumulation splits a
rank's slice into micro-batches. Only rank 0 writes. The resume state holds
no rank count, so a run saved on N ranks resumes on M.

Output directory::

    model.safetensors, config.json   final (or latest saved) weights, via save_checkpoint
    train_log.jsonl                  one JSON object per line: train and eval records
    resume.safetensors               weights, optimizer and RNG states; the
                                     step counter and hyper-parameters sit in
                                     its JSON metadata. No pickle anywhere.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save as st_save
from torch import nn
from tqdm import tqdm

from ..errors import CheckpointError, ConfigError, DataError, RecurnormError
from ..io import atomic_write_bytes, atomic_write_text, check_writable
from ..model import ModelConfig, RecurrentLM, save_checkpoint
from . import distributed
from .config import DEFAULT, TrainConfig
from .corpus import Corpus
from .optim import Optimizers, build_optimizer
from .schedule import lr_at

LOG_NAME = "train_log.jsonl"
RESUME_NAME = "resume.safetensors"
# 2: one entry per optimizer (AdamW, Muon); format 1 (a single AdamW) still loads.
RESUME_FORMAT = 2
READABLE_FORMATS = (1, 2)

# Hyper-parameters a resumed run must share with the run it continues (TrainConfig.resume_record).
# The number of ranks and the micro-batch are not among them: they do not change the loss curve.
RESUME_KEYS = tuple(DEFAULT.resume_record())
# What a saved run that predates a key used.
RESUME_DEFAULTS = {"optimizer": "adamw", "muon_lr_mult": 1.0}


@dataclass
class TrainResult:
    """What a training run produced."""

    model: nn.Module
    steps: int  # steps completed in total (including those before a resume)
    final_loss: float | None  # mean training loss over the last log interval
    val_bpb: float | None  # last evaluation, if an eval_fn was given
    elapsed_s: float  # wall time over all runs of this training (resumes add up)
    tokens_per_s: float  # training throughput of this run
    out_dir: Path | None = None
    log: list[dict] = field(default_factory=list)  # records written by this run
    # Set by train_qat: its λ/guard record per evaluation, and the final guard report.
    qat_log: list[dict] = field(default_factory=list)
    qat_guard: dict | None = None


def build_model(config: ModelConfig, seed: int, *, pair_init: bool = True) -> RecurrentLM:
    """A freshly initialized model; with pair_init its shared tensors equal the shared scheme's."""
    torch.manual_seed(seed)
    model = RecurrentLM(config)
    if pair_init and config.scheme != "shared":
        torch.manual_seed(seed)
        reference = RecurrentLM(ModelConfig.from_dict({**config.to_dict(), "scheme": "shared", "scheme_options": {}}))
        copy_matching(model, reference.state_dict())
    return model


def copy_matching(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Copy every tensor of state whose name and shape match one of model's; return the names."""
    own = model.state_dict()
    copied = []
    with torch.no_grad():
        for name, value in state.items():
            if name in own and own[name].shape == value.shape:
                own[name].copy_(value)
                copied.append(name)
    return copied


def train(
    config: ModelConfig,
    corpus: Corpus,
    hp: TrainConfig = DEFAULT,
    *,
    out_dir: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    eval_fn: Callable[[nn.Module], Any] | None = None,
    progress: bool = True,
    model: nn.Module | None = None,
    init_state: dict[str, torch.Tensor] | None = None,
    device: str = "auto",
    on_step: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Train config's model on corpus.train_tokens under hp; see the module docstring for outputs.

    ``hp.batch_size`` is the global batch: windows per optimizer step over all
    ranks. Each rank takes its slice of every step's windows and runs it in
    micro-batches of ``hp.micro_batch`` windows (default: the whole slice),
    accumulating gradients; so the loss curve does not depend on the number of
    ranks or the micro-batch, up to floating-point summation order.

    ``eval_fn(model)`` returns the validation bits per byte (a float or anything
    with ``bits_per_byte``); it runs every ``hp.eval_every`` steps and at the end,
    on every rank (so it may be a distributed evaluation).
    ``model`` trains an existing module (fine-tuning); ``init_state`` overwrites
    the matching tensors of a fresh one. ``on_step(step, record)`` runs after every step.
    """
    hp.check()
    _check_data(config, corpus)
    hparams = hp.resume_record()
    ctx = distributed.context(device)
    dev = ctx.device(device)
    local, micro, accum = batch_split(hp.batch_size, hp.micro_batch, ctx.world_size)

    out = Path(out_dir) if out_dir is not None else None
    saved = None
    if out is not None:
        if resume:
            saved = read_resume_state(out)
            _check_resume_matches(saved, config, hparams, _corpus_id(corpus))
        elif out.exists():
            check_writable(out, force=force, folder=True)
    # Every rank has read and checked --out before the main rank changes anything there.
    ctx.barrier()
    writer = out if ctx.is_main else None

    if model is None:
        model = build_model(config, hp.seed, pair_init=hp.pair_init)
        if init_state is not None:
            copy_matching(model, init_state)
    model.to(dev)
    opt = build_optimizer(
        model,
        hp.optimizer,
        lr=hp.lr,
        weight_decay=hp.weight_decay,
        control_lr_mult=hp.control_lr_mult,
        muon_lr_mult=hp.muon_lr_mult,
    )
    rng = np.random.Generator(np.random.PCG64(hparams["batch_seed"]))
    # Training-time randomness (e.g. noise injection) gets its own stream, apart from init.
    torch.manual_seed(hparams["batch_seed"] + 1)

    start, elapsed_before, meter = 0, 0.0, _Meter()
    if saved is not None:
        start, elapsed_before, meter.loss_sum, meter.loss_count = _restore(saved, model, opt, rng)
    if writer is not None:
        writer.mkdir(parents=True, exist_ok=True)
        _prepare_log(writer / LOG_NAME, keep_until=start if saved is not None else None)
        if saved is None:
            (writer / RESUME_NAME).unlink(missing_ok=True)

    fwd: nn.Module = model
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        fwd = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if hp.compile:
        fwd = torch.compile(fwd)

    steps, batch_size, seq_len = hp.steps, hp.batch_size, config.seq_len
    save_every = hp.save_every or hp.eval_every or steps
    batches = _Batches(corpus.train_tokens, seq_len, rng, ctx, local, micro, accum, dev)

    run_log: list[dict] = []
    last_loss, val_bpb = None, None
    t_run = time.perf_counter()
    bar = tqdm(
        total=steps,
        initial=start,
        unit="step",
        dynamic_ncols=True,
        disable=not progress or not ctx.is_main or not sys.stderr.isatty(),
    )
    model.train()
    try:
        for step in range(start, steps):
            t_step = time.perf_counter()
            distributed.maybe_crash(ctx, step + 1)
            lr_now = lr_at(step, lr=hp.lr, warmup=hp.warmup, steps=steps, min_lr_frac=hp.min_lr_frac)
            for group in opt.param_groups:
                group["lr"] = lr_now * group["lr_scale"]
            step_loss = _train_step(fwd, opt, batches.draw(batch_size), ctx, accum, dev)
            if not math.isfinite(step_loss):
                raise RecurnormError(f"training loss became {step_loss} at step {step + 1}; lower the learning rate")
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp.grad_clip)
            opt.step()

            done = step + 1
            meter.add(step_loss, batch_size * seq_len, time.perf_counter() - t_step)
            bar.update(1)
            records = []
            if done % hp.log_every == 0 or done == steps:
                records.append(meter.record(done, lr_now, grad_norm))
                last_loss = records[-1]["loss"]
                bar.set_postfix(loss=f"{last_loss:.3f}")
            if eval_fn is not None and ((hp.eval_every and done % hp.eval_every == 0) or done == steps):
                result = eval_fn(model)
                model.train()
                val_bpb = float(getattr(result, "bits_per_byte", result))
                records.append({"step": done, "val_bpb": val_bpb})
                bar.set_postfix(loss=f"{last_loss:.3f}" if last_loss else "", val_bpb=f"{val_bpb:.3f}")
            if writer is not None:
                _append_log(writer / LOG_NAME, records)
                if done % save_every == 0 or done == steps:
                    elapsed = elapsed_before + time.perf_counter() - t_run
                    save_checkpoint(model, writer, force=True)
                    state = (model, opt, rng, config, hparams, _corpus_id(corpus))
                    _write_resume(writer / RESUME_NAME, *state, step=done, elapsed=elapsed, loss_acc=meter.carried())
            run_log.extend(records)
            if on_step is not None:
                on_step(done, records[0] if records else {"step": done, "loss": step_loss})
    finally:
        bar.close()

    run_s = time.perf_counter() - t_run
    trained = max(0, steps - start)
    return TrainResult(
        model=model,
        steps=steps,
        final_loss=last_loss,
        val_bpb=val_bpb,
        elapsed_s=elapsed_before + run_s,
        tokens_per_s=trained * batch_size * seq_len / max(meter.total_s, 1e-9),
        out_dir=out,
        log=run_log,
    )


@dataclass
class _Meter:
    """Training loss and throughput since the last log record. Throughput counts only the
    training steps, not evaluation or checkpoint writes."""

    loss_sum: float = 0.0
    loss_count: int = 0
    seconds: float = 0.0
    tokens: int = 0
    total_s: float = 0.0  # every training step of this run

    def add(self, loss: float, tokens: int, seconds: float) -> None:
        self.loss_sum += loss
        self.loss_count += 1
        self.tokens += tokens
        self.seconds += seconds
        self.total_s += seconds

    def record(self, step: int, lr: float, grad_norm) -> dict:
        """The log record of the interval just ended; the interval starts again."""
        record = {
            "step": step,
            "loss": self.loss_sum / self.loss_count,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens_per_s": self.tokens / max(self.seconds, 1e-9),
        }
        self.loss_sum, self.loss_count, self.seconds, self.tokens = 0.0, 0, 0.0, 0
        return record

    def carried(self) -> tuple[float, int]:
        """The loss of the unfinished interval, carried in a resume state."""
        return self.loss_sum, self.loss_count


class _Batches:
    """This rank's micro-batches of each step's global batch, drawn from the one generator."""

    def __init__(self, tokens, seq_len: int, rng, ctx, local: int, micro: int, accum: int, dev) -> None:
        self.tokens, self.rng, self.ctx, self.dev = tokens, rng, ctx, dev
        self.local, self.micro, self.accum = local, micro, accum
        self.n_starts = len(tokens) - seq_len
        self.offsets = np.arange(seq_len + 1)

    def draw(self, batch_size: int) -> list[torch.Tensor]:
        # One draw of the global batch on every rank (the same generator state), so the
        # data order is that of one process whatever the number of ranks.
        starts = self.rng.integers(0, self.n_starts, size=batch_size)
        mine = starts[self.ctx.rank * self.local : (self.ctx.rank + 1) * self.local]
        out = []
        for m in range(self.accum):
            idx = mine[m * self.micro : (m + 1) * self.micro, None] + self.offsets
            batch_BxT1 = torch.from_numpy(np.asarray(self.tokens[idx], dtype=np.int64))
            out.append(batch_BxT1.to(self.dev, non_blocking=True))
        return out


def _train_step(fwd: nn.Module, opt: Optimizers, micro_batches: list[torch.Tensor], ctx, accum: int, dev) -> float:
    """Forward and backward over one step's micro-batches (gradients accumulated); the mean loss over ranks."""
    use_bf16 = dev.type == "cuda"
    opt.zero_grad(set_to_none=True)
    loss_local = 0.0
    for m, batch_BxT1 in enumerate(micro_batches):
        # Gradients are averaged across ranks only on the last micro-batch.
        sync = m == accum - 1 or not ctx.distributed
        with contextlib.nullcontext() if sync else fwd.no_sync():
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
                logits_BxTxV = fwd(batch_BxT1[:, :-1])
            loss = nn.functional.cross_entropy(
                logits_BxTxV.float().reshape(-1, logits_BxTxV.shape[-1]),
                batch_BxT1[:, 1:].reshape(-1),
            )
            (loss / accum if accum > 1 else loss).backward()
        loss_local += loss.item()
    return ctx.mean(loss_local / accum)


def batch_split(batch_size: int, micro_batch: int | None, world: int) -> tuple[int, int, int]:
    """(windows per rank, windows per micro-batch, micro-batches per step); ConfigError if uneven."""
    if batch_size % world:
        raise ConfigError(f"batch_size {batch_size} is not divisible by the {world} ranks")
    local = batch_size // world
    micro = local if micro_batch is None else min(int(micro_batch), local)
    if micro < 1 or local % micro:
        raise ConfigError(
            f"micro_batch {micro_batch} must divide the {local} windows per rank "
            f"(batch_size {batch_size} over {world} rank(s))"
        )
    return local, micro, local // micro


def _check_data(config: ModelConfig, corpus: Corpus) -> None:
    """ConfigError / DataError when the corpus does not fit the model."""
    if corpus.vocab_size > config.vocab_size:
        raise ConfigError(f"vocab_size {config.vocab_size} is smaller than the corpus's {corpus.vocab_size}")
    if len(corpus.train_tokens) <= config.seq_len + 1:
        raise DataError(
            f"corpus {corpus.source}: {len(corpus.train_tokens)} training tokens, "
            f"need more than seq_len + 1 = {config.seq_len + 1}"
        )


# --- logging -----------------------------------------------------------------


def _prepare_log(path: Path, keep_until: int | None) -> None:
    """Start a fresh log, or keep only the records up to the resumed step."""
    lines = []
    if keep_until is not None and path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and json.loads(line).get("step", 0) <= keep_until:
                lines.append(line + "\n")
    atomic_write_text(path, "".join(lines))


def _append_log(path: Path, records: list[dict]) -> None:
    if records:
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


def read_log(out_dir: str | Path) -> list[dict]:
    """The records of DIR/train_log.jsonl."""
    path = Path(out_dir) / LOG_NAME
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


# --- resume state ------------------------------------------------------------


def _write_resume(path, model, opt: Optimizers, rng, config, hparams, corpus_id, *, step, elapsed, loss_acc) -> None:
    """Weights, optimizer and RNG states in one safetensors file, written atomically."""
    tensors = {f"model/{k}": v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
    optimizers = []
    for j, sub in enumerate(opt.optimizers):
        opt_state = sub.state_dict()
        scalars: dict[str, dict] = {}
        for idx, state in opt_state["state"].items():
            for key, value in state.items():
                if torch.is_tensor(value):
                    tensors[f"opt{j}/{idx}/{key}"] = value.detach().cpu().clone().contiguous()
                else:
                    scalars.setdefault(str(idx), {})[key] = value
        groups = [{k: v for k, v in g.items()} for g in opt_state["param_groups"]]
        optimizers.append({"type": type(sub).__name__, "param_groups": groups, "opt_scalars": scalars})
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        tensors["rng/cuda"] = torch.cuda.get_rng_state()
    meta = {
        "format": RESUME_FORMAT,
        "step": step,
        "elapsed_s": elapsed,
        "loss_acc": list(loss_acc),
        "config": config.to_dict(),
        "hparams": hparams,
        "corpus": corpus_id,
        "numpy_rng": rng.bit_generator.state,
        "optimizers": optimizers,
    }
    data = st_save(tensors, metadata={"recurnorm_resume": json.dumps(meta)})
    atomic_write_bytes(path, data)


def read_resume_state(out_dir: str | Path) -> dict:
    """The resume state of DIR: {"meta": {...}, "tensors": {...}}; CheckpointError if absent."""
    path = Path(out_dir) / RESUME_NAME
    if not path.is_file():
        raise CheckpointError(f"{out_dir} has no resume state ({RESUME_NAME}); cannot --resume")
    try:
        tensors = st_load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["recurnorm_resume"])
    except Exception as exc:  # any parse failure means the file is unusable
        raise CheckpointError(f"{path} is not a valid resume state: {exc}") from exc
    if meta.get("format") not in READABLE_FORMATS:
        raise CheckpointError(f"{path}: unsupported resume format {meta.get('format')!r}")
    if meta["format"] == 1:  # one AdamW: its tensors were "opt/<idx>/<key>"
        meta["optimizers"] = [
            {"type": "AdamW", "param_groups": meta.pop("param_groups"), "opt_scalars": meta.pop("opt_scalars")}
        ]
        tensors = {("opt0/" + k[4:] if k.startswith("opt/") else k): v for k, v in tensors.items()}
    return {"meta": meta, "tensors": tensors}


def _corpus_id(corpus: Corpus) -> dict:
    """What identifies the training data in a resume state."""
    return {
        "source": corpus.source,
        "tokenizer": corpus.tokenizer,
        "train_tokens": len(corpus.train_tokens),
    }


def _check_resume_matches(saved: dict, config: ModelConfig, hparams: dict, corpus_id: dict) -> None:
    """A resumed run must use the saved config, hyper-parameters and data, or it would not match."""
    meta = saved["meta"]
    if meta["corpus"] != corpus_id:
        raise DataError(f"--resume: the corpus is {corpus_id}, the saved run trained on {meta['corpus']}")
    for key, value in config.to_dict().items():
        if meta["config"].get(key) != value:
            raise ConfigError(
                f"--resume: model config field {key} is {value!r}, the saved run used {meta['config'].get(key)!r}"
            )
    for key in RESUME_KEYS:
        was = meta["hparams"].get(key, RESUME_DEFAULTS.get(key))
        if was != hparams[key]:
            raise ConfigError(f"--resume: {key} is {hparams[key]!r}, the saved run used {was!r}")


def _restore(saved: dict, model, opt: Optimizers, rng) -> tuple[int, float, float, int]:
    """Load weights, optimizer and RNG states; return (step, elapsed, loss_sum, loss_count)."""
    meta, tensors = saved["meta"], saved["tensors"]
    model_state = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
    try:
        model.load_state_dict(model_state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"resume state does not fit the model: {exc}") from exc
    if len(meta["optimizers"]) != len(opt.optimizers):
        raise CheckpointError(
            f"resume state holds {len(meta['optimizers'])} optimizer(s), the {opt.name} run has {len(opt.optimizers)}"
        )
    device = distributed.device_of(model)
    for j, (sub, entry) in enumerate(zip(opt.optimizers, meta["optimizers"], strict=True)):
        state: dict[int, dict] = {}
        prefix = f"opt{j}/"
        for key, value in tensors.items():
            if key.startswith(prefix):
                _, idx, name = key.split("/", 2)
                state.setdefault(int(idx), {})[name] = value.to(device)
        for idx, extra in entry["opt_scalars"].items():
            state.setdefault(int(idx), {}).update(extra)
        sub.load_state_dict({"state": state, "param_groups": entry["param_groups"]})
    torch.set_rng_state(tensors["rng/torch"])
    if "rng/cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng/cuda"])
    rng.bit_generator.state = meta["numpy_rng"]
    loss_sum, loss_count = meta["loss_acc"]
    return int(meta["step"]), float(meta["elapsed_s"]), float(loss_sum), int(loss_count)
