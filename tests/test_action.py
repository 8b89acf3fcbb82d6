"""The composite action's scripts, run with bash as a GitHub runner would (inputs through env),
and the workflows around it: actions on a supported runtime, torch from the CPU index."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ci_doc_workflow import example_steps_yaml
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
    base = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        GITHUB_ACTION_PATH=str(REPO),
        RUNNER_TEMP=str(runner_temp),
        **{k: str(v) for k, v in files.items()},
    )
    rc, out = 0, ""
    for step in action["runs"]["steps"]:
        assert step["shell"] == "bash"
        env = dict(base, **{k: _substitute(str(v), inputs) for k, v in step.get("env", {}).items()})
        script = workdir / "step.sh"
        script.write_text(_substitute(step["run"], inputs))
        # GitHub's `shell: bash` is `bash --noprofile --norc -eo pipefail {0}`.
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
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
    sd = {
        "tok.weight": torch.randn(256, 32, generator=g) * 0.02,
        "blocks.0.attn.weight": torch.randn(96, 32, generator=g) * 0.05,
        "norm.weight": torch.ones(32),
    }
    torch.save(sd, d / "model.pt")
    art = d / "model.rnpk"
    r = CliRunner().invoke(main, ["pack", str(d / "model.pt"), "-o", str(art)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return art


@pytest.mark.slow  # runs the action's bash steps and a recurnorm child
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


@pytest.mark.slow  # runs the action's bash steps and a recurnorm child
def test_fails_over_the_cap(artifact, tmp_path):
    size = artifact.stat().st_size
    rc, out, files = run_action(tmp_path, artifact=str(artifact), **{"max-bytes": str(size - 1)})
    assert rc == 3, out
    assert "::error::artifact plus code exceeds the cap" in out
    summary = files["GITHUB_STEP_SUMMARY"]
    assert "over the cap" in summary and "bytes missing" in summary and f"{size:,}" in summary
    assert "report=" in files["GITHUB_OUTPUT"]  # the output is set on failure too


@pytest.mark.slow  # runs the action's bash steps and recurnorm children
def test_corrupt_and_missing_code_fail(artifact, tmp_path):
    bad = tmp_path / "bad.rnpk"
    bad.write_bytes(artifact.read_bytes()[:-5])
    rc, out, _ = run_action(tmp_path, artifact=str(bad))
    assert rc == 4 and "::error::artifact is corrupt" in out
    rc, out, _ = run_action(tmp_path, artifact=str(artifact), code="nothing/**/*.py")
    assert rc == 2 and "matched no file" in out


# -- the workflows: runtimes and the torch wheel ------------------------------------

# The first major of each action that runs on node24: node20 left GitHub's runners on
# 2026-09-23 (actionlint flags older majors). An action missing here must be added.
NODE24_MAJOR = {"actions/checkout": 5, "actions/setup-python": 6}
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"
USES = re.compile(r"^\s*-?\s*uses:\s*([\w.-]+/[\w.-]+)@v(\d+)\s*(?:#.*)?$", re.M)


def _ci_doc_steps() -> list[dict]:
    """The steps of the GitHub Action example in docs/CI.md (what make lint hands actionlint)."""
    steps = yaml.safe_load(example_steps_yaml())
    assert isinstance(steps, list)
    return steps


def test_the_ci_doc_example_passes_only_inputs_the_action_has():
    action = yaml.safe_load((REPO / "action.yml").read_text(encoding="utf-8"))
    ours = [s for s in _ci_doc_steps() if s.get("uses", "").split("@")[0].endswith("/recurnorm")]
    assert len(ours) == 1 and set(ours[0]["with"]) <= set(action["inputs"]), ours
    assert "artifact" in ours[0]["with"]


def _workflow_texts() -> dict[str, str]:
    texts = {
        p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
    }
    texts["docs/CI.md"] = (REPO / "docs" / "CI.md").read_text(encoding="utf-8")
    texts["action.yml"] = (REPO / "action.yml").read_text(encoding="utf-8")
    return texts


def test_workflows_use_actions_on_a_supported_runtime():
    seen = set()
    for name, text in _workflow_texts().items():
        for action, major in USES.findall(text):
            if not action.startswith("actions/"):
                continue
            assert action in NODE24_MAJOR, f"{name}: {action} has no known node24 major; add it"
            assert int(major) >= NODE24_MAJOR[action], f"{name}: {action}@v{major} runs on node20"
            seen.add((name, action))
    for name in (".github/workflows/artifact-gate.yml", "docs/CI.md"):
        assert {(name, a) for a in NODE24_MAJOR} <= seen, f"{name} should check out and set up Python"


def _run_lines() -> dict[str, list[str]]:
    """Every shell line a step runs: the workflows', the docs/CI.md example's and the action's."""
    scripts: dict[str, list[str]] = {}
    for p in sorted((REPO / ".github" / "workflows").glob("*.y*ml")):
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
        scripts[p.name] = [s["run"] for job in doc["jobs"].values() for s in job["steps"] if "run" in s]
    scripts["docs/CI.md"] = [s["run"] for s in _ci_doc_steps() if "run" in s]
    action = yaml.safe_load((REPO / "action.yml").read_text(encoding="utf-8"))
    scripts["action.yml"] = [s["run"] for s in action["runs"]["steps"]]
    # Join continued lines: `a ||\n  b` is one command for this check.
    return {k: re.sub(r"(\|\||&&|\\)\s*\n\s*", r"\1 ", "\n".join(v)).splitlines() for k, v in scripts.items()}


def test_torch_comes_from_the_cpu_index_in_every_workflow():
    """PyPI's Linux torch is the multi-GB CUDA build; a runner has no GPU."""
    lines = _run_lines()
    torch_installs = {k: [ln for ln in v if re.search(r"pip install\b.*\btorch\b", ln)] for k, v in lines.items()}
    for name, found in torch_installs.items():
        for ln in found:
            assert CPU_INDEX in ln, f"{name}: torch installed without the CPU index: {ln.strip()}"
    assert torch_installs["artifact-gate.yml"] and torch_installs["docs/CI.md"] and torch_installs["action.yml"]
    # `make test` installs torch itself: the workflow hands it the CPU index.
    make_tests = [ln for ln in lines["artifact-gate.yml"] if re.search(r"\bmake test\b", ln)]
    assert make_tests and all("TORCH_INDEX=https://download.pytorch.org/whl/cpu" in ln for ln in make_tests)


def test_make_passes_torch_index_to_pip():
    r = subprocess.run(
        ["make", "-n", "-B", "-f", str(REPO / "Makefile"), "install", "TORCH_INDEX=https://example.invalid/cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    torch_line = [ln for ln in r.stdout.splitlines() if "torch==" in ln]
    assert torch_line and "--index-url https://example.invalid/cpu" in torch_line[0], r.stdout
