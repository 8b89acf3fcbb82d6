"""verify, the CI size gate, and inspect read and check an artifact with numpy alone: importing
torch took 1.2 s of the 1.6 s verify of a 1.7 MB artifact (recurnorm/lazy.py). Run in a fresh
interpreter, since this one has torch already."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
