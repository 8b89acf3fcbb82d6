"""GPTQ export: the policy decides each tensor's format; GPTQ chooses the codes of the grid ones.

Works on recurnorm models (hooks on each projection, after its extra norm) and
on any model a ``--model-factory`` builds (hooks on its ``nn.Linear`` modules).
Calibration windows come from the *training* split only, as the Parameter Golf challenge
requires (https://github.com/openai/parameter-golf).
"""

from __future__ import annotations

import numpy as np
from torch import Tensor, nn

from ..errors import ConfigError
from ..model.checkpoint import state_dict_for_export
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
    from ..evaluate.factory import seq_len_of
    from ..quant.gptq import calibration_batches

    seq = seq_len or seq_len_of(model)
    if seq is None:
        raise ConfigError(
            "calibration: the model does not say its context length (seq_len, block_size, "
            "max_seq_len or train_seq_len on it or its config): set model.seq_len = N in the "
            "model factory, or pass seq_len="
        )
    return calibration_batches(np.asarray(train_tokens), seq, n_tokens)


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
    ):
        """``batches``: the model's own calibration inputs (e.g. padded sentences of an encoder),
        each run as ``model(batch)``, instead of training-token windows."""
        from ..evaluate.factory import run_forward
        from ..quant.gptq import collect_hessians

        self.model = model
        self.block, self.damp = block, damp
        self.state = state_dict_for_export(model)
        forward = None  # the model's own inputs: model(batch)
        if batches is None:
            batches, forward = calibration_windows(model, train_tokens, n_tokens, seq_len), run_forward
        self.hessians = collect_hessians(model, batches, linear_layers(model), forward)
        self._cache: dict[tuple, QTensor] = {}

    def gptq_qtensors(self, plan: Plan) -> dict[str, QTensor]:
        """GPTQ QTensors for every planned weight that has a Hessian and a scale-and-round format."""
        from ..quant import extras, lqer
        from ..quant.gptq import gptq_quantize
        from ..quant.grid import GridQuantizer

        out = {}
        for name, (fmt, opts, _) in plan.items():
            proj = name.removesuffix(".weight")
            if not name.endswith(".weight") or proj not in self.hessians:
                continue
            quantizer, extra = extras.split(fmt, opts)
            spec = extra.lowrank
            if not isinstance(quantizer, GridQuantizer) or fmt == "int8_pg" or self.state[name].dim() != 2:
                continue
            base = (name, fmt, tuple(sorted(quantizer.params.items())), extra.rdo)
            if base not in self._cache:
                self._cache[base] = gptq_quantize(
                    self.state[name], self.hessians[proj], quantizer, self.block, self.damp, name=name, rdo=extra.rdo
                )
            key = (*base, spec)  # the LQER correction of GPTQ's error, weighted by the same Hessian
            if key not in self._cache:
                self._cache[key] = (
                    self._cache[base]
                    if spec is None
                    else lqer.correct(self.state[name], self._cache[base], spec, self.hessians[proj], name)
                )
            out[name] = self._cache[key]
        return out

    def quantize(self, state: dict[str, Tensor], policy: ExportPolicy):
        """(QTensors, plan) of the policy, GPTQ codes where they apply (their rule says so)."""
        from .pack import quantize

        qts, plan = quantize(state, policy, self.gptq_qtensors(policy.plan(state)))
        done = {id(qt) for qt in self._cache.values()}
        return qts, {n: (f, o, r + GPTQ_MARK if id(qts[n]) in done else r) for n, (f, o, r) in plan.items()}


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
