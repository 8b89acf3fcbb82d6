"""Mutated and truncated artifacts: only ArtifactError escapes, quickly and without big allocations."""

from __future__ import annotations

import resource
import subprocess
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recurnorm.budget import pack_qtensors, read_artifact
from recurnorm.errors import ArtifactError
from recurnorm.quant.qtensor import QTensor


def _artifact() -> bytes:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 128))
    s = np.abs(w).max(1) / 7
    return pack_qtensors({
        "w": QTensor("int4", (64, 128), "float32", np.round(w / s[:, None]).astype(np.int8), s.astype(np.float16)),
        "t": QTensor("ternary", (40, 100), "float32", rng.integers(-1, 2, size=(1, 4000)).astype(np.int8),
                     np.array([0.5], np.float32)),
        "b": QTensor("raw", (9,), "int64", np.arange(9, dtype=np.int64).reshape(1, 9)),
    }, {"config": {"d": 1}})


ART = _artifact()


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


def test_forged_huge_shape_under_memory_limit():
    # A re-signed manifest that declares a 2**29-element stream must fail validation,
    # not allocate: run it in a child limited to 2 GiB of address space beyond imports.
    code = """
import hashlib, json, resource, sys
sys.path.insert(0, 'tests')
from test_fuzz_artifact import ART
from recurnorm.budget import format as fmt, read_artifact
from recurnorm.errors import ArtifactError
_, _, _, mlen, _ = fmt.HEADER.unpack_from(ART, 0)
m = json.loads(ART[48:48 + mlen]); payload = ART[48 + mlen:]
for t in m['tensors']:
    if t['name'] == 't':
        t['shape'] = [1 << 15, 1 << 14]; t['streams']['codes']['shape'] = [1, 1 << 29]
mb = fmt.dumps(m)
bad = fmt.HEADER.pack(fmt.MAGIC, 1, 0, len(mb), hashlib.sha256(mb).digest()) + mb + payload
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
