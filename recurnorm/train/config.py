"""TrainConfig: every training hyper-parameter, with the one set of defaults.

The library (``loop.train``), the presets (named TrainConfig values) and
``recurnorm train`` all read their defaults from here, so they cannot drift
apart: ``TrainConfig()`` is what ``recurnorm train`` runs with no options
(the ``tiny`` preset's training) and what ``train(config, corpus)`` runs.
A variant is ``dataclasses.replace(hp, lr=1e-3)``. This module imports
nothing heavy (the CLI reads it for its option defaults).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import ConfigError

OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class TrainConfig:
    """The hyper-parameters of one training run (model shape is ModelConfig's)."""

    steps: int = 600  # optimizer updates
    batch_size: int = 16  # global batch: windows per step over all ranks
    lr: float = 2e-3  # peak learning rate
    warmup: int = 50  # linear warm-up steps
    min_lr_frac: float = 0.1  # cosine decays to lr * min_lr_frac
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    control_lr_mult: float = 1.0  # lr multiplier for gains, gates and scalars
    # AdamW, the tiny preset's: `make demo`, the tests and every recorded tiny result use it.
    # The GPU presets name Muon (recurnorm.train.presets says why).
    optimizer: str = "adamw"  # or "muon" (recurnorm.train.optim)
    muon_lr_mult: float = 1.0  # Muon matrices' lr over the schedule's (optimizer "muon" only)
    seed: int = 0  # initial weights
    batch_seed: int | None = None  # batch order (None: seed)
    # With pair_init a scheme's tensors shared with the "shared" scheme start from its values,
    # so schemes trained with one seed differ only in what they add.
    pair_init: bool = True
    micro_batch: int | None = None  # windows per forward pass on one rank (None: all of them)
    compile: bool = False  # the forward pass through torch.compile
    log_every: int = 20  # steps between training-loss records
    eval_every: int = 200  # steps between evaluations (0: only at the end)
    save_every: int | None = None  # resume-state interval (None: at each evaluation)

    def check(self) -> None:
        """ConfigError naming the first value the loop cannot run with."""
        for name in ("steps", "batch_size", "log_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        for name in ("lr", "grad_clip", "muon_lr_mult"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.warmup < 0 or self.weight_decay < 0 or self.eval_every < 0:
            raise ConfigError("warmup, weight_decay and eval_every must be >= 0")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        for name in ("micro_batch", "save_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive int or None, got {value!r}")

    def resume_record(self) -> dict:
        """What a resume state records: the values a resumed run must share (loop.RESUME_KEYS)."""
        return {
            "steps": self.steps,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "warmup": self.warmup,
            "min_lr_frac": self.min_lr_frac,
            "weight_decay": self.weight_decay,
            "grad_clip": self.grad_clip,
            "control_lr_mult": self.control_lr_mult,
            "seed": self.seed,
            "batch_seed": self.seed if self.batch_seed is None else self.batch_seed,
            "optimizer": self.optimizer,
            "muon_lr_mult": self.muon_lr_mult if self.optimizer == "muon" else 1.0,  # AdamW runs ignore it
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """A TrainConfig from keyword values; ConfigError naming an unknown field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown training field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**d)


# The one set of defaults: train(), the presets' base and `recurnorm train`'s options.
DEFAULT = TrainConfig()
