"""Specialization schemes: what differs between the steps of a shared block.

Each scheme is one small registered class (`class Norm(Scheme, name="norm")`).
The model holds one instance as `model.spec`; its parameters are the
step-specific ones (state-dict prefix `spec.`). Once per step the model calls
`spec.for_step(step, layer)`, which returns the `mods` dict the block reads
(keys documented in `layers.py`). Counts below use d = d_model, S = depth,
h = d_mlp and "sites" = the gated projections.

| scheme          | step-specific parameters                       |
|-----------------|------------------------------------------------|
| unique          | S whole blocks (no `spec.*`; the blocks count)  |
| shared          | 0                                              |
| norm            | 2·d·S                                          |
| norm_gate       | 2·d·S + Σ_sites d_in·S                         |
| norm_gate_rank1 | 2·d·S + Σ_sites (S + d_in)                     |
| layerrope       | 4·d + 16 (independent of S)                    |
| lora            | S · r · Σ_proj (d_in + d_out) = S·r·(8d + 2(d+h)) |
| rezero          | 2·S                                            |
| layerscale      | 2·d·S                                          |
| scalar_gate     | 2·S                                            |
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn as nn
from torch import Tensor

from ..errors import ConfigError
from ..registry import Registry, resolve_options
from .layers import PROJECTIONS, projection_shapes

_REGISTRY: Registry[Scheme] = Registry("scheme", ConfigError)


def available() -> list[str]:
    """Names of every registered scheme."""
    return _REGISTRY.names()


def get(name: str, config: Any) -> Scheme:
    """The scheme `name` built for a model config; ConfigError lists the choices."""
    return _REGISTRY.get(name, config)


def scheme_class(name: str) -> type[Scheme]:
    """The class of scheme `name`, for what it declares before a model exists."""
    return _REGISTRY.type_of(name)


def unregister(name: str) -> None:
    """Drop a scheme (tests that register a throwaway one clean up with this)."""
    _REGISTRY.unregister(name)


class Scheme(nn.Module):
    """Base class; subclass with `name=` to register. Holds the step-specific params."""

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    untied_blocks: ClassVar[bool] = False  # True: one block per step (unique)
    owns_input_gains: ClassVar[bool] = False  # True: replaces the block's input RMSNorm gains
    control: ClassVar[bool] = True  # its parameters are small control tensors (kept float)

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if name is not None:
            _REGISTRY.register(name, cls)
            cls.name = name

    def __init__(self, config: Any):
        super().__init__()
        self.depth = config.depth
        self.options = self.resolve_options(config.scheme_options)

    @classmethod
    def resolve_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Defaults merged with options; unknown or ill-typed options raise ConfigError."""
        merged = resolve_options(f"scheme {cls.name!r}", cls.defaults, options, ConfigError)
        cls.check_options(merged)
        return merged

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Value checks beyond types; override where needed."""

    def for_step(self, step: int, layer: int) -> dict[str, Tensor]:
        """The mods dict for this step; `layer` is the physical block index."""
        return {}


class Unique(Scheme, name="unique"):
    """A separate block per step: the upper bound. No `spec.*` parameters."""

    untied_blocks = True


class Shared(Scheme, name="shared"):
    """Strict sharing (ALBERT, Universal Transformer): every step is identical."""


class Norm(Scheme, name="norm"):
    """Per-step RMSNorm gains before attention and MLP (replacing the shared gains): 2·d·S."""

    owns_input_gains = True

    def __init__(self, config: Any):
        super().__init__(config)
        S, d = config.depth, config.d_model
        self.attn_in = nn.Parameter(torch.ones(S, d))
        self.mlp_in = nn.Parameter(torch.ones(S, d))

    def for_step(self, step: int, layer: int) -> dict[str, Tensor]:
        return {"attn_in": self.attn_in[step], "mlp_in": self.mlp_in[step]}


def _check_sites(cls: type[Scheme], options: dict[str, Any]) -> None:
    bad = [s for s in options["sites"] if s not in PROJECTIONS]
    if bad or not options["sites"] or len(set(options["sites"])) != len(options["sites"]):
        raise ConfigError(
            f"option 'sites' of scheme {cls.name!r} must be distinct names from "
            f"{', '.join(PROJECTIONS)}; got {list(options['sites'])!r}"
        )


class NormGate(Norm, name="norm_gate"):
    """`norm` + diagonal per-step gates (init 1) on the inputs of `sites`: 2·d·S + Σ d_in·S."""

    # o and down: the projections fed by attention mixing and the MLP hidden,
    # where per-step channel emphasis is most likely to matter.
    defaults = {"sites": ["o", "down"]}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        _check_sites(cls, options)

    def __init__(self, config: Any):
        super().__init__(config)
        shapes = projection_shapes(config.d_model, config.d_mlp)
        for site in self.options["sites"]:
            d_in = shapes[site][1]
            self.register_parameter(f"gate_{site}", nn.Parameter(torch.ones(config.depth, d_in)))

    def for_step(self, step: int, layer: int) -> dict[str, Tensor]:
        mods = super().for_step(step, layer)
        for site in self.options["sites"]:
            mods[f"{site}.gate"] = getattr(self, f"gate_{site}")[step]
        return mods


class NormGateRank1(Norm, name="norm_gate_rank1"):
    """`norm` + gates factored across steps, gate_s = 1 + a[s]·b per site: 2·d·S + Σ (S + d_in).

    Init a = 0 (gates start at exactly 1) and b ~ N(0, b_std²). At init only a
    gets a gradient (∂/∂b ∝ a = 0); b starts learning after the first update.
    b_std defaults to 1 so that, under Adam, an update of a moves the gate by
    about the learning rate, as it would for a diagonal gate.
    """

    defaults = {"sites": ["o", "down"], "b_std": 1.0}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        _check_sites(cls, options)
        if options["b_std"] <= 0:
            raise ConfigError(f"option 'b_std' of scheme {cls.name!r} must be > 0")

    def __init__(self, config: Any):
        super().__init__(config)
        shapes = projection_shapes(config.d_model, config.d_mlp)
        for site in self.options["sites"]:
            d_in = shapes[site][1]
            b = torch.randn(d_in) * self.options["b_std"]
            self.register_parameter(f"gate_{site}_a", nn.Parameter(torch.zeros(config.depth)))
            self.register_parameter(f"gate_{site}_b", nn.Parameter(b))

    def for_step(self, step: int, layer: int) -> dict[str, Tensor]:
        mods = super().for_step(step, layer)
        for site in self.options["sites"]:
            a, b = getattr(self, f"gate_{site}_a"), getattr(self, f"gate_{site}_b")
            mods[f"{site}.gate"] = 1 + a[step] * b
        return mods


LAYERROPE_SITES = ("attn_in", "attn_out", "mlp_in", "mlp_out")


class LayerRoPEGain(nn.Module):
    """One LayerRoPE site: shared gain γ [d] and scalars (α, β, α_rot, β_rot)."""

    def __init__(self, d: int, scalars: list[float], base: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d))
        self.scalars = nn.Parameter(torch.tensor(scalars, dtype=torch.float32))
        self.register_buffer("freq", base ** (-2 * torch.arange(d // 2) / d), persistent=False)

    def forward(self, ell: int) -> Tensor:
        """g(ℓ): γ rotated pairwise by θ(ℓ, j), scaled by e^{r(ℓ)} (LayerRoPE, Srivastava & Kanan 2026)."""
        alpha, beta, alpha_rot, beta_rot = self.scalars.unbind()
        log_depth = math.log(ell + 1)
        r = alpha + beta * log_depth
        theta = torch.exp(alpha_rot + beta_rot * log_depth) * self.freq
        cos, sin = theta.cos(), theta.sin()
        g_even, g_odd = self.gamma[0::2], self.gamma[1::2]
        g = torch.stack([g_even * cos - g_odd * sin, g_even * sin + g_odd * cos], dim=-1)
        return torch.exp(r) * g.flatten()


class LayerRoPE(Scheme, name="layerrope"):
    """LayerRoPE gains at four sites, each γ [d] + 4 scalars: 4·d + 16, independent of S.

    Input sites replace the block's input RMSNorm gains; output sites multiply
    the branch output before the residual add. ℓ is the step index; with
    index="layer" it is the physical block index, which for one shared block is
    always 0 (every step then gets the same gain — kept to show that pitfall).
    """

    owns_input_gains = True
    defaults = {
        "base": 100.0,
        "alpha": 0.0,
        "beta": -0.5,
        "alpha_rot": 0.0,
        "beta_rot": -0.5,
        "index": "step",
    }

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        if options["index"] not in ("step", "layer"):
            raise ConfigError(
                f"option 'index' of scheme 'layerrope' must be 'step' or 'layer', got {options['index']!r}"
            )
        if options["base"] <= 0:
            raise ConfigError("option 'base' of scheme 'layerrope' must be > 0")

    def __init__(self, config: Any):
        super().__init__(config)
        o = self.options
        scalars = [float(o["alpha"]), float(o["beta"]), float(o["alpha_rot"]), float(o["beta_rot"])]
        for site in LAYERROPE_SITES:
            setattr(self, site, LayerRoPEGain(config.d_model, scalars, float(o["base"])))

    def for_step(self, step: int, layer: int) -> dict[str, Tensor]:
        ell = step if self.options["index"] == "step" else layer
        return {site: getattr(self, site)(ell) for site in LAYERROPE_SITES}


class LoRAPair(nn.Module):
    """Low-rank term B @ A [d_out, d_in]; B starts at zero so the term starts at zero."""

    def __init__(self, d_in: int, d_out: int, rank: int):
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, d_in))
        self.B = nn.Parameter(torch.zeros(d_out, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # as in the LoRA reference code

    def forward(self) -> Tensor:
        return self.B @ self.A


class LoRA(Scheme, name="lora"):
    """Per-step rank-r adapters on q,k,v,o,up,down: h = W'x + B_s A_s x.

    S·r·Σ(d_in + d_out) parameters, under `spec.steps.{s}.{proj}.{A,B}`. The
    term is folded into the weight (W' + B_s A_s), which is far cheaper than two
    extra matmuls per token; no α/r scaling.
    """

    control = False
    defaults = {"rank": 4}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        if options["rank"] < 1:
            raise ConfigError(f"option 'rank' of scheme 'lora' must be >= 1, got {options['rank']}")

    def __init__(self, config: Any):
        super().__init__(config)
        shapes = projection_shapes(config.d_model, config.d_mlp)
        r = self.options["rank"]
        self.steps = nn.ModuleList(
            nn.ModuleDict({p: LoRAPair(shapes[p][1], shapes[p][0], r) for p in PROJECTIONS})
            for _ in range(config.depth)
        )

    def for_step(self, step: int, layer: int) -> dict[str, Tensor]:
        return {f"{p}.delta": pair() for p, pair in self.steps[step].items()}


class BranchScale(Scheme):
    """Per-step multipliers of the two residual branches' outputs, shape `per_step`."""

    init_value: ClassVar[float] = 1.0
    per_channel: ClassVar[bool] = False

    def __init__(self, config: Any):
        super().__init__(config)
        shape = (config.depth, config.d_model) if self.per_channel else (config.depth,)
        init = float(self.options.get("init", self.init_value))
        self.attn_out = nn.Parameter(torch.full(shape, init))
        self.mlp_out = nn.Parameter(torch.full(shape, init))

    def for_step(self, step: int, layer: int) -> dict[str, Tensor]:
        return {"attn_out": self.attn_out[step], "mlp_out": self.mlp_out[step]}


class ReZero(BranchScale, name="rezero"):
    """One scalar per branch per step, init 0 (ReZero): 2·S."""

    init_value = 0.0


class LayerScale(BranchScale, name="layerscale"):
    """Per-channel scale per branch per step, init small (LayerScale): 2·d·S."""

    per_channel = True
    defaults = {"init": 1e-4}


class ScalarGate(BranchScale, name="scalar_gate"):
    """One scalar per branch per step, init 1 — the control ReZero/LayerScale lack: 2·S."""
