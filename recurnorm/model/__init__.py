"""recurnorm.model: the shared-depth causal LM, its specialization schemes, checkpoints."""

from . import schemes
from .checkpoint import (
    load_checkpoint,
    model_from_state_dict,
    save_checkpoint,
    state_dict_for_export,
)
from .config import ModelConfig
from .layers import Linear, RMSNorm
from .lm import RecurrentLM, relax_from_unique

__all__ = [
    "Linear",
    "ModelConfig",
    "RMSNorm",
    "RecurrentLM",
    "load_checkpoint",
    "model_from_state_dict",
    "relax_from_unique",
    "save_checkpoint",
    "schemes",
    "state_dict_for_export",
]
