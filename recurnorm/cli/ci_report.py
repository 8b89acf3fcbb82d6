"""What `recurnorm verify` tells CI: per-artifact checks, JUnit XML and a Markdown job summary."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .. import io
from ..display import printable
from . import exitcodes

# Which failure decides the exit code when several artifacts or checks fail: a
# corrupt artifact hides everything else, a cap failure is certain, a loss
# regression is a measurement, any other error comes last.
PRIORITY = (exitcodes.CORRUPT, exitcodes.OVER_CAP, exitcodes.LOSS_REGRESSION, exitcodes.FAILURE, exitcodes.USAGE)


def worst(codes) -> int:
    """The exit code that wins among codes (0 when all are 0)."""
    codes = set(codes) - {exitcodes.OK}
    for code in PRIORITY:
        if code in codes:
            return code
    return max(codes, default=exitcodes.OK)


@dataclass
class Check:
    """One JUnit testcase: status is passed, failed, error or skipped."""

    name: str
    status: str
    message: str = ""
    kind: str = ""  # failure type (the library error's name)


@dataclass
class Outcome:
    """Everything verify found about one artifact."""

    report: object  # budget.api.VerifyReport
    gate: dict | None = None  # GateReport.to_dict() when the loss gate ran
    gate_code: int = exitcodes.OK
    gate_error: str = ""
    gate_requested: bool = False
    checks: list[Check] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The worst of the integrity/cap code and the loss gate's code."""
        return worst([self.report.exit_code, self.gate_code])

    @property
    def path(self) -> str:
        """The artifact path as given."""
        return self.report.path

    def build_checks(self) -> list[Check]:
        """integrity, size cap and (when asked for) loss gate, as testcases."""
        rep = self.report
        corrupt = rep.exit_code == exitcodes.CORRUPT
        checks = [
            Check("integrity", "failed", rep.reason, "ArtifactError")
            if corrupt
            else Check("integrity", "passed", "every stream decodes and matches its checksum")
        ]
        if corrupt:
            checks.append(Check("size cap", "skipped", "artifact did not decode"))
        elif rep.exit_code == exitcodes.OVER_CAP:
            checks.append(Check("size cap", "failed", rep.reason, "OverCapError"))
        else:
            cap = rep.cap or {}
            checks.append(
                Check(
                    "size cap",
                    "passed",
                    f"{cap.get('total_bytes', 0):,} of "
                    f"{cap.get('max_bytes', 0):,} bytes; headroom {cap.get('headroom_bytes', 0):,}",
                )
            )
        if self.gate_requested:
            if corrupt:
                checks.append(Check("loss gate", "skipped", "artifact did not decode"))
            elif self.gate_code == exitcodes.LOSS_REGRESSION:
                checks.append(Check("loss gate", "failed", self.gate_error, "LossRegressionError"))
            elif self.gate_code != exitcodes.OK:
                checks.append(Check("loss gate", "error", self.gate_error, "RecurnormError"))
            else:
                checks.append(Check("loss gate", "passed", gate_line(self.gate)))
        self.checks = checks
        return checks

    def to_dict(self) -> dict:
        """JSON form: the VerifyReport's fields, the loss gate and the checks."""
        out = self.report.to_dict()
        out.update(
            exit_code=self.exit_code,
            ok=self.exit_code == exitcodes.OK,
            loss_gate=self.gate,
            checks=[
                {"name": c.name, "status": c.status, "message": c.message} for c in self.checks or self.build_checks()
            ],
        )
        if self.gate_error:
            out["loss_gate_error"] = self.gate_error
        return out


def gate_line(gate: dict | None) -> str:
    """One line: artifact vs reference bpb, delta and the allowed delta."""
    if not gate:
        return ""
    return (
        f"artifact {gate['bpb_artifact']:.4f} bpb vs reference {gate['bpb_reference']:.4f} "
        f"(delta {gate['delta']:+.4f}, allowed {gate['max_loss_delta']:.4f})"
    )


def to_json(outcomes: list[Outcome]) -> dict:
    """The whole run: overall ok/exit code and one entry per artifact."""
    code = worst(o.exit_code for o in outcomes)
    return {"ok": code == exitcodes.OK, "exit_code": code, "artifacts": [o.to_dict() for o in outcomes]}


# ------------------------------------------------------------------ JUnit XML


def junit_xml(outcomes: list[Outcome]) -> str:
    """JUnit XML: one testsuite per artifact, one testcase per check."""
    root = ET.Element("testsuites", name="recurnorm verify")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for o in outcomes:
        checks = o.checks or o.build_checks()
        counts = {
            "tests": len(checks),
            "failures": sum(c.status == "failed" for c in checks),
            "errors": sum(c.status == "error" for c in checks),
            "skipped": sum(c.status == "skipped" for c in checks),
        }
        # printable(): XML 1.0 cannot hold control characters, even escaped.
        suite = ET.SubElement(root, "testsuite", name=printable(o.path), **{k: str(v) for k, v in counts.items()})
        for c in checks:
            case = ET.SubElement(suite, "testcase", name=c.name, classname=f"recurnorm.verify.{_class(o.path)}")
            message = printable(c.message)
            if c.status in ("failed", "error"):
                el = ET.SubElement(case, "failure" if c.status == "failed" else "error", message=message, type=c.kind)
                el.text = message
            elif c.status == "skipped":
                ET.SubElement(case, "skipped", message=message)
            else:
                ET.SubElement(case, "system-out").text = message
        for k in totals:
            totals[k] += counts[k]
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _class(path: str) -> str:
    """A dotted-name-safe form of an artifact path for JUnit's classname."""
    stem = Path(path).name
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in stem) or "artifact"


# ------------------------------------------------------------------ Markdown


def _md(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return printable(text).replace("|", "\\|").replace("`", "'")


VERDICT = {
    exitcodes.OK: "✅ pass",
    exitcodes.OVER_CAP: "❌ over the cap",
    exitcodes.CORRUPT: "❌ corrupt",
    exitcodes.LOSS_REGRESSION: "❌ loss regression",
}


def markdown_summary(outcomes: list[Outcome], top: int = 10) -> str:
    """A job summary: per artifact the verdict, the size table, the largest tensors and the loss gate."""
    parts = []
    for o in outcomes:
        rep = o.report
        code = o.exit_code
        parts.append(f"### recurnorm verify `{_md(o.path)}`: {VERDICT.get(code, f'❌ error (exit {code})')}\n")
        if code != exitcodes.OK:
            reason = o.gate_error if rep.exit_code == exitcodes.OK else rep.reason
            parts.append(f"> {_md(reason)}\n")
        cap = rep.cap
        if cap:
            head = cap["headroom_bytes"]
            pct = 100.0 * head / cap["max_bytes"] if cap["max_bytes"] else 0.0
            rows = [
                ("artifact", f"{cap['artifact_bytes']:,}"),
                ("code", f"{cap['code_bytes']:,}"),
                ("total", f"**{cap['total_bytes']:,}**"),
                ("cap", f"{cap['max_bytes']:,}"),
            ]
            rows.append(
                ("headroom", f"{head:,} ({pct:.2f}% of the cap)")
                if head >= 0
                else ("**bytes missing**", f"**{-head:,}**")
            )
            parts.append("| size | bytes |\n|---|---:|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows))
        if o.gate:
            g = o.gate
            mark = "✅" if g["passed"] else "❌"
            parts.append(
                f"**Loss gate** {mark}: artifact {g['bpb_artifact']:.4f} bpb, reference "
                f"{g['bpb_reference']:.4f} bpb, delta {g['delta']:+.4f} (allowed "
                f"{g['max_loss_delta']:.4f}) on `{_md(g['data'])}` ({g['val_bytes']:,} bytes)\n"
            )
        elif o.gate_requested and o.gate_error and o.gate_code != exitcodes.LOSS_REGRESSION:
            parts.append(f"**Loss gate**: error: {_md(o.gate_error)}\n")
        tensors = sorted((r for r in rep.tensors if "alias_of" not in r), key=lambda r: (-r["bytes"], r["name"]))
        if tensors:
            lines = ["| tensor | shape | format | packed bytes | bits/weight |", "|---|---|---|---:|---:|"]
            for r in tensors[:top]:
                shape = "×".join(map(str, r["shape"])) or "scalar"
                lines.append(
                    f"| `{_md(r['name'])}` | {shape} | {_md(r['format'])} | {r['bytes']:,} | "
                    f"{r['bits_per_weight']:.3f} |"
                )
            more = len(tensors) - top
            parts.append(
                f"<details><summary>Largest tensors ({min(top, len(tensors))} of {len(tensors)})"
                "</summary>\n\n"
                + "\n".join(lines)
                + "\n"
                + (f"\n…and {more} more\n" if more > 0 else "")
                + "\n</details>\n"
            )
    return "\n".join(parts) + "\n"


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append to a file, as GitHub's $GITHUB_STEP_SUMMARY expects (earlier steps' text stays)."""
    io.append_text(path, text)
