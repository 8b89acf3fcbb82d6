"""Stacks of matrices (the 2026-04-27 Parameter Golf record's banks): exported slice by slice.

The state dict has the record's names (``qo_bank``, ``kv_bank``, ``mlp_up_bank``,
``mlp_down_bank``, its 16 control-name families, ``tok_emb``) at small dims; the unbanked
state is made here the way the record's ``_unbank_state_dict`` makes it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from banked_model import KV, BankedLM, D, H, L, V  # noqa: F401

from recurnorm.budget.api import pack_qtensors, read_artifact
from recurnorm.budget.rnpk_load import decode
from recurnorm.errors import ConfigError
from recurnorm.export.banks import restack, unbank
from recurnorm.export.pack import quantize
from recurnorm.export.policy import ExportPolicy
from recurnorm.export.recipes import RECORD, RecordPolicy
from recurnorm.quant import dequantize

HEADS = 4
CONTROLS = (
    "attn_scale",
    "attn_scales",
    "mlp_scale",
    "mlp_scales",
    "resid_mix",
    "resid_mixes",
    "q_gain",
    "skip_weight",
    "skip_weights",
    "skip_gates",
    "parallel_post_lambdas",
    "parallel_resid_lambdas",
    "attn_gate_proj",
    "attn_gate_w",
    "smear_gate",
    "smear_lambda",
)


def _w(g: torch.Generator, *shape: int, scale: float = 0.05) -> torch.Tensor:
    x = torch.randn(*shape, generator=g) * scale
    return x * torch.exp(torch.randn(*shape[:-1], 1, generator=g) * 0.5)  # rows of different scales


def record_state(seed: int = 0, L: int = L, D: int = D, KV: int = KV, H: int = H) -> dict[str, torch.Tensor]:
    """The record's banked state dict at small dims (names as its GPT has them)."""
    g = torch.Generator().manual_seed(seed)
    state = {
        "tok_emb.weight": _w(g, V, D),
        "qo_bank": _w(g, 2 * L, D, D),
        "kv_bank": _w(g, 2 * L, KV, D),
        "mlp_up_bank": _w(g, L, H, D),
        "mlp_down_bank": _w(g, L, D, H, scale=0.2),  # large errors: the LQER top 3 lands on them
        "skip_weights": torch.ones(L // 2 + 1, D),
        "skip_gates": torch.zeros(L // 2 + 1, D),
        "parallel_post_lambdas": torch.ones(L, 2, 2),
        "parallel_resid_lambdas": torch.full((L, 2), 1.1),
        "smear_gate.weight": _w(g, 1, 12),
        "smear_lambda": torch.zeros(1),
    }
    for i in range(L):
        p = f"blocks.{i}."
        state[p + "attn.q_gain"] = torch.full((HEADS,), 5.0)
        state[p + "attn.attn_gate_w"] = _w(g, HEADS, 12)
        state[p + "attn_scale"] = torch.ones(D)
        state[p + "mlp_scale"] = torch.ones(D)
        state[p + "resid_mix"] = torch.stack([torch.ones(D), torch.zeros(D)])
    return state


def record_unbank(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The record's _unbank_state_dict (its order and names)."""
    out = {}
    for k, t in state.items():
        if k == "qo_bank":
            for i in range(L):
                out[f"blocks.{i}.attn.c_q.weight"] = t[i]
                out[f"blocks.{i}.attn.proj.weight"] = t[L + i]
        elif k == "kv_bank":
            for i in range(L):
                out[f"blocks.{i}.attn.c_k.weight"] = t[i]
                out[f"blocks.{i}.attn.c_v.weight"] = t[L + i]
        elif k == "mlp_up_bank":
            for i in range(L):
                out[f"blocks.{i}.mlp.fc.weight"] = t[i]
        elif k == "mlp_down_bank":
            for i in range(L):
                out[f"blocks.{i}.mlp.proj.weight"] = t[i]
        else:
            out[k] = t
    return out


def small_record() -> RecordPolicy:
    return RecordPolicy(recipe={**RECORD, "small_max_numel": 1000})  # the record's 65,536 scaled down


BANKS = {"qo_bank": 2 * L, "kv_bank": 2 * L, "mlp_up_bank": L, "mlp_down_bank": L}


def test_record_banks_get_the_unbanked_decisions_slice_by_slice():
    state = record_state()
    flat = record_unbank(state)
    policy = small_record()
    qb, plan_b = quantize(state, policy)
    qf, plan_f = quantize(flat, policy)
    assert set(plan_b) == set(plan_f)
    for name, (fmt, opts, why) in plan_f.items():
        assert plan_b[name][:2] == (fmt, opts), name  # format, clip and LQER options
        assert plan_b[name][2] == why
        assert torch.equal(dequantize(qb[name]), dequantize(qf[name])), name
    roles = {n: o.get("clip") for n, (_, o, _) in plan_b.items()}
    assert roles["blocks.0.attn.c_q.weight"] == roles["blocks.2.attn.proj.weight"] == "std:13"
    assert roles["blocks.1.attn.c_v.weight"] == "std:13"
    assert roles["blocks.0.mlp.fc.weight"] == roles["blocks.1.mlp.proj.weight"] == "std:11.5"
    lqer = sorted(n for n, (_, o, _) in plan_b.items() if "lqer" in o)
    assert len(lqer) == 3 and all(".mlp.proj." in n for n in lqer)  # on slices of mlp_down_bank
    # never on a gate, never on tok_emb unless it is among the worst (as in the record)
    assert not any("gate" in n for n in lqer)
    assert plan_b["blocks.0.attn.attn_gate_w"][0] == "int8"  # the record's int8 gate

    # put back together: one tensor per bank, every slice's values (its LQER included) kept
    art = pack_qtensors(restack(unbank(state), qb), {})
    loaded = read_artifact(art).qtensors
    arrays, _ = decode(art)
    for bank, n in BANKS.items():
        assert loaded[bank].shape == tuple(state[bank].shape)
        torch_values = dequantize(loaded[bank])
        for i, piece in enumerate(unbank(state).banks[bank].slices):
            want = dequantize(qf[piece])
            assert torch.equal(torch_values[i], want), piece
            assert np.array_equal(arrays[bank][i], want.numpy()), piece
        assert i == n - 1
    assert loaded["mlp_down_bank"].lowrank is not None and loaded["qo_bank"].lowrank is None


def test_a_bank_is_packed_as_its_stacked_rows():
    """A bank quantized row by row is coded as one matrix of all its slices' rows (its entry's
    view, header flag 8): its rows find parents among the other rows, as the same rows would in
    one 2-D tensor; without the view it would be 4 rows of 16,384 values. All three readers
    give back the codes."""
    from helpers import standalone_loader

    from recurnorm.budget import spec
    from recurnorm.budget.format import split_container
    from recurnorm.quant import get

    g = torch.Generator().manual_seed(3)
    base = torch.randn(16, 64, generator=g)  # rows that recur, scaled and noisy, across slices
    rows = base[torch.randint(0, 16, (4 * 256,), generator=g)] * torch.rand(4 * 256, 1, generator=g).add(0.5)
    rows = get("int8").quantize(rows + 0.05 * torch.randn(4 * 256, 64, generator=g), name="mlp_up_bank")
    qt = dataclasses.replace(rows, shape=(4, 256, 64))  # as restack makes a bank of its slices
    art = pack_qtensors({"mlp_up_bank": qt})
    entry = split_container(art)[0]["tensors"][0]
    assert entry["view"] == [1024, 64] and "parents" in entry["streams"]
    assert art[6] & spec.FIELD_FLAGS["view"]
    flat = pack_qtensors({"mlp_up_bank": rows})
    assert abs(len(art) - len(flat)) < 64  # coded as the same rows in 2-D are (the manifest differs)
    want = dequantize(qt).numpy()
    assert np.array_equal(dequantize(read_artifact(art).qtensors["mlp_up_bank"]).numpy(), want)
    for compact in (False, True):
        assert np.array_equal(standalone_loader(compact)["decode"](art)[0]["mlp_up_bank"], want)


@pytest.mark.parametrize("policy", [ExportPolicy(), small_record()], ids=["default", "pg-record"])
def test_the_record_control_names_stay_float(policy):
    state = record_state()
    for i, name in enumerate(CONTROLS):  # every spelling of the record's patterns, as a [L, 8, 8] stack
        state[f"blocks.0.{name}" if i % 2 else name] = torch.ones(L, 8, 8) * 0.5
    plan = policy.plan(unbank(state))
    for name, (fmt, _, _) in plan.items():
        if any(c in name for c in CONTROLS) and not (isinstance(policy, RecordPolicy) and name.endswith("attn_gate_w")):
            assert fmt in ("fp32", "fp16"), (name, fmt)


def test_a_conv_kernel_is_not_a_stack():
    state = {"conv.weight": torch.randn(32, 16, 3, 3), "bank": torch.randn(2, 32, 32)}
    flat = unbank(state)
    assert "conv.weight" in flat and "bank.0" in flat and "bank.1" in flat and "bank" not in flat


def test_mixed_widths_in_one_bank_decode_exactly():
    state = {"w_bank": torch.randn(3, 64, 128)}
    policy = ExportPolicy(quantizer="int6")
    from recurnorm.export.spec import build_policy

    policy = build_policy("w_bank.0=int4,w_bank.1=int8:clip=std:3,int6")
    qts, plan = quantize(state, policy)
    assert [plan[f"w_bank.{i}"][0] for i in range(3)] == ["int4", "int8", "int6"]
    art = pack_qtensors(restack(unbank(state), qts), {})
    got = dequantize(read_artifact(art).qtensors["w_bank"])
    for i in range(3):
        assert torch.equal(got[i], dequantize(qts[f"w_bank.{i}"]))


# ----------------------------------------------------------------- GPTQ through F.linear


def test_gptq_sees_every_bank_slice_and_the_tied_head():
    from recurnorm.export.gptq import GPTQExporter

    torch.manual_seed(0)
    model = BankedLM().eval()
    tokens = np.random.default_rng(0).integers(0, V, 4096)
    exporter = GPTQExporter(model, tokens, 1024)
    state = unbank({k: v.detach() for k, v in model.state_dict().items()})
    policy = RecordPolicy(recipe={**RECORD, "small_max_numel": 1000})
    done, missed = exporter.coverage(policy.plan(state), state)
    slices = [n for n in state if ".attn." in n or ".mlp." in n]
    assert len(slices) == 4 * L + 2 * L and set(slices) <= set(done)
    assert "tok_emb.weight" in done and not missed
    qts, plan = exporter.quantize(model.state_dict(), policy)
    assert all(plan[n][2].endswith(" + GPTQ") for n in done)  # LQER'd ones included
    # GPTQ lowers the Hessian-weighted error of the tied embedding against rounding
    from recurnorm.quant.gptq import output_error

    H = exporter.hessians["tok_emb.weight"]
    W = state["tok_emb.weight"]
    rounded = quantize(state, policy)[0]["tok_emb.weight"]
    assert output_error(W, dequantize(qts["tok_emb.weight"]), H) < output_error(W, dequantize(rounded), H)


def test_gptq_that_sees_no_matrix_is_an_error():
    from recurnorm.export.ship import Source, ship_source

    model = BankedLM(matmul=False).eval()
    tokens = np.random.default_rng(0).integers(0, V, 4096)
    with pytest.raises(ConfigError, match="--gptq covers no matrix"):
        ship_source(Source.from_model(model), small_record(), gptq=True, train_tokens=tokens, calib_tokens=1024)


@pytest.fixture(scope="module")
def banked_ckpt(tmp_path_factory):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("banked") / "banked.safetensors"
    save_file({k: v.detach().contiguous() for k, v in BankedLM().state_dict().items()}, str(path))
    return path


def test_cli_gptq_on_banks_and_hessians_from_a_file(banked_ckpt, tmp_path):
    from click.testing import CliRunner
    from safetensors.torch import save_file

    from recurnorm.cli.main import main

    tests = Path(__file__).parent
    calib = [
        "--calib-data",
        "default",
        "--calib-tokens",
        "512",
        "--model-factory",
        f"{tests / 'banked_model.py'}:build",
    ]
    out = tmp_path / "g.rnpk"
    r = CliRunner().invoke(main, ["pack", str(banked_ckpt), "-q", "int6", "--gptq", *calib, "-o", str(out)])
    assert r.exit_code == 0, r.output
    art = read_artifact(out.read_bytes())
    n = 4 * L + 2 * L + 1  # every slice, and the tied embedding as the head
    assert f"GPTQ x{n}" in art.metadata["export"]["policy"], r.output
    assert art.qtensors["qo_bank"].shape == (2 * L, D, D)
    assert "gptq: matrix" in r.output and "gptq: calibration batch" in r.output

    # the same Hessians from a file: the same codes, no model run
    from safetensors.torch import load_file

    from recurnorm.export.gptq import GPTQExporter
    from recurnorm.train.data import load_corpus

    model = BankedLM()
    model.load_state_dict(load_file(str(banked_ckpt)))

    hs = GPTQExporter(model.eval(), load_corpus("default").train_tokens, 512).hessians
    save_file(hs, str(tmp_path / "h.safetensors"))
    out2 = tmp_path / "h.rnpk"
    args = ["pack", str(banked_ckpt), "-q", "int6", "--gptq", "--hessians", str(tmp_path / "h.safetensors")]
    r = CliRunner().invoke(main, [*args, "-o", str(out2)])
    assert r.exit_code == 0, r.output
    other = read_artifact(out2.read_bytes()).qtensors
    assert all(art.qtensors[k].equal(other[k]) for k in art.qtensors)

    blind = [*calib[:-1], f"{tests / 'banked_model.py'}:build_blind"]
    r = CliRunner().invoke(main, ["pack", str(banked_ckpt), "-q", "int6", "--gptq", *blind, "-o", str(tmp_path / "b")])
    assert r.exit_code == 2 and "--gptq covers no matrix" in r.output, r.output


# ----------------------------------------------------------------- --fit from the record


def test_fit_at_the_record_exports_own_size_succeeds_with_defaults():
    from recurnorm.export.fit import fit_budget, parse_formats
    from recurnorm.export.pack import pack_state

    # the record's proportions: the embedding ~12% of the weights, controls well under 1%
    state = record_state(L=4, D=128, KV=64, H=512)
    record_bytes = len(pack_state(state, small_record()))
    assert "int6:clip=record" in [f"{f}:clip={o['clip']}" for f, o in parse_formats(None) if "clip" in o]
    for policy in (ExportPolicy(), small_record()):  # the default policy, and -q @pg-record --fit
        result = fit_budget(state, policy, record_bytes)
        assert result.measured_bytes <= record_bytes
        assert any(n.startswith("blocks.0.attn.c_q") for n in result.allocation)  # slices are candidates
        got = read_artifact(result.data).qtensors
        assert got["qo_bank"].shape == (8, 128, 128)


def test_gptq_names_the_matrices_it_leaves_to_rounding():
    from pg_model import build

    from recurnorm.export.gptq import GPTQExporter
    from recurnorm.export.ship import gptq_coverage

    torch.manual_seed(0)
    model = build(None).eval()  # an untied head: tok_emb is only looked up, never multiplied
    exporter = GPTQExporter(model, np.random.default_rng(0).integers(0, 256, 2048), 512)
    notes = gptq_coverage(exporter, ExportPolicy(quantizer="int6"), model.state_dict())
    assert len(notes) == 1 and "GPTQ'd 25 of 26" in notes[0] and "tok_emb.weight" in notes[0], notes
    assert "no calibration inputs" in notes[0]


def test_calibrated_fit_measures_bank_slices():
    from recurnorm.export.fit import calibration_loss_fn, fisher_diagonal, fit_budget
    from recurnorm.export.pack import pack_state

    torch.manual_seed(0)
    model = BankedLM().eval()
    windows = [torch.as_tensor(np.random.default_rng(0).integers(0, V, (4, 17)))]
    fisher = fisher_diagonal(model, windows)
    assert fisher["blocks.0.attn.c_q.weight"].shape == (D, D) and "qo_bank" not in fisher
    loss = calibration_loss_fn(model, windows)
    before = model.qo_bank.detach().clone()
    assert loss({"blocks.1.attn.c_q.weight": torch.zeros(D, D)}) != loss({})
    assert torch.equal(model.qo_bank.detach(), before)  # swapped back
    state = {k: v.detach() for k, v in model.state_dict().items()}
    size = len(pack_state(state, ExportPolicy(quantizer="int6")))
    for kw in ({"fisher": fisher}, {"loss_fn": loss}):
        result = fit_budget(state, ExportPolicy(), size, formats=(("int8", {}), ("int5", {})), **kw)
        assert result.measured_bytes <= size and "blocks.0.attn.c_q.weight" in result.allocation
