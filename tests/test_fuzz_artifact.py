"""Mutated and truncated artifacts: only ArtifactError escapes, quickly and without big allocations."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from helpers import fuzz_base_artifact
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recurnorm.budget import format as fmt
from recurnorm.budget import read_artifact
from recurnorm.errors import ArtifactError

ART = fuzz_base_artifact()


def test_fuzzed_artifact_holds_a_grid_context():
    manifest, _ = fmt.split_container(ART)
    assert "grid" in {t["streams"]["codes"]["params"].get("context") for t in manifest["tensors"]}


@st.composite
def mutations(draw):
    data = bytearray(ART)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            del data[pos:]
    return bytes(data)


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_mutations_raise_only_artifact_error(data):
    if data == ART:
        return
    try:
        read_artifact(data)
    except ArtifactError:
        pass


@pytest.mark.slow  # a child under an address-space limit
def test_forged_huge_shape_under_memory_limit():
    # A re-signed manifest that declares a 2**29-element stream must fail validation,
    # not allocate: run it in a child limited to 2 GiB of address space beyond imports.
    code = """
import hashlib, json, resource, sys
sys.path.insert(0, 'tests')
from helpers import fuzz_base_artifact
ART = fuzz_base_artifact()
from recurnorm.budget import format as fmt, read_artifact, spec
from recurnorm.errors import ArtifactError
m, payload = fmt.split_container(ART)
for t in m['tensors']:
    if t['name'] == 't':
        t['shape'] = [1 << 15, 1 << 14]; t['streams']['codes']['shape'] = [1, 1 << 29]
mb = fmt.dumps(m)
bad = fmt.container(mb, payload, 0, 1)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 31), hard))
try:
    read_artifact(bad)
except ArtifactError as e:
    print('ok', e)
else:
    print('no error')
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("ok"), r.stdout + r.stderr
    assert resource  # imported for the child's sake


MANIFEST, PAYLOAD = fmt.split_container(ART)


def _resigned(payload: bytes) -> bytes:
    """ART with another payload, every hash recomputed: what a hostile file can do."""
    return fmt.write_container(MANIFEST, payload)


@pytest.mark.slow  # 300 hypothesis examples
@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(PAYLOAD) - 1), st.integers(1, 255)), min_size=1, max_size=4))
def test_resigned_payload_mutations_reach_the_codecs_and_raise_only_artifact_error(flips):
    """Hashes are no defence against a forger: every codec must reject bad streams itself."""
    data = bytearray(PAYLOAD)
    for pos, x in flips:
        data[pos] ^= x
    try:
        read_artifact(_resigned(bytes(data)))
    except ArtifactError:
        pass


def test_forged_zstd_content_size_is_rejected_without_allocating():
    """A 47-byte side-data frame that declares an exabyte of output (found by fuzzing)."""
    from recurnorm.budget import spec
    from recurnorm.budget.compress import decompress

    blob = bytes.fromhex("e100550100724f08801051ec2044ac85") + bytes(31)
    with pytest.raises(ArtifactError, match="rans side data"):
        decompress(spec.ZSTD, blob, 256, "rans side data", magicless=True)
    import zstandard

    big = zstandard.ZstdCompressor().compress(bytes(10_000))
    with pytest.raises(ArtifactError, match="declares 10,000 bytes"):
        decompress(spec.ZSTD, big, 9_999, "codes stream")
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(10_000))
    with pytest.raises(ArtifactError, match="codes stream: zstd"):
        decompress(spec.ZSTD, unsized, 9_999, "codes stream")
    with pytest.raises(ArtifactError, match="codes stream: zstd"):  # truncated frame
        decompress(spec.ZSTD, unsized[:-3], 10_000, "codes stream")
    assert decompress(spec.ZSTD, big, 10_000, "codes stream") == bytes(10_000)
