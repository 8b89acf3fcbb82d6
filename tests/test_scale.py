"""Presets up to golf, the artifact-size estimate, and the Muon optimizer."""

from __future__ import annotations

import pytest
import torch

from recurnorm.budget.cap import DEFAULT_MAX_BYTES
from recurnorm.export.plan import predict_size
from recurnorm.export.policy import ExportPolicy
from recurnorm.export.spec import build_policy
from recurnorm.model import ModelConfig
from recurnorm.train.config import TrainConfig
from recurnorm.train.loop import read_log, train
from recurnorm.train.optim import build_optimizer
from recurnorm.train.presets import get_preset

CONFIG = ModelConfig(d_model=32, n_heads=2, depth=2, seq_len=32, vocab_size=256, scheme="norm")
FAST = dict(batch_size=8, lr=3e-3, warmup=2, log_every=1)


def test_golf_fills_the_cap_and_tiny_stays_the_demo_preset():
    golf = get_preset("golf")
    plan = predict_size(ModelConfig(**golf.model), build_policy("int8"))
    assert 0.9 * DEFAULT_MAX_BYTES < plan.predicted_bytes < DEFAULT_MAX_BYTES
    assert plan.formats["int8"]["weights"] > 0.99 * plan.weights  # int8 nearly everywhere
    assert "of the 16,000,000-byte cap" in plan.line()
    tiny = get_preset("tiny")  # `make demo` depends on these values
    assert (tiny.hp.optimizer, tiny.hp.micro_batch, tiny.hp.lr, tiny.hp.steps) == ("adamw", None, 2e-3, 600)


@pytest.mark.parametrize("keep_float", [0, None])
def test_size_estimate_is_close_to_the_packed_size(trained_tiny, keep_float):
    import recurnorm
    from recurnorm.model import state_dict_for_export

    model, _ = trained_tiny
    kw = {} if keep_float is None else {"keep_float_max_numel": keep_float}
    policy = ExportPolicy(quantizer="int8", control_names=model.control_names(), **kw)
    actual = len(recurnorm.pack(state_dict_for_export(model), quant="int8", policy=policy))
    est = predict_size(model.config, policy).predicted_bytes
    assert 0.85 < est / actual < 1.2, (est, actual)


def test_muon_takes_the_matrices_and_adamw_the_rest():
    from recurnorm.train.loop import build_model

    model = build_model(CONFIG, seed=0)
    opt = build_optimizer(model, "muon", lr=1e-3, weight_decay=0.1)
    adamw, muon = opt.optimizers
    assert isinstance(adamw, torch.optim.AdamW) and isinstance(muon, torch.optim.Muon)
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in in_muon}
    assert "embed.weight" not in names and "blocks.0.attn.q.weight" in names
    assert all(p.ndim == 2 for g in muon.param_groups for p in g["params"])
    total = sum(1 for _ in model.parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == total


def test_muon_learns_and_resumes_exactly(default_corpus, tmp_path):
    hp, kw = TrainConfig(steps=8, seed=1, save_every=4, optimizer="muon", **FAST), dict(progress=False)
    full = train(CONFIG, default_corpus, hp, out_dir=tmp_path / "full", **kw)
    losses = [r["loss"] for r in full.log if "loss" in r]
    assert losses[-1] < losses[0] - 0.3

    class Stop(Exception):
        pass

    def stop(step, _record):
        if step == 6:
            raise Stop

    with pytest.raises(Stop):
        train(CONFIG, default_corpus, hp, out_dir=tmp_path / "cut", on_step=stop, **kw)
    resumed = train(CONFIG, default_corpus, hp, out_dir=tmp_path / "cut", resume=True, **kw)
    assert [r.get("loss") for r in read_log(tmp_path / "cut")] == [r.get("loss") for r in read_log(tmp_path / "full")]
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # spawns worker processes that import torch
def test_roundtrip_jobs_trains_in_parallel_processes_with_the_same_result(default_corpus, tmp_path):
    from recurnorm.evaluate.roundtrip import roundtrip
    from recurnorm.train.corpus import Corpus

    c = default_corpus
    small = Corpus(c.train_tokens, c.val_tokens[:2048], c.val_bytes[:2048], c.vocab_size, c.tokenizer, c.source)
    kw = dict(
        data=small,
        steps=6,
        progress=False,
        write=False,
        model_overrides=dict(d_model=32, n_heads=2, depth=2, seq_len=32),
        train_overrides=dict(batch_size=8, lr=3e-3, warmup=2),
    )
    one = roundtrip(["shared", "norm"], ["int8"], **kw)
    two = roundtrip(["shared", "norm"], ["int8"], jobs=2, **kw)
    key = lambda r: (r.scheme, r.quant, r.seed)  # noqa: E731
    for a, b in zip(sorted(one.rows, key=key), sorted(two.rows, key=key), strict=True):
        assert (a.bpb_pre, a.bpb_post, a.artifact_bytes) == (b.bpb_pre, b.bpb_post, b.artifact_bytes)
    assert all("parallel job on cpu" in s for s in two.config["sources"].values())


def test_training_shards_stay_memory_mapped_and_train_like_an_array(default_corpus, tmp_path):
    import numpy as np

    from recurnorm.train.corpus import Corpus
    from recurnorm.train.shards import load_shard_corpus, write_shard
    from recurnorm.train.tokens import TokenStream

    c = default_corpus
    a, b = c.train_tokens[:30_000], c.train_tokens[30_000:50_000]
    write_shard(tmp_path / "fineweb_train_000000.bin", a)
    write_shard(tmp_path / "fineweb_train_000001.bin", b)
    write_shard(tmp_path / "fineweb_val_000000.bin", c.val_tokens[:3000])
    sharded = load_shard_corpus(str(tmp_path))
    assert isinstance(sharded.train_tokens, TokenStream)
    whole = np.concatenate([a, b])
    idx = np.array([[0, 1, 29_999, 30_000], [49_999, 5, 30_001, 12]])
    assert np.array_equal(sharded.train_tokens[idx], whole[idx])
    assert np.array_equal(sharded.train_tokens[29_990:30_010], whole[29_990:30_010])
    assert np.array_equal(np.asarray(sharded.train_tokens), whole)

    in_memory = Corpus(whole, sharded.val_tokens, sharded.val_bytes, 256, "byte", "mem")
    kw = dict(steps=3, seed=0, **FAST)
    hp = TrainConfig(**kw)
    x, y = train(CONFIG, sharded, hp, progress=False), train(CONFIG, in_memory, hp, progress=False)
    assert [r["loss"] for r in x.log] == [r["loss"] for r in y.log]


def test_step_flops_count_the_loop_depth_times():
    from recurnorm.model import RecurrentLM
    from recurnorm.train.flops import step_flops

    def per_token(depth: int) -> float:
        c = ModelConfig(d_model=64, n_heads=2, depth=depth, seq_len=32, vocab_size=256)
        with torch.device("meta"):  # counted, not computed
            model = RecurrentLM(c)
            batch = torch.zeros(2, c.seq_len + 1, dtype=torch.long)
        return step_flops(model, batch) / (2 * c.seq_len)

    block = 12 * 64 * 64  # q, k, v, o and the 4x MLP: the shared block's matrices
    # 6 FLOPs per parameter per token (forward + backward) for each application, plus attention.
    assert 6 * block * 4 <= per_token(6) - per_token(2) <= 1.2 * 6 * block * 4
