"""Specialization schemes: gradients, closed-form counts, equivalences, LayerRoPE formula."""

from __future__ import annotations

import cmath
import math

import pytest
import torch

from recurnorm.errors import ConfigError
from recurnorm.model import ModelConfig, RecurrentLM, relax_from_unique, schemes

D, H, S, V, HID = 32, 2, 3, 256, 128  # HID = mlp_ratio · D
TINY = dict(vocab_size=V, d_model=D, n_heads=H, depth=S, seq_len=16)


def tiny(scheme: str = "shared", seed: int = 0, **kw) -> RecurrentLM:
    torch.manual_seed(seed)
    return RecurrentLM(ModelConfig(**{**TINY, "scheme": scheme, **kw}))


def tokens() -> torch.Tensor:
    return torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))


def perturb(model: RecurrentLM, scale: float = 0.1) -> RecurrentLM:
    """Move every parameter off its init (norm gains included) so equalities are not trivial."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def shared_body(model: RecurrentLM) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if not k.startswith("spec.")}


def test_registry():
    assert set(schemes.available()) == {
        "unique",
        "shared",
        "norm",
        "norm_gate",
        "norm_gate_rank1",
        "layerrope",
        "lora",
        "rezero",
        "layerscale",
        "scalar_gate",
    }
    assert schemes.scheme_class("norm").name == "norm"
    assert isinstance(schemes.get("norm", ModelConfig(scheme="norm")), schemes.Norm)
    with pytest.raises(ConfigError, match="unknown scheme 'bogus'; available: layerrope"):
        schemes.scheme_class("bogus")


def test_new_scheme_is_one_class():
    class Doubler(schemes.Scheme, name="_test_doubler"):
        def for_step(self, step, layer):
            return {"mlp_out": torch.tensor(2.0)}

    try:
        assert "_test_doubler" in schemes.available()
        assert tiny("_test_doubler")(tokens()).shape == (2, 16, V)
    finally:
        schemes.unregister("_test_doubler")


# -- gradients -------------------------------------------------------------------


@pytest.mark.parametrize("scheme", schemes.available())
def test_gradients_reach_every_parameter(scheme):
    m = tiny(scheme)
    x = tokens()
    loss = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())
    loss.backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    # Zero-init factors (LoRA B, rank-1 a, ReZero scalars) stop gradients to
    # their partner for exactly one step; after one update everything learns.
    first_zero = {n for n, g in grads.items() if g is None or not g.abs().sum() > 0}
    expected_first_zero = {
        "lora": {n for n in grads if n.endswith(".A")},
        "norm_gate_rank1": {n for n in grads if n.endswith("_b")},
        "rezero": {n for n in grads if n.startswith("blocks.")},
    }.get(scheme, set())
    assert first_zero == expected_first_zero
    assert all(grads[n].abs().sum() > 0 for n in m.step_specific_names() - expected_first_zero)

    with torch.no_grad():
        for p in m.parameters():
            p.sub_(0.05 * p.grad.sign())
    m.zero_grad()
    torch.nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
    dead = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert dead == []


# -- closed-form counts -----------------------------------------------------------

BLOCK = 4 * D * D + 2 * D * HID + 2 * D  # projections + two input gains


@pytest.mark.parametrize(
    "scheme,options,expected",
    [
        ("shared", {}, 0),
        ("unique", {}, S * BLOCK),
        ("norm", {}, 2 * D * S),
        ("norm_gate", {}, 2 * D * S + (D + HID) * S),  # sites o (d_in D), down (d_in HID)
        ("norm_gate", {"sites": ["q", "o"]}, 2 * D * S + 2 * D * S),
        ("norm_gate_rank1", {}, 2 * D * S + (S + D) + (S + HID)),
        ("layerrope", {}, 4 * D + 16),
        ("lora", {}, S * 4 * (8 * D + 2 * (D + HID))),
        ("lora", {"rank": 2}, S * 2 * (8 * D + 2 * (D + HID))),
        ("rezero", {}, 2 * S),
        ("scalar_gate", {}, 2 * S),
        ("layerscale", {}, 2 * D * S),
    ],
)
def test_step_specific_counts(scheme, options, expected):
    counts = tiny(scheme, scheme_options=options).param_counts()
    assert counts["step_specific"] == expected
    assert counts["embedding"] == V * D


def test_layerrope_count_independent_of_depth():
    for depth in (1, 3, 7):
        m = RecurrentLM(ModelConfig(**{**TINY, "depth": depth, "scheme": "layerrope"}))
        assert m.param_counts()["step_specific"] == 4 * D + 16


def test_shared_count_loses_gains_owned_by_scheme():
    assert tiny("shared").param_counts()["shared"] - tiny("norm").param_counts()["shared"] == 2 * D


# -- equivalences -----------------------------------------------------------------


def test_norm_with_identical_gains_equals_shared():
    ref = perturb(tiny("shared"))
    m = tiny("norm")
    body = shared_body(ref)
    gains = {k: body.pop(f"blocks.0.{k}.weight") for k in ("norm_attn", "norm_mlp")}
    m.load_state_dict(body, strict=False)
    with torch.no_grad():
        m.spec.attn_in.copy_(gains["norm_attn"].expand(S, D))
        m.spec.mlp_in.copy_(gains["norm_mlp"].expand(S, D))
    assert torch.allclose(m(tokens()), ref(tokens()), atol=1e-6)
    # and differing gains do change the output
    with torch.no_grad():
        m.spec.attn_in[1] *= 2
    assert not torch.allclose(m(tokens()), ref(tokens()), atol=1e-3)


def test_lora_with_zero_B_equals_shared():
    ref = perturb(tiny("shared"))
    m = tiny("lora")
    missing, unexpected = m.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("spec.") for k in missing)
    assert all(torch.equal(p, torch.zeros_like(p)) for n, p in m.named_parameters() if n.endswith(".B"))
    assert torch.allclose(m(tokens()), ref(tokens()), atol=1e-6)


def test_unique_with_copied_blocks_equals_shared():
    ref = perturb(tiny("shared"))
    m = tiny("unique")
    block = ref.blocks[0].state_dict()
    for b in m.blocks:
        b.load_state_dict(block)
    m.embed.load_state_dict(ref.embed.state_dict())
    m.final_norm.load_state_dict(ref.final_norm.state_dict())
    assert torch.allclose(m(tokens()), ref(tokens()), atol=1e-6)


def test_same_seed_gives_every_scheme_the_same_shared_init():
    ref = tiny("shared").state_dict()
    for scheme in schemes.available():
        sd = tiny(scheme).state_dict()
        for k, v in ref.items():
            if k in sd:
                assert torch.equal(sd[k], v), (scheme, k)


def test_rezero_at_init_is_embedding_path_only():
    m = perturb(tiny("rezero"))
    with torch.no_grad():
        m.spec.attn_out.zero_()
        m.spec.mlp_out.zero_()
    x = tokens()
    expected = m.final_norm(m.embed(x)) @ m.embed.weight.T
    assert torch.allclose(m(x), expected, atol=1e-6)


@pytest.mark.parametrize(
    "scheme,options",
    [
        ("scalar_gate", {}),
        ("layerscale", {"init": 1.0}),
        ("norm_gate", {}),
        ("norm_gate_rank1", {}),
        # β = 0 and a tiny rotation make every LayerRoPE gain ≈ γ = 1
        ("layerrope", {"beta": 0.0, "alpha_rot": -60.0, "beta_rot": 0.0}),
    ],
)
def test_neutral_init_equals_shared(scheme, options):
    ref = tiny("shared")  # unit gains, so schemes owning the gains start equal
    m = tiny(scheme, scheme_options=options)
    m.load_state_dict(shared_body(ref), strict=False)
    assert torch.allclose(m(tokens()), ref(tokens()), atol=1e-5)


def test_gate_multiplies_projection_input():
    m = perturb(tiny("norm_gate"))
    ref = tiny("norm")
    ref.load_state_dict({k: v for k, v in m.state_dict().items() if "gate" not in k})
    with torch.no_grad():
        m.spec.gate_o.fill_(2.0)
        m.spec.gate_down.fill_(0.5)
        ref.blocks[0].attn.o.weight.mul_(2.0)
        ref.blocks[0].mlp.down.weight.mul_(0.5)
    assert torch.allclose(m(tokens()), ref(tokens()), atol=1e-5)


def test_rank1_gate_is_one_plus_outer():
    m = tiny("norm_gate_rank1")
    with torch.no_grad():
        m.spec.gate_o_a.copy_(torch.tensor([0.0, 0.5, -1.0]))
    for s in range(S):
        gate = m.spec.for_step(s, 0)["o.gate"]
        assert torch.allclose(gate, 1 + m.spec.gate_o_a[s] * m.spec.gate_o_b)


# -- LayerRoPE formula --------------------------------------------------------------


def reference_gain(gamma, alpha, beta, alpha_rot, beta_rot, base, ell):
    """Reference §2 with python complex numbers: pair j is γ[2j] + iγ[2j+1]."""
    d = len(gamma)
    r = alpha + beta * math.log(ell + 1)
    out = []
    for j in range(d // 2):
        theta = math.exp(alpha_rot + beta_rot * math.log(ell + 1)) * base ** (-2 * j / d)
        z = math.exp(r) * complex(gamma[2 * j], gamma[2 * j + 1]) * cmath.exp(1j * theta)
        out += [z.real, z.imag]
    return torch.tensor(out)


@pytest.mark.parametrize("options", [{}, {"beta": 0.0, "beta_rot": 0.0, "base": 1e4}, {"alpha": 0.3}])
def test_layerrope_gain_matches_reference(options):
    d = 8
    m = RecurrentLM(
        ModelConfig(vocab_size=V, d_model=d, n_heads=2, depth=5, scheme="layerrope", scheme_options=options)
    )
    spec = m.spec
    torch.manual_seed(3)
    with torch.no_grad():
        spec.mlp_out.gamma.copy_(torch.randn(d))
        spec.mlp_out.scalars.add_(torch.randn(4) * 0.1)
    o = {**schemes.scheme_class("layerrope").defaults, **options}
    for site in ("attn_in", "attn_out", "mlp_in", "mlp_out"):
        mod = getattr(spec, site)
        a, b, ar, br = mod.scalars.tolist()
        for ell in range(5):
            want = reference_gain(mod.gamma.tolist(), a, b, ar, br, o["base"], ell)
            assert torch.allclose(spec.for_step(ell, 0)[site], want, atol=1e-5), (site, ell)


def test_layerrope_init_and_index_option():
    spec = tiny("layerrope").spec
    for site in ("attn_in", "attn_out", "mlp_in", "mlp_out"):
        assert getattr(spec, site).scalars.tolist() == [0.0, -0.5, 0.0, -0.5]
        assert torch.equal(getattr(spec, site).gamma, torch.ones(D))
    assert not torch.allclose(spec.for_step(0, 0)["attn_in"], spec.for_step(2, 0)["attn_in"])
    layer = tiny("layerrope", scheme_options={"index": "layer"}).spec
    assert torch.equal(layer.for_step(0, 0)["attn_in"], layer.for_step(2, 0)["attn_in"])


def test_layerrope_params_are_controls():
    m = tiny("layerrope")
    assert m.step_specific_names() <= m.control_names() <= m.no_decay_names()
    assert "blocks.0.norm_attn.weight" not in m.state_dict()  # the scheme owns the input gains


# -- relax_from_unique --------------------------------------------------------------


def unique_with_distinct_blocks() -> RecurrentLM:
    m = tiny("unique", seed=5)
    with torch.no_grad():
        for _, lin in m.projections():
            lin.weight.add_(torch.randn_like(lin.weight) * 0.05)
    return m


def test_relax_full_rank_reproduces_unique():
    u = unique_with_distinct_blocks()
    r = relax_from_unique(u, rank=D)
    assert r.config.scheme == "lora" and r.config.scheme_options == {"rank": D}
    assert torch.allclose(r(tokens()), u(tokens()), atol=1e-4)
    avg = torch.stack([b.attn.q.weight for b in u.blocks]).mean(0)
    assert torch.allclose(r.blocks[0].attn.q.weight, avg)


def test_relax_low_rank_is_best_rank_r_residual():
    u = unique_with_distinct_blocks()
    r = relax_from_unique(u, rank=2)
    pair = r.spec.steps[1]["up"]
    residual = u.blocks[1].mlp.up.weight - r.blocks[0].mlp.up.weight
    sv = torch.linalg.svdvals(residual)
    err = torch.linalg.matrix_norm(residual - pair.B @ pair.A)
    assert torch.allclose(err, sv[2:].norm(), rtol=1e-4)


def test_relax_zero_and_stepwise():
    u = unique_with_distinct_blocks()
    r = relax_from_unique(u, rank=3, init="zero", shared_init="stepwise")
    assert torch.equal(r.blocks[0].mlp.down.weight, u.blocks[0].mlp.down.weight)
    assert all(torch.equal(p, torch.zeros_like(p)) for n, p in r.named_parameters() if n.endswith(".B"))


def test_relax_bad_arguments():
    with pytest.raises(ConfigError, match="needs a 'unique' model"):
        relax_from_unique(tiny("shared"), rank=2)
    u = tiny("unique")
    with pytest.raises(ConfigError, match="init"):
        relax_from_unique(u, rank=2, init="pca")
    with pytest.raises(ConfigError, match="shared_init"):
        relax_from_unique(u, rank=2, shared_init="first")
    with pytest.raises(ConfigError, match="rank"):
        relax_from_unique(u, rank=0)
