"""GPTQ export: the policy decides each tensor's format; GPTQ chooses the codes of the grid ones.

Works on recurnorm models (hooks on each projection, after its extra norm) and
on any model a ``--model-factory`` builds (hooks on its ``nn.Linear`` modules).
Calibration windows come from the *training* split only, as the Parameter Golf challenge
requires (https://github.com/openai/parameter-golf).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError
from ..model.checkpoint import state_dict_for_export
from ..quant.passthrough import FLOAT_FORMATS
from ..quant.qtensor import QTensor
from .policy import GPTQ_MARK, ExportPolicy, Plan

DEFAULT_CALIB_TOKENS = 32768


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(state-dict prefix, module) of every weight GPTQ can see the inputs of."""
    if hasattr(model, "projections"):
        return list(model.projections())
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def calibration_windows(
    model: nn.Module, train_tokens, n_tokens: int = DEFAULT_CALIB_TOKENS, seq_len: int | None = None
) -> list[Tensor]:
    """Training-split windows [B, seq_len] of the model's own context length."""
    from ..model.run import seq_len_of
    from ..quant.gptq import calibration_batches

    seq = seq_len or seq_len_of(model)
    if seq is None:
        raise ConfigError(
            "calibration: the model does not say its context length (seq_len, block_size, "
            "max_seq_len or train_seq_len on it or its config): set model.seq_len = N in the "
            "model factory, or pass seq_len="
        )
    return calibration_batches(np.asarray(train_tokens), seq, n_tokens)


def _key(t: Tensor) -> tuple:
    """What identifies a weight or a view of one: storage, offset, shape, strides."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


class _MatmulInputs(TorchFunctionMode):
    """Σ xxᵀ of the inputs of every F.linear(x, W) and x @ Wᵀ whose W is a known weight or a
    view of one (a slice of a bank): no nn.Linear needed. ``weights``: {key: tensor name}."""

    LINEAR = frozenset({F.linear, torch._C._nn.linear})
    MATMUL = frozenset({torch.matmul, Tensor.__matmul__, torch.mm, Tensor.matmul, Tensor.mm})

    def __init__(self, weights: dict[tuple, str], store: dict[str, Tensor]):
        super().__init__()
        self.weights, self.store = weights, store

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = w = None
        if func in self.LINEAR and len(args) >= 2:
            x, w = args[0], args[1]
        elif func in self.MATMUL and len(args) == 2 and isinstance(args[1], Tensor) and args[1].dim() == 2:
            x, w = args[0], args[1].mT  # x @ Wᵀ: W [out, in] seen transposed
        if isinstance(w, Tensor) and isinstance(x, Tensor) and w.dim() == 2:
            name = self.weights.get(_key(w))
            if name is not None and x.shape[-1] == w.shape[1]:
                x_NxD = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
                h = x_NxD.T @ x_NxD
                self.store[name] = self.store[name] + h if name in self.store else h
        return func(*args, **kwargs)


def collect_all_hessians(
    model: nn.Module, batches, state: dict[str, Tensor], forward=None, progress=None
) -> dict[str, Tensor]:
    """{weight name: H} of every matrix of `state` (an unbanked state: slices of stacks too)
    whose inputs a forward shows: recurnorm's projections and nn.Linear modules through their
    hooks (after an extra norm where there is one), any other weight or slice of one through
    the F.linear / matmul calls that use it (a tied embedding used as the head, a bank's slices)."""
    from ..quant.gptq import collect_hessians

    say = progress or (lambda _m: None)
    layers = linear_layers(model)
    hooked = {f"{n}.weight" for n, _ in layers}
    weights = {}
    if not hasattr(model, "projections"):  # recurnorm models: their projections, as before
        weights = {_key(t): n for n, t in state.items() if t.dim() == 2 and t.is_floating_point() and n not in hooked}
    store: dict[str, Tensor] = {}
    batches = list(batches)
    done = []

    def run(m, batch):
        done.append(1)
        say(f"gptq: calibration batch {len(done)}/{len(batches)}")
        with _MatmulInputs(weights, store):
            return m(batch) if forward is None else forward(m, batch)

    found = collect_hessians(model, batches, layers, run)
    out = {f"{k}.weight": v for k, v in found.items()}
    out.update({k: v.to(torch.float32) for k, v in store.items() if k not in out})
    return out


class GPTQExporter:
    """Hessians collected once; GPTQ codes for any policy (``quantize`` is a fit.Quantize)."""

    def __init__(
        self,
        model: nn.Module,
        train_tokens,
        n_tokens: int = DEFAULT_CALIB_TOKENS,
        block: int = 128,
        damp: float = 0.01,
        seq_len: int | None = None,
        batches: list | None = None,
        hessians: dict[str, Tensor] | None = None,
        progress=None,
    ):
        """``batches``: the model's own calibration inputs (e.g. padded sentences of an encoder),
        each run as ``model(batch)``, instead of training-token windows. ``hessians``: {weight
        name: H} given (a competitor's own, ``--hessians``): no calibration is run for them.
        Hessians are keyed by tensor name (a stack's slices by theirs, export/banks.py)."""
        from ..model.run import run_forward
        from .banks import unbank

        self.model = model
        self.block, self.damp = block, damp
        self.state = unbank(state_dict_for_export(model)) if model is not None else {}
        self.say = progress or (lambda _m: None)
        if hessians is not None:
            self.hessians = dict(hessians)
        else:
            forward = None  # the model's own inputs: model(batch)
            if batches is None:
                batches, forward = calibration_windows(model, train_tokens, n_tokens, seq_len), run_forward
            self.hessians = collect_all_hessians(model, batches, self.state, forward, progress)
        self._cache: dict[tuple, QTensor] = {}

    def _gptq_format(self, name: str, fmt: str, opts: dict, state: dict[str, Tensor]):
        """(quantizer, extras) when GPTQ can choose this tensor's codes, else (None, why)."""
        from ..quant import extras
        from ..quant.grid import GridQuantizer

        quantizer, extra = extras.split(fmt, opts)
        if not isinstance(quantizer, GridQuantizer) or fmt == "int8_pg":
            return None, f"{fmt} is not a scale-and-round grid"
        t = state.get(name)
        if t is None or t.dim() != 2:
            return None, "not a matrix"
        H = self.hessians.get(name)
        if H is None:
            return None, "no calibration inputs (no F.linear / matmul used it)"
        if H.shape != (t.shape[1], t.shape[1]):
            return None, f"its Hessian is {list(H.shape)}, not [{t.shape[1]}, {t.shape[1]}]"
        return quantizer, extra

    def coverage(self, plan: Plan, state: dict[str, Tensor]) -> tuple[list[str], dict[str, str]]:
        """(matrices GPTQ will choose the codes of, {quantized matrix it will not: why})."""
        done, missed = [], {}
        for name, (fmt, opts, _) in plan.items():
            t = state.get(name)
            if t is None or t.dim() != 2 or fmt in (*FLOAT_FORMATS, "raw"):
                continue
            quantizer, why = self._gptq_format(name, fmt, opts, state)
            if quantizer is None:
                missed[name] = why
            else:
                done.append(name)
        return done, missed

    def gptq_qtensors(self, plan: Plan, state: dict[str, Tensor] | None = None) -> dict[str, QTensor]:
        """GPTQ QTensors for every planned weight that has a Hessian and a scale-and-round format."""
        from ..quant import lqer
        from ..quant.gptq import gptq_quantize

        state = self.state if state is None else state
        out = {}
        todo = [(n, f, o) for n, (f, o, _) in plan.items() if self._gptq_format(n, f, o, state)[0] is not None]
        for i, (name, fmt, opts) in enumerate(todo):
            quantizer, extra = self._gptq_format(name, fmt, opts, state)
            spec = extra.lowrank
            H = self.hessians[name]
            base = (name, fmt, tuple(sorted(quantizer.params.items())), extra.rdo)
            if base not in self._cache:
                self.say(f"gptq: matrix {i + 1}/{len(todo)} {name} {fmt}")
                self._cache[base] = gptq_quantize(
                    state[name], H, quantizer, self.block, self.damp, name=name, rdo=extra.rdo
                )
            key = (*base, spec)  # the LQER correction of GPTQ's error, weighted by the same Hessian
            if key not in self._cache:
                self._cache[key] = (
                    self._cache[base] if spec is None else lqer.correct(state[name], self._cache[base], spec, H, name)
                )
            out[name] = self._cache[key]
        return out

    def quantize(self, state: dict[str, Tensor], policy: ExportPolicy):
        """(QTensors, plan) of the policy, GPTQ codes where they apply (their rule says so); the
        state's stacks split into slices (banks.unbank)."""
        from .banks import unbank
        from .pack import quantize

        state = unbank(state)
        qts, plan = quantize(state, policy, self.gptq_qtensors(policy.plan(state), state))
        done = {id(qt) for qt in self._cache.values()}
        # a GPTQ'd matrix the policy's finish corrected (a recipe's LQER) is still GPTQ's codes
        gptq_codes = {id(qt.codes) for qt in self._cache.values()}
        marked = {
            n: (f, o, r + GPTQ_MARK if id(qts[n]) in done or id(qts[n].codes) in gptq_codes else r)
            for n, (f, o, r) in plan.items()
        }
        return qts, marked


def gptq_export(
    model: nn.Module,
    policy: ExportPolicy,
    train_tokens: np.ndarray | Tensor,
    n_tokens: int = DEFAULT_CALIB_TOKENS,
    block: int = 128,
    damp: float = 0.01,
) -> dict[str, QTensor]:
    """Export a model: GPTQ for projection weights the policy quantizes, the policy for the rest.

    `train_tokens` must be the training split (``corpus.train_tokens``), never validation.
    """
    exporter = GPTQExporter(model, train_tokens, n_tokens, block, damp)
    return exporter.quantize(exporter.state, policy)[0]
