"""GPTQ (Frantar et al., 2022): quantize column by column, pushing each error onto later columns.

The algorithm is the paper's (arXiv:2210.17323). The codes lie on the
quantizer's own grid (its `fit_groups`/`encode_grid`/`decode_grid`), so the
normal `dequantize` of the returned QTensor gives exactly the GPTQ weights.
Calibration activations must come from the *training* split (the Parameter
Golf challenge, https://github.com/openai/parameter-golf: calibration may
never see validation data).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import QuantError
from .grid import GridQuantizer
from .qtensor import QTensor
from .registry import Quantizer, check_finite


def _grid_quantizer(quantizer: Quantizer) -> GridQuantizer:
    if not isinstance(quantizer, GridQuantizer) or quantizer.name == "int8_pg":
        raise QuantError(f"GPTQ needs a scale-and-round format (int2..int8, ternary), got {quantizer.name!r}")
    return quantizer


def gptq_quantize(
    W: Tensor,
    H: Tensor,
    quantizer: Quantizer,
    block: int = 128,
    damp: float = 0.01,
    name: str = "tensor",
    rdo: float = 0.0,
) -> QTensor:
    """GPTQ-quantize W [out, in] given H = Σ xxᵀ [in, in]; a QTensor of `quantizer`'s format."""
    return gptq_with_weights(W, H, quantizer, block, damp, name, rdo)[0]


@torch.no_grad()
def gptq_with_weights(
    W: Tensor,
    H: Tensor,
    quantizer: Quantizer,
    block: int = 128,
    damp: float = 0.01,
    name: str = "tensor",
    rdo: float = 0.0,
) -> tuple[QTensor, Tensor]:
    """(QTensor, the GPTQ weights Ŵ as the algorithm computed them).

    Group-wise formats whose groups tile the rows (in % group == 0) fit each
    group's scale when GPTQ reaches it, on the error-updated weights; other
    layouts (per row, per tensor, groups straddling rows) fit scales on W first and take
    the columns in act-order (descending Hessian diagonal).
    ``rdo`` > 0 rounds each column rate-aware (quant/rdo.py) with the code lengths of the
    tensor's nearest-rounded codes; GPTQ then pushes that error onto later columns as any other.
    """
    q = _grid_quantizer(quantizer)
    if not W.is_floating_point():
        raise QuantError(f"tensor {name} has dtype {W.dtype}; GPTQ takes float weights")
    check_finite(W, name)
    orig_dtype = W.dtype
    if W.dim() != 2 or H.shape != (W.shape[1], W.shape[1]):
        raise QuantError(f"{name}: GPTQ needs W [out, in] and H [in, in], got {tuple(W.shape)} and {tuple(H.shape)}")
    W = W.detach().to(torch.float32).clone()
    H = H.detach().to(torch.float32).clone()
    rows, cols = W.shape
    G, L = q.layout((rows, cols))
    group = q.group_size()
    dynamic = group is not None and cols % group == 0 and rows > 0
    S_full = torch.zeros(G * L)  # per-element scale (and zero) map, flattened like the codes
    Z_full = None
    if not dynamic:
        s, z = q.fit_tensor(W)
        S_full = s.repeat_interleave(L)
        Z_full = None if z is None else z.repeat_interleave(L)
    S = S_full[: rows * cols].reshape(rows, cols)
    Z = None if Z_full is None else Z_full[: rows * cols].reshape(rows, cols)
    scales = torch.zeros(G)
    zeros: Tensor | None = None
    lengths = None
    if rdo:
        from .rdo import code_lengths

        if dynamic or not hasattr(q, "code_range"):
            raise QuantError(f"{name}: rate-aware rounding in GPTQ needs scales fixed before it (per row or tensor)")
        lo, hi = q.code_range()
        lengths = code_lengths(q.encode_grid(W, S, Z), lo, hi)

    # Dead inputs (never active in calibration) carry no error signal: decouple them, and
    # their weights, which no calibration output depends on, become 0 (cheapest to code; as
    # the Parameter Golf records do). Scales fixed before GPTQ were fitted on W as it was.
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.mean(torch.diag(H)) * torch.eye(cols)
    # Act-order: the columns of largest input energy first, while the most columns are left to
    # take their error (as the Parameter Golf records do; on their model's attention output
    # projection it cut the Hessian-weighted error ~3x). Scales fixed before GPTQ only: a
    # group fitted as GPTQ reaches it needs its columns together.
    perm = None
    if not dynamic:
        perm = torch.argsort(torch.diag(H), descending=True, stable=True)
        W, S, H = W[:, perm], S[:, perm], H[perm][:, perm]
        Z = None if Z is None else Z[:, perm]
    try:
        # (cholesky_inverse, as the records' GPTQ: the same H gives the same codes bit for bit)
        Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    except RuntimeError as e:  # torch's LinAlgError subclasses RuntimeError
        raise QuantError(f"{name}: Hessian not positive definite even after damping ({e})") from None

    codes = torch.zeros(rows, cols)
    W_hat = torch.zeros(rows, cols)
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if dynamic and col % group == 0:
                # The group's columns as GPTQ has updated them so far.
                upd = torch.cat([W1[:, i:], W[:, i2:]], dim=1)[:, :group]
                s_g, z_g = q.fit_groups(upd)
                S[:, col : col + group] = s_g[:, None]
                gidx = torch.arange(rows) * (cols // group) + col // group
                scales[gidx] = s_g
                if z_g is not None:
                    if Z is None:
                        Z, zeros = torch.zeros(rows, cols), torch.zeros(G)
                    Z[:, col : col + group] = z_g[:, None]
                    zeros[gidx] = z_g
            w = W1[:, i]
            s_c = S[:, col]
            z_c = None if Z is None else Z[:, col]
            if lengths is None:
                c = q.encode_grid(w, s_c, z_c)
            else:
                from .rdo import rate_aware

                y = w / torch.where(s_c > 0, s_c, 1.0) + (0 if z_c is None else z_c)
                c = rate_aware(y, lo, hi, rdo, lengths=lengths)
            wq = q.decode_grid(c, s_c, z_c)
            codes[:, col] = c
            W_hat[:, col] = wq
            err = (w - wq) / Hinv1[i, i]
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]

    if not dynamic:
        scales, zeros = s, z
        inv = torch.argsort(perm)
        codes, W_hat = codes[:, inv], W_hat[:, inv]
    flat = torch.zeros(G * L)
    flat[: rows * cols] = codes.reshape(-1)
    return q.pack(flat.reshape(G, L), scales, zeros, (rows, cols), orig_dtype), W_hat


def _projection_input_hook(store: dict[str, Tensor], key: str):
    def hook(_module: nn.Module, args: tuple, output: Tensor | None = None) -> None:
        x = output if output is not None else args[0]
        x_NxD = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        if key in store:
            store[key] += x_NxD.T @ x_NxD
        else:
            store[key] = x_NxD.T @ x_NxD

    return hook


@torch.no_grad()
def collect_hessians(
    model: nn.Module,
    token_batches: Iterable[Tensor],
    layers: list[tuple[str, nn.Module]] | None = None,
    forward=None,
) -> dict[str, Tensor]:
    """{projection name: H = Σ xxᵀ} over the actual inputs of each projection's weight.

    A shared block runs `depth` times per forward; its hooks fire every step,
    so H sums over all steps. With an extra RMSNorm the weight sees the
    normalized input, so the hook sits on `input_norm`'s output. ``layers``
    (name, Linear) defaults to ``model.projections()`` (a RecurrentLM); any
    model's ``nn.Linear`` modules work too. ``forward(model, batch)`` runs one batch
    (default ``model(batch)``; a model that takes targets too is called with them).
    """
    store: dict[str, Tensor] = {}
    handles = []
    for name, lin in model.projections() if layers is None else layers:
        norm = getattr(lin, "input_norm", None)
        if norm is not None:
            handles.append(norm.register_forward_hook(_projection_input_hook(store, name)))
        else:
            hook = _projection_input_hook(store, name)
            handles.append(lin.register_forward_pre_hook(lambda m, a, h=hook: h(m, a)))
    was_training = model.training
    model.eval()
    try:
        for batch in token_batches:
            batch = torch.as_tensor(batch, dtype=torch.long)
            model(batch) if forward is None else forward(model, batch)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {k: v.to(torch.float32) for k, v in store.items()}


def calibration_batches(
    train_tokens: np.ndarray | Tensor, seq_len: int, n_tokens: int = 32768, batch_size: int = 16
) -> list[Tensor]:
    """Contiguous windows [B, seq_len] from the start of the training stream."""
    toks = torch.as_tensor(np.asarray(train_tokens), dtype=torch.long).reshape(-1)
    n_seq = min(n_tokens // seq_len, toks.numel() // seq_len)
    if n_seq == 0:
        raise QuantError(f"calibration needs at least seq_len={seq_len} training tokens, got {toks.numel()}")
    windows = toks[: n_seq * seq_len].reshape(n_seq, seq_len)
    return [windows[i : i + batch_size] for i in range(0, n_seq, batch_size)]


def output_error(W: Tensor, W_hat: Tensor, H: Tensor) -> float:
    """‖WX − ŴX‖_F² / ‖WX‖_F² computed from H = XᵀX (no need to keep X)."""
    D = (W - W_hat).double()
    Hd = H.double()
    num = torch.einsum("ij,jk,ik->", D, Hd, D)
    den = torch.einsum("ij,jk,ik->", W.double(), Hd, W.double())
    return float(num / den) if den > 0 else math.nan
