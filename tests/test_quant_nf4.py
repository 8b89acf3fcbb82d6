"""NF4 through bitsandbytes: nibble order, exact agreement with bnb, the blocksize > row bug."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import recurnorm.quant as q

bnbf = pytest.importorskip("bitsandbytes.functional")

from recurnorm.quant.nf4 import NF4_TABLE, dequantize_with_bnb  # noqa: E402


def gaussian(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def rel(d: torch.Tensor, w: torch.Tensor) -> float:
    return float((d - w).norm() / w.norm())


def test_table_is_bnbs():
    assert torch.equal(torch.from_numpy(NF4_TABLE), bnbf.get_4bit_type("nf4", device="cpu").float())


def test_nibble_order_first_element_is_high_nibble():
    # 0 -> index 7, absmax -> 15, -absmax -> 0: one block of 64
    w = torch.zeros(64)
    w[0], w[1], w[2] = 0.0, 1.0, -1.0
    qt = q.get("nf4").quantize(w)
    assert qt.codes[0, :3].tolist() == [7, 15, 0]
    packed, _ = bnbf.quantize_4bit(w.reshape(1, 64), blocksize=64, quant_type="nf4")
    assert int(packed.reshape(-1)[0]) == (7 << 4) | 15


@pytest.mark.parametrize("shape", [(256, 256), (64, 96), (3, 70), (1000,)])
def test_our_decode_equals_bnb_decode(shape):
    w = gaussian(*shape)
    qt = q.get("nf4").quantize(w)
    ours = q.dequantize(qt)
    assert torch.equal(ours, dequantize_with_bnb(qt))
    # and equals bnb's own quantize -> dequantize of the same blocks
    G, B = qt.codes.shape
    flat = torch.cat([w.reshape(-1), torch.zeros(G * B - w.numel())]).reshape(G, B)
    packed, state = bnbf.quantize_4bit(flat, blocksize=B, quant_type="nf4")
    ref = bnbf.dequantize_4bit(packed, state).reshape(-1)[: w.numel()].reshape(shape)
    assert torch.equal(ours, ref)


def test_error_figure_and_blocks():
    w = gaussian(256, 256)
    qt = q.get("nf4", group=64).quantize(w)
    assert qt.codes.shape == (1024, 64) and qt.codes.dtype == np.uint8
    assert 0.08 < rel(q.dequantize(qt), w) <= 0.10


@pytest.mark.parametrize(
    "shape,group",
    [
        ((256, 16), 64),
        ((64, 8), 256),
        pytest.param((512, 4), 4096, marks=pytest.mark.slow),  # bnb's CPU path takes ~20 s on 4096-blocks
        ((100, 30), 128),
    ],
)
def test_blocksize_larger_than_rows_never_reaches_the_user(shape, group):
    """bnb 0.50.2's CPU dequantize_4bit misbehaves when blocksize > row length (rel. error
    0.25-0.33): we hand bnb [G, blocksize] views, so the user sees the normal ~0.10 error."""
    w = gaussian(*shape, seed=2)
    qt = q.get("nf4", group=group).quantize(w)
    assert qt.codes.shape[1] <= group
    err = rel(q.dequantize(qt), w)
    assert err < 0.12, err
    assert torch.equal(q.dequantize(qt), dequantize_with_bnb(qt))


def test_small_tensor_blocksize_shrinks():
    qt = q.get("nf4", group=256).quantize(gaussian(40))
    assert qt.codes.shape == (1, 64)
    assert q.get("nf4").quantize(gaussian(10)).codes.shape == (1, 32)


def test_missing_bitsandbytes_is_a_quant_error(monkeypatch):
    import builtins

    from recurnorm.errors import QuantError

    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name.startswith("bitsandbytes"):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(QuantError, match="pip install bitsandbytes"):
        q.get("nf4").quantize(gaussian(64))
