"""examples/parameter_golf: the challenge baseline's model trains, packs itself in-process with the
records' recipe (GPTQ included), counts its code and the loader, verifies, and evaluates through
rnpk_load alone (recurnorm blocked); at a reduced size here, at the baseline's by default."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import IMPORT_BLOCKER
from pg_model import baseline_state

from recurnorm.budget.api import read_artifact

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "parameter_golf"
REDUCED = {
    "NUM_LAYERS": "3",
    "MODEL_DIM": "64",
    "NUM_HEADS": "4",
    "NUM_KV_HEADS": "2",
    "ITERATIONS": "5",
    "TRAIN_SEQ_LEN": "64",
    "TRAIN_BATCH_TOKENS": "1024",
    "GPTQ": "1",
}


def test_the_example_is_the_baseline_at_its_defaults(monkeypatch):
    for key in (*REDUCED, "VOCAB_SIZE", "MLP_MULT"):
        monkeypatch.delenv(key, raising=False)
    spec = importlib.util.spec_from_file_location("pg_example_train_gpt", EXAMPLE / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        model = module.GPT()
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == {k: tuple(v.shape) for k, v in baseline_state().items()}
    assert sum(v.numel() for v in model.parameters()) == 17_059_912


@pytest.mark.slow
def test_parameter_golf_example_ships_through_the_loader(tmp_path):
    for f in ("train_gpt.py", "run.sh"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    env = {**os.environ, **REDUCED, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = (tmp_path / "run.sh").read_text().replace("python submission/train_gpt.py eval", "true  # below")
    (tmp_path / "run.sh").write_text(script)
    run = subprocess.run(["bash", "run.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ok: final_model.rnpk" in run.stdout and "roundtrip: val_loss" in run.stdout
    counted = len((tmp_path / "submission" / "train_gpt.py").read_bytes())
    assert f"+ code {counted:,} (submission/train_gpt.py)" in run.stdout  # the wrapped file, counted in-process
    art = read_artifact((tmp_path / "final_model.rnpk").read_bytes())
    q = art.qtensors
    assert q["tok_emb.weight"].format == "int8" and q["tok_emb.weight"].params["clip"] == "sigma:20"
    assert q["blocks.0.attn.c_k.weight"].format == "int6" and q["blocks.0.attn.c_k.weight"].params["clip"] == "sigma:13"
    assert q["blocks.2.mlp.fc.weight"].params["clip"] == "sigma:10"
    for name in ("skip_weights", "blocks.1.resid_mix", "blocks.0.attn.q_gain", "blocks.2.mlp_scale"):
        assert q[name].format == "fp32", name
    rules = art.metadata["export"]["rules"]
    assert rules["blocks.1.mlp.proj.weight"].endswith("+ GPTQ") and "GPTQ x" in art.metadata["export"]["policy"]
    # The evaluation machine has no recurnorm: the source through rnpk_load.py, then the wrapped
    # file alone (its loader inside, no rnpk_load.py beside it), as the challenge runs it.
    losses = []
    for program in ("train_gpt.py", "submission/train_gpt.py"):
        if program.startswith("submission"):
            (tmp_path / "rnpk_load.py").unlink()
        evaluate = IMPORT_BLOCKER + (
            f"import runpy; sys.argv = [{program!r}, 'eval']; runpy.run_path({program!r}, run_name='__main__')"
        )
        run = subprocess.run(
            [sys.executable, "-c", evaluate], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "loaded final_model.rnpk" in run.stdout
        losses.append(run.stdout.split("val_loss")[1].split()[0])
    assert losses[0] == losses[1]  # the same program, the same weights
