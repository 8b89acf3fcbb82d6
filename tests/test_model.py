"""RecurrentLM, ModelConfig and checkpoints: shapes, naming, hooks, errors."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from recurnorm.errors import CheckpointError, ConfigError, OutputExistsError
from recurnorm.model import (
    ModelConfig,
    RecurrentLM,
    load_checkpoint,
    save_checkpoint,
    schemes,
)
from recurnorm.model.layers import Linear, RMSNorm

TINY = dict(vocab_size=256, d_model=32, n_heads=2, depth=3, seq_len=16)


def tiny(**kw) -> RecurrentLM:
    torch.manual_seed(0)
    return RecurrentLM(ModelConfig(**{**TINY, **kw}))


def tokens(B: int = 2, T: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(1))


# -- config ---------------------------------------------------------------------


def test_config_roundtrip_through_json():
    c = ModelConfig(**TINY, scheme="norm_gate", scheme_options={"sites": ["o"]}, qat={"format": "ternary"})
    again = ModelConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c


def test_config_defaults_are_the_documented_ones_and_build_a_model():
    """docs/DESIGN.md states the defaults; the test holds code and doc together, not a copy."""
    design = (Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    block = re.search(r"`ModelConfig` dataclass: `([^`]+)`", design).group(1)
    documented = {k: ast.literal_eval(v) for k, v in re.findall(r"(\w+)=(\"\w*\"|[^,\s(]+)", block)}
    c = ModelConfig()
    assert documented == {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
    c.validate()
    torch.manual_seed(0)
    assert RecurrentLM(c)(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, c.vocab_size)


def test_config_unknown_field_is_named():
    with pytest.raises(ConfigError, match="unknown model config field 'd_modle'"):
        ModelConfig.from_dict({"d_modle": 64})


@pytest.mark.parametrize(
    "field,value",
    [
        ("d_model", "128"),
        ("depth", 0),
        ("norm", "post"),
        ("tie_embeddings", 1),
        ("mlp_ratio", None),
        ("qat", "ternary"),
        ("scheme_options", []),
    ],
)
def test_config_bad_value_names_field(field, value):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_dict({field: value})


def test_config_d_model_not_divisible():
    with pytest.raises(ConfigError, match="d_model 130 is not divisible by n_heads 4"):
        ModelConfig(d_model=130, n_heads=4).validate()


def test_config_unknown_scheme_lists_available():
    with pytest.raises(ConfigError) as e:
        ModelConfig(scheme="nope").validate()
    assert "'nope'" in str(e.value)
    for name in ("shared", "norm", "layerrope", "lora"):
        assert name in str(e.value)


def test_config_unknown_scheme_option():
    with pytest.raises(ConfigError, match="unknown option 'rnak' for scheme 'lora'.*rank"):
        ModelConfig(scheme="lora", scheme_options={"rnak": 2}).validate()
    with pytest.raises(ConfigError, match="unknown option 'rank' for scheme 'shared'"):
        ModelConfig(scheme="shared", scheme_options={"rank": 2}).validate()


def test_config_bad_scheme_option_values():
    with pytest.raises(ConfigError, match="rank"):
        ModelConfig(scheme="lora", scheme_options={"rank": 0}).validate()
    with pytest.raises(ConfigError, match="rank"):
        ModelConfig(scheme="lora", scheme_options={"rank": "4"}).validate()
    with pytest.raises(ConfigError, match="sites"):
        ModelConfig(scheme="norm_gate", scheme_options={"sites": ["x"]}).validate()
    with pytest.raises(ConfigError, match="index"):
        ModelConfig(scheme="layerrope", scheme_options={"index": "depth"}).validate()


def test_model_validates_its_config():
    with pytest.raises(ConfigError, match="not divisible"):
        RecurrentLM(ModelConfig(d_model=33, n_heads=2))


# -- forward and naming ----------------------------------------------------------


@pytest.mark.parametrize("scheme", schemes.available())
@pytest.mark.parametrize("norm", ["pre", "peri"])
def test_forward_shape(scheme, norm):
    m = tiny(scheme=scheme, norm=norm)
    logits = m(tokens())
    assert logits.shape == (2, 16, 256)
    assert torch.isfinite(logits).all()


def test_forward_is_causal():
    m = tiny(scheme="norm_gate")
    x = tokens()
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 256
    assert torch.allclose(m(x)[:, :10], m(y)[:, :10], atol=1e-6)
    assert not torch.allclose(m(x)[:, 10:], m(y)[:, 10:])


def test_longer_than_seq_len_still_runs():
    assert tiny()(tokens(1, 40)).shape == (1, 40, 256)


def test_state_dict_names_shared():
    assert set(tiny().state_dict()) == {
        "embed.weight",
        "final_norm.weight",
        "blocks.0.attn.q.weight",
        "blocks.0.attn.k.weight",
        "blocks.0.attn.v.weight",
        "blocks.0.attn.o.weight",
        "blocks.0.mlp.up.weight",
        "blocks.0.mlp.down.weight",
        "blocks.0.norm_attn.weight",
        "blocks.0.norm_mlp.weight",
    }


def test_state_dict_names_peri_untied_unique():
    names = set(tiny(norm="peri", tie_embeddings=False, scheme="unique").state_dict())
    assert "head.weight" in names
    for i in range(3):
        assert f"blocks.{i}.norm_attn_out.weight" in names
        assert f"blocks.{i}.norm_mlp_out.weight" in names
        assert f"blocks.{i}.mlp.down.weight" in names
    assert "head.weight" not in tiny().state_dict()


def test_step_specific_params_live_under_spec():
    for scheme in schemes.available():
        m = tiny(scheme=scheme)
        if scheme == "unique":
            assert m.step_specific_names() == {n for n, _ in m.named_parameters() if n.startswith("blocks.")}
        else:
            assert m.step_specific_names() == {n for n, _ in m.named_parameters() if n.startswith("spec.")}


def test_projections_named_by_state_dict_prefix():
    m = tiny(scheme="unique", extra_norm=True)
    projs = m.projections()
    assert len(projs) == 6 * 3
    names = set(m.state_dict())
    for name, lin in projs:
        assert isinstance(lin, Linear)
        assert f"{name}.weight" in names
        assert f"{name}.input_norm.weight" in names
        assert isinstance(lin.input_norm, RMSNorm)
        assert torch.equal(lin.input_norm.weight, torch.ones_like(lin.input_norm.weight))
    assert [n for n, _ in projs][:6] == [
        "blocks.0.attn.q",
        "blocks.0.attn.k",
        "blocks.0.attn.v",
        "blocks.0.attn.o",
        "blocks.0.mlp.up",
        "blocks.0.mlp.down",
    ]
    assert all(lin.input_norm is None for _, lin in tiny().projections())


def test_weight_transform_hook_is_applied():
    m = tiny()
    x = tokens()
    before = m(x)
    for _, lin in m.projections():
        lin.weight_transform = torch.zeros_like
    # With every projection zeroed the blocks add nothing: logits = norm(embed) @ embedᵀ.
    expected = m.final_norm(m.embed(x)) @ m.embed.weight.T
    assert torch.allclose(m(x), expected, atol=1e-6)
    for _, lin in m.projections():
        lin.weight_transform = None
    assert torch.equal(m(x), before)
    assert "weight_transform" not in str(list(m.state_dict()))


def test_param_counts_add_up_and_tied_counted_once():
    m = tiny()
    c = m.param_counts()
    assert set(c) == {"shared", "step_specific", "embedding", "total"}
    assert c["total"] == sum(p.numel() for p in m.parameters())
    assert c["embedding"] == 256 * 32
    assert c["shared"] + c["step_specific"] + c["embedding"] == c["total"]
    u = tiny(tie_embeddings=False).param_counts()
    assert u["embedding"] == 2 * 256 * 32 and u["total"] == c["total"] + 256 * 32


def test_control_and_no_decay_names():
    m = tiny(scheme="norm_gate", extra_norm=True, norm="peri")
    control = m.control_names()
    assert "final_norm.weight" in control
    assert "blocks.0.attn.q.input_norm.weight" in control
    assert "blocks.0.norm_attn_out.weight" in control
    assert {"spec.attn_in", "spec.mlp_in", "spec.gate_o", "spec.gate_down"} <= control
    assert not any(n.endswith("attn.q.weight") for n in control)
    assert control <= m.no_decay_names()
    assert "blocks.0.mlp.up.weight" not in m.no_decay_names()
    lora = tiny(scheme="lora")
    assert not any(n.startswith("spec.") for n in lora.control_names())


# -- checkpoints -----------------------------------------------------------------


@pytest.mark.parametrize("scheme", schemes.available())
def test_save_load_bit_identical(tmp_path, scheme):
    m = tiny(scheme=scheme, norm="peri", tie_embeddings=False)
    with torch.no_grad():  # move every parameter off its init so nothing matches by chance
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    save_checkpoint(m, tmp_path / "ck")
    m2 = load_checkpoint(tmp_path / "ck")
    assert m2.config == m.config
    x = tokens()
    assert torch.equal(m(x), m2(x))


def test_save_load_extra_norm_and_file_path(tmp_path):
    m = tiny(extra_norm=True)
    with torch.no_grad():
        for _, lin in m.projections():
            lin.input_norm.weight.uniform_(0.5, 1.5)
    save_checkpoint(m, tmp_path)
    m2 = load_checkpoint(tmp_path / "model.safetensors")
    x = tokens()
    assert torch.equal(m(x), m2(x))


def test_tied_checkpoint_stores_embed_only(tmp_path):
    from safetensors.torch import load_file

    save_checkpoint(tiny(), tmp_path)
    names = set(load_file(tmp_path / "model.safetensors"))
    assert "embed.weight" in names and "head.weight" not in names


def test_save_refuses_to_overwrite(tmp_path):
    m = tiny()
    save_checkpoint(m, tmp_path)
    with pytest.raises(OutputExistsError, match="model.safetensors"):
        save_checkpoint(m, tmp_path)
    save_checkpoint(m, tmp_path, force=True)


def _tamper(tmp_path, edit):
    from safetensors.torch import load_file, save_file

    save_checkpoint(tiny(), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    edit(tensors)
    save_file(tensors, tmp_path / "model.safetensors")


def test_load_missing_tensor(tmp_path):
    _tamper(tmp_path, lambda t: t.pop("blocks.0.mlp.up.weight"))
    with pytest.raises(CheckpointError, match="missing tensor 'blocks.0.mlp.up.weight'"):
        load_checkpoint(tmp_path)


def test_load_wrong_shape(tmp_path):
    def edit(t):
        t["blocks.0.attn.q.weight"] = torch.zeros(32, 16)

    _tamper(tmp_path, edit)
    with pytest.raises(CheckpointError, match=r"'blocks.0.attn.q.weight'.*\(32, 16\).*\(32, 32\)"):
        load_checkpoint(tmp_path)


def test_load_unexpected_tensor(tmp_path):
    def edit(t):
        t["spec.attn_in"] = torch.ones(3, 32)

    _tamper(tmp_path, edit)
    with pytest.raises(CheckpointError, match="unexpected tensor 'spec.attn_in'"):
        load_checkpoint(tmp_path)


def test_load_config_disagrees_with_tensors(tmp_path):
    save_checkpoint(tiny(), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["scheme"] = "norm"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="spec.attn_in"):
        load_checkpoint(tmp_path)


def test_load_missing_config(tmp_path):
    save_checkpoint(tiny(), tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(tmp_path)


def test_load_bad_config_and_corrupt_weights(tmp_path):
    save_checkpoint(tiny(), tmp_path)
    (tmp_path / "config.json").write_text('{"scheme": "nope"}')
    with pytest.raises(CheckpointError, match="unknown scheme 'nope'"):
        load_checkpoint(tmp_path)
    save_checkpoint(tiny(), tmp_path, force=True)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint weights"):
        load_checkpoint(tmp_path / "absent")
