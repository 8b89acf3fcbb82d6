"""Stacks of matrices ("banks"): exported slice by slice, stored as one tensor.

Some models keep their weight matrices in one tensor of three or more dimensions: the
best Parameter Golf record's ``qo_bank [2L, d, d]`` (L query matrices, then L output
projections), ``kv_bank [2L, kv, d]`` (keys, then values), ``mlp_up_bank [L, h, d]`` and
``mlp_down_bank [L, d, h]``. Its export unbanks them into ``blocks.{i}.attn.c_q.weight`` and
so on; quantized as one tensor, a bank would get one role for all of it and, on a per-row
grid, one scale for each whole slice.

`unbank` gives the export stage a state dict in which every such stack is split into its
slices (views), named as the record names them when the bank is one of the record's, else
``NAME.i``; the policy, LQER, GPTQ and --fit then see ordinary matrices with the roles
their names give. `restack` puts the quantized slices back into one QTensor of the bank's
shape, so that the artifact loads into the banked model as it is:
- scale-and-round slices (int2..int8, any clip, mixed bit widths) become one intN grid of
  the widest bits whose groups tile the slices' rows (a per-row scale repeated over its
  groups where the slices' groups differ): every value decodes exactly as its slice's;
- LQER corrections become one correction of the bank viewed as ``[slices x rows, cols]``:
  the right factors stacked, each left factor placed on its own slice's rows (zeros
  elsewhere, which cost next to nothing once entropy-coded);
- float slices of one format are concatenated.

A stack is a float tensor of >= 3 dims whose last two are each at least MIN_SIDE (a conv
kernel's 3x3 is not a matrix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import QuantError
from ..quant.passthrough import FLOAT_FORMATS
from ..quant.qtensor import QTensor

if TYPE_CHECKING:
    from torch import Tensor

MIN_SIDE = 16
# The record's own unbanking (_unbank_state_dict): slice i of a bank of S slices with m
# templates is templates[i // (S / m)] at layer i % (S / m).
RECORD_BANKS = {
    "qo_bank": ("blocks.{i}.attn.c_q.weight", "blocks.{i}.attn.proj.weight"),
    "kv_bank": ("blocks.{i}.attn.c_k.weight", "blocks.{i}.attn.c_v.weight"),
    "mlp_up_bank": ("blocks.{i}.mlp.fc.weight",),
    "mlp_down_bank": ("blocks.{i}.mlp.proj.weight",),
}
PASSTHROUGH = tuple(FLOAT_FORMATS)


@dataclass(frozen=True)
class Bank:
    """One stack: its shape and dtype, and the names of its slices in order."""

    shape: tuple[int, ...]
    slices: tuple[str, ...]


class FlatState(dict):
    """A state dict whose stacks are split into slices; ``banks`` says how to put them back,
    ``order`` the original names (banks where they were)."""

    banks: dict[str, Bank]
    order: tuple[str, ...]


def is_stack(t: Tensor) -> bool:
    """A float tensor of >= 3 dims whose last two dims are a matrix (each >= MIN_SIDE)."""
    return t.is_floating_point() and t.dim() >= 3 and min(t.shape[-2:]) >= MIN_SIDE


def slice_names(name: str, n: int) -> list[str]:
    """The names of a stack's n slices: the record's own when it is one of the record's banks."""
    prefix, _, base = name.rpartition(".")
    templates = RECORD_BANKS.get(base)
    if templates is None or n % len(templates):
        return [f"{name}.{i}" for i in range(n)]
    per = n // len(templates)
    lead = prefix + "." if prefix else ""
    return [lead + templates[i // per].format(i=i % per) for i in range(n)]


def unbank(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The state with every stack split into slice views (a FlatState), or the state itself
    when it has none."""
    if isinstance(state, FlatState) or not any(is_stack(t) for t in state.values()):
        return state
    flat, banks = FlatState(), {}
    for name, t in state.items():
        if not is_stack(t):
            flat[name] = t
            continue
        rows = t.reshape(-1, *t.shape[-2:])
        names = slice_names(name, rows.shape[0])
        if any(n in state or n in flat for n in names):  # a clash with a real name: the plain names
            names = [f"{name}.{i}" for i in range(rows.shape[0])]
        for n, piece in zip(names, rows, strict=True):
            flat[n] = piece
        banks[name] = Bank(tuple(t.shape), tuple(names))
    flat.banks, flat.order = banks, tuple(state)
    return flat


def bank_of(state: dict) -> dict[str, str]:
    """{slice name: its bank} of a FlatState ({} otherwise)."""
    return {s: b for b, bank in getattr(state, "banks", {}).items() for s in bank.slices}


def restack(state: dict, qtensors: dict[str, QTensor]) -> dict[str, QTensor]:
    """The QTensors with each bank's slices put back into one QTensor of the bank's shape,
    in the original order; QuantError when a bank's slices cannot share one tensor."""
    banks = getattr(state, "banks", None)
    if not banks:
        return qtensors
    out = {}
    for name in state.order:
        out[name] = (
            stack(name, banks[name], [qtensors[s] for s in banks[name].slices]) if name in banks else qtensors[name]
        )
    return out


def stack(name: str, bank: Bank, parts: list[QTensor]) -> QTensor:
    """One QTensor of the bank's shape whose values are the parts' (see the module docstring)."""
    rows, cols = bank.shape[-2], bank.shape[-1]
    formats = {p.format for p in parts}
    if formats <= set(PASSTHROUGH) and len(formats) == 1 and not any(p.lowrank for p in parts):
        codes = np.concatenate([p.codes.reshape(-1)[: p.numel] for p in parts])[None, :]
        return QTensor(parts[0].format, bank.shape, parts[0].dtype, codes, params=dict(parts[0].params))
    grid = _grid_rows(name, [(p, cols) for p in parts], bank.shape)
    lowranks = [p.lowrank for p in parts]
    if not any(lowranks):
        return grid
    # One correction of the [S * rows, cols] view: R stacked, each L on its own slice's rows.
    left_rows, right_rows = [], []
    for i, lr in enumerate(lowranks):
        if lr is None:
            continue
        L, R = lr
        r = L.shape[0]
        right_rows.append((R, cols))
        for k in range(r):  # row k of the big L: zeros, then this slice's row k, then zeros
            left_rows.append([(None, i * rows), (L, rows, k), (None, (len(parts) - 1 - i) * rows)])
    R_shape = (sum(p[0].shape[0] for p in right_rows), cols)
    L_shape = (len(left_rows), len(parts) * rows)
    try:
        grid.lowrank = (
            _grid_pieces(f"{name} lqer L", left_rows, L_shape),
            _grid_rows(f"{name} lqer R", right_rows, R_shape),
        )
    except QuantError:  # factor groups that straddle the rows: their exact values in float32
        grid.lowrank = _float_factors(lowranks, rows, L_shape, R_shape)
    return grid


def _float_factors(lowranks: list, rows: int, L_shape: tuple, R_shape: tuple) -> tuple[QTensor, QTensor]:
    """The stacked factors as fp32 tensors of their dequantized values (exact, larger)."""
    import torch

    from ..quant import extras
    from ..quant.registry import dequantize

    L_big, R_big = torch.zeros(L_shape), torch.zeros(R_shape)
    k = 0
    for i, lr in enumerate(lowranks):
        if lr is None:
            continue
        L, R = (dequantize(f) for f in lr)
        L_big[k : k + L.shape[0], i * rows : (i + 1) * rows] = L
        R_big[k : k + L.shape[0]] = R
        k += L.shape[0]
    return extras.quantize(L_big, "fp32", {}), extras.quantize(R_big, "fp32", {})


def _row_view(qt: QTensor, row_len: int, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(codes [n, row_len], scales [n, row_len / g], zeros or None, g) of a grid QTensor."""
    from ..quant.qtensor import rows_layout

    if not qt.format.startswith("int") or qt.format == "int8_pg" or qt.scales is None:
        raise QuantError(f"{where}: format {qt.format} cannot share one tensor with its bank's other slices")
    g = qt.params.get("group") or rows_layout(tuple(qt.shape))[1]
    if row_len % g or qt.numel % row_len:
        raise QuantError(f"{where}: groups of {g} do not tile rows of {row_len}")
    n = qt.numel // row_len
    codes = qt.codes.reshape(-1)[: qt.numel].reshape(n, row_len)
    scales = qt.scales.reshape(-1)[: qt.numel // g].reshape(n, row_len // g)
    zeros = None if qt.zeros is None else qt.zeros.reshape(-1)[: qt.numel // g].reshape(n, row_len // g)
    return codes, scales, zeros, g


def _grid_rows(where: str, parts: list[tuple[QTensor, int]], shape: tuple[int, ...]) -> QTensor:
    """The parts' rows one after another as one grid QTensor of `shape`."""
    return _grid_pieces(where, [[(qt, row_len, None)] for qt, row_len in parts], shape)


def _grid_pieces(where: str, lines: list[list[tuple]], shape: tuple[int, ...]) -> QTensor:
    """One intN QTensor from lines of pieces laid side by side: (qt, row_len, k) is row k of
    qt's [n, row_len] view (k None: all its rows, as a line of their own), (None, width)
    zeros. The groups are the largest size every piece's groups are multiples of."""
    width: dict[int, tuple] = {}
    for line in lines:
        for piece in line:
            if piece[0] is not None and id(piece[0]) not in width:
                width[id(piece[0])] = _row_view(piece[0], piece[1], where)
    pieces = [v for v in width.values()]
    if not pieces:
        raise QuantError(f"{where}: nothing to stack")
    g = math.gcd(*(v[3] for v in pieces))
    for line in lines:
        for piece in line:
            if piece[0] is None and piece[1] % g:
                raise QuantError(f"{where}: groups of {g} do not tile a block of {piece[1]}")
    asym = {v[2] is not None for v in pieces}
    if len(asym) > 1:
        raise QuantError(f"{where}: symmetric and asymmetric slices cannot share one tensor")
    asymmetric = asym.pop()
    sdt = pieces[0][1].dtype
    cdt = np.uint8 if asymmetric else np.int8
    code_rows, scale_rows, zero_rows = [], [], []
    for line in lines:
        pc, ps, pz = [], [], []
        n = None
        for piece in line:
            if piece[0] is None:
                continue
            codes, _, _, _ = width[id(piece[0])]
            n = codes.shape[0] if piece[2] is None else 1
        n = n or 1
        for piece in line:
            if piece[0] is None:
                pc.append(np.zeros((n, piece[1]), cdt))
                ps.append(np.zeros((n, piece[1] // g), sdt))
                pz.append(np.zeros((n, piece[1] // g), sdt))
                continue
            codes, scales, zeros, gi = width[id(piece[0])]
            sel = slice(None) if piece[2] is None else slice(piece[2], piece[2] + 1)
            pc.append(codes[sel].astype(cdt))
            ps.append(np.repeat(scales[sel], gi // g, axis=1).astype(sdt))
            if asymmetric:
                pz.append(np.repeat(zeros[sel], gi // g, axis=1).astype(sdt))
        code_rows.append(np.concatenate(pc, axis=1))
        scale_rows.append(np.concatenate(ps, axis=1))
        zero_rows.append(np.concatenate(pz, axis=1) if asymmetric else None)
    codes = np.concatenate(code_rows).reshape(-1, g)
    scales = np.concatenate(scale_rows).reshape(-1)
    zeros = np.concatenate(zero_rows).reshape(-1) if asymmetric else None
    if codes.size != math.prod(shape):
        raise QuantError(f"{where}: the slices hold {codes.size} values, the stack {math.prod(shape)}")
    widest = max((p for line in lines for p in line if p[0] is not None), key=lambda p: int(p[0].format[3:]))[0]
    params = {**widest.params, "group": g}
    return QTensor(widest.format, tuple(shape), widest.dtype, codes, scales, zeros, params)
