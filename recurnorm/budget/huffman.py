"""Bytes as one deflate block of Huffman-coded literals (RFC 1951, dynamic Huffman, no
matches): what deflate makes of quantized codes without repetition, written here.

Its size follows from the byte counts alone (`block_bits`), so a race can price the block
without making it. One block for the whole stream: zlib's Huffman-only mode pays a new code
table (~150 bytes for a wide alphabet) every 32K symbols. Any inflater reads it.

The compiled kernel (`_ransc.huffman_literals`) writes the same bytes as this numpy reference,
step for step:
  - code lengths: Huffman's two-queue merge over the used symbols ordered by (count, symbol),
    a leaf first on equal weights; lengths over the limit (15 for literals, 7 for the
    code-length code) folded back by the JPEG rule (Annex K.3), and handed out again from
    the longest, least frequent symbols first; a lone used symbol gets a second, unused one
    beside it (a code-length code must be complete);
  - the 257 literal/end lengths and one empty distance length as one sequence, run-length
    coded greedily: zero runs by 18 (11-138) then 17 (3-10), runs of a nonzero length as the
    length then 16 (3-6) repeats;
  - canonical codes (RFC 1951 3.2.2), written least significant bit first.
"""

from __future__ import annotations

import numpy as np

LIT_LIMIT, CL_LIMIT = 15, 7
END = 256  # the end-of-block symbol
CL_ORDER = (16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15)
CL_EXTRA = {16: 2, 17: 3, 18: 7}  # extra bits of the repeat codes


def _kernel():
    from . import rans  # (rans imports compress, which imports this module)

    return rans._ransc


def code_lengths(counts, limit: int) -> list[int]:
    """Length-limited Huffman code lengths of each symbol (0 where its count is 0)."""
    n = len(counts)
    used = sorted((int(c), s) for s, c in enumerate(counts) if c > 0)
    lengths = [0] * n
    if not used:
        return lengths
    if len(used) == 1:  # a complete code needs two symbols: the lowest other one joins it
        s = used[0][1]
        lengths[s] = lengths[1 if s == 0 else 0] = 1
        return lengths
    m = len(used)
    weight = [c for c, _ in used] + [0] * (m - 1)
    parent = [0] * (2 * m - 1)
    leaf = inner = 0  # next unmerged leaf; next unmerged internal node (m + inner)
    for node in range(m, 2 * m - 1):
        for _ in range(2):
            if leaf < m and (inner >= node - m or weight[leaf] <= weight[m + inner]):
                child, leaf = leaf, leaf + 1
            else:
                child, inner = m + inner, inner + 1
            parent[child] = node
            weight[node] += weight[child]
    depth = [0] * (2 * m - 1)
    for node in range(2 * m - 3, -1, -1):
        depth[node] = depth[parent[node]] + 1
    top = max(depth[:m])
    bl_count = [0] * (max(top, limit) + 1)
    for d in depth[:m]:
        bl_count[d] += 1
    for i in range(top, limit, -1):  # JPEG Annex K.3: the Kraft sum stays 1
        while bl_count[i] > 0:
            j = i - 2
            while bl_count[j] == 0:
                j -= 1
            bl_count[i] -= 2
            bl_count[i - 1] += 1
            bl_count[j + 1] += 2
            bl_count[j] -= 1
    k = 0  # the least frequent symbols take the longest codes
    for length in range(limit, 0, -1):
        for _ in range(bl_count[length]):
            lengths[used[k][1]] = length
            k += 1
    return lengths


def canonical_codes(lengths) -> list[int]:
    """Each symbol's code (RFC 1951 3.2.2), bit-reversed for least-significant-first writing."""
    top = max(lengths)
    bl_count = [0] * (top + 1)
    for length in lengths:
        bl_count[length] += 1
    bl_count[0] = 0
    next_code, code = [0] * (top + 2), 0
    for bits in range(1, top + 1):
        code = (code + bl_count[bits - 1]) << 1
        next_code[bits] = code
    codes = [0] * len(lengths)
    for s, length in enumerate(lengths):
        if length:
            c = next_code[length]
            next_code[length] += 1
            codes[s] = int(f"{c:0{length}b}"[::-1], 2)
    return codes


def _runs(lengths) -> list[tuple[int, int]]:
    """(code-length symbol, extra-bits value) of the code-length sequence, run-length coded."""
    out, i, n = [], 0, len(lengths)
    while i < n:
        v, run = lengths[i], 1
        while i + run < n and lengths[i + run] == v:
            run += 1
        i += run
        if v == 0:
            while run >= 11:
                r = min(run, 138)
                out.append((18, r - 11))
                run -= r
            if run >= 3:
                out.append((17, run - 3))
                run = 0
        else:
            out.append((v, 0))
            run -= 1
            while run >= 3:
                r = min(run, 6)
                out.append((16, r - 3))
                run -= r
        out += [(v, 0)] * run
    return out


def _plan(counts):
    """(literal/end lengths, header fields as (value, bits) pairs, total bits of the block)."""
    freq = [int(c) for c in counts] + [1]  # the end of block, once
    lit = code_lengths(freq, LIT_LIMIT)
    runs = _runs(lit + [0])  # one distance code, empty: the block has no matches
    cl_freq = [0] * 19
    for sym, _ in runs:
        cl_freq[sym] += 1
    cl = code_lengths(cl_freq, CL_LIMIT)
    hclen = max(4, max(i + 1 for i, s in enumerate(CL_ORDER) if cl[s] or i < 4))
    cl_codes = canonical_codes(cl)
    # BFINAL=1, BTYPE=2 (dynamic); HLIT=0 (257 codes), HDIST=0 (1 code), HCLEN
    fields = [(1, 1), (2, 2), (0, 5), (0, 5), (hclen - 4, 4)]
    fields += [(cl[s], 3) for s in CL_ORDER[:hclen]]
    for sym, extra in runs:
        fields.append((cl_codes[sym], cl[sym]))
        if sym in CL_EXTRA:
            fields.append((extra, CL_EXTRA[sym]))
    bits = sum(b for _, b in fields) + sum(f * length for f, length in zip(freq, lit, strict=True))
    return lit, fields, bits


def block_bits(counts) -> int:
    """Bits of the block that `block` makes of bytes with these 256 counts."""
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if (k := _kernel()) is not None:
        return k.huffman_literals(counts)
    return _plan(counts)[2]


def block_size(counts) -> int:
    """Bytes of that block."""
    return -(-block_bits(counts) // 8)


def block(raw: bytes, counts=None) -> bytes:
    """raw as one deflate block of Huffman-coded literals (counts: raw's 256 byte counts,
    when the caller has them)."""
    b = np.frombuffer(raw, dtype=np.uint8)
    counts = np.ascontiguousarray(np.bincount(b, minlength=256) if counts is None else counts, dtype=np.int64)
    if (k := _kernel()) is not None:
        return k.huffman_literals(counts, raw)
    lit, fields, bits = _plan(counts)
    codes = np.array(canonical_codes(lit), dtype=np.uint64)
    lengths = np.array(lit, dtype=np.int64)
    # the header, the literals, the end code
    values = np.concatenate([np.array([v for v, _ in fields], dtype=np.uint64), codes[b], codes[END:]])
    widths = np.concatenate([np.array([w for _, w in fields], dtype=np.int64), lengths[b], lengths[END:]])
    return _pack_bits(values, widths, bits)


def _pack_bits(values: np.ndarray, widths: np.ndarray, bits: int) -> bytes:
    """values[i] in widths[i] bits each, least significant bit first, into bytes."""
    pos = np.cumsum(widths) - widths  # each value's first bit
    out = np.zeros(-(-bits // 8) * 8, dtype=np.uint8)
    for j in range(int(widths.max(initial=0))):  # bit j of every value that has one
        has = widths > j
        out[pos[has] + j] = ((values[has] >> np.uint64(j)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(out, bitorder="little").tobytes()
