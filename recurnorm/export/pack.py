"""State dicts and checkpoints to artifact bytes through one policy; the rule of each tensor kept.

Every artifact carries ``metadata["export"] = {"policy": <one line>, "rules":
{tensor: <the rule that chose its format>}}`` so that ``inspect`` can say why
each tensor has its format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..quant import extras
from ..quant.qtensor import QTensor
from .banks import restack, unbank
from .options import ExportOptions, Format
from .policy import ExportPolicy, Plan
from .qat import export_config, is_qat_pending, qat_policy
from .record import packed_rows

if TYPE_CHECKING:
    from torch import Tensor, nn


def export_metadata(
    policy: ExportPolicy, plan: Plan, qtensors: dict[str, QTensor] | None = None, state: dict | None = None
) -> dict:
    """The ``export`` metadata entry: the policy line (what the plan chose, tied tensors once)
    and the rule of every tensor."""
    out = {
        "policy": policy.summary(plan, aliases=tied_names(qtensors or {})),
        "rules": {n: reason for n, (_, _, reason) in sorted(plan.items())},
    }
    banks = getattr(state, "banks", None) if state is not None else None
    if banks:  # a stack's slices were chosen one by one: inspect shows their rules on its row
        out["banks"] = {name: list(bank.slices) for name, bank in banks.items()}
    return out


def tied_names(qtensors: dict[str, QTensor]) -> set[str]:
    """Names whose QTensor an earlier name (in sorted order) already holds: stored once."""
    seen: set[int] = set()
    tied = set()
    for name in sorted(qtensors):
        if id(qtensors[name]) in seen:
            tied.add(name)
        seen.add(id(qtensors[name]))
    return tied


def _dedupe(state_dict: dict) -> tuple[dict, dict[str, str]]:
    """Drop tensors that share storage, shape and strides with an earlier one (tied weights)."""
    seen: dict[tuple, str] = {}
    unique, aliases = {}, {}
    for name in sorted(state_dict):
        t = state_dict[name]
        try:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        except (AttributeError, RuntimeError):
            key = None
        if key is not None and t.numel() > 0 and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        unique[name] = t
    return unique, aliases


def export_qtensors(
    state_dict: dict,
    quant: str = "int8",
    policy: ExportPolicy | None = None,
    replace: dict[str, QTensor] | None = None,
    **quant_options,
) -> dict[str, QTensor]:
    """QTensors for a state dict via the export policy; tied tensors map to one QTensor.
    ``replace``: QTensors made elsewhere (GPTQ's, or a hint's estimates), used as they are
    (a tied name's replacement stands for all its names)."""
    unique, aliases = _dedupe(state_dict)
    if policy is None:
        policy = ExportPolicy(quantizer=quant, options=dict(quant_options))
    swap = {aliases.get(n, n): qt for n, qt in (replace or {}).items()}
    plan = policy.plan({n: t for n, t in unique.items() if n not in swap})
    qts = {n: swap[n] if n in swap else extras.quantize(t, plan[n][0], plan[n][1], n) for n, t in unique.items()}
    for name, target in aliases.items():
        qts[name] = qts[target]
    return qts


def quantize(
    state: dict[str, Tensor], policy: ExportPolicy, replace: dict[str, QTensor] | None = None
) -> tuple[dict[str, QTensor], Plan]:
    """(QTensors, plan) of the state with its stacks split into slices (banks.unbank; restack
    them with banks.restack): tied tensors share one QTensor; ``replace`` swaps in QTensors (GPTQ)."""
    state = unbank(state)
    qts = export_qtensors(state, policy=policy, replace=replace)
    return policy.finish(state, qts, policy.plan(state))


def pack_state(
    state: dict[str, Tensor],
    policy: ExportPolicy,
    metadata: dict | None = None,
    *,
    effort: str = "normal",
    codecs=None,
    replace: dict[str, QTensor] | None = None,
) -> bytes:
    """Artifact bytes of a state dict under a policy (export rules recorded in the metadata)."""
    state = unbank(state)
    qts, plan = quantize(state, policy, replace)
    return pack_plan(state, qts, plan, policy, metadata, effort=effort, codecs=codecs)


def export_qat(model: nn.Module, base: ExportPolicy | None = None, metadata: dict | None = None) -> bytes:
    """Artifact bytes of a QAT model: qat_policy codes, the config (qat exported) in metadata."""
    from ..model import state_dict_for_export

    policy = qat_policy(model.config, base)
    meta = {**(metadata or {}), "config": export_config(model.config), "quant": model.config.qat["format"]}
    return pack_state(state_dict_for_export(model), policy, metadata=meta)


def pack_plan(
    state: dict, qts: dict[str, QTensor], plan: Plan, policy: ExportPolicy, metadata: dict | None, **kw
) -> bytes:
    """Artifact bytes of quantized (unbanked) tensors and their plan: stacks put back together,
    the export record in the metadata."""
    from ..budget.api import pack_qtensors

    meta = {**(metadata or {}), "export": export_metadata(policy, plan, qts, state)}
    return pack_qtensors(restack(state, qts), meta, kw.get("codecs"), kw.get("effort", "normal"))


def checkpoint_policy(
    policy: ExportPolicy, config: dict | None, source: str = "checkpoint"
) -> tuple[ExportPolicy, dict | None]:
    """(policy, config for the metadata): a QAT checkpoint ships exactly the codes training saw.

    Its projections use the recorded QAT quantizer whatever -q says; the config
    is marked exported so that loaders do not fake-quantize the grid weights again.
    """
    if not is_qat_pending(config, source):
        return policy, config
    from ..model import ModelConfig

    model_config = ModelConfig.from_dict(config)
    return qat_policy(model_config, base=policy), export_config(model_config)


def pack(
    state_dict_or_model,
    quant: str | ExportOptions | Format = "int8",
    policy: ExportPolicy | None = None,
    metadata: dict | None = None,
    codecs=None,
    effort: str = "normal",
    *,
    config: dict | None = None,
    **quant_options,
) -> bytes:
    """``recurnorm.pack``: quantize a state dict (or a model) with the export policy and pack it.

    ``quant`` is a -q string (``int6``, ``int4:group=128``, rules, ``@pg-record``)
    or the same typed: an ExportOptions (which also carries --keep-float and
    --effort) or a Format; options may also come as keywords. A model brings
    its config into the metadata (a state dict may pass ``config=``), and a QAT
    model is exported with the QAT policy, as ``recurnorm pack`` does. A rule
    that changes no tensor raises ConfigError.
    """
    from torch import nn

    from ..model import state_dict_for_export
    from .spec import build_policy

    if isinstance(quant, Format):
        quant = ExportOptions(quant)
    if isinstance(quant, ExportOptions):
        effort = quant.effort if effort == "normal" else effort
    state = state_dict_or_model
    if isinstance(state_dict_or_model, nn.Module):
        state = state_dict_for_export(state_dict_or_model)
        cfg = getattr(state_dict_or_model, "config", None)
        config = cfg.to_dict() if hasattr(cfg, "to_dict") else config
    if policy is None:
        policy = quant.policy() if isinstance(quant, ExportOptions) else build_policy(quant)
        policy = _with_options(policy, quant_options)
    policy.check_rules(state, "pack")
    policy, config = checkpoint_policy(policy, config)
    meta = dict(metadata or {})
    if config is not None:
        meta.setdefault("config", config)
    return pack_state(state, policy, meta, effort=effort, codecs=codecs)


def _with_options(policy: ExportPolicy, quant_options: dict) -> ExportPolicy:
    """The policy with keyword options added to its main format (checked)."""
    if not quant_options:
        return policy
    from dataclasses import replace

    from .spec import check_format

    check_format(policy.quantizer, {**policy.options, **quant_options}, "pack")
    return replace(policy, options={**policy.options, **quant_options})


@dataclass
class Packed:
    """A packed checkpoint: bytes, per-tensor rows (with the rule), the policy used, notes to print."""

    data: bytes
    rows: list[dict]
    policy: ExportPolicy
    metadata: dict
    notes: list[str] = field(default_factory=list)
    fit: Any = None  # a fit.FitResult when --fit chose the formats
    state: dict | None = None  # the tensors packed (the over-cap hint re-uses them); None: streamed
    temp: str | None = None  # streamed: the artifact's temp file beside the output (data maps it)

    @property
    def policy_line(self) -> str:
        """The policy line the artifact records: what the plan chose, as printed."""
        return (self.metadata.get("export") or {}).get("policy") or self.policy.summary()


def check_decoded_limit(state: dict, max_decoded_bytes: int | None = None) -> None:
    """QuantError before any work when the artifact of state would decode to more than readers
    allow: each tensor takes at least its elements x max(its itemsize, 4 when float: formats
    dequantize through float32), tied names again. The default allows at most the machine's
    memory (validate.default_max_decoded_bytes); the rest of its rule is checked after packing."""
    from ..budget.validate import default_max_decoded_bytes
    from ..errors import QuantError

    limit = default_max_decoded_bytes(1 << 62) if max_decoded_bytes is None else max_decoded_bytes
    need = sum(t.numel() * max(t.element_size(), 4 * t.is_floating_point()) for t in state.values())
    if need > limit:
        raise QuantError(
            f"its artifact would decode to at least {need:,} bytes, more than the {limit:,} readers allow "
            "(--max-decoded-bytes raises the limit)"
        )


def load_state(ckpt: str | Path) -> tuple[dict, dict | None, list[str]]:
    """(tensors, config, notes) of a checkpoint: a wrapper's prefix on every name is stripped,
    and a note says so."""
    from .load import load_checkpoint_state
    from .policy import strip_wrapper_prefixes

    state, config = load_checkpoint_state(ckpt)
    state, stripped = strip_wrapper_prefixes(state)
    return state, config, strip_wrapper_note(stripped)


def strip_wrapper_note(stripped: list[str]) -> list[str]:
    """The note that says which wrapper prefixes were stripped (none: no note)."""
    if not stripped:
        return []
    return [
        f"stripped the wrapper prefix {''.join(stripped)!r} from every tensor name "
        "(torch.compile / DataParallel); the artifact holds the plain names"
    ]


def pack_checkpoint(
    ckpt: str | Path,
    policy: ExportPolicy,
    *,
    effort: str = "normal",
    replace: dict[str, QTensor] | None = None,
    state=None,
    config=None,
    extra_metadata: dict | None = None,
    max_decoded_bytes: int | None = None,
) -> Packed:
    """Pack a checkpoint (dir, .safetensors, .pt/.pth/.bin) under a policy."""
    ckpt = Path(ckpt)
    notes: list[str] = []
    if state is None:
        state, config, notes = load_state(ckpt)
    check_decoded_limit(state, max_decoded_bytes)
    policy.check_rules(state, str(ckpt))
    policy, config = checkpoint_policy(policy, config, str(ckpt))
    metadata = {"quant": policy.quantizer, "source": ckpt.name, **(extra_metadata or {})}
    if config is not None:
        metadata["config"] = config
    data = pack_state(state, policy, metadata, effort=effort, replace=replace)
    rows, metadata = packed_rows(data, max_decoded_bytes)
    return Packed(data, rows, policy, metadata, notes, state=state)
