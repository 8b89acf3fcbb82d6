"""ExportPolicy plans, fake quantization (STE) and the extra-RMSNorm transform."""

from __future__ import annotations

import pytest
import torch

import recurnorm.quant as q
from recurnorm.errors import QuantError
from recurnorm.export.policy import ExportPolicy
from recurnorm.quant.extra_norm import add_extra_norm
from recurnorm.quant.fake import absmax_act_quant, fake_quant, fake_quant_transform


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(512, 256, generator=g),
        "head.weight": torch.randn(512, 256, generator=g),
        "blocks.0.attn.q.weight": torch.randn(512, 256, generator=g),
        "blocks.0.mlp.up.weight": torch.randn(1024, 256, generator=g),
        "blocks.0.attn.q.input_norm.weight": torch.ones(256),
        "blocks.0.norm_attn.weight": torch.ones(256),
        "final_norm.weight": torch.ones(256),
        "spec.gains": torch.ones(6, 256),
        "spec.layerrope.alpha": torch.zeros(4),
        "small.proj.weight": torch.randn(64, 64, generator=g),
        "steps": torch.tensor([3], dtype=torch.int64),
    }


def test_default_plan():
    plan = ExportPolicy().plan(state())
    fmt = {k: v[0] for k, v in plan.items()}
    assert fmt["blocks.0.attn.q.weight"] == "int8" and fmt["blocks.0.mlp.up.weight"] == "int8"
    for c in (
        "blocks.0.attn.q.input_norm.weight",
        "blocks.0.norm_attn.weight",
        "final_norm.weight",
        "spec.gains",
        "spec.layerrope.alpha",
    ):
        assert fmt[c] == "fp32" and plan[c][2] == "control"
    # every weight matrix gets the requested format, however small (no silent fp16)
    assert fmt["small.proj.weight"] == "int8" and plan["small.proj.weight"][2] == "weight"
    assert fmt["embed.weight"] == "int8" and plan["embed.weight"][2] == "embedding"
    assert fmt["steps"] == "raw"


def test_embedding_option_controls_flag_and_overrides():
    pol = ExportPolicy(
        quantizer="int4",
        options={"group": 32},
        embedding_format="fp16",
        quantize_controls=True,
        overrides={"blocks.*.mlp.*": ("int6", {"clip_search": True})},
    )
    plan = pol.plan(state())
    assert plan["embed.weight"][0] == plan["head.weight"][0] == "fp16"
    assert plan["blocks.0.norm_attn.weight"][:2] == ("int4", {"group": 32})
    assert plan["spec.gains"][2] == "control (quantize_controls)"
    assert plan["blocks.0.mlp.up.weight"][:2] == ("int6", {"clip_search": True})
    assert plan["blocks.0.attn.q.weight"][:2] == ("int4", {"group": 32})
    out = pol.export(state())
    assert out["blocks.0.mlp.up.weight"].format == "int6"
    assert out["blocks.0.mlp.up.weight"].params["clip_search"] is True
    text = pol.describe(state())
    assert "blocks.0.mlp.up.weight" in text and "override" in text


def test_control_names_from_the_model_and_big_spec_matrices():
    sd = {"spec.lora.A": torch.randn(300, 256), "blocks.0.mix": torch.ones(8)}
    plan = ExportPolicy(control_names=frozenset({"blocks.0.mix"})).plan(sd)
    assert plan["spec.lora.A"][0] == "int8"  # a step-specific matrix is a weight, not a control
    assert plan["blocks.0.mix"][0] == "fp32"


def test_bad_policy_fails_early():
    with pytest.raises(QuantError, match="available"):
        ExportPolicy(quantizer="int9")
    with pytest.raises(QuantError, match="options"):
        ExportPolicy(overrides={"x*": ("int4", {"bogus": 1})})
    with pytest.raises(QuantError, match="embedding_format"):
        ExportPolicy(embedding_format="int9")
    assert ExportPolicy(embedding_format="int6").plan(state())["embed.weight"][0] == "int6"


def test_export_and_dequantize_all_restore_dtypes():
    sd = state()
    sd["blocks.0.attn.q.weight"] = sd["blocks.0.attn.q.weight"].to(torch.bfloat16)
    back = q.dequantize_all(ExportPolicy().export(sd))
    assert back.keys() == sd.keys()
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
    assert torch.equal(back["steps"], sd["steps"])
    assert torch.equal(back["final_norm.weight"], sd["final_norm.weight"])


# -- fake quantization -------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,opts",
    [("int4", {}), ("int8", {}), ("ternary", {}), ("nf4", {}), ("int6", {"asymmetric": True, "clip_search": True})],
)
def test_fake_quant_forward_is_export_and_grad_is_identity(fmt, opts):
    quant = q.get(fmt, **opts)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    y = fake_quant(w, quant)
    assert torch.equal(y.detach(), q.dequantize(quant.quantize(w.detach())))
    g = torch.randn(32, 64)
    (y * g).sum().backward()
    assert torch.equal(w.grad, g)


def test_fake_quant_lambda_mixes():
    quant = q.get("ternary")
    w = torch.randn(16, 64).requires_grad_()
    qw = q.dequantize(quant.quantize(w.detach()))
    assert torch.equal(fake_quant(w, quant, lam=0.0).detach(), w.detach())
    assert torch.allclose(fake_quant(w, quant, lam=0.5).detach(), 0.5 * (w.detach() + qw), atol=1e-6)


def test_fake_quant_as_linear_weight_transform():
    from recurnorm.model.layers import Linear

    lin = Linear(64, 32)
    quant = q.get("int4")
    lin.weight_transform = fake_quant_transform(quant)
    x = torch.randn(5, 64)
    y = lin(x)
    ref = x @ q.dequantize(quant.quantize(lin.weight.detach())).T
    assert torch.allclose(y, ref, atol=1e-6)
    y.sum().backward()
    assert lin.weight.grad is not None and torch.isfinite(lin.weight.grad).all()


def test_absmax_act_quant():
    x = torch.randn(4, 10, 32).requires_grad_()
    y = absmax_act_quant(x)
    m = x.detach().abs().amax(-1, keepdim=True)
    ref = (x.detach() * 127 / m).round().clamp(-128, 127) * m / 127
    assert torch.allclose(y.detach(), ref, atol=1e-6)
    assert len(torch.unique((y.detach() / m * 127).round())) <= 255
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    assert torch.isfinite(absmax_act_quant(torch.zeros(2, 8))).all()


# -- extra RMSNorm ---------------------------------------------------------------


def test_add_extra_norm_is_idempotent_and_named():
    from recurnorm.model import ModelConfig, RecurrentLM
    from recurnorm.model.layers import RMSNorm

    model = RecurrentLM(ModelConfig(d_model=32, n_heads=2, depth=2, seq_len=16))
    idx = torch.randint(0, 256, (2, 16))
    before = model(idx)
    add_extra_norm(model)
    assert model.config.extra_norm is True
    norms = [lin.input_norm for _, lin in model.projections()]
    assert all(isinstance(n, RMSNorm) for n in norms)
    assert all(torch.equal(n.weight, torch.ones_like(n.weight)) for n in norms)
    names = set(model.state_dict())
    for proj, _ in model.projections():
        assert f"{proj}.input_norm.weight" in names
    add_extra_norm(model)
    assert [lin.input_norm for _, lin in model.projections()] == norms
    assert model(idx).shape == before.shape
    # the policy keeps the new gains in fp32
    plan = ExportPolicy(control_names=frozenset(model.control_names())).plan(model.state_dict())
    assert all(plan[f"{p}.input_norm.weight"][0] == "fp32" for p, _ in model.projections())
