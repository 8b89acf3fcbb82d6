"""verify, the CI size gate, and inspect read and check an artifact with numpy alone: importing
torch took 1.2 s of the 1.6 s verify of a 1.7 MB artifact (recurnorm/lazy.py). Run in a fresh
interpreter, since this one has torch already."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from recurnorm.cli.main import main
from recurnorm.lazy import LazyModule

GOLDENS = sorted((Path(__file__).parent / "data" / "goldens").glob("*.rnpk"))  # every format and codec

# The CLI as a user runs it, then whether torch was ever imported (the last line of stderr).
RUN_CLI = """
import sys
from recurnorm.cli.main import main
try:
    main(sys.argv[1:])
finally:
    print("torch imported:", "torch" in sys.modules, file=sys.stderr)
"""


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN_CLI, *map(str, args)], capture_output=True, text=True)


def test_verify_of_every_format_and_codec_imports_no_torch(tmp_path):
    loader = tmp_path / "rnpk_load.py"
    assert CliRunner().invoke(main, ["loader", "-o", str(loader)]).exit_code == 0
    assert len(GOLDENS) >= 10
    portable = [g for g in GOLDENS if g.stem.startswith("v3_")]  # (what the loader reads: format 3)
    assert portable
    for args in (GOLDENS, [*GOLDENS, "--jobs", 2], [*portable, "--loader", loader]):  # (forked jobs too)
        r = run_cli("verify", *args, "--json")
        assert r.returncode == 0, r.stdout
        assert r.stderr.splitlines()[-1] == "torch imported: False"


def test_inspect_of_an_artifact_imports_no_torch():
    for args in ([GOLDENS[0]], [GOLDENS[-1], "--json"]):
        r = run_cli("inspect", *args)
        assert r.returncode == 0 and "rule" in r.stdout, r.stderr
        assert r.stderr.splitlines()[-1] == "torch imported: False"


def test_verify_still_refuses_values_a_format_cannot_hold_without_torch(tmp_path):
    """raw codes outside their dtype: the check that used torch.iinfo, now numpy's."""
    import numpy as np

    from recurnorm.budget.api import pack_qtensors
    from recurnorm.quant import QTensor

    codes = np.array([[0, 300]], dtype=np.int16)  # (int8 holds at most 127)
    bad = tmp_path / "bad.rnpk"
    bad.write_bytes(pack_qtensors({"w": QTensor("raw", (2,), "int8", codes, params={})}, check=False))
    r = run_cli("verify", bad)
    assert r.returncode == 4 and "outside int8" in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == "torch imported: False"


def test_a_lazy_module_is_imported_when_first_used(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    lazy = LazyModule("colorsys")
    assert "colorsys" not in sys.modules
    assert lazy.rgb_to_hsv(0.0, 0.0, 0.0) == (0.0, 0.0, 0.0) and "colorsys" in sys.modules


def _mixed_checkpoint(path: Path, floats=("bfloat16", "float16", "float32")) -> None:
    """Matrices, vectors, a scalar and an empty tensor of each float dtype, beside integers and bools."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    sd = {
        "ids": torch.arange(300),
        "small": torch.arange(-5, 5, dtype=torch.int8),
        "mask": torch.rand(40, generator=g) > 0.5,
    }
    for dt in floats:
        d = getattr(torch, dt)
        sd |= {f"{dt}.w": (torch.randn(96, 64, generator=g) * 0.02).to(d), f"{dt}.norm": torch.ones(64, dtype=d)}
        sd |= {f"{dt}.scale": torch.tensor(0.5, dtype=d), f"{dt}.empty": torch.zeros(0, 4, dtype=d)}
    save_file(sd, path)


def test_a_lossless_pack_reads_words_without_torch_and_writes_the_same_bytes(tmp_path):
    """Floats kept in their dtype or widened to float32, and integers, are read with numpy: the
    artifact is the one the whole state dict packed with torch makes, byte for byte."""
    from recurnorm.export.pack import pack_checkpoint
    from recurnorm.export.spec import build_policy

    mixed, bf16 = tmp_path / "mixed.safetensors", tmp_path / "bf16.safetensors"
    _mixed_checkpoint(mixed)
    _mixed_checkpoint(bf16, floats=("bfloat16",))
    for ckpt, quant in ((mixed, "fp32"), (bf16, "bf16"), (bf16, "fp32")):
        for jobs in (1, 2):
            out = tmp_path / f"{ckpt.stem}-{quant}-{jobs}.rnpk"
            r = run_cli("pack", ckpt, "-q", quant, "--jobs", jobs, "-o", out)
            assert r.returncode == 0, r.stderr
            assert r.stderr.splitlines()[-1] == "torch imported: False"
            assert out.read_bytes() == pack_checkpoint(ckpt, build_policy(quant)).data, (ckpt, quant, jobs)
    # A float narrowed (bf16 and float32 to fp16) is rounded by torch, imported before the jobs fork.
    out = tmp_path / "fp16.rnpk"
    r = run_cli("pack", mixed, "-q", "fp16", "--jobs", 2, "-o", out)
    assert r.returncode == 0 and r.stderr.splitlines()[-1] == "torch imported: True", r.stderr
    assert out.read_bytes() == pack_checkpoint(mixed, build_policy("fp16")).data


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_nan_and_inf_read_as_words_are_refused_as_torch_refuses_them(dtype):
    import numpy as np
    import torch

    from recurnorm.errors import QuantError
    from recurnorm.export.stream import WORDS, check_finite_words
    from recurnorm.quant.registry import check_finite

    def refusal(check, *args):
        try:
            check(*args)
        except QuantError as exc:
            return str(exc)
        return None

    d = getattr(torch, dtype)
    big = torch.finfo(d).max
    for shape in [(3, 5), (7,), ()]:
        for bad in [None, float("nan"), -float("nan"), float("inf"), -float("inf")]:
            for at in {0, max(0, math.prod(shape) - 1), math.prod(shape) // 2}:
                t = torch.tensor([big, -big, 0.0, -0.0, 1e-3] * 3, dtype=torch.float32)[: math.prod(shape)].to(d)
                if bad is not None:
                    t[at] = bad
                t = t.reshape(shape)
                words = t.reshape(-1).view(torch.int16 if d.itemsize == 2 else torch.int32).numpy().view(WORDS[dtype])
                expected = refusal(check_finite, t, "w")
                assert (expected is None) == (bad is None)
                assert refusal(check_finite_words, np.ascontiguousarray(words), dtype, shape, "w") == expected
