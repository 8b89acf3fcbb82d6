"""A checkpoint to an artifact the way `recurnorm pack` does it: policy, GPTQ, --fit, the over-cap hint.

The CLI only parses options and prints; everything it decides is here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ConfigError
from .fit import DEFAULT_FORMATS, fit_budget
from .pack import Packed, checkpoint_policy, pack_state, packed_rows
from .policy import ExportPolicy, format_spec

# --fit's calibration windows. Direct sensitivities run (formats x candidate tensors) passes over
# them: with 4,096 tokens their noise let --fit lose to uniform int6 on a tiny model, with 32,768
# it won (benchmarks/frontier.py); --fit-sensitivity fisher needs one backward per window.
FIT_CALIB_TOKENS = 32768
# fisher: ½ Σ F δ² from one backward per calibration window (cheap, smooth); direct: the
# calibration loss with each tensor alone quantized, one pass per tensor and format.
SENSITIVITIES = ("fisher", "direct")


@dataclass
class Source:
    """A checkpoint: its tensors, its config, and (when recurnorm can run it) the model."""

    path: Path
    state: dict
    config: dict | None
    model: object | None = None  # an nn.Module with these weights, or None
    why_no_model: str = ""


def load_source(path: str | Path, model_factory=None, need_model: bool = False) -> Source:
    """Tensors and config of a checkpoint; the runnable model when asked and possible."""
    from ..budget.api import load_checkpoint_state

    path = Path(path)
    state, config = load_checkpoint_state(path)
    src = Source(path, state, config)
    if not need_model:
        return src
    if model_factory is not None:
        from ..evaluate import factory as fac

        src.model = fac.build_model(fac.resolve(model_factory), config, state, str(path))
    elif isinstance(config, dict) and "scheme" in config:
        from .load import load_model

        src.model = load_model(path)
    else:
        src.why_no_model = (
            f"{path} has no recurnorm config.json beside it and no --model-factory "
            "was given, so recurnorm cannot run it"
        )
    return src


def _train_tokens(calib_data: str, tokenizer: str | None):
    from ..train.data import load_corpus

    return load_corpus(calib_data, tokenizer=tokenizer).train_tokens  # the training split only


def ship(
    ckpt: str | Path,
    policy: ExportPolicy,
    *,
    effort: str = "normal",
    fit_bytes: int | None = None,
    code_bytes: int = 0,
    fit_formats=None,
    gptq: bool = False,
    calib_data: str | None = None,
    tokenizer: str | None = None,
    calib_tokens: int | None = None,
    model_factory=None,
    sensitivity: str = "direct",
    progress: Callable[[str], None] | None = None,
) -> Packed:
    """Pack a checkpoint under a policy; with GPTQ codes and/or formats chosen by --fit."""
    from .gptq import DEFAULT_CALIB_TOKENS, GPTQExporter

    if gptq and calib_data is None:
        raise ConfigError("--gptq needs --calib-data (its training split calibrates the Hessians)")
    need_model = gptq or (fit_bytes is not None and calib_data is not None)
    src = load_source(ckpt, model_factory, need_model)
    policy, config = checkpoint_policy(policy, src.config, str(src.path))
    notes: list[str] = []
    metadata = {"quant": policy.quantizer, "source": src.path.name}
    if config is not None:
        metadata["config"] = config
    if need_model and src.model is None:
        raise ConfigError(
            f"{'--gptq' if gptq else '--calib-data'}: {src.why_no_model}; pass --model-factory MODULE:FUNCTION"
        )
    if gptq and config is not None and config.get("qat"):
        raise ConfigError("--gptq: a QAT checkpoint ships the codes its training saw; GPTQ would change them")
    tokens = _train_tokens(calib_data, tokenizer) if calib_data is not None else None
    quantize_fn = None
    if gptq:
        n_tokens = calib_tokens or DEFAULT_CALIB_TOKENS
        exporter = GPTQExporter(src.model, tokens, n_tokens)
        quantize_fn = exporter.quantize
        metadata["gptq"] = {"calib_data": str(calib_data), "calib_tokens": n_tokens}
    if fit_bytes is None:
        if quantize_fn is None:
            data = pack_state(src.state, policy, metadata, effort=effort)
        else:
            from ..budget.api import pack_qtensors
            from .pack import export_metadata

            qts, plan = quantize_fn(src.state, policy)
            data = pack_qtensors(qts, {**metadata, "export": export_metadata(policy, plan)}, effort=effort)
        rows, meta = packed_rows(data)
        return Packed(data, rows, policy, meta, notes)

    loss_fn = fisher = None
    if sensitivity not in SENSITIVITIES:
        raise ConfigError(f"--fit-sensitivity {sensitivity!r}: expected one of {', '.join(SENSITIVITIES)}")
    if calib_data is not None:
        from .fit import calibration_loss_fn, fisher_diagonal
        from .gptq import calibration_windows

        windows = calibration_windows(src.model, tokens, calib_tokens or FIT_CALIB_TOKENS)
        if sensitivity == "fisher":
            say = progress or (lambda _m: None)
            say("fit: diagonal Fisher on the calibration windows")
            fisher = fisher_diagonal(src.model, windows)
        else:
            loss_fn = calibration_loss_fn(src.model, windows)
    else:
        notes.append("fit: no --calib-data: sensitivities are a weight-space proxy, not measured Δloss")
    result = fit_budget(
        src.state,
        policy,
        fit_bytes,
        formats=fit_formats,
        loss_fn=loss_fn,
        fisher=fisher,
        quantize_fn=quantize_fn,
        metadata=metadata,
        effort=effort,
        code_bytes=code_bytes,
        progress=progress,
    )
    rows, meta = packed_rows(result.data)
    return Packed(result.data, rows, result.policy, meta, notes, fit=result)


def over_cap_hint(
    ckpt: str | Path, policy: ExportPolicy, max_bytes: int, code_bytes: int, effort: str = "normal"
) -> str:
    """What would fit instead: the widest uniform format under the cap, and whether --fit would."""
    from .fit import parse_formats

    src = load_source(ckpt)
    fitting, smallest = None, None
    for fmt, opts in parse_formats(None):
        pol = replace(policy, quantizer=fmt, options=opts)
        size = len(pack_state(src.state, pol, {}, effort=effort)) + code_bytes
        smallest = size if smallest is None else min(smallest, size)
        if size <= max_bytes:
            fitting = (format_spec(fmt, opts), size)
            break
    narrowest = DEFAULT_FORMATS[-1]
    if fitting is None:
        return (
            f"hint: even -q {narrowest} packs to {smallest:,} bytes with code; no uniform "
            f"int8..{narrowest} format and no --fit {max_bytes} fits"
        )
    return (
        f"hint: -q {fitting[0]} fits ({fitting[1]:,} bytes with code); "
        f"--fit {max_bytes} would choose a format per tensor to fill the cap"
    )
