"""Probes: step shuffling and control fragility."""

from __future__ import annotations

import pytest
import torch

from recurnorm.errors import ConfigError
from recurnorm.evaluate.probes import (
    check_probes,
    fragility_probe,
    shuffle_probe,
    shuffled_state,
    step_permutation,
)
from recurnorm.model import ModelConfig, RecurrentLM
from recurnorm.train.corpus import Corpus

TINY = dict(d_model=32, n_heads=2, depth=3, seq_len=64)


@pytest.fixture(scope="module")
def small_corpus(default_corpus) -> Corpus:
    c = default_corpus
    return Corpus(c.train_tokens, c.val_tokens[:4096], c.val_bytes[:4096], c.vocab_size, c.tokenizer, c.source)


def fresh(scheme: str, **options) -> RecurrentLM:
    torch.manual_seed(0)
    return RecurrentLM(ModelConfig(scheme=scheme, scheme_options=options, **TINY)).eval()


def test_permutation_is_fixed_and_not_identity():
    for depth in (2, 3, 6):
        perm = step_permutation(depth)
        assert sorted(perm) == list(range(depth))
        assert all(p != s for s, p in enumerate(perm))


def test_shuffled_state_moves_each_step_axis():
    model = fresh("norm_gate")
    with torch.no_grad():
        for p in model.spec.parameters():
            p.copy_(torch.randn_like(p))
    state, changed = shuffled_state(model)
    assert set(changed) == {n for n in model.step_specific_names()}
    assert torch.equal(state["spec.attn_in"][0], model.spec.attn_in[1])
    assert torch.equal(state["spec.gate_down"][2], model.spec.gate_down[0])
    assert torch.equal(state["blocks.0.attn.q.weight"], model.blocks[0].attn.q.weight)

    lora = fresh("lora", rank=2)
    state, changed = shuffled_state(lora)
    assert torch.equal(state["spec.steps.0.q.A"], lora.spec.steps[1]["q"].A)
    assert "spec.steps.2.down.B" in changed

    unique = fresh("unique")
    state, _ = shuffled_state(unique)
    assert torch.equal(state["blocks.1.mlp.up.weight"], unique.blocks[2].mlp.up.weight)

    # rank-1 gates: a (one per step) moves, the shared b does not; LayerRoPE has no step axis.
    r1_state, r1_changed = shuffled_state(fresh("norm_gate_rank1"))
    assert "spec.gate_o_a" in r1_changed and "spec.gate_o_b" not in r1_changed
    assert shuffled_state(fresh("layerrope"))[1] == []


def test_shuffle_leaves_shared_unchanged(small_corpus):
    result = shuffle_probe(fresh("shared"), small_corpus)
    assert result["delta"] == 0.0 and result["tensors"] == 0


def test_shuffle_changes_a_trained_norm_model(trained_tiny, small_corpus):
    model, _ = trained_tiny
    result = shuffle_probe(model, small_corpus)
    assert result["tensors"] == 2
    assert result["delta"] != 0.0
    # the model itself is untouched
    state, _ = shuffled_state(model)
    assert not torch.equal(state["spec.attn_in"], model.spec.attn_in)


def test_fragility(trained_tiny, small_corpus):
    model, _ = trained_tiny
    lossless = fragility_probe(model, small_corpus, "fp32")
    assert lossless["delta"] == 0.0
    rough = fragility_probe(model, small_corpus, "ternary")
    assert rough["delta"] != 0.0
    assert rough["bpb_controls_quantized"] - rough["bpb_controls_float"] == rough["delta"]


def test_unknown_probe():
    assert check_probes(["shuffle", "shuffle"]) == ("shuffle",)
    with pytest.raises(ConfigError, match="unknown probe"):
        check_probes(["nope"])
