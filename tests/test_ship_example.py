"""examples/parameter_golf: a train_gpt.py-style script packs, verifies with its code and the
loader counted, and evaluates its model loaded through rnpk_load alone (recurnorm blocked)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import IMPORT_BLOCKER

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "parameter_golf"


@pytest.mark.slow
def test_parameter_golf_example_ships_through_the_loader(tmp_path):
    for f in ("train_gpt.py", "run.sh"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = (tmp_path / "run.sh").read_text().replace("python train_gpt.py eval", "true  # eval below")
    script = script.replace("train --out model.safetensors", "train --out model.safetensors --steps 5")
    (tmp_path / "run.sh").write_text(script)
    run = subprocess.run(["bash", "run.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ok: final_model.rnpk" in run.stdout and "wrote submission/train_gpt.py" in run.stdout
    evaluate = IMPORT_BLOCKER + (
        "import runpy; sys.argv = ['train_gpt.py', 'eval', '--artifact', 'final_model.rnpk']; "
        "sys.path.insert(0, '.'); runpy.run_path('train_gpt.py', run_name='__main__')"
    )
    run = subprocess.run([sys.executable, "-c", evaluate], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loaded final_model.rnpk" in run.stdout
    # The wrapped file alone (its loader inside, no rnpk_load.py beside it) loads the artifact too;
    # its bpb differs: the program reads its own file as text, and that is now the wrapper.
    (tmp_path / "rnpk_load.py").unlink()
    evaluate = evaluate.replace("'train_gpt.py'", "'submission/train_gpt.py'")
    run = subprocess.run([sys.executable, "-c", evaluate], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loaded final_model.rnpk" in run.stdout
