"""Deflate blocks of Huffman-coded literals: any inflater reads them, their size is known
from the counts alone, and the compiled kernel writes the numpy reference's bytes."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recurnorm.budget import huffman, rans

kernel = pytest.mark.skipif(not rans.has_kernel(), reason="compiled kernel not built")


def _inflate(block: bytes) -> bytes:
    d = zlib.decompressobj(-15)
    out = d.decompress(block)
    assert d.eof and not d.unused_data
    return out


def _reference(raw: bytes) -> tuple[bytes, int]:
    """The numpy reference's block and bits (the kernel set aside)."""
    kernel_module, rans._ransc = rans._ransc, None
    try:
        return huffman.block(raw), huffman.block_bits(np.bincount(np.frombuffer(raw, np.uint8), minlength=256))
    finally:
        rans._ransc = kernel_module


def _fibonacci_bytes(symbols: int) -> bytes:
    """Counts 1, 1, 2, 3, 5, ...: the deepest Huffman tree, past deflate's 15-bit limit."""
    fib = [1, 1]
    while len(fib) < symbols:
        fib.append(fib[-1] + fib[-2])
    return np.repeat(np.arange(symbols, dtype=np.uint8), fib).tobytes()


@pytest.mark.parametrize(
    "raw",
    [b"", b"a", b"ab", bytes(1000), bytes(range(256)) * 3, _fibonacci_bytes(30)],
    ids=["empty", "one", "two", "constant", "uniform", "fibonacci"],
)
def test_blocks_inflate_and_their_size_is_known_from_counts(raw):
    counts = np.bincount(np.frombuffer(raw, np.uint8), minlength=256)
    block = huffman.block(raw)
    assert _inflate(block) == raw
    assert len(block) == huffman.block_size(counts)


def test_code_lengths_are_huffman_within_the_limit():
    counts = np.bincount(np.frombuffer(_fibonacci_bytes(30), np.uint8), minlength=256)
    free = huffman.code_lengths(list(counts), 64)
    limited = huffman.code_lengths(list(counts), 15)
    assert max(free) == 29 and max(limited) == 15
    for lengths in (free, limited):  # complete prefix codes
        assert sum(2.0**-n for n in lengths if n) == 1.0
    # Huffman is optimal: no other complete code of the same symbols is cheaper; the limit costs little
    cost = lambda lengths: sum(int(c) * n for c, n in zip(counts, lengths, strict=True))  # noqa: E731
    assert cost(free) <= cost(limited) < 1.005 * cost(free)  # (the worst case: Fibonacci counts)
    assert huffman.code_lengths([0, 7, 0], 15) == [1, 1, 0]  # a lone symbol gets a partner


def test_one_block_beats_zlibs_32k_blocks_on_wide_stationary_codes():
    rng = np.random.default_rng(0)
    raw = (np.round(rng.normal(size=200_000) * 30) % 256).astype(np.uint8).tobytes()
    c = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_HUFFMAN_ONLY)
    assert len(huffman.block(raw)) < len(c.compress(raw) + c.flush())


@kernel
@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31), n=st.integers(0, 40_000), shape=st.sampled_from(["uniform", "zipf", "few", "normal"])
)
def test_kernel_writes_the_reference_bytes(seed, n, shape):
    rng = np.random.default_rng(seed)
    if shape == "uniform":
        b = rng.integers(0, 256, n, dtype=np.uint8)
    elif shape == "zipf":
        b = (rng.zipf(1.2, n) % 256).astype(np.uint8)
    elif shape == "few":
        b = rng.integers(0, 3, n, dtype=np.uint8) * 40
    else:
        b = (np.round(rng.normal(size=n) * rng.uniform(0.3, 50)) % 256).astype(np.uint8)
    raw = b.tobytes()
    block = huffman.block(raw)
    ref, bits = _reference(raw)
    assert block == ref and huffman.block_bits(np.bincount(b, minlength=256)) == bits
    assert _inflate(block) == raw


@kernel
def test_kernel_refuses_counts_that_are_not_the_bytes():
    with pytest.raises(ValueError, match="not raw's"):
        rans._ransc.huffman_literals(np.zeros(256, np.int64), b"a")
    with pytest.raises(ValueError, match="256 int64"):
        rans._ransc.huffman_literals(np.zeros(255, np.int64))
