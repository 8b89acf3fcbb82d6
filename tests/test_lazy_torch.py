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


def _mixed_checkpoint(path: Path, floats=("bfloat16", "float16", "float32"), rows: int = 96) -> None:
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
        sd |= {f"{dt}.w": (torch.randn(rows, 64, generator=g) * 0.02).to(d), f"{dt}.norm": torch.ones(64, dtype=d)}
        sd |= {f"{dt}.scale": torch.tensor(0.5, dtype=d), f"{dt}.empty": torch.zeros(0, 4, dtype=d)}
    save_file(sd, path)


def test_packs_and_unpacks_in_float_formats_run_without_torch_as_torch_would(tmp_path):
    """Floats in a float format (kept, widened or rounded) and raw integers are read and written
    as words with numpy: the artifact is the one the whole state dict packed with torch makes,
    and unpack writes what recurnorm.load (torch's dequantize) returns, byte for byte."""
    import torch
    from safetensors.torch import load_file

    from recurnorm import load
    from recurnorm.export.pack import pack_checkpoint
    from recurnorm.export.spec import build_policy

    mixed, bf16 = tmp_path / "mixed.safetensors", tmp_path / "bf16.safetensors"
    _mixed_checkpoint(mixed)
    _mixed_checkpoint(bf16, floats=("bfloat16",))
    for ckpt, quant in ((mixed, "fp32"), (mixed, "bf16"), (mixed, "fp16"), (bf16, "bf16")):
        for jobs in (1, 2):
            out, back = (
                tmp_path / f"{ckpt.stem}-{quant}-{jobs}.rnpk",
                tmp_path / f"{ckpt.stem}-{jobs}" / f"{quant}.safetensors",
            )
            r = run_cli("pack", ckpt, "-q", quant, "--jobs", jobs, "-o", out)
            assert r.returncode == 0 and r.stderr.splitlines()[-1] == "torch imported: False", r.stderr
            assert out.read_bytes() == pack_checkpoint(ckpt, build_policy(quant)).data, (ckpt, quant, jobs)
            r = run_cli("unpack", out, "-o", back, "--jobs", jobs)
            assert r.returncode == 0 and r.stderr.splitlines()[-1] == "torch imported: False", r.stderr
            got, want = load_file(back), load(out)
            assert got.keys() == want.keys()
            for k, t in want.items():
                assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
                assert torch.equal(got[k].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), (quant, k)


def test_unpacks_quantized_formats_without_torch_as_torch_would(tmp_path):
    """Integer grids, ternary and NF4 restored to each float dtype (float64 too), beside float
    formats and raw integers: unpack writes, with numpy alone, what recurnorm.load (torch's
    dequantize) returns, byte for byte, with 1 and 2 jobs. Quantizing still needs torch."""
    import torch
    from safetensors.torch import load_file

    from recurnorm import load
    from recurnorm.quant.blockwise import BLOCK

    mixed = tmp_path / "mixed.safetensors"  # (matrices of more than one piece)
    _mixed_checkpoint(mixed, floats=("bfloat16", "float16", "float32", "float64"), rows=BLOCK // 64 + 100)
    for quant in ("int8", "int4", "int6:asymmetric=true", "int8_pg", "ternary", "nf4"):
        art = tmp_path / f"{quant}.rnpk"
        r = run_cli("pack", mixed, "-q", quant, "--jobs", 2, "-o", art)
        assert r.returncode == 0 and r.stderr.splitlines()[-1] == "torch imported: True", r.stderr
        want = load(art)
        for jobs in (1, 2):
            back = tmp_path / f"{quant}-{jobs}" / "out.safetensors"
            r = run_cli("unpack", art, "-o", back, "--jobs", jobs)
            assert r.returncode == 0 and r.stderr.splitlines()[-1] == "torch imported: False", r.stderr
            got = load_file(back)
            assert got.keys() == want.keys()
            for k, t in want.items():
                assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
                assert torch.equal(got[k].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), (quant, k)


@pytest.mark.parametrize("quant", ["int8", "int4", "int5:asymmetric=true", "int8_pg", "ternary", "nf4"])
def test_word_blocks_are_the_dequantized_tensor_in_pieces(quant):
    """Pieces of rows, a row longer than a piece (split by columns), a padded last group: the
    words joined are dequantize(qt, original_dtype=True)'s, for each float dtype."""
    import torch

    from recurnorm.budget.safetensors_out import raw_bytes
    from recurnorm.export.spec import parse_format
    from recurnorm.quant.blockwise import BLOCK
    from recurnorm.quant.registry import dequantize, get, word_blocks

    fmt, options = parse_format(quant)
    g = torch.Generator().manual_seed(1)
    for shape in ((3 * BLOCK // 1000 + 7, 1000), (2, BLOCK + 100), (37,)):
        x = torch.randn(shape, generator=g) * 0.02
        for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
            qt = get(fmt, **options).quantize(x.to(dtype))
            pieces = list(word_blocks(qt))
            assert len(pieces) > 1 or x.numel() < BLOCK
            got = b"".join(p.tobytes() for p in pieces)
            assert got == raw_bytes(dequantize(qt, original_dtype=True)).tobytes(), (quant, shape, dtype)


@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16"])
def test_float_words_convert_as_torch_does(src):
    """Exactly where the output is as wide; else to nearest, ties to even, as torch rounds: ties,
    subnormals, the largest finite values, values past the output's range."""
    import torch

    from recurnorm.quant.passthrough import WORD_DTYPES, float_words

    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4000, generator=g) * s for s in (1e-8, 1e-6, 1e-4, 0.02, 1.0, 300.0, 7e4, 1e30)])
    spots = [0.0, -0.0, 1.0, 65504.0, 65520.0, 7e4, 3.3895e38, 3.4e38, 6e-8, 1e-7, 3e-8, 1.2e-38, 1e-45]
    x = torch.cat([x, torch.tensor(spots), -torch.tensor(spots)])
    bits = torch.arange(0, 1 << 16, dtype=torch.int32)  # every bf16 pattern, and ties below each
    x = torch.cat([x, (bits << 16).view(torch.float32), ((bits << 16) | 0x8000).view(torch.float32)])
    x = x.to(getattr(torch, src))
    x = x[torch.isfinite(x)]
    words = x.view(torch.int16 if x.element_size() == 2 else torch.int32).numpy().view(WORD_DTYPES[src])
    for dst in ("float32", "float16", "bfloat16", "float64"):
        want = x.to(getattr(torch, dst))
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.element_size()]
        assert torch.equal(want.view(ints), x.to(torch.float32).to(want.dtype).view(ints))  # (pack's, unpack's)
        got = float_words(words, src, dst)
        assert got.dtype == WORD_DTYPES[dst]
        assert (got.view(f"i{got.itemsize}") == want.view(ints).numpy()).all(), (src, dst)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_nan_and_inf_read_as_words_are_refused_as_torch_refuses_them(dtype):
    import numpy as np
    import torch

    from recurnorm.errors import QuantError
    from recurnorm.export.stream import check_finite_words
    from recurnorm.quant.passthrough import WORD_DTYPES
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
                words = (
                    t.reshape(-1).view(torch.int16 if d.itemsize == 2 else torch.int32).numpy().view(WORD_DTYPES[dtype])
                )
                expected = refusal(check_finite, t, "w")
                assert (expected is None) == (bad is None)
                assert refusal(check_finite_words, np.ascontiguousarray(words), dtype, shape, "w") == expected
