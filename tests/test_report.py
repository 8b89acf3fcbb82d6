"""Report arithmetic (gap recovered, paired noise) and writers, on hand-made rows."""

from __future__ import annotations

import csv
import json

import pytest

from recurnorm.errors import OutputExistsError
from recurnorm.evaluate.report import (
    Row,
    aggregate,
    falsification,
    fill_gap_recovered,
    gap_recovered,
    paired_stats,
    to_markdown,
    write_outputs,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_rows(seeds=(0, 1, 2), quants=("int8", "int4")) -> list[Row]:
    """shared 3.0, unique 2.8, norm_gate 2.9 (+noise), lora 2.85; int4 adds damage."""
    base = {"shared": 3.0, "unique": 2.8, "norm_gate": 2.9, "lora": 2.85}
    spec = {"shared": 0, "unique": 90_000, "norm_gate": 1_500, "lora": 4_000}
    rows = []
    for seed in seeds:
        for q in quants:
            hit = 0.01 if q == "int8" else 0.05
            for s, b in base.items():
                jitter = 0.01 * seed
                extra = 0.03 if (s == "norm_gate" and q == "int4") else 0.0
                rows.append(
                    Row(
                        scheme=s,
                        quant=q,
                        seed=seed,
                        bpb_pre=b + jitter,
                        bpb_post=b + jitter + hit + extra,
                        artifact_bytes=50_000 + spec[s],
                        step_specific_bytes=spec[s],
                        d_model=64,
                        params={"shared": 100, "step_specific": spec[s], "embedding": 10, "total": 110 + spec[s]},
                        probes={"fragility": {"delta": 0.001 * (s != "shared")}},
                    )
                )
    return rows


def test_gap_recovered_arithmetic():
    assert gap_recovered(3.0, 2.9, 2.8) == pytest.approx(0.5)
    assert gap_recovered(3.0, 3.0, 2.8) == pytest.approx(0.0)
    assert gap_recovered(3.0, 2.8, 2.8) == pytest.approx(1.0)
    assert gap_recovered(3.0, 3.1, 2.8) == pytest.approx(-0.5)
    # No gap to recover: unique not better than shared.
    assert gap_recovered(3.0, 2.9, 3.0) is None
    assert gap_recovered(3.0, 2.9, 3.2) is None
    # A gap below MIN_GAP_BPB is noise: no ratio (a 0.015 gap once gave -41.7).
    assert gap_recovered(3.0, 2.9, 2.985) is None


def test_fill_gap_recovered_per_seed_and_quant():
    rows = fill_gap_recovered(make_rows())
    ng = [r for r in rows if r.scheme == "norm_gate"]
    for r in ng:
        assert r.gap_recovered_pre == pytest.approx(0.5)
        # int4 hurts norm_gate by 0.03 extra: (3.05 - 2.98) / (3.05 - 2.85) = 0.35
        assert r.gap_recovered_post == pytest.approx(0.5 if r.quant == "int8" else 0.35)
    assert all(r.gap_recovered_pre == pytest.approx(0.0) for r in rows if r.scheme == "shared")
    assert all(r.gap_recovered_pre == pytest.approx(1.0) for r in rows if r.scheme == "unique")
    # Without unique there is nothing to compute.
    no_unique = fill_gap_recovered([r for r in make_rows() if r.scheme != "unique"])
    assert all(r.gap_recovered_pre is None and r.gap_recovered_post is None for r in no_unique)


def test_paired_stats_noise_rules():
    assert paired_stats([-0.1, -0.1])["verdict"] == "not enough seeds"
    assert paired_stats([-0.1, -0.1])["within_noise"]
    clear = paired_stats([-0.10, -0.12, -0.11])
    assert clear["verdict"] == "lower" and not clear["within_noise"]
    assert clear["mean"] == pytest.approx(-0.11)
    assert clear["std"] == pytest.approx(0.01)
    assert paired_stats([0.1, 0.12, 0.11])["verdict"] == "higher"
    # min..max covers zero
    assert paired_stats([-0.2, -0.3, 0.01])["verdict"] == "within noise"
    # mean ± std covers zero
    assert paired_stats([0.05, -0.04, 0.06, 0.0001])["verdict"] == "within noise"
    assert paired_stats([])["verdict"] == "not measured"


def test_aggregate_pairs_with_shared():
    rows = fill_gap_recovered(make_rows())
    aggs = aggregate(rows)
    ng = next(a for a in aggs if a["scheme"] == "norm_gate" and a["quant"] == "int4")
    assert ng["bpb_pre"]["n"] == 3
    assert ng["bpb_pre"]["mean"] == pytest.approx(2.91)
    assert ng["vs_shared"]["bpb_pre"]["mean"] == pytest.approx(-0.1)
    assert ng["vs_shared"]["bpb_pre"]["verdict"] == "lower"
    assert ng["vs_shared"]["delta_bpb"]["verdict"] == "higher"
    assert ng["fragility"]["delta"]["mean"] == pytest.approx(0.001)
    assert "vs_shared" not in next(a for a in aggs if a["scheme"] == "shared")


def test_falsification_answers_cite_numbers():
    rows = fill_gap_recovered(make_rows())
    answers = falsification(rows)
    assert len(answers) == 4
    q1, q2, q3, q4 = answers
    # norm_gate is 0.05 behind lora at 4000/1500 bytes: "yes" for (1).
    assert q1["answer"].startswith("yes") and "2.9" in " ".join(q1["evidence"])
    assert "survives" in q2["answer"]
    assert "int4" in q4["answer"] and q4["answer"].startswith("yes")
    assert q3["evidence"]
    one_seed = falsification(fill_gap_recovered(make_rows(seeds=(0,))))
    text = " ".join(a["answer"] + " ".join(a["evidence"]) for a in one_seed)
    assert "not enough seeds" in text
    assert not one_seed[0]["answer"].startswith("yes")


def test_missing_schemes_are_said():
    rows = [r for r in make_rows() if r.scheme in ("shared", "unique")]
    answers = falsification(rows)
    assert all(a["answer"].startswith("not measured") for a in answers)


def test_writers(tmp_path):
    rows = fill_gap_recovered(make_rows(seeds=(0,)))
    cfg = {"data": "default", "preset": "tiny", "steps": 10}
    paths = write_outputs(rows, cfg, tmp_path)
    doc = json.loads(paths["json"].read_text())
    assert len(doc["rows"]) == len(rows) and doc["config"] == cfg and len(doc["falsification"]) == 4
    assert {r["scheme"] for r in doc["rows"]} == {"shared", "unique", "norm_gate", "lora"}
    with paths["csv"].open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and "fragility_delta" in table[0]
    md = paths["md"].read_text()
    assert "## int8" in md and "## int4" in md and "(4)" in md
    png = paths["png"].read_bytes()
    assert png[:8] == PNG_SIGNATURE
    import matplotlib.image

    assert matplotlib.image.imread(str(paths["png"])).ndim == 3
    with pytest.raises(OutputExistsError):
        write_outputs(rows, cfg, tmp_path)
    write_outputs(rows, cfg, tmp_path, force=True)


def test_markdown_without_gap_columns():
    rows = [r for r in make_rows(seeds=(0,)) if r.scheme != "unique"]
    md = to_markdown(rows, aggregate(rows), falsification(rows), {})
    assert "gap rec." not in md
