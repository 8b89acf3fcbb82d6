"""One rule for every registry: schemes, quantizers and codecs behave alike."""

from __future__ import annotations

import pytest

from recurnorm import quant
from recurnorm.budget import codecs
from recurnorm.errors import ArtifactError, ConfigError, QuantError
from recurnorm.model import ModelConfig, schemes
from recurnorm.registry import Registry, resolve_options

KINDS = [  # (get an instance, the base class, an existing name, its error type)
    (lambda n: schemes.get(n, ModelConfig(scheme=n)), schemes.Scheme, "norm", ConfigError),
    (quant.get, quant.Quantizer, "int8", QuantError),
    (codecs.get, codecs.Codec, "rans", ArtifactError),
]


@pytest.mark.parametrize("get, base, name, error", KINDS)
def test_get_returns_an_instance_and_names_the_choices(get, base, name, error):
    assert isinstance(get(name), base)
    with pytest.raises(error, match=f"unknown .* 'nope'; available: .*{name}"):
        get("nope")


@pytest.mark.parametrize("get, base, name, error", KINDS)
def test_a_name_registered_twice_is_refused(get, base, name, error):
    before = type(get(name))
    with pytest.raises(error, match=f"'{name}' registered twice"):
        type("Again", (base,), {}, name=name)
    assert type(get(name)) is before  # the first class still answers


def test_options_one_way():
    defaults = {"group": 64, "ratio": 0.5, "flag": False, "sites": ["o"], "free": None}
    assert resolve_options("x", defaults, {"ratio": 1}, ValueError)["ratio"] == 1  # int for a float
    assert resolve_options("x", defaults, {"group": None}, ValueError, frozenset({"group"}))["group"] is None
    assert resolve_options("x", defaults, {"free": "anything"}, ValueError)["free"] == "anything"
    for bad, match in [
        ({"nope": 1}, "unknown option 'nope' for x; known options: flag, free"),
        ({"group": None}, "option 'group' of x must be a int"),
        ({"group": True}, "must be a int"),
        ({"flag": 1}, "must be a bool"),
        ({"sites": "o"}, "must be a list"),
    ]:
        with pytest.raises(ValueError, match=match):
            resolve_options("x", defaults, bad, ValueError)
    # the same rule reaches schemes and quantizers
    with pytest.raises(ConfigError, match="unknown option 'rnak' for scheme 'lora'"):
        schemes.scheme_class("lora").resolve_options({"rnak": 2})
    with pytest.raises(QuantError, match="unknown option 'grup' for format 'int4'"):
        quant.get("int4", grup=32)
    with pytest.raises(QuantError, match="option 'lsq_rescale' of format 'ternary' must be a bool"):
        quant.get("ternary", lsq_rescale=1)
    assert quant.get("int4", group=None).params["group"] is None  # per row: None is allowed there


def test_registry_table_is_private():
    r: Registry[object] = Registry("thing", KeyError)
    r.register("a", object)
    assert r.names() == ["a"] and "a" in r and r.type_of("a") is object
    assert not hasattr(codecs.Codec, "registry")
