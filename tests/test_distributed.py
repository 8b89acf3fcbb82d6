"""Scale-out: torchrun/DDP on CPU (gloo) matches one process; resume across rank counts;
only rank 0 writes; a crash on one rank stops the run with an error naming it.

The torchrun jobs are tiny (d=32, depth 2, 10 steps) so that each one costs
mostly its process start-up (a few seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from recurnorm.cli.main import main
from recurnorm.errors import ConfigError
from recurnorm.model import ModelConfig, load_checkpoint
from recurnorm.train.config import TrainConfig
from recurnorm.train.distributed import CRASH_ENV
from recurnorm.train.loop import read_log, read_resume_state, train

WORKER = Path(__file__).with_name("dist_worker.py")
SHAPE = ["--d-model", "32", "--heads", "2", "--depth", "2", "--seq-len", "32"]
RUN = [
    *SHAPE,
    "--steps",
    "10",
    "--batch-size",
    "8",
    "--lr",
    "3e-3",
    "--log-every",
    "1",
    "--eval-every",
    "0",
    "--save-every",
    "5",
    "--no-progress",
    "--seed",
    "2",
]
# The library call the CLI options above amount to (tiny preset: warm-up 50, min_lr_frac 0.1).
LIB = TrainConfig(steps=10, batch_size=8, lr=3e-3, log_every=1, save_every=5, seed=2)
CONFIG = ModelConfig(d_model=32, n_heads=2, depth=2, seq_len=32, vocab_size=256)


def _losses(out_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_log(out_dir) if "loss" in r]


def _torchrun(tmp_path, nproc: int, out: Path, args: list[str], env: dict | None = None):
    audit = tmp_path / "audit"
    audit.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(WORKER),
        str(audit),
        str(out),
        "--",
        *args,
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    return proc, audit


@pytest.mark.parametrize("world", ["1", "2"])
def test_a_rank_ends_without_interpreter_finalization(world):
    """A rank of a multi-process job ends by os._exit after flushing (gloo threads releasing
    tensors at finalization aborted ranks after successful runs); one process exits as usual.
    `python -m recurnorm.train` ends that way: here an atexit handler shows whether Python
    finalized."""
    probe = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('finalized', flush=True))\n"
        "print('flushed', end='')\n"
        "sys.argv = ['recurnorm.train', '--help']\n"
        "runpy.run_module('recurnorm.train', run_name='__main__')\n"
    )
    env = {**os.environ, "WORLD_SIZE": world, "RANK": "0", "LOCAL_RANK": "0"}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("flushed") and "Usage:" in run.stdout  # nothing left in a buffer
    assert ("finalized" in run.stdout) == (world == "1")


@pytest.fixture(scope="module")
def one_process(default_corpus, tmp_path_factory):
    """The reference: one process, the whole batch of 8 windows per step."""
    out = tmp_path_factory.mktemp("one") / "run"
    result = train(CONFIG, default_corpus, LIB, out_dir=out, progress=False)
    return out, result


@pytest.mark.slow  # torchrun with 2 ranks
def test_two_ranks_match_one_process_and_only_rank0_writes(tmp_path, one_process):
    out = tmp_path / "two"
    proc, audit = _torchrun(tmp_path, 2, out, RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref_out, ref = one_process
    two, one = _losses(out), _losses(ref_out)
    assert [s for s, _ in two] == list(range(1, 11))
    for (_, a), (_, b) in zip(two, one, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    got = load_checkpoint(out).state_dict()
    for name, value in ref.model.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5)
    # Only rank 0 touched the output directory; both ranks ran to the end.
    written = {r: json.loads((audit / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert written[1] == []
    assert any("train_log.jsonl" in w for w in written[0])
    assert any("resume.safetensors" in w for w in written[0])
    assert proc.stdout.count("trained shared") == 1  # the summary is printed once
    # The final evaluation was split over both ranks and equals one process's.
    from recurnorm.evaluate import loss
    from recurnorm.train.data import load_corpus

    (val,) = [r["val_bpb"] for r in read_log(out) if "val_bpb" in r]
    assert val == pytest.approx(loss(ref.model, load_corpus("default")).bits_per_byte, rel=1e-5)


@pytest.mark.slow  # torchrun with 2 ranks, then a resume
def test_crash_on_one_rank_is_named_and_the_run_resumes_on_one_rank(tmp_path, one_process, monkeypatch):
    out = tmp_path / "cut"
    monkeypatch.setenv(CRASH_ENV, "1:8")  # rank 1 fails before step 8; the state of step 5 stays
    result = CliRunner().invoke(main, ["train", "--nproc", "2", *RUN, "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "error: rank 1 of 2: injected crash" in result.output
    assert read_resume_state(out)["meta"]["step"] == 5
    monkeypatch.delenv(CRASH_ENV)

    # Resume the 2-rank run in this one process: the loss curve continues as if uninterrupted.
    from recurnorm.train.data import load_corpus

    resumed = train(CONFIG, load_corpus("default"), LIB, out_dir=out, resume=True, progress=False)
    ref_out, ref = one_process
    cut, one = _losses(out), _losses(ref_out)
    assert [s for s, _ in cut] == list(range(1, 11))
    for (_, a), (_, b) in zip(cut, one, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    for name, value in ref.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=1e-4, atol=1e-5)


def test_micro_batches_match_the_whole_batch(default_corpus):
    hp = replace(LIB, steps=4)
    whole = train(CONFIG, default_corpus, hp, progress=False)
    micro = train(CONFIG, default_corpus, replace(hp, micro_batch=2), progress=False)
    for a, b in zip(whole.log, micro.log, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    with pytest.raises(ConfigError, match="micro_batch 3 must divide"):
        train(CONFIG, default_corpus, replace(hp, micro_batch=3), progress=False)


def test_batch_split_over_ranks_and_micro_batches():
    from recurnorm.train.loop import batch_split

    assert batch_split(8, None, 2) == (4, 4, 1)
    assert batch_split(8, 2, 2) == (4, 2, 2)
    assert batch_split(8, 64, 1) == (8, 8, 1)  # a micro-batch larger than the slice is the slice
    with pytest.raises(ConfigError, match="not divisible by the 2 ranks"):
        batch_split(7, None, 2)


def test_launcher_raises_the_failing_ranks_error_with_its_exit_code(tmp_path, monkeypatch):
    """The launcher's side of a failure: the first rank's record becomes that error type."""
    import recurnorm.train.launch as launch_mod
    from recurnorm.train.distributed import ERROR_DIR_ENV

    seen = {}

    def fake_run(cmd, env, check):
        seen["cmd"] = cmd
        record = {
            "rank": 1,
            "world_size": 2,
            "error": "ConfigError",
            "message": "batch_size 7 is not divisible by the 2 ranks",
            "exit_code": 2,
        }
        (Path(env[ERROR_DIR_ENV]) / "rank1.json").write_text(json.dumps(record))
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(launch_mod.subprocess, "run", fake_run)
    result = CliRunner().invoke(
        main, ["train", "--nproc", "2", "--batch-size", "7", "--out", str(tmp_path / "r"), "--no-progress"]
    )
    assert result.exit_code == 2
    assert "error: rank 1 of 2: batch_size 7 is not divisible" in result.output
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc_per_node=2" in cmd and "--nproc" not in cmd
    assert cmd[cmd.index("-m", 4) + 1] == "recurnorm.train" and "--batch-size" in cmd
