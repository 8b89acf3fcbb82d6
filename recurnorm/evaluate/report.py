"""Roundtrip rows, their paired statistics, and the report files (JSON, CSV, Markdown).

Everything here is plain Python on numbers (no torch), so the arithmetic that
the conclusions rest on (gap recovered, paired differences, "within noise")
can be tested on hand-made rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..io import atomic_write_json, atomic_write_text, check_writable

# A claim needs at least this many paired seeds: in our own tiny-preset runs one scheme
# moved by up to 0.18 bpb between seeds, as much as the schemes differ.
MIN_SEEDS = 3
# Output files of one run, in the order they are written.
OUTPUT_FILES = ("results.json", "results.csv", "results.md", "roundtrip.png")
# Written too when a run has several training lengths: paired Δbpb vs shared against length.
LENGTHS_PNG = "lengths.png"
# Formats whose codes carry at most ~4 bits: "aggressive compression" in question (4).
AGGRESSIVE_HINTS = ("int2", "int3", "int4", "int5", "ternary", "nf4", "fp4", "binary")


@dataclass
class Row:
    """One (scheme, quantizer, seed) measurement of the export roundtrip."""

    scheme: str
    quant: str
    seed: int
    bpb_pre: float
    bpb_post: float
    artifact_bytes: int
    step_specific_bytes: int
    params: dict[str, int] = field(default_factory=dict)
    d_model: int = 0
    gap_recovered_pre: float | None = None
    gap_recovered_post: float | None = None
    # probe name -> {measure: value}; see evaluate.probes
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Training length of the model; rows are compared (paired) only within one length.
    steps: int | None = None

    @property
    def delta_bpb(self) -> float:
        """Loss the export costs (post − pre)."""
        return self.bpb_post - self.bpb_pre

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict, with delta_bpb spelled out."""
        d = asdict(self)
        d["delta_bpb"] = self.delta_bpb
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        """Inverse of to_dict (delta_bpb is derived, so dropped)."""
        d = {k: v for k, v in d.items() if k != "delta_bpb"}
        return cls(**d)


# Below this gap (bpb) between shared and unique the ratio is noise over noise:
# our working rule (not a measured bound) treats differences under ~0.01 nats as noise at
# this scale; twice that.
MIN_GAP_BPB = 0.02


def gap_recovered(bpb_shared: float, bpb_scheme: float, bpb_unique: float) -> float | None:
    """(shared − scheme) / (shared − unique); None when unique does not clearly beat shared."""
    denom = bpb_shared - bpb_unique
    # No gap to recover when unique is not clearly better than shared: a ratio
    # over a near-zero denominator would mislead (it once read −41.7).
    if not denom > MIN_GAP_BPB:
        return None
    return (bpb_shared - bpb_scheme) / denom


def fill_gap_recovered(rows: list[Row]) -> list[Row]:
    """Set gap_recovered_pre/post on every row whose seed and quant also have shared and unique."""
    by_key = {(r.scheme, r.quant, r.seed, r.steps): r for r in rows}
    for r in rows:
        shared = by_key.get(("shared", r.quant, r.seed, r.steps))
        unique = by_key.get(("unique", r.quant, r.seed, r.steps))
        if shared is None or unique is None:
            r.gap_recovered_pre = r.gap_recovered_post = None
            continue
        r.gap_recovered_pre = gap_recovered(shared.bpb_pre, r.bpb_pre, unique.bpb_pre)
        r.gap_recovered_post = gap_recovered(shared.bpb_post, r.bpb_post, unique.bpb_post)
    return rows


def mean_std(values: list[float]) -> dict[str, float | int | None]:
    """Mean and sample standard deviation (0 for a single value); None when empty."""
    vals = [float(v) for v in values if v is not None]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "std": None}
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "mean": mean, "std": std}


def paired_stats(diffs: list[float], min_seeds: int = MIN_SEEDS) -> dict[str, Any]:
    """Summary of per-seed paired differences and whether they are distinguishable from zero.

    Within noise when fewer than ``min_seeds`` seeds, or when either mean ± std
    or min..max covers zero; otherwise the sign decides "lower" / "higher".
    """
    diffs = [float(d) for d in diffs]
    stats = mean_std(diffs)
    n = stats["n"]
    if n == 0:
        return {
            "n": 0,
            "diffs": [],
            "mean": None,
            "std": None,
            "min": None,
            "max": None,
            "within_noise": True,
            "verdict": "not measured",
        }
    mean, std = stats["mean"], stats["std"]
    lo, hi = min(diffs), max(diffs)
    covers_zero = abs(mean) <= std or lo <= 0.0 <= hi
    if n < min_seeds:
        verdict = "not enough seeds"
    elif covers_zero:
        verdict = "within noise"
    else:
        verdict = "lower" if mean < 0 else "higher"
    return {
        "n": n,
        "diffs": diffs,
        "mean": mean,
        "std": std,
        "min": lo,
        "max": hi,
        "within_noise": verdict in ("within noise", "not enough seeds"),
        "verdict": verdict,
    }


def _value(row: Row, key: str) -> float | None:
    """A numeric field of a row; probe fields as 'probe.measure'."""
    if "." in key:
        probe, measure = key.split(".", 1)
        v = row.probes.get(probe, {}).get(measure)
    else:
        v = getattr(row, key)
    return None if v is None else float(v)


def paired_diffs(rows: list[Row], a: str, b: str, quant: str, key: str) -> list[float]:
    """Per-seed value(a) − value(b) for one quantizer, over seeds where both exist.

    A pair is one seed at one training length: seed k at 150 steps is never
    paired with seed k at 2400 (pass one length's rows to get one length's diffs).
    """
    va = {(r.steps or 0, r.seed): _value(r, key) for r in rows if r.scheme == a and r.quant == quant}
    vb = {(r.steps or 0, r.seed): _value(r, key) for r in rows if r.scheme == b and r.quant == quant}
    return [va[k] - vb[k] for k in sorted(va) if k in vb and va[k] is not None and vb[k] is not None]


def _ordered(values) -> list:
    """Unique values in first-seen order."""
    return list(dict.fromkeys(values))


AGG_FIELDS = (
    "bpb_pre",
    "bpb_post",
    "delta_bpb",
    "gap_recovered_pre",
    "gap_recovered_post",
    "artifact_bytes",
    "step_specific_bytes",
)
PAIRED_FIELDS = ("bpb_pre", "bpb_post", "delta_bpb")


def lengths_of(rows: list[Row]) -> list[int | None]:
    """The training lengths present, shortest first (None for rows that predate lengths)."""
    return sorted(_ordered(r.steps for r in rows), key=lambda n: -1 if n is None else n)


def at_length(rows: list[Row], steps: int | None) -> list[Row]:
    """The rows of one training length."""
    return [r for r in rows if r.steps == steps]


def aggregate(rows: list[Row], min_seeds: int = MIN_SEEDS) -> list[dict[str, Any]]:
    """Per (length, quant, scheme): mean ± std over seeds, and paired differences to shared.

    Every statistic is taken within one training length (``Row.steps``).
    """
    out = []
    for steps in lengths_of(rows):
        for agg in _aggregate_one_length(at_length(rows, steps), min_seeds):
            out.append({"steps": steps, **agg})
    return out


def _aggregate_one_length(rows: list[Row], min_seeds: int) -> list[dict[str, Any]]:
    out = []
    for quant in _ordered(r.quant for r in rows):
        for scheme in _ordered(r.scheme for r in rows):
            group = [r for r in rows if r.scheme == scheme and r.quant == quant]
            if not group:
                continue
            agg: dict[str, Any] = {
                "scheme": scheme,
                "quant": quant,
                "seeds": [r.seed for r in group],
                "d_model": group[0].d_model,
                "params": group[0].params,
            }
            for key in AGG_FIELDS:
                agg[key] = mean_std([_value(r, key) for r in group])
            for probe in _ordered(p for r in group for p in r.probes):
                measures = _ordered(m for r in group for m in r.probes.get(probe, {}))
                agg[probe] = {m: mean_std([_value(r, f"{probe}.{m}") for r in group]) for m in measures}
            if scheme != "shared" and any(r.scheme == "shared" for r in rows):
                agg["vs_shared"] = {
                    key: paired_stats(paired_diffs(rows, scheme, "shared", quant, key), min_seeds)
                    for key in PAIRED_FIELDS
                }
            out.append(agg)
    return out


# ---------------------------------------------------------------- formatting


def fmt(x: float | None, digits: int = 3, signed: bool = False) -> str:
    """A number or an em dash."""
    if x is None:
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def fmt_ms(stat: dict[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """mean ± std (just the mean for one seed)."""
    if not stat or stat.get("mean") is None:
        return "—"
    if stat["n"] > 1:
        return f"{fmt(stat['mean'], digits, signed)} ± {stat['std']:.{digits}f}"
    return fmt(stat["mean"], digits, signed)


def fmt_bytes(n: float | None) -> str:
    """Bytes with thousands separators."""
    return "—" if n is None else f"{round(n):,}"


def fmt_paired(p: dict[str, Any] | None, digits: int = 3) -> str:
    """Paired difference with its spread and verdict, e.g. '+0.012 ± 0.004 [n=3, higher]'."""
    if not p or p["n"] == 0:
        return "—"
    spread = f" ± {p['std']:.{digits}f}" if p["n"] > 1 else ""
    rng = f", {p['min']:+.{digits}f}..{p['max']:+.{digits}f}" if p["n"] > 1 else ""
    return f"{p['mean']:+.{digits}f}{spread} [n={p['n']}{rng}, {p['verdict']}]"


# ------------------------------------------------------ falsification questions


QUESTIONS = (
    "(1) Does norm / norm_gate stay far behind tiny LoRA at similar byte cost?",
    "(2) Does its gain before compression vanish after the export roundtrip?",
    "(3) Can diagonal controls express what depth phases need?",
    "(4) Do the specialized norms break under aggressive compression?",
)
NORM_SCHEMES = ("norm", "norm_gate")


def _agg_of(aggs: list[dict], scheme: str, quant: str) -> dict | None:
    return next((a for a in aggs if a["scheme"] == scheme and a["quant"] == quant), None)


def _noise_note(p: dict[str, Any]) -> str:
    """The honesty clause every verdict carries."""
    if p["verdict"] == "not enough seeds":
        return f"not enough seeds ({p['n']} < {MIN_SEEDS}): no claim"
    if p["verdict"] == "within noise":
        return "within noise"
    return f"{p['verdict']} beyond the seed spread"


def _present(rows: list[Row]) -> set[str]:
    return {r.scheme for r in rows}


def _byte_cost(aggs: list[dict], scheme: str, quant: str) -> tuple[float | None, str]:
    """What specialization costs in bytes: artifact bytes over shared's when shared ran
    (counts manifest entries and codec tables too), else the step-specific stream bytes."""
    a, sh = _agg_of(aggs, scheme, quant), _agg_of(aggs, "shared", quant)
    if sh is not None and a["artifact_bytes"]["mean"] is not None:
        return a["artifact_bytes"]["mean"] - sh["artifact_bytes"]["mean"], "artifact bytes over shared"
    return a["step_specific_bytes"]["mean"], "step-specific bytes"


def _q1(rows: list[Row], aggs: list[dict], quants: list[str]) -> dict[str, Any]:
    present = _present(rows)
    cands = [s for s in NORM_SCHEMES if s in present]
    if "lora" not in present or not cands:
        return {"answer": "not measured: needs lora and norm or norm_gate in --schemes", "evidence": []}
    evidence, behind, close = [], [], []
    for q in quants:
        lo = _agg_of(aggs, "lora", q)
        lo_cost, what = _byte_cost(aggs, "lora", q)
        for s in cands:
            a = _agg_of(aggs, s, q)
            cost, _ = _byte_cost(aggs, s, q)
            p = paired_stats(paired_diffs(rows, s, "lora", q, "bpb_post"))
            ratio = lo_cost / cost if cost and cost > 0 and lo_cost is not None else None
            evidence.append(
                f"{q}: {s} post-export bpb {fmt_ms(a['bpb_post'])} at {fmt_bytes(cost)} {what} vs "
                f"lora {fmt_ms(lo['bpb_post'])} at {fmt_bytes(lo_cost)} (lora costs "
                f"×{fmt(ratio, 1)}); paired {s} − lora {fmt_paired(p)} → {_noise_note(p)}"
            )
            if p["verdict"] == "higher":
                (behind if ratio is not None and ratio <= 4 else close).append((q, s))
    if behind:
        answer = (
            "yes for "
            + ", ".join(f"{s} at {q}" for q, s in behind)
            + ": behind lora beyond the seed spread at a byte cost within 4× of lora's — "
            "evidence against the hypothesis"
        )
    elif close:
        answer = (
            "behind lora beyond the seed spread, but lora spends more than 4× the bytes, so not at similar byte cost"
        )
    else:
        answer = (
            "no demonstrated gap to lora (every paired difference is lower, within noise, or rests on too few seeds)"
        )
    return {"answer": answer, "evidence": evidence}


def _q2(rows: list[Row], aggs: list[dict], quants: list[str]) -> dict[str, Any]:
    present = _present(rows)
    cands = [s for s in NORM_SCHEMES if s in present]
    if "shared" not in present or not cands:
        return {"answer": "not measured: needs shared and norm or norm_gate in --schemes", "evidence": []}
    evidence, vanished, survived, no_gain = [], [], [], []
    for q in quants:
        for s in cands:
            a = _agg_of(aggs, s, q)
            pre, post = a["vs_shared"]["bpb_pre"], a["vs_shared"]["bpb_post"]
            evidence.append(
                f"{q}: {s} − shared before export {fmt_paired(pre)}, after {fmt_paired(post)}; "
                f"gap recovered {fmt_ms(a['gap_recovered_pre'], 2)} → {fmt_ms(a['gap_recovered_post'], 2)}"
            )
            if pre["verdict"] != "lower":
                no_gain.append((q, s))
            elif post["verdict"] == "lower":
                survived.append((q, s))
            else:
                vanished.append((q, s))
    parts = []
    if vanished:
        parts.append(
            "yes, the gain vanishes for "
            + ", ".join(f"{s} at {q}" for q, s in vanished)
            + " — evidence against the hypothesis"
        )
    if survived:
        parts.append("the gain survives for " + ", ".join(f"{s} at {q}" for q, s in survived))
    if no_gain:
        parts.append(
            "no gain over shared before export to begin with (within noise or too few "
            "seeds) for " + ", ".join(f"{s} at {q}" for q, s in no_gain)
        )
    return {"answer": "; ".join(parts), "evidence": evidence}


def _q3(rows: list[Row], aggs: list[dict], quants: list[str]) -> dict[str, Any]:
    present = _present(rows)
    diag = [s for s in ("norm", "norm_gate", "norm_gate_rank1", "layerrope") if s in present]
    richer = [s for s in ("lora", "unique") if s in present]
    if not diag or not richer:
        return {
            "answer": "not measured: needs a diagonal scheme (norm_gate, norm_gate_rank1, "
            "layerrope) and lora or unique in --schemes",
            "evidence": [],
        }
    evidence = []
    q = quants[0]
    for s in diag + [s for s in ("lora",) if s in present]:
        a = _agg_of(aggs, s, q)
        line = (
            f"{s}: gap recovered before export {fmt_ms(a['gap_recovered_pre'], 2)}, "
            f"after {q} {fmt_ms(a['gap_recovered_post'], 2)}; bpb before export "
            f"{fmt_ms(a['bpb_pre'])}"
        )
        shuffle = a.get("shuffle", {}).get("delta")
        if shuffle and shuffle.get("mean") is not None:
            # Did the steps specialize? Moving step s's controls to step s+1 hurts only if so.
            line += f"; shifting its per-step parameters by one step costs {fmt_ms(shuffle, 4, signed=True)} bpb"
        evidence.append(line)
    ref = "lora" if "lora" in present else "unique"
    short, matched = [], []
    for s in diag:
        p = paired_stats(paired_diffs(rows, s, ref, q, "bpb_pre"))
        evidence.append(f"{s} − {ref} before export {fmt_paired(p)} → {_noise_note(p)}")
        (short if p["verdict"] == "higher" else matched).append(s)
    if short and not matched:
        answer = (
            f"no: every diagonal scheme stays behind {ref} before export beyond the seed "
            "spread — diagonal controls do not express what the steps need"
        )
    elif short:
        answer = (
            f"partly: {', '.join(matched)} reach {ref} within noise or better; "
            f"{', '.join(short)} stay behind beyond the seed spread"
        )
    else:
        answer = (
            f"no shortfall shown: no diagonal scheme is behind {ref} beyond the seed spread "
            "(within noise or too few seeds is not a yes)"
        )
    return {"answer": answer, "evidence": evidence}


def _q4(rows: list[Row], aggs: list[dict], quants: list[str]) -> dict[str, Any]:
    present = _present(rows)
    cands = [s for s in ("norm", "norm_gate", "norm_gate_rank1", "layerrope") if s in present]
    if "shared" not in present or not cands:
        return {"answer": "not measured: needs shared and a specialized-norm scheme", "evidence": []}
    aggressive = [q for q in quants if any(h in q.lower() for h in AGGRESSIVE_HINTS)] or quants
    evidence, broke = [], []
    for q in aggressive:
        sh = _agg_of(aggs, "shared", q)
        for s in cands:
            a = _agg_of(aggs, s, q)
            p = a["vs_shared"]["delta_bpb"]
            line = (
                f"{q}: export cost Δbpb {s} {fmt_ms(a['delta_bpb'])} vs shared "
                f"{fmt_ms(sh['delta_bpb'])}; paired {fmt_paired(p)} → {_noise_note(p)}"
            )
            frag = a.get("fragility", {}).get("delta")
            if frag and frag.get("mean") is not None:
                line += f"; quantizing its controls too costs {fmt_ms(frag, 4, signed=True)} bpb"
            evidence.append(line)
            if p["verdict"] == "higher":
                broke.append((q, s))
    if broke:
        answer = (
            "yes: the export costs more than it costs shared, beyond the seed spread, for "
            + ", ".join(f"{s} at {q}" for q, s in broke)
            + " — evidence against the hypothesis"
        )
    else:
        answer = (
            "no breakage shown: no specialized scheme loses more than shared in the "
            "export beyond the seed spread (within noise or too few seeds is not a no)"
        )
    return {"answer": answer, "evidence": evidence}


def falsification(rows: list[Row], aggs: list[dict] | None = None) -> list[dict[str, Any]]:
    """The four falsification questions of the seed hypothesis, each answered with its numbers.

    One answer per question and training length (``steps`` says which), each from that
    length's rows alone: four entries for a one-length run.
    """
    aggs = aggregate(rows) if aggs is None else aggs
    answers = []
    for steps in lengths_of(rows):
        sub = at_length(rows, steps)
        sub_aggs = [a for a in aggs if a.get("steps") == steps]
        quants = _ordered(r.quant for r in sub)
        for question, fn in zip(QUESTIONS, (_q1, _q2, _q3, _q4), strict=True):
            ans = fn(sub, sub_aggs, quants)
            answers.append({"question": question, "steps": steps, **ans})
    return answers


def length_changes(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per question: its answer at the shortest and the longest length, and whether it changed."""
    out = []
    for question in QUESTIONS:
        by_len = [a for a in answers if a["question"] == question]
        if len(by_len) < 2:
            continue
        first, last = by_len[0], by_len[-1]
        out.append(
            {
                "question": question,
                "from_steps": first["steps"],
                "to_steps": last["steps"],
                "from": first["answer"],
                "to": last["answer"],
                "changed": first["answer"] != last["answer"],
                "answers": {str(a["steps"]): a["answer"] for a in by_len},
            }
        )
    return out


# ------------------------------------------------------------------ writers


CSV_COLUMNS = (
    "scheme",
    "quant",
    "seed",
    "steps",
    "d_model",
    "params_shared",
    "params_step_specific",
    "params_embedding",
    "params_total",
    "artifact_bytes",
    "step_specific_bytes",
    "bpb_pre",
    "bpb_post",
    "delta_bpb",
    "gap_recovered_pre",
    "gap_recovered_post",
)


def to_csv(rows: list[Row]) -> str:
    """One line per row; probe measures become 'probe_measure' columns."""
    probe_cols = _ordered(f"{p}_{m}" for r in rows for p, ms in r.probes.items() for m in ms)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*CSV_COLUMNS, *probe_cols])
    for r in rows:
        d = r.to_dict()
        for k in ("shared", "step_specific", "embedding", "total"):
            d[f"params_{k}"] = r.params.get(k)
        for p, ms in r.probes.items():
            for m, v in ms.items():
                d[f"{p}_{m}"] = v
        w.writerow(["" if d.get(c) is None else d.get(c) for c in (*CSV_COLUMNS, *probe_cols)])
    return buf.getvalue()


def _quant_tables(rows: list[Row], aggs: list[dict], heading: str = "##") -> list[str]:
    """One table per quantizer: every scheme's numbers at one training length."""
    quants = _ordered(r.quant for r in rows)
    has_gap = any(r.gap_recovered_pre is not None for r in rows)
    probes = _ordered(p for r in rows for p in r.probes)
    lines: list[str] = []
    for q in quants:
        lines += [f"{heading} {q}", ""]
        head = [
            "scheme",
            "d",
            "params shared / step-spec / total",
            "artifact bytes",
            "step-spec bytes",
            "bpb pre",
            "bpb post",
            "Δbpb",
        ]
        if has_gap:
            head += ["gap rec. pre", "gap rec. post"]
        head += ["post vs shared"]
        if "fragility" in probes:
            head += ["fragility Δ"]
        if "shuffle" in probes:
            head += ["shuffle Δ"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for a in (a for a in aggs if a["quant"] == q):
            p = a["params"]
            cells = [
                a["scheme"],
                str(a["d_model"]),
                f"{p.get('shared', 0):,} / {p.get('step_specific', 0):,} / {p.get('total', 0):,}",
                fmt_bytes(a["artifact_bytes"]["mean"]),
                fmt_bytes(a["step_specific_bytes"]["mean"]),
                fmt_ms(a["bpb_pre"]),
                fmt_ms(a["bpb_post"]),
                fmt_ms(a["delta_bpb"], 4, signed=True),
            ]
            if has_gap:
                cells += [fmt_ms(a["gap_recovered_pre"], 2), fmt_ms(a["gap_recovered_post"], 2)]
            cells += [fmt_paired(a.get("vs_shared", {}).get("bpb_post")) if "vs_shared" in a else "—"]
            if "fragility" in probes:
                cells += [fmt_ms(a.get("fragility", {}).get("delta"), 4, signed=True)]
            if "shuffle" in probes:
                cells += [fmt_ms(a.get("shuffle", {}).get("delta"), 4, signed=True)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _length_label(steps: int | None) -> str:
    return "steps ?" if steps is None else f"{steps:,} steps"


def lengths_table(aggs: list[dict]) -> list[str]:
    """Paired Δbpb vs shared per scheme against training length: before export, then after each quantizer.

    Each cell is the mean over seeds, the min..max of the per-seed paired
    differences and the verdict (lower / higher beyond the spread, within noise).
    """
    lengths = sorted(_ordered(a["steps"] for a in aggs), key=lambda n: -1 if n is None else n)
    quants = _ordered(a["quant"] for a in aggs)
    schemes = _ordered(a["scheme"] for a in aggs if "vs_shared" in a)
    lines = ["| scheme | measure | " + " | ".join(_length_label(n) for n in lengths) + " |"]
    lines.append("|---|---|" + "---|" * len(lengths))
    measures = [("before export", quants[0] if quants else None, "bpb_pre")]
    measures += [(f"after {q}", q, "bpb_post") for q in quants]
    for scheme in schemes:
        for label, q, key in measures:
            cells = []
            for n in lengths:
                a = next(
                    (a for a in aggs if a["steps"] == n and a["quant"] == q and a["scheme"] == scheme),
                    None,
                )
                cells.append(_fmt_cell((a or {}).get("vs_shared", {}).get(key)))
            lines.append(f"| {scheme} | {label} | " + " | ".join(cells) + " |")
    return lines


def _fmt_cell(p: dict[str, Any] | None, digits: int = 4) -> str:
    """'−0.008 [−0.012..−0.004] lower' — mean, min..max of the paired diffs, verdict."""
    if not p or not p.get("n"):
        return "—"
    if p["n"] == 1:
        return f"{p['mean']:+.{digits}f} (n=1)"
    return f"{p['mean']:+.{digits}f} [{p['min']:+.{digits}f}..{p['max']:+.{digits}f}] {p['verdict']}"


def _notes(rows: list[Row], config: dict, quants: list[str]) -> list[str]:
    lines: list[str] = []
    probes = _ordered(p for r in rows for p in r.probes)
    if config.get("match_bytes") and quants:
        mb = config["match_bytes"]
        if isinstance(mb, str):
            lines.append(_rank_note(config.get("matched_rank") or {}, mb, quants[0]))
        else:
            lines.append(
                f"Widths were chosen so each artifact at {quants[0]} lands within ±3% of {mb:,} bytes (column d)."
            )
        lines.append("")
    if "fragility" in probes:
        lines.append(
            "Fragility Δ: bpb with the control tensors (gains, gates, scalars) quantized "
            "like the weights minus bpb with them kept in float."
        )
    if "shuffle" in probes:
        lines.append(
            "Shuffle Δ: bpb after permuting the step-specific parameters across steps "
            "minus bpb before (float model); shared has nothing to shuffle."
        )
    if probes:
        lines.append("")
    return lines


def _rank_note(m: dict, target: str, quant: str) -> str:
    """What --match-bytes SCHEME chose for lora and how close the trained artifacts landed."""
    rank = m.get("rank")
    note = (
        f"lora's rank ({rank}) was chosen so its {quant} artifact lands nearest {target}'s "
        f"(planner: {fmt_bytes(m.get('estimated_bytes'))} vs {fmt_bytes(m.get('target_bytes'))} bytes)"
    )
    actual = m.get("actual") or {}
    if actual:
        parts = [
            f"{int(n):,} steps {fmt_bytes(a.get('lora'))} vs {fmt_bytes(a.get(target))} "
            f"({fmt(None if a.get('deviation') is None else 100 * a['deviation'], 1, signed=True)}%)"
            for n, a in actual.items()
        ]
        note += "; trained artifacts: " + ", ".join(parts)
    if rank == 1 and actual and all((a.get("deviation") or 0) > 0.03 for a in actual.values()):
        note += f"; rank 1 is the smallest lora, so it cannot come closer to {target}'s bytes"
    return note + "."


def _answers(answers: list[dict], heading: str = "**") -> list[str]:
    lines: list[str] = []
    for ans in answers:
        lines += [f"{heading}{ans['question']}{heading}", "", ans["answer"] + ".", ""]
        lines += [f"- {e}" for e in ans["evidence"]]
        lines.append("")
    return lines


def _failures(config: dict) -> list[str]:
    fails = config.get("failures") or []
    if not fails:
        return []
    lines = ["## Training failures", ""]
    lines.append(
        f"{len(fails)} model(s) failed to train; their rows are missing and every paired "
        "statistic of that length uses the seeds that remain:"
    )
    lines.append("")
    for f in fails:
        lines.append(f"- {_length_label(f.get('steps'))}, {f['scheme']}/seed{f['seed']}: {f['error']}")
    lines.append("")
    return lines


def to_markdown(rows: list[Row], aggs: list[dict], answers: list[dict], config: dict) -> str:
    """The human report: a table per quantizer (per training length), then the four questions answered."""
    quants = _ordered(r.quant for r in rows)
    seeds = _ordered(r.seed for r in rows)
    cfg_steps = config.get("steps")
    wanted = cfg_steps if isinstance(cfg_steps, list) else [cfg_steps] if cfg_steps is not None else []
    lengths = sorted(set(wanted) | {n for n in lengths_of(rows) if n is not None}) or lengths_of(rows)
    lines = ["# recurnorm roundtrip", ""]
    lines.append(
        f"Data `{config.get('data')}`, preset `{config.get('preset')}`, "
        f"steps {cfg_steps}, seeds {seeds}. bpb = validation bits per byte over "
        "the whole validation split; post = after packing to artifact bytes and unpacking "
        "into a fresh model. Values are mean ± std over seeds; 'vs shared' is the paired "
        f"per-seed difference (lower is better); fewer than {MIN_SEEDS} seeds or a spread "
        "that covers zero is reported as such, never as a win."
    )
    if len(lengths) > 1:
        lines += [
            "",
            "Training lengths: each length is its own training run from initialization, with the "
            "preset's warm-up and a cosine schedule that ends at that length (not a checkpoint of a "
            "longer run, whose learning rate would still be high); seeds are paired within a length only.",
        ]
    if config.get("export_policy"):
        lines += ["", f"Export policy: {config['export_policy']}."]
    if config.get("paired"):
        lines += ["", f"Pairing: {config['paired']}."]
    if config.get("sources"):
        lines += ["", "Models: " + "; ".join(f"{k} {v}" for k, v in config["sources"].items()) + "."]
    lines.append("")
    lines += _failures(config)
    if len(lengths) <= 1:
        lines += _quant_tables(rows, aggs)
        lines += _notes(rows, config, quants)
        lines += ["## The four falsification questions (norm-only seed hypothesis)", ""]
        lines += _answers(answers)
        return "\n".join(lines)
    lines += ["## Paired Δbpb vs shared against training length", ""]
    lines.append(
        "Mean over seeds of the per-seed difference scheme − shared (bpb; negative = better than "
        "shared), [min..max] of those differences, and the verdict (lower/higher beyond the "
        "spread, within noise when the spread covers zero)."
    )
    lines.append("")
    lines += lengths_table(aggs) + [""]
    lines += _notes(rows, config, quants)
    for n in lengths:
        sub = at_length(rows, n)
        lines += [f"## {_length_label(n)}", ""]
        if not sub:
            lines += ["No model trained at this length (see Training failures).", ""]
            continue
        lines += _quant_tables(sub, [a for a in aggs if a.get("steps") == n], heading="###")
    lines += ["## The four falsification questions at each length", ""]
    for n in lengths:
        lines += [f"### {_length_label(n)}", ""]
        lines += _answers([a for a in answers if a.get("steps") == n])
    changes = length_changes(answers)
    if changes:
        lines += [
            f"## What changed between {_length_label(changes[0]['from_steps'])} and "
            f"{_length_label(changes[0]['to_steps'])}",
            "",
        ]
        for c in changes:
            if c["changed"]:
                lines.append(f"- {c['question']} changed: {c['from']} → {c['to']}.")
            else:
                lines.append(f"- {c['question']} the same answer: {c['to']}.")
        lines.append("")
    return "\n".join(lines)


def results_dict(rows: list[Row], aggs: list[dict], answers: list[dict], config: dict) -> dict:
    """Everything results.json holds."""
    return {
        "config": config,
        "rows": [r.to_dict() for r in rows],
        "aggregates": aggs,
        "falsification": answers,
        "length_changes": length_changes(answers),
    }


def check_outputs(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Refuse (OutputExistsError) when any output of a run already exists, unless force."""
    out = Path(out_dir)
    for name in (*OUTPUT_FILES, LENGTHS_PNG):
        check_writable(out / name, force=force)
    return out


def write_outputs(
    rows: list[Row],
    config: dict,
    out_dir: str | os.PathLike,
    force: bool = False,
    aggs: list[dict] | None = None,
    answers: list[dict] | None = None,
    extra_json: dict | None = None,
    markdown: str | None = None,
) -> dict[str, Path]:
    """Write results.{json,csv,md} and roundtrip.png atomically into out_dir.

    ``extra_json`` adds keys to results.json and ``markdown`` replaces results.md's text
    (the learning-rate study puts its sweep in both).

    With several training lengths, roundtrip.png shows the longest and lengths.png
    the paired Δbpb vs shared against length.
    """
    from .plot import plot_lengths, plot_roundtrip  # matplotlib imports slowly; only when writing

    out = check_outputs(out_dir, force)
    out.mkdir(parents=True, exist_ok=True)
    aggs = aggregate(rows) if aggs is None else aggs
    answers = falsification(rows, aggs) if answers is None else answers
    paths = {
        "json": atomic_write_json(
            out / "results.json",
            {**results_dict(rows, aggs, answers, config), **(extra_json or {})},
            exclusive=not force,
        ),
        "csv": atomic_write_text(out / "results.csv", to_csv(rows), exclusive=not force),
        "md": atomic_write_text(
            out / "results.md",
            to_markdown(rows, aggs, answers, config) if markdown is None else markdown,
            exclusive=not force,
        ),
    }
    lengths = lengths_of(rows)
    longest = [a for a in aggs if a.get("steps") == lengths[-1]] if lengths else aggs
    title = "Export roundtrip: bpb before → after, by artifact size"
    if len(lengths) > 1:
        title += f" ({_length_label(lengths[-1])})"
    paths["png"] = plot_roundtrip(longest, out / "roundtrip.png", title=title, exclusive=not force)
    if len(lengths) > 1:
        paths["lengths_png"] = plot_lengths(aggs, out / LENGTHS_PNG, exclusive=not force)
    else:
        (out / LENGTHS_PNG).unlink(missing_ok=True)  # a previous run's (--force): not this run's
    return paths


def load_results(path: str | os.PathLike) -> tuple[list[Row], dict]:
    """Rows and the whole document back from a results.json."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return [Row.from_dict(r) for r in doc["rows"]], doc
