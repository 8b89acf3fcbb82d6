"""recurnorm.evaluate: validation loss and export roundtrips."""

from .exported import export_model
from .gate import GateReport, loss_gate
from .loss import LossResult, loss
from .roundtrip import RoundtripResult, roundtrip

__all__ = ["GateReport", "LossResult", "RoundtripResult", "export_model", "loss", "loss_gate", "roundtrip"]
