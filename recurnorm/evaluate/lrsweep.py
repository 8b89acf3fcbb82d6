"""Every scheme at its own learning rate: a sweep, the choice, and the paired comparison.

The validation split is cut in two contiguous halves: the rate (and the control
learning-rate multiplier) is chosen on the first, the *selection* half, and the
comparison is reported on the second, the *report* half, so the reported numbers
are not the ones the choice was fitted to. Each half is scored on its own windows
(``loss.loss`` cuts a stream from its start), so no token is an input or a target
of both.

Pairing holds across rates: within one seed every run draws the same batches
(the batch generator depends on the seed only) and starts its shared parameters
from the ``shared`` scheme's values (``pair_init``); the rate changes only the
updates.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError
from ..train.corpus import Corpus

# The rates within this many bpb of a scheme's best count as "as good" (flatness).
FLAT_BPB = 0.02
SWEEP_PNG = "lr_sweep.png"
SWEEP_CSV = "lr_sweep.csv"
SWEEP_RUNS = "lr_sweep_runs.jsonl"  # each sweep run as it ends: a sweep cut short resumes from it
SWEEP_COLUMNS = ("scheme", "lr", "control_lr_mult", "seeds", "bpb_select", "best", "error")


@dataclass(frozen=True)
class ValidationSplit:
    """The selection half and the report half of a corpus's validation split (token index ranges)."""

    select: Corpus
    report: Corpus
    select_range: tuple[int, int]  # [start, stop) in corpus.val_tokens
    report_range: tuple[int, int]


def split_validation(corpus: Corpus) -> ValidationSplit:
    """Cut the validation tokens in two contiguous halves; both keep the training tokens."""
    n = len(corpus.val_tokens)
    cut = n // 2
    if cut < 2 or n - cut < 2:
        raise DataError(f"corpus {corpus.source}: {n} validation tokens cannot be split into two scored halves")

    def half(a: int, b: int) -> Corpus:
        return Corpus(
            corpus.train_tokens,
            corpus.val_tokens[a:b],
            corpus.val_bytes[a:b],
            corpus.vocab_size,
            corpus.tokenizer,
            corpus.source,
        )

    return ValidationSplit(half(0, cut), half(cut, n), (0, cut), (cut, n))


def parse_floats(value: str | list | tuple, what: str) -> list[float]:
    """'5e-4,1e-3' or a list -> sorted distinct positive floats; ConfigError naming `what` otherwise."""
    parts = [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else list(value)
    try:
        out = sorted({float(p) for p in parts})
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be positive numbers separated by commas, got {value!r}") from None
    if not out or any(not math.isfinite(x) or x <= 0 for x in out):
        raise ConfigError(f"{what} must be positive numbers separated by commas, got {value!r}")
    return out


def has_step_controls(config: dict) -> bool:
    """Whether a scheme has step-specific control tensors (gains, gates) for control_lr_mult to act on."""
    from ..model import ModelConfig, RecurrentLM

    model = RecurrentLM(ModelConfig.from_dict(config))
    return bool(model.control_names() & model.step_specific_names())


@dataclass
class SweepResult:
    """Every sweep run, its per-setting means, each scheme's choice and flatness."""

    runs: list[dict]  # one per (scheme, lr, control_lr_mult, seed)
    table: list[dict]  # one per (scheme, lr, control_lr_mult): mean selection bpb over seeds
    best: dict[str, dict]  # scheme -> {"lr", "control_lr_mult", "bpb_select", "flatness": {...}}
    config: dict = field(default_factory=dict)

    def scheme_train(self) -> dict[str, dict]:
        """The roundtrip's per-scheme overrides: each scheme's chosen rate and multiplier."""
        return {s: {"lr": b["lr"], "control_lr_mult": b["control_lr_mult"]} for s, b in self.best.items()}

    def to_dict(self) -> dict:
        return {"config": self.config, "runs": self.runs, "table": self.table, "best": self.best}


def lr_sweep(
    schemes: str | list[str],
    rates: str | list[float],
    *,
    control_mults: str | list[float] = (1.0,),
    data: Any = "default",
    tokenizer: str | None = None,
    preset: str = "sweep",
    steps: int | None = None,
    seeds: int = 1,
    model_overrides: dict | None = None,
    train_overrides: dict | None = None,
    scheme_options: dict[str, dict] | None = None,
    device: str = "auto",
    progress: bool = True,
    runs_log: str | os.PathLike | None = None,
    match_bytes: int | str | None = None,
    match_quant: str = "int8",
) -> SweepResult:
    """Train every scheme at every rate (and, where it has step controls, every control multiplier).

    ``runs_log`` (a JSON-lines file) gets each finished run as it ends, so a sweep cut
    short resumes: the runs already there, made with the same data, preset, length and
    model, are not trained again. ``match_bytes`` (with ``match_quant``) sizes the models as
    roundtrip's ``--match-bytes`` does, so each scheme is tuned at the shape it is compared at.

    Each run is scored on the selection half of the validation split only
    (``split_validation``); the choice per scheme is the setting with the lowest
    mean selection bpb over seeds. A run whose training fails (a rate too high
    diverges) is listed with its error and cannot be chosen.
    """
    from tqdm import tqdm

    from ..model import ModelConfig
    from ..train.config import TrainConfig
    from ..train.data import as_corpus
    from ..train.distributed import resolve_device
    from ..train.loop import train
    from ..train.presets import get_preset
    from .loss import loss
    from .parallel import failure_text
    from .roundtrip import apply_match, base_model_config, resolve_schemes

    t0 = time.perf_counter()
    schemes = resolve_schemes(schemes)
    rates = parse_floats(rates, "lr-sweep rates")
    mults = parse_floats(control_mults, "control-lr-mult values")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds must be a positive int, got {seeds!r}")
    p = get_preset(preset)
    n = int(steps or p.hp.steps)
    train_kw = p.with_overrides(**(train_overrides or {})).train_kwargs()
    for k in ("eval_every", "steps", "lr", "control_lr_mult"):
        train_kw.pop(k, None)
    corpus = as_corpus(data, tokenizer)
    split = split_validation(corpus)
    base = base_model_config(p, corpus, model_overrides)
    scheme_options = scheme_options or {}
    configs = {s: {**base, "scheme": s, "scheme_options": dict(scheme_options.get(s, {}))} for s in schemes}
    apply_match(configs, match_bytes, match_quant, None)
    # A scheme without step controls: the multiplier would act on the shared norms only; one value.
    mults_of = {s: (mults if has_step_controls(c) else [1.0]) for s, c in configs.items()}
    dev = resolve_device(device)
    plan = [(seed, s, lr, m) for seed in range(seeds) for s in schemes for lr in rates for m in mults_of[s]]
    bar = tqdm(total=len(plan), unit="run", desc="lr sweep", disable=not progress, dynamic_ncols=True)
    fingerprint = {"data": str(corpus.source), "preset": preset, "steps": n, "models": configs, "train": train_kw}
    done = _read_runs_log(runs_log, fingerprint) if runs_log is not None else {}
    runs = []
    try:
        for seed, s, lr, m in plan:
            if (s, lr, m, seed) in done:
                runs.append(done[(s, lr, m, seed)])
                bar.update(1)
                continue
            bar.set_description(f"sweep {s} lr={lr:g} ×{m:g} seed{seed}")
            run = {"scheme": s, "lr": lr, "control_lr_mult": m, "seed": seed, "bpb_select": None, "error": None}
            t_run = time.perf_counter()
            try:
                hp = TrainConfig(**train_kw, seed=seed, steps=n, lr=lr, control_lr_mult=m)
                res = train(ModelConfig.from_dict(configs[s]), split.select, hp, progress=False, device=str(dev))
                run["bpb_select"] = loss(res.model.eval(), split.select).bits_per_byte
            except Exception as exc:  # a diverged rate is a result of the sweep, not the end of it
                run["error"] = failure_text(exc)
            run["train_s"] = round(time.perf_counter() - t_run, 1)
            runs.append(run)
            if runs_log is not None:
                _append_run(runs_log, fingerprint, run)
            bar.update(1)
            if run["bpb_select"] is not None:
                bar.set_postfix(bpb=f"{run['bpb_select']:.3f}")
    finally:
        bar.close()
    table = sweep_table(runs)
    best = choose(table)
    config = {
        "schemes": schemes,
        "rates": rates,
        "control_lr_mults": {s: mults_of[s] for s in schemes},
        "steps": n,
        "seeds": seeds,
        "preset": preset,
        "data": str(getattr(corpus, "source", data)),
        "tokenizer": getattr(corpus, "tokenizer", None),
        "train": train_kw,
        "model": base,
        "models": configs,
        "match_bytes": match_bytes,
        "selection_split": {"val_tokens": list(split.select_range)},
        "report_split": {"val_tokens": list(split.report_range)},
        "choice": "lowest mean bpb over seeds on the selection half of the validation split",
        "flat_bpb": FLAT_BPB,
        "device": str(dev),
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    return SweepResult(runs, table, best, config)


def _read_runs_log(path: str | os.PathLike, fingerprint: dict) -> dict[tuple, dict]:
    """The finished runs of an earlier sweep with this fingerprint; ConfigError if it had another."""
    path = Path(path)
    if not path.is_file():
        return {}
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    if lines and lines[0].get("fingerprint") != json.loads(json.dumps(fingerprint)):
        raise ConfigError(f"{path} holds sweep runs of another configuration; remove it or use another output folder")
    return {(r["scheme"], r["lr"], r["control_lr_mult"], r["seed"]): r for r in lines[1:]}


def _append_run(path: str | os.PathLike, fingerprint: dict, run: dict) -> None:
    """One finished run, on its own line (the first line says which configuration the runs belong to)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        if f.tell() == 0:
            f.write(json.dumps({"fingerprint": fingerprint}, sort_keys=True) + "\n")
        f.write(json.dumps(run, sort_keys=True) + "\n")


def sweep_table(runs: list[dict]) -> list[dict]:
    """Mean selection bpb per (scheme, lr, control_lr_mult); a setting with a failed seed has none."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["scheme"], r["lr"], r["control_lr_mult"]), []).append(r)
    table = []
    for (s, lr, m), rs in groups.items():
        errors = [r["error"] for r in rs if r["error"]]
        bpb = None if errors else sum(r["bpb_select"] for r in rs) / len(rs)
        table.append(
            {
                "scheme": s,
                "lr": lr,
                "control_lr_mult": m,
                "seeds": len(rs),
                "bpb_select": bpb,
                "error": errors[0] if errors else None,
            }
        )
    return table


def flatness(points: list[tuple[float, float | None]], tol: float = FLAT_BPB) -> dict:
    """The rates whose bpb is within tol of the best: lowest, highest, their ratio, how many of all.

    ``edge`` says the best rate is the grid's lowest or highest, so the optimum may lie outside it.
    """
    ok = sorted((lr, b) for lr, b in points if b is not None)
    if not ok:
        return {"lo": None, "hi": None, "ratio": None, "within": 0, "of": len(points), "edge": None}
    best_lr, best = min(ok, key=lambda t: t[1])
    within = [lr for lr, b in ok if b <= best + tol]
    grid = sorted(lr for lr, _ in points)
    return {
        "lo": within[0],
        "hi": within[-1],
        "ratio": within[-1] / within[0],
        "within": len(within),
        "of": len(points),
        "edge": best_lr in (grid[0], grid[-1]) and len(grid) > 1,
    }


def choose(table: list[dict]) -> dict[str, dict]:
    """Each scheme's setting with the lowest selection bpb, and the flatness of its rate curve."""
    best = {}
    for s in dict.fromkeys(t["scheme"] for t in table):
        ok = [t for t in table if t["scheme"] == s and t["bpb_select"] is not None]
        if not ok:
            continue  # every setting failed: the scheme has no tuned rate (listed in the table)
        b = min(ok, key=lambda t: (t["bpb_select"], t["lr"]))
        curve = [
            (t["lr"], t["bpb_select"])
            for t in table
            if t["scheme"] == s and t["control_lr_mult"] == b["control_lr_mult"]
        ]
        best[s] = {
            "lr": b["lr"],
            "control_lr_mult": b["control_lr_mult"],
            "bpb_select": b["bpb_select"],
            "flatness": flatness(curve),
        }
    return best


def _g(x: float | None) -> str:
    return "—" if x is None else f"{x:g}"


def sweep_markdown(result: SweepResult, heading: str = "##") -> str:
    """The sweep section of results.md: per scheme its chosen setting and flatness, then every setting."""
    c = result.config
    lines = [
        f"{heading} Learning-rate sweep ({c['steps']} steps, {c['seeds']} seed(s), preset `{c['preset']}`)",
        "",
        f"Each scheme trained at every rate {', '.join(_g(r) for r in c['rates'])} (AdamW peak rate; "
        "schemes with step-specific controls also at each control_lr_mult), scored on the selection half of "
        f"the validation split (tokens {c['selection_split']['val_tokens'][0]}–{c['selection_split']['val_tokens'][1]}); "
        f"the comparison is reported on the other half (tokens {c['report_split']['val_tokens'][0]}–"
        f"{c['report_split']['val_tokens'][1]}). Flat range: the rates within {c['flat_bpb']} bpb of the best "
        "(at the chosen multiplier); 'edge' = the best rate is the grid's lowest or highest.",
        "",
        "| scheme | best lr | control_lr_mult | selection bpb | flat range | rates within | edge |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in c["schemes"]:
        b = result.best.get(s)
        if b is None:
            lines.append(f"| {s} | every setting failed | | | | | |")
            continue
        f = b["flatness"]
        rng = f"{_g(f['lo'])}–{_g(f['hi'])} ({f['ratio']:.0f}×)" if f["ratio"] else "—"
        lines.append(
            f"| {s} | {_g(b['lr'])} | {_g(b['control_lr_mult'])} | {b['bpb_select']:.4f} | {rng} | "
            f"{f['within']}/{f['of']} | {'yes' if f['edge'] else 'no'} |"
        )
    lines += ["", "Every setting (mean selection bpb over seeds; a failed run is named):", ""]
    mults = sorted({t["control_lr_mult"] for t in result.table})
    cols = [(m, lr) for m in mults for lr in c["rates"]]
    lines.append(
        "| scheme | " + " | ".join(f"{_g(lr)}" + (f" ×{_g(m)}" if len(mults) > 1 else "") for m, lr in cols) + " |"
    )
    lines.append("|---" * (len(cols) + 1) + "|")
    cell = {(t["scheme"], t["control_lr_mult"], t["lr"]): t for t in result.table}
    for s in c["schemes"]:
        vals = []
        for m, lr in cols:
            t = cell.get((s, m, lr))
            if t is None:
                vals.append("")
            elif t["bpb_select"] is None:
                vals.append("failed")
            else:
                star = "**" if result.best.get(s, {}).get("lr") == lr and result.best[s]["control_lr_mult"] == m else ""
                vals.append(f"{star}{t['bpb_select']:.4f}{star}")
        lines.append(f"| {s} | " + " | ".join(vals) + " |")
    errors = [t for t in result.table if t["error"]]
    if errors:
        lines += [
            "",
            "Failed settings: "
            + "; ".join(f"{t['scheme']} lr={_g(t['lr'])} ×{_g(t['control_lr_mult'])}: {t['error']}" for t in errors)
            + ".",
        ]
    lines.append("")
    return "\n".join(lines)


def sweep_csv(result: SweepResult) -> str:
    """One line per (scheme, lr, control_lr_mult): its mean selection bpb and whether it was chosen."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SWEEP_COLUMNS)
    for t in result.table:
        b = result.best.get(t["scheme"], {})
        chosen = b.get("lr") == t["lr"] and b.get("control_lr_mult") == t["control_lr_mult"]
        bpb = "" if t["bpb_select"] is None else f"{t['bpb_select']:.6f}"
        w.writerow(
            [t["scheme"], f"{t['lr']:g}", f"{t['control_lr_mult']:g}", t["seeds"], bpb, int(chosen), t["error"] or ""]
        )
    return buf.getvalue()


def plot_sweep(result: SweepResult, path: str | os.PathLike, *, exclusive: bool = False) -> Path:
    """Selection bpb against learning rate (log x), one line per scheme (and control multiplier)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import atomic_write_bytes

    c = result.config
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    styles = ("-", "--", ":", "-.")
    mults = sorted({t["control_lr_mult"] for t in result.table})
    for i, s in enumerate(c["schemes"]):
        for j, m in enumerate(mults):
            pts = sorted(
                (t["lr"], t["bpb_select"]) for t in result.table if t["scheme"] == s and t["control_lr_mult"] == m
            )
            if not pts:
                continue
            xs = [lr for lr, b in pts if b is not None]
            ys = [b for _, b in pts if b is not None]
            label = s + (f" (control ×{m:g})" if len(c["control_lr_mults"][s]) > 1 else "")
            ax.plot(xs, ys, styles[j % len(styles)], marker="o", color=cmap(i % 10), label=label)
            failed = [lr for lr, b in pts if b is None]
            if failed and ys:
                ax.scatter(failed, [max(ys)] * len(failed), marker="x", color=cmap(i % 10), zorder=4)
        b = result.best.get(s)
        if b is not None:
            ax.scatter([b["lr"]], [b["bpb_select"]], s=120, facecolors="none", edgecolors=[cmap(i % 10)], zorder=5)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate (AdamW)")
    ax.set_ylabel("selection-half validation bits per byte (lower is better)")
    ax.set_title(f"LR sensitivity: {c['data']}, {c['steps']} steps, {c['seeds']} seed(s) (circle: chosen; x: failed)")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue(), exclusive=exclusive)


def load_sweep(path: str | os.PathLike) -> SweepResult:
    """The sweep of an earlier ``--lr-sweep`` run, from its results.json; DataError naming the file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read it as a results.json: {exc}") from None
    sw = doc.get("lr_sweep") if isinstance(doc, dict) else None
    if not isinstance(sw, dict) or not {"runs", "table", "best", "config"} <= set(sw):
        raise DataError(f"{path}: holds no lr_sweep (it is written by `recurnorm roundtrip --lr-sweep`)")
    return SweepResult(sw["runs"], sw["table"], sw["best"], sw["config"])


def check_reusable(
    sweep: SweepResult, schemes: list[str], corpus: Corpus, preset: str, source: str, match_bytes: int | str | None
) -> None:
    """ConfigError unless an earlier sweep chose rates for these schemes on this data, preset and split."""
    c = sweep.config
    split = split_validation(corpus)
    want = {
        "data": str(corpus.source),
        "preset": preset,
        "selection_split": {"val_tokens": list(split.select_range)},
        "match_bytes": match_bytes,
    }
    for key, value in want.items():
        if c.get(key) != value:
            raise ConfigError(f"{source}: its sweep ran with {key} {c.get(key)!r}, this run has {value!r}")
    missing = [s for s in schemes if s not in sweep.best]
    if missing:
        raise ConfigError(f"{source}: no tuned rate for {', '.join(missing)} (swept: {', '.join(sweep.best)})")


@dataclass
class LRStudyResult:
    """The sweep, and (unless sweep_only) the roundtrip comparison at each scheme's chosen setting."""

    sweep: SweepResult
    roundtrip: Any = None  # roundtrip.RoundtripResult on the report half, or None (sweep only)
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def config(self) -> dict:
        return self.roundtrip.config if self.roundtrip is not None else self.sweep.config

    def to_dict(self) -> dict:
        d = self.roundtrip.to_dict() if self.roundtrip is not None else {"config": self.sweep.config}
        d["lr_sweep"] = self.sweep.to_dict()
        d["paths"] = {k: str(v) for k, v in self.paths.items()}
        return d

    def markdown(self) -> str:
        head = "# recurnorm roundtrip --lr-sweep\n\n" + sweep_markdown(self.sweep)
        if self.roundtrip is None:
            return head
        # The comparison is scored on the report half, not the whole split its header assumes.
        body = self.roundtrip.markdown().replace(
            "over the whole validation split", "over the report half of the validation split", 1
        )
        return head + "\n" + body.replace("# recurnorm roundtrip", "# The comparison at each scheme's chosen rate", 1)


def lr_study(
    schemes: str | list[str],
    quants: str | list[str],
    rates: str | list[float] | None,
    *,
    control_mults: str | list[float] = (1.0,),
    sweep_from: str | os.PathLike | None = None,
    sweep_steps: int | None = None,
    sweep_seeds: int = 1,
    sweep_only: bool = False,
    data: Any = "default",
    tokenizer: str | None = None,
    preset: str = "sweep",
    steps: int | str | list[int] | None = None,
    seeds: int = 1,
    out_dir: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    model_overrides: dict | None = None,
    train_overrides: dict | None = None,
    write: bool = True,
    **roundtrip_kw,
) -> LRStudyResult:
    """Sweep the rates (``lr_sweep``, ``sweep_steps``: default the shortest of ``steps``), then run
    ``roundtrip`` with every scheme at its chosen setting, reported on the report half of the
    validation split. Writes results.{json,csv,md} (the sweep table in each; results.csv holds
    the comparison's rows, or the sweep table with ``sweep_only``), lr_sweep.csv and lr_sweep.png.
    ``sweep_from`` (an earlier run's results.json) takes that sweep's choices instead of sweeping
    again, so a long study can run in stages; it must have swept these schemes on the same data.
    """
    from ..io import atomic_write_json, atomic_write_text, check_writable
    from ..train.data import as_corpus
    from ..train.presets import get_preset
    from . import report as rep
    from .roundtrip import resolve_quants, resolve_steps
    from .roundtrip import roundtrip as run_roundtrip

    if roundtrip_kw.get("checkpoints_dir") is not None:
        raise ConfigError("--checkpoints cannot be used with --lr-sweep: a checkpoint does not record its rate")
    quants = resolve_quants(quants)
    lengths = resolve_steps(steps, get_preset(preset).hp.steps)
    if write:
        if out_dir is None:
            raise ConfigError("out_dir is required to write the results")
        rep.check_outputs(out_dir, force)
        for name in (SWEEP_CSV, SWEEP_PNG):
            check_writable(Path(out_dir) / name, force=force)
    corpus = as_corpus(data, tokenizer)
    if sweep_from is not None:
        from .roundtrip import resolve_schemes

        if sweep_only:
            raise ConfigError("sweep_only with sweep_from would do nothing: the sweep is already there")
        wanted = resolve_schemes(schemes)
        sweep = load_sweep(sweep_from)
        check_reusable(sweep, wanted, corpus, preset, str(sweep_from), roundtrip_kw.get("match_bytes"))
        sweep.best = {s: sweep.best[s] for s in wanted}
        sweep.config = {**sweep.config, "reused_from": str(sweep_from)}
    elif rates is None:
        raise ConfigError("give the rates to sweep, or an earlier sweep to reuse (sweep_from)")
    else:
        sweep = lr_sweep(
            schemes, rates, control_mults=control_mults, data=corpus, preset=preset,
            steps=sweep_steps or lengths[0], seeds=sweep_seeds, model_overrides=model_overrides,
            train_overrides=train_overrides, scheme_options=roundtrip_kw.get("scheme_options"),
            device=roundtrip_kw.get("device", "auto"), progress=progress,
            runs_log=Path(out_dir) / SWEEP_RUNS if write else None, match_bytes=roundtrip_kw.get("match_bytes"),
            match_quant=quants[0],
        )  # fmt: skip
    result = LRStudyResult(sweep)
    if not sweep_only:
        tuned = list(sweep.best)  # a scheme whose every setting failed has no rate to compare at
        if not tuned:
            raise ConfigError("every setting of every scheme failed in the sweep; nothing to compare")
        split = split_validation(corpus)
        rt = run_roundtrip(
            tuned, quants, data=split.report, seeds=seeds, preset=preset, steps=lengths, progress=progress,
            model_overrides=model_overrides, train_overrides=train_overrides, write=False,
            scheme_train=sweep.scheme_train(), **roundtrip_kw,
        )  # fmt: skip
        rt.config["validation"] = (
            f"report half of the validation split (tokens {split.report_range[0]}–{split.report_range[1]}); "
            f"rates chosen on the other half (tokens {split.select_range[0]}–{split.select_range[1]})"
        )
        rt.config["untuned"] = [s for s in sweep.config["schemes"] if s not in sweep.best and sweep_from is None]
        result.roundtrip = rt
    if write:
        out = Path(out_dir)
        if result.roundtrip is not None:
            rt = result.roundtrip
            result.paths = rep.write_outputs(
                rt.rows, rt.config, out, force=force, aggs=rt.aggregates, answers=rt.falsification,
                extra_json={"lr_sweep": sweep.to_dict()}, markdown=result.markdown(),
            )  # fmt: skip
        else:
            out.mkdir(parents=True, exist_ok=True)
            result.paths = {
                "json": atomic_write_json(out / "results.json", result.to_dict(), exclusive=not force),
                "csv": atomic_write_text(out / "results.csv", sweep_csv(sweep), exclusive=not force),
                "md": atomic_write_text(out / "results.md", result.markdown(), exclusive=not force),
            }
        result.paths["sweep_csv"] = atomic_write_text(out / SWEEP_CSV, sweep_csv(sweep), exclusive=not force)
        result.paths["sweep_png"] = plot_sweep(sweep, out / SWEEP_PNG, exclusive=not force)
    return result
