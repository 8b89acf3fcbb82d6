"""What every benchmark shares: the one cache folder, and the --smoke switch.

The cache holds what the benchmarks read but the repository does not carry (a real checkpoint
turned into .safetensors by real_ckpt.py, the frontier model, the Parameter Golf scripts, the
anchors' remembered sizes): `RECURNORM_BENCH_CACHE`, default ~/.cache/recurnorm-bench. No
script downloads anything into it; each says which command fills what it needs.

`--smoke` runs a script's own code path on tiny inputs (seconds on 2 cores, what CI runs):
it measures nothing worth quoting, it proves the script still runs. A smoke run never writes
into the cache folder's top level, where the full runs look for real checkpoints: what it
caches goes to SMOKE_CACHE.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

CACHE = Path(os.environ.get("RECURNORM_BENCH_CACHE") or Path.home() / ".cache" / "recurnorm-bench").expanduser()
SMOKE_CACHE = CACHE / "smoke"
# A smoke run's model: the tiny preset's options overridden by these (its loss over the default
# corpus's validation split: half a second on one thread, against 3 s at the tiny preset)
SMOKE_MODEL = {"d_model": 32, "n_heads": 2, "depth": 2, "seq_len": 32}
SMOKE_HELP = "tiny inputs, seconds: proves the script runs (what CI runs), measures nothing worth quoting"


def add_smoke(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def skipped(what: str, why: str) -> None:
    """The one line a run prints for an anchor or input it cannot have here."""
    print(f"{what}: skipped ({why})", flush=True)


SMOKE_MIN_NUMEL = 4096  # a smoke run's "large matrix" (real checkpoints: 65,536 values)


def tiny_real_checkpoint(folder: Path, name: str = "tiny-bert") -> Path:
    """A BERT-named float checkpoint of two layers, 64 wide (every matrix SMOKE_MIN_NUMEL
    values or more): a stand-in for real_ckpt.py's cached MiniLM in smoke runs."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    d, ff = 64, 128
    state = {"embeddings.word_embeddings.weight": torch.randn(256, d, generator=g) * 0.05}
    for i in range(2):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            state[p + f"attention.self.{n}.weight"] = torch.randn(d, d, generator=g) * 0.05
            state[p + f"attention.self.{n}.bias"] = torch.randn(d, generator=g) * 0.01
        state[p + "attention.output.dense.weight"] = torch.randn(d, d, generator=g) * 0.05
        state[p + "intermediate.dense.weight"] = torch.randn(ff, d, generator=g) * 0.05
        state[p + "output.dense.weight"] = torch.randn(d, ff, generator=g) * 0.05
        state[p + "output.LayerNorm.weight"] = 1 + 0.1 * torch.randn(d, generator=g)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.safetensors"
    save_file(state, str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)
    return path
