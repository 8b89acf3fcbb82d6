"""ModelConfig: every choice that decides a model's shape, as one dataclass."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import ConfigError

NORMS = ("pre", "peri")


@dataclass
class ModelConfig:
    """Shape of a shared-depth causal LM; `depth` counts block applications (steps)."""

    vocab_size: int = 256
    d_model: int = 128
    n_heads: int = 4
    mlp_ratio: float = 4.0
    depth: int = 6
    seq_len: int = 128
    norm: str = "pre"  # "pre": x + f(norm(x)); "peri": x + norm_out(f(norm_in(x)))
    tie_embeddings: bool = True
    scheme: str = "shared"
    scheme_options: dict[str, Any] = field(default_factory=dict)
    extra_norm: bool = False  # RMSNorm on the input of every q/k/v/o/up/down projection
    qat: dict[str, Any] | None = None  # recorded by QAT training; model/ never acts on it

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_mlp(self) -> int:
        return int(self.mlp_ratio * self.d_model)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy of every field."""
        return copy.deepcopy(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build and validate a config; unknown keys or bad values raise ConfigError."""
        if not isinstance(d, dict):
            raise ConfigError(f"model config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown model config field {unknown[0]!r}; known fields: {', '.join(sorted(known))}")
        config = cls(**copy.deepcopy(d))
        config.validate()
        return config

    def validate(self) -> ModelConfig:
        """Raise ConfigError naming the first bad field; return self when all is well."""
        for name in ("vocab_size", "d_model", "n_heads", "depth", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.mlp_ratio, bool) or not isinstance(self.mlp_ratio, (int, float)):
            raise ConfigError(f"mlp_ratio must be a number, got {self.mlp_ratio!r}")
        if self.d_mlp < 1:
            raise ConfigError(f"mlp_ratio {self.mlp_ratio} gives an empty MLP")
        if self.norm not in NORMS:
            raise ConfigError(f"norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        for name in ("tie_embeddings", "extra_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads != 0:
            raise ConfigError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.d_head % 2 != 0:
            raise ConfigError(f"head dim {self.d_head} must be even for rotary positions")
        if not isinstance(self.scheme_options, dict):
            raise ConfigError(f"scheme_options must be a dict, got {self.scheme_options!r}")
        if self.qat is not None and not isinstance(self.qat, dict):
            raise ConfigError(f"qat must be a dict or null, got {self.qat!r}")
        from . import schemes  # late: schemes imports layers, which imports torch

        schemes.scheme_class(self.scheme).resolve_options(self.scheme_options)
        return self
