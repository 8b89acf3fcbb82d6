"""A quick estimate of a config's packed artifact size, printed when training starts.

It counts the tensors of the model (built on the meta device: no memory) and
prices each by the format the default export policy gives it: quantized
matrices at the bits per weight measured on a trained, packed model, float
tensors at their width. It is an estimate to size a preset before a long run,
not the packer: ``recurnorm pack`` and ``recurnorm verify`` give the real size
(and the ``plan`` command of the export stage, when it lands, a better one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..model import ModelConfig, RecurrentLM

CAP_BYTES = 16_000_000
# Bits per weight of int8 codes plus their per-row scales after the entropy packer, measured
# on the tiny preset (shared, 150 steps, default corpus) with every matrix quantized:
#   recurnorm train --preset tiny --steps 150 --out R
#   recurnorm pack R -q int8 --keep-float-max-numel 0   # 7.569 bits/weight over all tensors;
#   matrices 7.34-7.83, embedding 7.30. Rounded up, since trained-longer weights spread more.
MEASURED_BITS = {"int8": 7.7}
FLOAT_BITS = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "raw": 32.0}
OVERHEAD_BYTES = 4_096  # header, manifest and coder tables, order of magnitude


@dataclass(frozen=True)
class SizeEstimate:
    """Estimated artifact bytes of a config under one quantizer."""

    quant: str
    params: int
    quantized_params: int
    bytes: int
    bits_per_weight: float  # the measured figure used for the quantized tensors
    cap: int = CAP_BYTES

    @property
    def fill(self) -> float:
        return self.bytes / self.cap

    def to_dict(self) -> dict:
        return {**asdict(self), "fill": self.fill}

    def line(self) -> str:
        return (f"{self.params:,} parameters; estimated {self.quant} artifact "
                f"{self.bytes / 1e6:.2f} MB = {100 * self.fill:.1f}% of the {self.cap:,}-byte cap "
                f"({self.bits_per_weight} bits/weight measured; `recurnorm pack` gives the "
                "real size)")  # fmt: skip


def estimate_artifact_bytes(config: ModelConfig, policy, quant: str = "int8") -> SizeEstimate:
    """Estimate of the packed size of config's model under an export policy with quant.

    ``policy`` is a function of the model giving its export policy (export/ owns policies,
    and train/ may not import it: the caller passes it in).
    """
    if quant not in MEASURED_BITS:
        raise ValueError(f"no measured bits/weight for {quant!r}; known: {sorted(MEASURED_BITS)}")
    with torch.device("meta"):
        model = RecurrentLM(config)
    state = dict(model.state_dict())
    plan = policy(model).plan(state)
    bits, quantized = 0.0, 0
    for name, tensor in state.items():
        fmt = plan[name][0]
        n = tensor.numel()
        if fmt in FLOAT_BITS:
            bits += n * FLOAT_BITS[fmt]
        else:  # the main quantizer or the int8 embedding
            bits += n * MEASURED_BITS.get(fmt, MEASURED_BITS[quant])
            quantized += n
    return SizeEstimate(
        quant=quant, params=sum(t.numel() for t in state.values()), quantized_params=quantized,
        bytes=int(bits / 8) + OVERHEAD_BYTES, bits_per_weight=MEASURED_BITS[quant],
    )  # fmt: skip
