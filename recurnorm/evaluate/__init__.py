"""recurnorm.evaluate: validation loss and export roundtrips."""

from .gate import GateReport, loss_gate
from .loss import LossResult, loss
from .roundtrip import RoundtripResult, export_model, roundtrip

__all__ = ["GateReport", "LossResult", "RoundtripResult", "export_model", "loss", "loss_gate", "roundtrip"]
