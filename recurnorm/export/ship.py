"""A checkpoint (or a model in memory) to an artifact the way `recurnorm pack` does it:
names checked, policy, GPTQ, --fit. The over-cap hint is hint.py.

The CLI only parses options and prints; everything it decides is here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..budget.cap import Budget
from ..errors import ConfigError
from .pack import Packed, check_decoded_limit, checkpoint_policy, load_state, pack_state
from .policy import ExportPolicy
from .record import packed_rows

# --fit's calibration windows. Direct sensitivities run (formats x candidate tensors) passes over
# them: with 4,096 tokens their noise let --fit lose to uniform int6 on a tiny model, with 32,768
# it won (benchmarks/frontier.py); --fit-sensitivity fisher needs one backward per window.
FIT_CALIB_TOKENS = 32768
# fisher: ½ Σ F δ² from one backward per calibration window (cheap, smooth); direct: the
# calibration loss with each tensor alone quantized, one pass per tensor and format.
# hessian: tr(δHδᵀ) per tensor and candidate with H = Σ xxᵀ of the layer's calibration inputs,
# scaled by one direct Δloss per tensor: one loss pass per tensor whatever the number of
# candidates (bits x clip x LQER rank), where direct takes one per tensor and candidate.
SENSITIVITIES = ("fisher", "direct", "hessian")


@dataclass
class Source:
    """A checkpoint: its tensors, its config, and (when recurnorm can run it) the model."""

    path: Path
    state: dict
    config: dict | None
    model: object | None = None  # an nn.Module with these weights, or None
    why_no_model: str = ""
    notes: list[str] = field(default_factory=list)  # what was done to it on the way in

    @classmethod
    def from_model(cls, model, name: str = "model", config: dict | None = None) -> Source:
        """A model in memory (a training script packing its own model): its state dict, tied
        parameters kept as one tensor."""
        state = {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()}
        return cls(Path(name), state, config, model)


def load_source(path: str | Path, model_factory=None, need_model: bool = False) -> Source:
    """Tensors and config of a checkpoint (wrapper prefixes stripped); the runnable model when
    asked and possible."""
    path = Path(path)
    state, config, notes = load_state(path)
    src = Source(path, state, config, notes=notes)
    if not need_model:
        return src
    if model_factory is not None:
        from ..model.factory import build_model, resolve

        src.model = build_model(resolve(model_factory), config, state, str(path))
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
    fit_bytes: Budget | int | None = None,
    gptq: bool = False,
    calib_data: str | None = None,
    tokenizer: str | None = None,
    model_factory=None,
    hessians_file: str | Path | None = None,
    out: str | Path | None = None,
    jobs: int = 1,
    **kw,
) -> Packed:
    """Pack a checkpoint under a policy; with GPTQ codes and/or formats chosen by --fit
    (``fit_bytes``: a cap, or a Budget counting code and loader too; ``hessians_file``: a
    safetensors file of {weight name: H} to GPTQ with instead of calibrating).

    out: where the artifact will go: a .safetensors checkpoint packed as it is (no --fit or
    GPTQ, effort normal, no stacked matrices) is then streamed, tensor by tensor (``jobs`` at
    once), into a temp file beside it (Packed.temp, which Packed.data maps; io.publish names it)."""
    hessians_given = None
    if hessians_file is not None:
        if not gptq:
            raise ConfigError("--hessians FILE only applies with --gptq")
        hessians_given = load_hessians(hessians_file)
    elif gptq and calib_data is None:
        raise ConfigError("--gptq needs --calib-data (its training split calibrates the Hessians) or --hessians FILE")
    if out is not None and not gptq and fit_bytes is None and kw.get("effort", "normal") == "normal":
        packed = _ship_streamed(ckpt, policy, Path(out), jobs, kw.get("max_decoded_bytes"))
        if packed is not None:
            return packed
    need_model = (gptq and hessians_given is None) or (fit_bytes is not None and calib_data is not None)
    src = load_source(ckpt, model_factory, need_model)
    if need_model and src.model is None:
        raise ConfigError(
            f"{'--gptq' if gptq else '--calib-data'}: {src.why_no_model}; pass --model-factory MODULE:FUNCTION"
        )
    tokens = _train_tokens(calib_data, tokenizer) if calib_data is not None else None
    label = calib_data if hessians_file is None else Path(hessians_file).name
    return ship_source(
        src,
        policy,
        fit_bytes=fit_bytes,
        gptq=gptq,
        train_tokens=tokens,
        calib_label=label,
        hessians_given=hessians_given,
        **kw,
    )


def load_hessians(path: str | Path) -> dict:
    """{weight name: H [in, in]} from a safetensors file (a competitor's own calibration)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        found = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise ConfigError(f"--hessians {path}: not a readable safetensors file ({exc})") from None
    for name, H in found.items():
        if H.dim() != 2 or H.shape[0] != H.shape[1] or not H.is_floating_point():
            raise ConfigError(f"--hessians {path}: tensor {name!r} is {list(H.shape)} {H.dtype}, not a square float H")
    return {n: H.float() for n, H in found.items()}


def gptq_coverage(exporter, policy: ExportPolicy, state: dict) -> list[str]:
    """Notes on the matrices --gptq leaves to rounding (and why); ConfigError when it covers none."""
    from .banks import unbank

    flat = unbank(state)
    done, missed = exporter.coverage(policy.plan(flat), flat)
    if not done:
        shown = "; ".join(f"{n}: {why}" for n, why in list(missed.items())[:3])
        raise ConfigError(
            "--gptq covers no matrix the policy quantizes"
            + (f" ({shown}{'; ...' if len(missed) > 3 else ''})" if missed else "")
            + ": the model's forward uses no weight through F.linear, matmul or nn.Linear, or the names differ"
        )
    if not missed:
        return []
    whys: dict[str, list[str]] = {}
    for n, why in missed.items():
        whys.setdefault(why, []).append(n)
    parts = [f"{len(ns)} {why} ({', '.join(ns[:4])}{', ...' if len(ns) > 4 else ''})" for why, ns in whys.items()]
    return [f"--gptq: GPTQ'd {len(done)} of {len(done) + len(missed)} quantized matrices; rounded: " + "; ".join(parts)]


def _ship_streamed(ckpt, policy: ExportPolicy, out: Path, jobs: int, max_decoded_bytes: int | None) -> Packed | None:
    """ship() of a checkpoint read tensor by tensor (stream.py), or None where it cannot be."""
    import os

    from ..io import _discard, temp_beside
    from .banks import is_stack
    from .stream import open_streamed, pack_streamed, streams

    streamed = open_streamed(ckpt)
    if streamed is None:
        return None
    _, _, state, config, notes = streamed
    if any(is_stack(t) for t in state.values()):  # banks are sliced and restacked in memory
        return None
    policy.check_rules(state, str(ckpt))
    policy, config = checkpoint_policy(policy, config, str(ckpt))
    if not streams(policy):
        return None
    check_decoded_limit(state, max_decoded_bytes)  # before any work
    metadata = {"quant": policy.quantizer, "source": Path(ckpt).name}
    if config is not None:
        metadata["config"] = config

    # The self-check: a full decode, in jobs, of the file's bytes (each stream's codes against their
    # checksum; the payload's was taken of the bytes as they were written: not again, 1.4-3 s of
    # one core).
    def check(data):
        return packed_rows(data, max_decoded_bytes, jobs, hashed=True)

    fd, tmp = temp_beside(out)
    try:
        with os.fdopen(fd, "wb+") as f:
            data, (rows, meta) = pack_streamed(streamed, policy, metadata, f, jobs=jobs, check=check)
            f.flush()
    except BaseException:
        _discard(tmp)
        raise
    return Packed(data, rows, policy, meta, notes, temp=tmp)


def ship_model(model, policy: ExportPolicy | str, *, name: str = "model", config: dict | None = None, **kw) -> Packed:
    """Pack a model in memory, as a training script does at its end (``policy``: an
    ExportPolicy or a -q string; ``train_tokens=`` and ``gptq=True`` for GPTQ codes,
    ``seq_len=`` for its calibration windows when the model does not say its own)."""
    from .spec import build_policy

    policy = build_policy(policy) if isinstance(policy, str) else policy
    return ship_source(Source.from_model(model, name, config), policy, **kw)


def ship_source(
    src: Source,
    policy: ExportPolicy,
    *,
    effort: str = "normal",
    fit_bytes: Budget | int | None = None,
    fit_formats=None,
    gptq: bool = False,
    train_tokens=None,
    calib_label: str | None = None,
    calib_tokens: int | None = None,
    seq_len: int | None = None,
    sensitivity: str = "direct",
    fit_embeddings: bool = False,
    progress: Callable[[str], None] | None = None,
    hessians_given: dict | None = None,
    max_decoded_bytes: int | None = None,
) -> Packed:
    """Pack a Source under a policy: rules checked against its names, then GPTQ and --fit as asked
    (``hessians_given``: {weight name: H} to GPTQ with, instead of calibrating the model;
    ``max_decoded_bytes``: what verify allows the artifact to decode to, checked first and after)."""
    from .fit import fit_budget
    from .gptq import DEFAULT_CALIB_TOKENS, GPTQExporter

    check_decoded_limit(src.state, max_decoded_bytes)
    policy.check_rules(src.state, str(src.path))
    policy, config = checkpoint_policy(policy, src.config, str(src.path))
    notes = list(src.notes)
    metadata = {"quant": policy.quantizer, "source": src.path.name}
    if config is not None:
        metadata["config"] = config
    if (gptq and hessians_given is None or train_tokens is not None and fit_bytes is not None) and src.model is None:
        raise ConfigError(f"{src.path}: GPTQ and calibrated --fit need the model to run")
    if gptq and train_tokens is None and hessians_given is None:
        raise ConfigError("GPTQ needs training tokens to calibrate its Hessians")
    if gptq and config is not None and config.get("qat"):
        raise ConfigError("--gptq: a QAT checkpoint ships the codes its training saw; GPTQ would change them")
    quantize_fn = None
    if gptq:
        n_tokens = calib_tokens or DEFAULT_CALIB_TOKENS
        if hessians_given is None:
            exporter = GPTQExporter(src.model, train_tokens, n_tokens, seq_len=seq_len, progress=progress)
            metadata["gptq"] = {"calib_data": str(calib_label or "train_tokens"), "calib_tokens": n_tokens}
        else:
            exporter = GPTQExporter(None, None, hessians=hessians_given, progress=progress)
            metadata["gptq"] = {"hessians": str(calib_label)}
        notes += gptq_coverage(exporter, policy, src.state)
        quantize_fn = exporter.quantize
    if fit_bytes is None:
        if quantize_fn is None:
            data = pack_state(src.state, policy, metadata, effort=effort)
        else:
            from .banks import unbank
            from .pack import pack_plan

            state = unbank(src.state)
            qts, plan = quantize_fn(state, policy)
            data = pack_plan(state, qts, plan, policy, metadata, effort=effort)
        rows, meta = packed_rows(data, max_decoded_bytes)
        return Packed(data, rows, policy, meta, notes, state=src.state)

    loss_fn = fisher = hessians = None
    if sensitivity not in SENSITIVITIES:
        raise ConfigError(f"--fit-sensitivity {sensitivity!r}: expected one of {', '.join(SENSITIVITIES)}")
    if train_tokens is not None:
        from .fit import calibration_loss_fn, fisher_diagonal
        from .gptq import calibration_windows

        windows = calibration_windows(src.model, train_tokens, calib_tokens or FIT_CALIB_TOKENS, seq_len)
        if sensitivity == "fisher":
            say = progress or (lambda _m: None)
            say("fit: diagonal Fisher on the calibration windows")
            fisher = fisher_diagonal(src.model, windows)
        else:
            loss_fn = calibration_loss_fn(src.model, windows)
        if sensitivity == "hessian":
            from ..model.run import run_forward
            from .banks import unbank
            from .gptq import collect_all_hessians

            hessians = (
                exporter.hessians
                if gptq
                else collect_all_hessians(src.model, windows, unbank(src.state), run_forward, progress)
            )
    else:
        notes.append("fit: no --calib-data: sensitivities are a weight-space proxy, not measured Δloss")
    result = fit_budget(
        src.state,
        policy,
        fit_bytes,
        formats=fit_formats,
        loss_fn=loss_fn,
        fisher=fisher,
        hessians=hessians,
        quantize_fn=quantize_fn,
        metadata=metadata,
        effort=effort,
        embeddings=fit_embeddings,
        progress=progress,
    )
    rows, meta = packed_rows(result.data, max_decoded_bytes)
    return Packed(result.data, rows, result.policy, meta, notes, fit=result, state=src.state)
