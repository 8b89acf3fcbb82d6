"""Quantization-aware training: fake quantization on every projection, a λ schedule, a guard.

Why: quantization error of a shared block is amplified over the loop (~900× over 3 loops,
as Parameter Golf participants found: https://github.com/openai/parameter-golf), and
training through the quantizer cures it.

- ``apply_qat(model, spec)`` hooks a `QATTransform` into every projection's
  ``Linear.weight_transform``: forward ``w + λ·(q(w) − w)`` with the
  straight-through gradient (as ``quant.fake.fake_quant``), where ``q`` is the
  export quantizer itself, so at λ = 1 the forward sees bit for bit the values
  the artifact will hold. Ternary gets the extra RMSNorm (Steinmetz et al.) on
  every projection input first. ``act_quant`` adds 8-bit absmax fake
  quantization of every projection input (after its extra norm); it is not
  ramped. ``noise`` (grid formats, meant for intN): while the module trains,
  the forward is ``w + λ·u·step`` with ``u ~ U(−½, ½)`` and ``step`` the
  quantizer's per-group scale (noise one step wide *instead of* the rounding,
  as the Parameter Golf looped-core fix did); in eval mode it is the exact
  fake quant, so evaluation and export agree.
- λ schedule: ``λ = min(step / (ramp·steps), 1)``. ``stepwise`` ramps untied
  blocks (scheme ``unique``) one after another: block i of n reaches λ = 1 at
  ``ramp·steps·(i+1)/n``. A shared block serves every step with one weight,
  so stepwise is a no-op there (documented choice, not an error).
- ``config.qat`` records ``{"format", "options", "ramp", "act_quant", "noise",
  "stepwise", "extra_norm"}``. A model rebuilt from an *artifact* already holds
  the dequantized grid weights; re-quantizing them is not a fixed point (ternary
  absmean: ``mean|s·Q| ≠ s``), so artifact models get only the activation hooks
  (``weights=False``); exports mark ``config.qat["exported"] = True``.
- Exporting a QAT model (``qat_policy``, ``export_qat``) and loading a checkpoint
  or artifact as the model it is (``load_model``) live in `recurnorm.export`:
  train/ never touches artifacts (docs/DESIGN.md, one-way flow).
- ``check_qat`` (the guard) raises `QATGuardError` when the forward pass does
  not really use quantized weights (missing/replaced transforms, transforms
  never called — e.g. folded away by torch.compile — or logits that do not
  move the way the quantized weights predict).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError, RecurnormError
from ..model.lm import projection_block
from ..model.run import device_of
from ..quant.fake import absmax_act_quant, quantize_dequantize, ste_mix
from .config import DEFAULT, TrainConfig

DEFAULT_RAMP = 0.5
QAT_KEYS = ("format", "options", "ramp", "act_quant", "noise", "stepwise", "extra_norm", "exported")


class QATGuardError(RecurnormError):
    """QAT is configured but the forward pass does not use the quantized weights."""


@dataclass
class QATSpec:
    """What QAT trains against; `to_dict()` is what config.qat records."""

    format: str
    options: dict[str, Any] = field(default_factory=dict)
    ramp: float = DEFAULT_RAMP  # fraction of the steps over which λ goes 0 -> 1
    act_quant: bool = False  # 8-bit absmax fake quant of projection inputs
    noise: bool = False  # train with uniform ±½-step noise instead of rounding
    stepwise: bool = False  # untied blocks reach λ = 1 one after another
    extra_norm: bool | None = None  # None: True for ternary, False otherwise
    exported: bool = False  # weights already on the grid (rebuilt from an artifact)

    def __post_init__(self) -> None:
        if self.extra_norm is None:
            self.extra_norm = self.format == "ternary"
        self.validate()

    def validate(self) -> QATSpec:
        """ConfigError naming the bad field; the quantizer itself checks format and options."""
        from ..quant import get
        from ..quant.grid import GridQuantizer

        if not isinstance(self.format, str):
            raise ConfigError(f"qat format must be a string, got {self.format!r}")
        if not isinstance(self.options, dict):
            raise ConfigError(f"qat options must be a dict, got {self.options!r}")
        ramp = self.ramp
        if isinstance(ramp, bool) or not isinstance(ramp, (int, float)) or not 0.0 <= ramp <= 1.0:
            raise ConfigError(f"qat ramp must be a fraction in [0, 1], got {ramp!r}")
        for name in ("act_quant", "noise", "stepwise", "extra_norm", "exported"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"qat {name} must be true or false, got {getattr(self, name)!r}")
        quantizer = get(self.format, **self.options)  # QuantError on unknown format/option
        if self.noise and not isinstance(quantizer, GridQuantizer):
            raise ConfigError(f"qat noise needs a grid format (intN, ternary), not {self.format!r}")
        return self

    def quantizer(self):
        """The export quantizer this spec trains against."""
        from ..quant import get

        return get(self.format, **self.options)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record for config.qat."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | QATSpec) -> QATSpec:
        """A spec from config.qat; unknown keys raise ConfigError."""
        if isinstance(d, QATSpec):
            return d
        if not isinstance(d, dict) or "format" not in d:
            raise ConfigError(f"config.qat must be a dict with a 'format', got {d!r}")
        unknown = sorted(set(d) - set(QAT_KEYS))
        if unknown:
            raise ConfigError(f"unknown config.qat field {unknown[0]!r}; known: {', '.join(QAT_KEYS)}")
        return cls(**{**d, "options": dict(d.get("options") or {})})


def lam_at(step: int, total_steps: int, ramp: float, *, index: int = 0, count: int = 1) -> float:
    """λ = min(step / K, 1), K = ramp·total_steps·(index+1)/count (stepwise: block index of count)."""
    k = ramp * total_steps * (index + 1) / max(count, 1)
    if k <= 0:
        return 1.0
    return float(min(max(step, 0) / k, 1.0))


class QATState:
    """Per-model QAT runtime: the spec, the current step and λ, the transforms and hooks."""

    def __init__(self, spec: QATSpec, n_blocks: int, weights: bool):
        self.spec = spec
        self.quantizer = spec.quantizer()
        self.n_blocks = n_blocks
        self.weights = weights  # fake-quantize weights (False: exported grid weights)
        self.total_steps: int | None = None  # None: λ = 1 (a finished QAT model)
        self.step = 0
        self.bypass_weights = False
        self.bypass_acts = False
        self.transforms: dict[str, QATTransform] = {}
        self.hooks: list[Any] = []

    def lam(self, block: int = 0) -> float:
        """λ for the projections of block `block` at the current step."""
        if self.total_steps is None:
            return 1.0
        count = self.n_blocks if self.spec.stepwise else 1
        index = block if self.spec.stepwise else 0
        return lam_at(self.step, self.total_steps, self.spec.ramp, index=index, count=count)

    def set_step(self, step: int, total_steps: int | None = None) -> None:
        """Move the schedule to `step` (λ for the next forward passes)."""
        if total_steps is not None:
            self.total_steps = total_steps
        self.step = step

    @contextmanager
    def bypassed(self, weights: bool = True, acts: bool = False):
        """Temporarily run the float model (weights and/or activations unquantized)."""
        old = self.bypass_weights, self.bypass_acts
        self.bypass_weights, self.bypass_acts = weights or old[0], acts or old[1]
        try:
            yield
        finally:
            self.bypass_weights, self.bypass_acts = old


class QATTransform:
    """A Linear.weight_transform: fake quant (or noise) at the state's λ; counts its calls."""

    def __init__(self, state: QATState, lin: nn.Module, block: int):
        self.state, self.lin, self.block = state, lin, block
        self.calls = 0
        # q(w) (or the noise) is recomputed only when the weight changes: a shared
        # block calls its transform once per step of the loop.
        self._key: tuple | None = None
        self._cached: Tensor | None = None

    def _cache_key(self, w: Tensor, kind: str) -> tuple:
        return (kind, w.data_ptr(), w._version, w.device, w.dtype)

    def _quantized(self, w: Tensor) -> Tensor:
        key = self._cache_key(w, "q")
        if key != self._key or self._cached is None:
            self._cached, self._key = quantize_dequantize(w, self.state.quantizer), key
        return self._cached

    def _noise(self, w: Tensor) -> Tensor:
        key = self._cache_key(w, "noise")
        if key != self._key or self._cached is None:
            quantizer = self.state.quantizer
            with torch.no_grad():
                w32 = w.detach().float().cpu()
                step_G = quantizer.fit_tensor(w32)[0]
                G, L = quantizer.layout(tuple(w.shape))
                u_GxL = torch.rand(G, L) - 0.5
                noise = (u_GxL * step_G[:, None]).reshape(-1)[: w.numel()].reshape(w.shape)
            self._cached, self._key = noise.to(device=w.device, dtype=w.dtype), key
        return self._cached

    def __call__(self, w: Tensor) -> Tensor:
        self.calls += 1
        st = self.state
        if st.bypass_weights or not st.weights:
            return w
        lam = st.lam(self.block)
        if lam == 0.0:
            return w
        if st.spec.noise and self.lin.training:
            return w + lam * self._noise(w)
        return ste_mix(w, self._quantized(w), lam)


def _act_hook(state: QATState) -> tuple[Callable, Callable]:
    """(forward hook for an input_norm, pre-hook for a Linear) that fake-quantize activations."""

    def post(module, args, output):
        return output if state.bypass_acts else absmax_act_quant(output)

    def pre(module, args):
        if state.bypass_acts:
            return None
        return (absmax_act_quant(args[0]),) + tuple(args[1:])

    return post, pre


def apply_qat(
    model: nn.Module,
    spec: QATSpec | dict,
    *,
    weights: bool | None = None,
    total_steps: int | None = None,
) -> QATState:
    """Hook QAT into every projection; record spec in config.qat; λ = 1 unless total_steps is set.

    ``weights=None`` fake-quantizes weights unless ``spec.exported`` (an artifact's grid weights).
    """
    spec = QATSpec.from_dict(spec)
    if getattr(model, "qat_state", None) is not None:
        remove_qat(model)
    if spec.extra_norm:
        from ..quant.extra_norm import add_extra_norm

        add_extra_norm(model)
    weights = (not spec.exported) if weights is None else weights
    projections = model.projections()
    n_blocks = len({projection_block(n) for n, _ in projections})
    state = QATState(spec, n_blocks, weights)
    state.total_steps = total_steps
    for name, lin in projections:
        transform = QATTransform(state, lin, projection_block(name))
        state.transforms[name] = transform
        lin.weight_transform = transform
    if spec.act_quant:
        post, pre = _act_hook(state)
        for _, lin in projections:
            if lin.input_norm is not None:
                state.hooks.append(lin.input_norm.register_forward_hook(post))
            else:
                state.hooks.append(lin.register_forward_pre_hook(pre))
    record = spec.to_dict()
    record["exported"] = spec.exported or not weights
    model.config.qat = record
    model.qat_state = state
    return state


def remove_qat(model: nn.Module, *, forget: bool = False) -> nn.Module:
    """Take the transforms and hooks off (the float model); forget=True also clears config.qat."""
    state = getattr(model, "qat_state", None)
    for name, lin in model.projections():
        if state is None or lin.weight_transform is state.transforms.get(name):
            lin.weight_transform = None
    if state is not None:
        for handle in state.hooks:
            handle.remove()
    model.qat_state = None
    if forget:
        model.config.qat = None
    return model


def qat_state(model: nn.Module) -> QATState | None:
    """The QAT runtime of a model, or None."""
    return getattr(model, "qat_state", None)


# --- the guard --------------------------------------------------------------


def guard_batch(config, batch_size: int = 2, seq_len: int = 32, seed: int = 0) -> Tensor:
    """A fixed token batch (seeded; independent of the global RNG) for the guard."""
    gen = torch.Generator().manual_seed(seed)
    T = min(seq_len, config.seq_len)
    return torch.randint(0, config.vocab_size, (batch_size, T), generator=gen)


@torch.no_grad()
def check_qat(model: nn.Module, batch_BxT: Tensor | None = None, *, min_ratio: float = 0.5) -> dict:
    """Raise QATGuardError unless the forward pass really uses the quantized weights.

    Three forwards on a fixed batch: live (fake quant as configured), float
    (transforms bypassed) and expected (weights replaced in place by
    ``w + λ·(q(w) − w)`` computed with the quantizer directly, transforms
    bypassed). Live must have moved from float by at least ``min_ratio`` of
    the expected move and lie closer to expected than that; every transform
    must have been called. Returns λ and the logit distances (relative RMS).
    """
    state = qat_state(model)
    config = getattr(model, "config", None)
    if state is None:
        raise QATGuardError(
            "QAT guard: forward pass did not use quantized weights (no QAT state on the model; "
            "apply_qat was not called or was removed)"
        )
    projections = model.projections()
    wrong = [n for n, lin in projections if lin.weight_transform is not state.transforms.get(n)]
    if wrong:
        raise QATGuardError(
            f"QAT guard: forward pass did not use quantized weights (weight_transform missing or "
            f"replaced on {len(wrong)} of {len(projections)} projections, e.g. {wrong[0]})"
        )
    batch = (guard_batch(config) if batch_BxT is None else batch_BxT).to(device_of(model))
    was_training = model.training
    model.eval()
    try:
        for t in state.transforms.values():
            t.calls = 0
        live = model(batch).float()
        uncalled = [n for n, t in state.transforms.items() if t.calls == 0]
        if uncalled:
            raise QATGuardError(
                f"QAT guard: forward pass did not use quantized weights (weight_transform of "
                f"{len(uncalled)} projections never called, e.g. {uncalled[0]}; a compiled or "
                "custom forward may have folded it away)"
            )
        lam_max = max(state.lam(t.block) for t in state.transforms.values())
        with state.bypassed(weights=True):
            float_ = model(batch).float()
            expected = _expected_logits(model, state, batch) if state.weights else float_
    finally:
        model.train(was_training)
    scale = float(float_.square().mean().sqrt().clamp(min=1e-12))

    def dist(a: Tensor, b: Tensor) -> float:
        return float((a - b).square().mean().sqrt()) / scale

    d_exp, d_live, err = dist(expected, float_), dist(live, float_), dist(live, expected)
    report = {
        "qat_lambda": lam_max,
        "logit_gap": d_live,
        "expected_gap": d_exp,
        "mismatch": err,
        "calls": sum(t.calls for t in state.transforms.values()),
    }
    if state.weights and lam_max > 0 and d_exp > 1e-6:
        if d_live < min_ratio * d_exp or err > min_ratio * d_exp:
            raise QATGuardError(
                f"QAT guard: forward pass did not use quantized weights (λ={lam_max:.3g}: "
                f"logits moved {d_live:.3g} from the float model, quantized weights predict "
                f"{d_exp:.3g}; mismatch {err:.3g})"
            )
    return report


def _expected_logits(model: nn.Module, state: QATState, batch: Tensor) -> Tensor:
    """Logits with each projection weight replaced in place by w + λ(q(w) − w), then restored."""
    saved = {}
    try:
        for name, lin in model.projections():
            w = lin.weight
            saved[name] = w.detach().clone()
            lam = state.lam(state.transforms[name].block)
            w.copy_(ste_mix(w, quantize_dequantize(w, state.quantizer), lam))
        return model(batch).float()
    finally:
        for name, lin in model.projections():
            if name in saved:
                lin.weight.copy_(saved[name])


# --- training ----------------------------------------------------------------


def fine_tune_warmup(warmup: int, steps: int) -> int:
    """Warm-up steps of a QAT fine-tune: the preset's, but at most a tenth of its steps."""
    return min(int(warmup), steps // 10)


def train_qat(
    config_or_model,
    corpus,
    spec: QATSpec | dict,
    hp: TrainConfig = DEFAULT,
    *,
    out_dir=None,
    eval_fn: Callable[[nn.Module], Any] | None = None,
    float_eval: bool = True,
    resume: bool = False,
    **run_kwargs,
):
    """QAT from scratch (a ModelConfig) or fine-tuning (a model) through train.loop.train under hp.

    λ follows the schedule via the loop's ``on_step``; at each evaluation the
    guard runs, and λ, the guard's logit gap and (``float_eval``) the float
    model's bpb are appended to train_log.jsonl. The returned TrainResult has
    ``qat_log`` (those records) and ``qat_guard`` (the final guard report).
    """
    from ..model import ModelConfig
    from .loop import LOG_NAME, build_model, read_resume_state
    from .loop import train as run_training

    steps = hp.steps
    spec = QATSpec.from_dict(spec)
    if isinstance(config_or_model, ModelConfig):
        config = config_or_model
        config.extra_norm = config.extra_norm or bool(spec.extra_norm)
        config.qat = {**spec.to_dict(), "exported": False}
        config.validate()
        model = build_model(config, hp.seed, pair_init=hp.pair_init)
    else:
        model = config_or_model
        config = model.config
    state = apply_qat(model, spec, weights=True, total_steps=steps)
    start = 0
    if resume and out_dir is not None:
        start = int(read_resume_state(out_dir)["meta"]["step"])
    state.set_step(start)
    guard_tokens = guard_batch(config)
    pending: list[dict] = []
    qat_log: list[dict] = []

    eval_every = hp.eval_every

    def guard_record(m: nn.Module) -> dict:
        report = check_qat(m, guard_tokens)
        return {"qat_lambda": state.lam(), **{k: report[k] for k in ("logit_gap", "expected_gap", "mismatch")}}

    def qat_eval(m: nn.Module):
        rec = guard_record(m)
        result = eval_fn(m)
        rec["qat_val_bpb"] = float(getattr(result, "bits_per_byte", result))
        if float_eval:
            with state.bypassed(weights=True, acts=True):
                f = eval_fn(m)
            rec["float_val_bpb"] = float(getattr(f, "bits_per_byte", f))
            rec["qat_gap_bpb"] = rec["qat_val_bpb"] - rec["float_val_bpb"]
        pending.append(rec)
        return result

    def on_step(done: int, record: dict) -> None:
        state.set_step(done)
        if eval_fn is None and ((eval_every and done % eval_every == 0) or done == steps):
            pending.append(guard_record(model))  # no evaluation: the guard still runs
        if pending:
            rec = {"step": done, **pending.pop()}
            pending.clear()
            qat_log.append(rec)
            if out_dir is not None:
                with open(Path(out_dir) / LOG_NAME, "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")

    result = run_training(
        config,
        corpus,
        hp,
        out_dir=out_dir,
        model=model,
        eval_fn=qat_eval if eval_fn is not None else None,
        resume=resume,
        on_step=on_step,
        **run_kwargs,
    )
    state.set_step(steps)
    guard = check_qat(model, guard_tokens)
    model.eval()
    return replace(result, qat_log=qat_log, qat_guard=guard)
