"""The public library: one pack, one load, typed options beside the -q spelling."""

from __future__ import annotations

import pytest
import torch

import recurnorm
from recurnorm import ExportOptions, Format
from recurnorm.errors import ConfigError
from recurnorm.model import ModelConfig, RecurrentLM


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return RecurrentLM(ModelConfig(d_model=32, n_heads=2, depth=2, seq_len=32, scheme="norm")).eval()


def test_the_public_names_are_one_pack_one_load_and_the_configs():
    assert set(recurnorm.__all__) == {
        "__version__",
        "pack",
        "load",
        "ExportOptions",
        "Format",
        "TrainConfig",
        "ModelConfig",
        "RecurrentLM",
    }
    for name in recurnorm.__all__:
        assert getattr(recurnorm, name) is not None
    with pytest.raises(AttributeError):
        recurnorm.unpack  # noqa: B018 - the internal reader is budget.api.unpack


# (the -q string, the same typed)
SPELLINGS = [
    ("int6:clip=std:12", ExportOptions(Format("int6", {"clip": "std:12"}))),
    ("int4:group=32", Format("int4", {"group": 32})),
    ("embed.weight=int8,int6", ExportOptions("int6", rules=(("embed.weight", Format("int8")),))),
    (
        "blocks.*.mlp.*=int5:group=64,int6:clip_search=true",
        ExportOptions(
            Format("int6", {"clip_search": True}),
            rules=(("blocks.*.mlp.*", Format("int5", {"group": 64})),),
        ),
    ),
]


@pytest.mark.parametrize("text,typed", SPELLINGS, ids=[s for s, _ in SPELLINGS])
def test_typed_and_string_options_give_the_same_bytes(model, text, typed):
    options = typed if isinstance(typed, ExportOptions) else ExportOptions(typed)
    assert options.quant == text
    assert ExportOptions.parse(text).quant == text
    assert recurnorm.pack(model, typed) == recurnorm.pack(model, quant=text)


def test_typed_options_carry_what_the_string_cannot(model):
    keep = ExportOptions("int4", keep_float=("blocks.0.attn.q.weight",))
    art = recurnorm.load(recurnorm.pack(model, keep))
    want = model.state_dict()["blocks.0.attn.q.weight"]
    assert torch.equal(art["blocks.0.attn.q.weight"], want)  # kept float: exact
    assert not torch.equal(art["blocks.0.attn.k.weight"], model.state_dict()["blocks.0.attn.k.weight"])
    with pytest.raises(ConfigError, match="int99"):
        recurnorm.pack(model, ExportOptions(Format("int99")))
    with pytest.raises(ConfigError, match="int99"):
        ExportOptions.parse("embed.weight=int99,int6")


def test_load_gives_back_the_tensors_and_the_model(model, tmp_path):
    from recurnorm.budget.api import unpack

    blob = recurnorm.pack(model, quant="int8")
    path = tmp_path / "m.rnpk"
    path.write_bytes(blob)
    weights = recurnorm.load(blob)
    assert weights.keys() == model.state_dict().keys()
    from_path = recurnorm.load(path)
    internal = unpack(blob)
    for name, value in weights.items():
        assert torch.equal(value, from_path[name]) and torch.equal(value, internal[name])
        assert value.dtype == model.state_dict()[name].dtype
    rebuilt = recurnorm.load(path, as_model=True)
    assert isinstance(rebuilt, RecurrentLM) and not rebuilt.training
    assert rebuilt.config.to_dict() == model.config.to_dict()
    for name, value in rebuilt.state_dict().items():
        assert torch.equal(value, weights[name])
    # int8 is close to the float weights: the load is the dequantized artifact, not noise
    q = model.state_dict()["blocks.0.attn.q.weight"]
    assert (weights["blocks.0.attn.q.weight"] - q).abs().max() < 0.05 * q.abs().max()
