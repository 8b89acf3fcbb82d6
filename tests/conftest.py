"""Shared fixtures: the default corpus and one small model trained once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# The Parameter Golf SP8192 tokenizer lives in shared/ beside the repository (never copied in).
SP8192_MODEL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "fineweb_8192_bpe.model"

# The test models are tiny: one thread is as fast as two on them, and it avoids
# the heavy slowdown of OpenMP threads spinning when other processes share the cores.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def default_corpus():
    """The default corpus (CPython pydoc topics), byte tokenized."""
    from recurnorm.train.data import load_corpus

    return load_corpus("default")


@pytest.fixture(scope="session")
def trained_tiny(default_corpus):
    """(model, corpus): d=64, depth 3, seq 64, scheme "norm", 200 steps on the default corpus."""
    from recurnorm.model import ModelConfig
    from recurnorm.train.config import TrainConfig
    from recurnorm.train.loop import train

    config = ModelConfig(d_model=64, n_heads=2, depth=3, seq_len=64, scheme="norm")
    hp = TrainConfig(steps=200, batch_size=16, lr=3e-3, warmup=20, seed=0, log_every=50)
    result = train(config, default_corpus, hp, progress=False)
    model = result.model.eval()
    return model, default_corpus


@pytest.fixture(scope="session")
def pg_ckpt(tmp_path_factory, default_corpus) -> Path:
    """A briefly trained model with the Parameter Golf baseline's names, as .safetensors."""
    from pg_model import build, train_briefly
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = train_briefly(build(None), default_corpus.train_tokens, steps=30)
    path = tmp_path_factory.mktemp("pg") / "pg.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="session")
def sp8192_model() -> Path:
    """Path of the real Parameter Golf SentencePiece model; skips, saying where it looked."""
    if not SP8192_MODEL.is_file():
        pytest.skip(f"Parameter Golf SP8192 model not found at {SP8192_MODEL} (<repo>/../shared/data)")
    return SP8192_MODEL


@pytest.fixture(params=["kernel", "numpy"])
def backend(request):
    """The test run with the compiled kernel (where built) and with its numpy references
    (recurnorm.budget.kernel's switch, as RECURNORM_KERNEL=0 sets it): both write the same bytes."""
    from recurnorm.budget import kernel

    if request.param == "kernel" and kernel._built is None:
        pytest.skip("the compiled kernel is not built (no C compiler)")
    with kernel.use(request.param == "kernel"):
        yield request.param
