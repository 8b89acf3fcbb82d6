"""The composite action's scripts, run with bash as a GitHub runner would (inputs through env)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra: pip install -e .[dev]")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def _substitute(text: str, inputs: dict[str, str]) -> str:
    """Replace ${{ inputs.X }} and ${{ github.action_path }} as the runner does."""

    def value(m: re.Match) -> str:
        expr = m.group(1)
        if expr.startswith("inputs."):
            return inputs[expr.removeprefix("inputs.")]
        if expr == "github.action_path":
            return str(REPO)
        raise AssertionError(f"test does not know the expression {expr!r}")

    return EXPR.sub(value, text)


def run_action(workdir: Path, **given: str) -> tuple[int, str, dict]:
    """Run every step of action.yml; (exit code of the last step run, its output, files written)."""
    action = yaml.safe_load((REPO / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    inputs = {}
    for name, spec in action["inputs"].items():
        if spec.get("required") and name not in given:
            raise AssertionError(f"required input {name} missing")
        inputs[name] = given.get(name, spec.get("default", ""))
    unknown = set(given) - set(action["inputs"])
    assert not unknown, unknown
    files = {k: workdir / f"{k.lower()}.txt" for k in ("GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT")}
    runner_temp = workdir / "runner_temp"
    runner_temp.mkdir(exist_ok=True)
    base = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                GITHUB_ACTION_PATH=str(REPO), RUNNER_TEMP=str(runner_temp),
                **{k: str(v) for k, v in files.items()})
    rc, out = 0, ""
    for step in action["runs"]["steps"]:
        assert step["shell"] == "bash"
        env = dict(base, **{k: _substitute(str(v), inputs) for k, v in step.get("env", {}).items()})
        script = workdir / "step.sh"
        script.write_text(_substitute(step["run"], inputs))
        # GitHub's `shell: bash` is `bash --noprofile --norc -eo pipefail {0}`.
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workdir,
                              env=env, capture_output=True, text=True, timeout=120)
        rc, out = proc.returncode, proc.stdout + proc.stderr
        if rc != 0:
            break
    written = {k: v.read_text() if v.exists() else "" for k, v in files.items()}
    return rc, out, written


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """A tiny random model packed int8 (any state dict packs; no training needed here)."""
    from recurnorm.cli.main import main

    d = tmp_path_factory.mktemp("action")
    g = torch.Generator().manual_seed(0)
    sd = {"tok.weight": torch.randn(256, 32, generator=g) * 0.02,
          "blocks.0.attn.weight": torch.randn(96, 32, generator=g) * 0.05, "norm.weight": torch.ones(32)}
    torch.save(sd, d / "model.pt")
    art = d / "model.rnpk"
    r = CliRunner().invoke(main, ["pack", str(d / "model.pt"), "-o", str(art)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return art


def test_passes_under_the_cap(artifact, tmp_path):
    assert (BIN / "recurnorm").exists(), "the venv's recurnorm script is needed on PATH"
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    code = [tmp_path / "src" / "run.py", tmp_path / "src" / "pkg" / "model.py"]
    for i, f in enumerate(code):
        f.write_text("print('x')\n" * (i + 1))
    rc, out, files = run_action(tmp_path, artifact=str(artifact), code="src/**/*.py")
    assert rc == 0, out
    assert "recurnorm already installed" not in out  # only the last step's output is kept
    assert "artifact OK" in out
    size = artifact.stat().st_size
    summary = files["GITHUB_STEP_SUMMARY"]
    assert "✅ pass" in summary and f"{size:,}" in summary and "headroom" in summary and "16,000,000" in summary
    report = re.search(r"^report=(.+)$", files["GITHUB_OUTPUT"], re.M).group(1)
    doc = json.loads(Path(report).read_text())
    cap = doc["artifacts"][0]["cap"]
    assert doc["ok"] and cap["code_bytes"] == sum(len(f.read_bytes()) for f in code)
    assert f"{cap['headroom_bytes']:,}" in summary


def test_fails_over_the_cap(artifact, tmp_path):
    size = artifact.stat().st_size
    rc, out, files = run_action(tmp_path, artifact=str(artifact), **{"max-bytes": str(size - 1)})
    assert rc == 3, out
    assert "::error::artifact plus code exceeds the cap" in out
    summary = files["GITHUB_STEP_SUMMARY"]
    assert "over the cap" in summary and "bytes missing" in summary and f"{size:,}" in summary
    assert "report=" in files["GITHUB_OUTPUT"]  # the output is set on failure too


def test_corrupt_and_missing_code_fail(artifact, tmp_path):
    bad = tmp_path / "bad.rnpk"
    bad.write_bytes(artifact.read_bytes()[:-5])
    rc, out, _ = run_action(tmp_path, artifact=str(bad))
    assert rc == 4 and "::error::artifact is corrupt" in out
    rc, out, _ = run_action(tmp_path, artifact=str(artifact), code="nothing/**/*.py")
    assert rc == 2 and "matched no file" in out
