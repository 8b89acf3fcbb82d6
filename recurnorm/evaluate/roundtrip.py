"""The roundtrip matrix: train (or load) each scheme, export it through real artifact bytes
under each quantizer, rebuild a fresh model from the bytes, and measure the loss it costs.

Comparisons are paired (in our own tiny-preset runs seed noise was as large as the
differences between schemes): within one seed every scheme trains on
the same batches in the same order, and the parameters it shares with
``shared`` start from the same values (``train.loop.train(seed=..., pair_init=True)``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError
from ..model.run import device_of
from ..train.distributed import resolve_device
from . import report as rep
from .exported import export_model, export_policy
from .probes import check_probes, fragility_probe, shuffle_probe

# Shared and unique first: they anchor the gap-recovered ratio and the paired differences.
ANCHORS = ("shared", "unique")


@dataclass
class RoundtripResult:
    """Every row, the aggregates, the four answers, the run's config and the files written."""

    rows: list[rep.Row]
    aggregates: list[dict]
    falsification: list[dict]
    config: dict
    paths: dict[str, Path] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """What results.json holds, plus where the files are."""
        d = rep.results_dict(self.rows, self.aggregates, self.falsification, self.config)
        d["paths"] = {k: str(v) for k, v in self.paths.items()}
        return d

    def markdown(self) -> str:
        """The results.md text."""
        return rep.to_markdown(self.rows, self.aggregates, self.falsification, self.config)


def qat_row(
    model,
    corpus,
    quant: str,
    *,
    scheme: str,
    seed: int,
    steps: int,
    train_kw: dict,
    device: str = "cpu",
    quant_options: dict | None = None,
) -> rep.Row:
    """A ``qat-<quant>`` row: QAT-fine-tune a copy of model, export with qat_policy, measure."""
    import copy

    from ..export.qat import qat_policy
    from ..train.config import TrainConfig
    from ..train.qat import QATSpec, fine_tune_warmup, remove_qat, train_qat
    from .loss import loss

    ft = remove_qat(copy.deepcopy(model).cpu())  # fine-tune from the latent float weights
    kw = {k: v for k, v in train_kw.items() if k not in ("steps", "eval_every")}
    kw["warmup"] = fine_tune_warmup(kw.get("warmup", 0), steps)
    hp = TrainConfig(**kw, steps=steps, seed=seed, eval_every=0)  # the guard runs once, at the end
    result = train_qat(ft, corpus, QATSpec(quant, dict(quant_options or {})), hp, progress=False, device=device)
    ft = result.model.eval()
    bpb_pre = loss(ft, corpus).bits_per_byte
    base = export_policy(ft, quant, quant_options=quant_options)
    exp = export_model(ft, quant, policy=qat_policy(ft.config, base))
    bpb_post = loss(exp.model.to(device_of(ft)), corpus).bits_per_byte
    return rep.Row(
        scheme=scheme,
        quant=f"qat-{quant}",
        seed=seed,
        bpb_pre=bpb_pre,
        bpb_post=bpb_post,
        artifact_bytes=exp.artifact_bytes,
        step_specific_bytes=exp.step_specific_bytes,
        params=ft.param_counts(),
        d_model=ft.config.d_model,
    )


def _step_postfix(bar, steps: int):
    """An on_step callback that shows training progress on the outer bar (every 10 steps)."""

    def on_step(done: int, record: dict) -> None:
        if done % 10 == 0 or done == steps:
            bar.set_postfix(step=f"{done}/{steps}", loss=f"{record.get('loss', 0.0):.3f}")

    return on_step


def _train_in_parallel(
    jobs, lengths, schemes, seeds, configs, checkpoints_dir, data, corpus, tokenizer, train_kw, bar, scheme_train=None
):
    """(pretrained {(scheme, seed, steps): JobResult}, temporary folder or None) for --jobs > 1.

    Every length's models go into one pool, shortest length first and one seed's schemes
    together, so a run cut short leaves whole lengths of checkpoints that a rerun reuses
    (the tail costs nothing: the longest length's jobs are equal and many); a job that
    fails comes back with its error instead of stopping the others.
    """
    if jobs <= 1:
        return {}, None
    import tempfile

    from .parallel import TrainJob, train_parallel

    tmp = None if checkpoints_dir is not None else tempfile.TemporaryDirectory(prefix="rt-jobs-")
    root = Path(checkpoints_dir) if checkpoints_dir is not None else Path(tmp.name)
    multi = len(lengths) > 1
    todo = [
        TrainJob(
            s,
            seed,
            configs[s],
            str(checkpoint_root(root, n, multi) / s / f"seed{seed}"),
            steps=n,
            train_kw=dict((scheme_train or {}).get(s, {})),
        )
        for n in sorted(lengths)
        for seed in range(seeds)
        for s in schemes
        if checkpoints_dir is None
        or checkpoint_path(checkpoint_root(checkpoints_dir, n, multi), s, seed, seeds) is None
    ]
    bar.set_description(f"train {len(todo)} models on {jobs} processes")
    spec = data if isinstance(data, (str, os.PathLike)) else corpus
    try:
        done = train_parallel(
            todo,
            data=spec,
            tokenizer=tokenizer,
            train_kw=train_kw,
            n_jobs=jobs,
            on_done=lambda r: bar.set_postfix(done=f"{r.scheme}/seed{r.seed}@{r.steps}"),
            keep_going=True,
        )
    except BaseException:
        if tmp is not None:
            tmp.cleanup()
        raise
    return done, tmp


def check_scheme_train(scheme_train: dict[str, dict] | None, schemes: list[str], train_kw: dict) -> dict[str, dict]:
    """Per-scheme training overrides, checked: known schemes, known hyper-parameters; ConfigError otherwise."""
    out = {}
    for s, kw in (scheme_train or {}).items():
        if s not in schemes:
            raise ConfigError(f"scheme_train names {s!r}, which is not among the schemes ({', '.join(schemes)})")
        unknown = sorted(set(kw) - set(train_kw))
        if unknown:
            raise ConfigError(f"scheme_train[{s!r}]: unknown training field(s) {', '.join(unknown)}")
        out[s] = dict(kw)
    return out


def checkpoint_root(checkpoints_dir: str | os.PathLike, steps: int, multi: bool) -> Path:
    """Where one length's checkpoints live: DIR itself for a one-length run, DIR/steps<N> otherwise."""
    return Path(checkpoints_dir) / f"steps{steps}" if multi else Path(checkpoints_dir)


def resolve_steps(steps: int | str | list[int] | tuple[int, ...] | None, default: int) -> list[int]:
    """Training lengths from an int, '150,600,2400' or a list; the preset's when None. Shortest first."""
    if steps is None:
        return [int(default)]
    if isinstance(steps, str):
        parts = [p.strip() for p in steps.split(",") if p.strip()]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise ConfigError(f"steps must be positive integers separated by commas, got {steps!r}") from None
    elif isinstance(steps, (list, tuple)):
        values = list(steps)
    else:
        values = [steps]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise ConfigError(f"steps must be positive integers, got {steps!r}")
    return sorted(set(values))


def _name_list(names: str | list[str] | tuple[str, ...], what: str) -> list[str]:
    """Names from a list or 'a,b,c', stripped, first occurrence kept; ConfigError when none."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    names = list(dict.fromkeys(n.strip() for n in names))
    if not names:
        raise ConfigError(f"no {what} given")
    return names


def resolve_schemes(schemes: str | list[str] | tuple[str, ...]) -> list[str]:
    """A scheme list from names or 'all' / 'a,b,c'; anchors first, unknown names raise ConfigError."""
    from ..model import schemes as registry

    schemes = _name_list(registry.available() if schemes == "all" else schemes, "schemes")
    for s in schemes:
        registry.scheme_class(s)  # ConfigError naming the choices
    return [s for s in ANCHORS if s in schemes] + [s for s in schemes if s not in ANCHORS]


def resolve_quants(quants: str | list[str] | tuple[str, ...]) -> list[str]:
    """A quantizer list from names or 'a,b'; unknown names raise (QuantError lists the formats)."""
    from .. import quant as qmod

    quants = _name_list(quants, "quantizers")
    for q in quants:
        qmod.get(q)
    return quants


def checkpoint_path(checkpoints_dir: str | os.PathLike, scheme: str, seed: int, seeds: int) -> Path | None:
    """DIR/<scheme>/seed<k>, or DIR/<scheme> for a one-seed run; None when neither holds weights."""
    base = Path(checkpoints_dir) / scheme
    for cand in (base / f"seed{seed}", base if seeds == 1 or seed == 0 else None):
        if cand is not None and (cand / "model.safetensors").is_file():
            return cand
    return None


def base_model_config(preset, corpus, model_overrides: dict | None) -> dict:
    """The preset's model fields, widened to the corpus vocabulary, with overrides applied."""
    cfg = dict(preset.model)
    cfg["vocab_size"] = max(int(cfg.get("vocab_size", 256)), int(corpus.vocab_size))
    cfg.update(model_overrides or {})
    return cfg


def roundtrip(
    schemes: str | list[str] = ("shared", "unique", "norm_gate"),
    quants: str | list[str] = ("int8", "int4"),
    *,
    data: Any = "default",
    seeds: int = 1,
    preset: str = "tiny",
    steps: int | str | list[int] | None = None,
    out_dir: str | os.PathLike | None = None,
    checkpoints_dir: str | os.PathLike | None = None,
    probes: tuple[str, ...] | list[str] = (),
    match_bytes: int | str | None = None,
    progress: bool = True,
    force: bool = False,
    tokenizer: str | None = None,
    model_overrides: dict | None = None,
    train_overrides: dict | None = None,
    scheme_options: dict[str, dict] | None = None,
    quant_options: dict[str, dict] | None = None,
    device: str = "auto",
    write: bool = True,
    qat: str | list[str] | tuple[str, ...] = (),
    qat_steps: int = 100,
    jobs: int = 1,
    scheme_train: dict[str, dict] | None = None,
) -> RoundtripResult:
    """Train or load every scheme per seed, export under every quantizer, measure, and report.

    ``data`` is a corpus spec or a loaded Corpus. ``steps`` is one training
    length or several ('150,600,2400' or a list): each length trains its own
    models from initialization with the preset's warm-up and a cosine schedule
    ending at that length (a checkpoint of a longer cosine run would still
    have a high learning rate, so it is not a shorter run), and seeds are
    paired within a length only. A model whose training fails is reported
    (``config["failures"]``, the report's Training failures) and the run goes on.
    ``model_overrides`` and ``train_overrides`` replace fields of the preset
    (tests use tiny shapes). Trained models are saved to
    ``checkpoints_dir/<scheme>/seed<k>`` (``checkpoints_dir/steps<N>/...`` with
    several lengths) when that path is given and holds none yet, so a later
    run can reuse them. ``match_bytes`` is a byte count (each scheme's width is
    chosen so its artifact lands near it) or a scheme name (lora's rank is
    chosen so its artifact lands nearest that scheme's). ``qat`` formats add a
    ``qat-<format>`` row per scheme: the trained model QAT-fine-tuned for
    ``qat_steps`` steps; pre = the QAT model (fake quant at λ=1), post = its
    export under ``train.qat.qat_policy`` (the codes training saw).
    ``jobs`` > 1 trains the models in that many parallel processes first
    (``evaluate.parallel``; one per GPU where there are GPUs), then measures them here.
    ``scheme_train`` overrides training hyper-parameters per scheme (``{"norm": {"lr": 4e-3}}``:
    each scheme at its own tuned rate, ``evaluate.lrsweep``); batches and shared initial
    values depend on the seed only, so the pairing holds at different rates.
    """
    from tqdm import tqdm

    from ..model import ModelConfig
    from ..train.data import as_corpus
    from ..train.presets import get_preset

    t0 = time.perf_counter()
    schemes = resolve_schemes(schemes)
    quants = resolve_quants(quants)
    qat_formats = resolve_quants(qat) if qat else []
    probes = check_probes(probes)
    quant_options = quant_options or {}
    scheme_options = scheme_options or {}
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds must be a positive int, got {seeds!r}")
    if write:
        if out_dir is None:
            raise ConfigError("out_dir is required to write the results")
        rep.check_outputs(out_dir, force)  # fail before any training, not after
    p = get_preset(preset)
    lengths = resolve_steps(steps, p.hp.steps)
    train_kw = p.with_overrides(**(train_overrides or {})).train_kwargs()
    train_kw.pop("eval_every", None)
    train_kw.pop("steps", None)  # per length
    scheme_train = check_scheme_train(scheme_train, schemes, train_kw)
    corpus = as_corpus(data, tokenizer)
    base = base_model_config(p, corpus, model_overrides)
    configs = {s: {**base, "scheme": s, "scheme_options": dict(scheme_options.get(s, {}))} for s in schemes}
    for c in configs.values():
        ModelConfig.from_dict(c)  # ConfigError now, not after the first training

    matches, rank_match = apply_match(configs, match_bytes, quants[0], quant_options.get(quants[0]))

    dev = resolve_device(device)
    per_job = 1 + len(quants) + len(qat_formats) + ("shuffle" in probes) + ("fragility" in probes) * len(quants)
    bar = tqdm(
        total=len(lengths) * seeds * len(schemes) * per_job,
        unit="job",
        desc="roundtrip",
        disable=not progress,
        dynamic_ncols=True,
    )
    rows: list[rep.Row] = []
    sources: dict[str, str] = {}
    failures: list[dict] = []
    pretrained, tmp = _train_in_parallel(
        jobs, lengths, schemes, seeds, configs, checkpoints_dir, data, corpus, tokenizer, train_kw, bar, scheme_train
    )
    multi = len(lengths) > 1
    try:
        for n in lengths:
            kw = {**train_kw, "steps": n}
            ckpt_root = checkpoint_root(checkpoints_dir, n, multi) if checkpoints_dir is not None else None
            for seed in range(seeds):
                for scheme in schemes:
                    kw_s = {**kw, **scheme_train.get(scheme, {})}
                    key = f"{scheme}/seed{seed}" + (f"@{n}" if multi else "")
                    model, source, error = _obtain_model(
                        scheme, seed, n, seeds, configs, ckpt_root, pretrained.get((scheme, seed, n)), corpus,
                        kw_s, dev, bar, progress,
                    )  # fmt: skip
                    if error is not None:
                        failures.append({"steps": n, "scheme": scheme, "seed": seed, "error": error})
                        sources[key] = f"FAILED: {error}"
                        bar.update(per_job)
                        continue
                    if scheme_train.get(scheme):
                        source += " at " + ", ".join(f"{k} {v}" for k, v in scheme_train[scheme].items())
                    sources[key] = source
                    rows += _measure(
                        model, corpus, scheme=scheme, seed=seed, steps=n, quants=quants, qat_formats=qat_formats,
                        probes=probes, quant_options=quant_options, qat_steps=qat_steps, train_kw=kw_s, dev=dev,
                        bar=bar, key=key,
                    )  # fmt: skip
    finally:
        bar.close()
        if tmp is not None:
            tmp.cleanup()

    for s, m in matches.items():
        got = [r.artifact_bytes for r in rows if r.scheme == s and r.quant == quants[0]]
        m.actual_bytes = round(sum(got) / len(got)) if got else None
        m.within_tolerance = abs(m.deviation) <= 0.03
    if rank_match is not None:
        rank_match.fill_actual(rows, quants[0])
    rows = rep.fill_gap_recovered(rows)
    aggs = rep.aggregate(rows)
    answers = rep.falsification(rows, aggs)
    config = {
        "schemes": schemes,
        "quants": quants,
        "seeds": seeds,
        "preset": preset,
        "data": str(getattr(corpus, "source", data)),
        "tokenizer": getattr(corpus, "tokenizer", None),
        "steps": lengths if multi else lengths[0],
        "train": {**train_kw, "steps": lengths if multi else lengths[0]},
        "schedule": (
            "each length trained from initialization: linear warm-up, then cosine to "
            "lr·min_lr_frac at that length (shorter runs are not checkpoints of longer ones)"
        ),
        "model": base,
        "scheme_options": {s: c["scheme_options"] for s, c in configs.items() if c["scheme_options"]},
        "scheme_train": scheme_train,
        "quant_options": quant_options,
        "probes": list(probes),
        "match_bytes": match_bytes,
        "qat": qat_formats,
        "qat_steps": qat_steps if qat_formats else None,
        "export_policy": (
            "recurnorm.export default: every weight matrix quantized whatever its "
            "size; controls (model.control_names() and norm/gate/scale name patterns) "
            "kept fp32; embeddings int8; vectors fp16; fp32/fp16/bf16 export "
            "every tensor in that format"
        ),
        "matched_widths": {s: m.to_dict() for s, m in matches.items()},
        "matched_rank": rank_match.to_dict() if rank_match is not None else None,
        "sources": sources,
        "failures": failures,
        "paired": (
            "same seed: same batches in the same order"
            + (
                "; widths differ (--match-bytes), so initial values are not shared"
                if matches
                else " and the same initial values for shared parameters"
            )
            + ("; within one training length only" if multi else "")
        ),
        "device": str(dev),
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    result = RoundtripResult(rows, aggs, answers, config)
    if write:
        result.paths = rep.write_outputs(rows, config, out_dir, force=force, aggs=aggs, answers=answers)
    return result


def apply_match(configs: dict[str, dict], match_bytes: int | str | None, quant: str, quant_options: dict | None):
    """(widths, rank match) of --match-bytes, written into configs: a scheme name sets lora's rank
    to the one whose artifact lands nearest that scheme's, a byte count each scheme's width."""
    if isinstance(match_bytes, str):
        from .matching import match_rank

        rank_match = match_rank(configs, match_bytes, quant, quant_options)
        configs["lora"]["scheme_options"]["rank"] = rank_match.rank
        return {}, rank_match
    if match_bytes is not None:
        from .matching import match_widths

        matches = match_widths(configs, quant, int(match_bytes), quant_options)
        for s, m in matches.items():
            configs[s]["d_model"] = m.d_model
        return matches, None
    return {}, None


def _obtain_model(scheme, seed, steps, seeds, configs, ckpt_root, done, corpus, train_kw, dev, bar, progress):
    """(model, source, None), or (None, None, error text) when its training failed."""
    from ..export.load import load_model
    from ..model import ModelConfig, save_checkpoint
    from ..train.config import TrainConfig
    from ..train.loop import train
    from .parallel import failure_text

    key = f"{scheme}/seed{seed}"
    ckpt = checkpoint_path(ckpt_root, scheme, seed, seeds) if ckpt_root is not None else None
    if done is not None:
        if done.error is not None:
            return None, None, done.error
        bar.set_description(f"load {key}")
        source = f"trained {steps} steps in {done.elapsed_s:.1f} s (parallel job on {done.device})"
        model = load_model(done.path)
    elif ckpt is not None:
        bar.set_description(f"load {key}")
        model = load_model(ckpt)  # a QAT checkpoint is evaluated as what it is
        if model.config.scheme != scheme:
            raise CheckpointError(f"{ckpt} holds scheme {model.config.scheme!r}, not {scheme!r}")
        source = f"loaded from {ckpt}"
    else:
        bar.set_description(f"train {key} ({steps} steps)")
        try:
            result = train(
                ModelConfig.from_dict(configs[scheme]),
                corpus,
                TrainConfig(**train_kw, seed=seed),
                progress=progress,
                device=str(dev),
                on_step=_step_postfix(bar, steps),
            )
        except Exception as exc:  # reported with the results, not fatal to the other models
            return None, None, failure_text(exc)
        model = result.model
        source = f"trained {steps} steps in {result.elapsed_s:.1f} s"
        if ckpt_root is not None:
            save_checkpoint(model, Path(ckpt_root) / scheme / f"seed{seed}")
    bar.update(1)
    return model.to(dev).eval(), source, None


def _measure(
    model, corpus, *, scheme, seed, steps, quants, qat_formats, probes, quant_options, qat_steps, train_kw, dev, bar,
    key,
) -> list[rep.Row]:  # fmt: skip
    """The rows of one trained model: bpb before export, then each quantizer's roundtrip (and probes, QAT)."""
    from .loss import loss

    rows = []
    bar.set_description(f"eval {key}")
    bpb_pre = loss(model, corpus).bits_per_byte
    shuffle = None
    if "shuffle" in probes:
        shuffle = shuffle_probe(model, corpus, bpb_before=bpb_pre)
        bar.update(1)
    params = model.param_counts()
    for q in quants:
        bar.set_description(f"export {key} {q}")
        exp = export_model(model, q, quant_options=quant_options.get(q))
        bpb_post = loss(exp.model.to(dev), corpus).bits_per_byte
        bar.update(1)
        row_probes: dict[str, dict] = {}
        if shuffle is not None:
            row_probes["shuffle"] = dict(shuffle)
        if "fragility" in probes:
            bar.set_description(f"fragility {key} {q}")
            row_probes["fragility"] = fragility_probe(
                model, corpus, q, quant_options=quant_options.get(q), bpb_controls_float=bpb_post
            )  # the default export keeps them float
            bar.update(1)
        rows.append(
            rep.Row(
                scheme=scheme,
                quant=q,
                seed=seed,
                bpb_pre=bpb_pre,
                bpb_post=bpb_post,
                artifact_bytes=exp.artifact_bytes,
                step_specific_bytes=exp.step_specific_bytes,
                params=params,
                d_model=model.config.d_model,
                probes=row_probes,
                steps=steps,
            )
        )
        bar.set_postfix(bpb=f"{bpb_pre:.3f}→{bpb_post:.3f}")
        del exp
    for q in qat_formats:
        bar.set_description(f"qat {key} {q}")
        row = qat_row(
            model,
            corpus,
            q,
            scheme=scheme,
            seed=seed,
            steps=qat_steps,
            train_kw=train_kw,
            device=str(dev),
            quant_options=quant_options.get(q),
        )
        row.steps = steps
        rows.append(row)
        bar.update(1)
        bar.set_postfix(bpb=f"{row.bpb_pre:.3f}→{row.bpb_post:.3f}")
    return rows
