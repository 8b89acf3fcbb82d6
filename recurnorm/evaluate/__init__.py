"""recurnorm.evaluate: validation loss and export roundtrips."""

from .loss import LossResult, loss

__all__ = ["LossResult", "loss"]
