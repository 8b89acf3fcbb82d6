"""Files, checkpoints and options from issue 13: one no-clobber rule for every output, never an
input overwritten, write failures and bad inputs as one line, names escaped."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from recurnorm import io
from recurnorm.budget import Budget, pack_qtensors
from recurnorm.cli.main import main
from recurnorm.errors import ConfigError, OutputExistsError, WriteError
from recurnorm.quant.qtensor import QTensor


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(r) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return lines[0]


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    save_file({"w": torch.randn(8, 8), "b": torch.zeros(8)}, d / "model.safetensors")
    (d / "config.json").write_text('{"d_model": 8}')
    return d


@pytest.fixture
def artifact(tmp_path):
    p = tmp_path / "a.rnpk"
    p.write_bytes(pack_qtensors({"w": QTensor("raw", (3,), "int64", torch.arange(3).numpy().reshape(1, 3))}))
    return p


# ------------------------------------------------------------------ outputs


def test_report_and_junit_are_not_clobbered_without_force(artifact, tmp_path):
    for flag in ("--report", "--junit"):
        out = tmp_path / f"out{flag}"
        out.write_text("keep me")
        r = _run("verify", artifact, flag, out)
        assert r.exit_code == 2 and "--force" in _one_error_line(r)
        assert out.read_text() == "keep me"
        assert _run("verify", artifact, flag, out, "--force").exit_code == 0
        assert out.read_text() != "keep me"


@pytest.mark.parametrize("flag", ["--report", "--junit", "--summary"])
def test_verify_never_writes_over_its_artifact(artifact, flag):
    before = artifact.read_bytes()
    r = _run("verify", artifact, flag, artifact, "--force")
    assert r.exit_code == 2 and "input" in _one_error_line(r)
    assert artifact.read_bytes() == before


def test_summary_appends_to_an_existing_file(artifact, tmp_path):
    summary = tmp_path / "s.md"
    summary.write_text("earlier step\n")
    assert _run("verify", artifact, "--summary", summary).exit_code == 0
    assert summary.read_text().startswith("earlier step\n") and "recurnorm verify" in summary.read_text()


def test_pack_never_replaces_its_checkpoint(ckpt, tmp_path):
    weights = ckpt / "model.safetensors"
    before = weights.read_bytes()
    r = _run("pack", ckpt, "-o", weights, "--force")
    assert r.exit_code == 2 and "input" in _one_error_line(r)
    r = _run("pack", weights, "-o", weights, "--force")
    assert r.exit_code == 2 and weights.read_bytes() == before


def test_unpack_never_replaces_its_artifact(artifact):
    before = artifact.read_bytes()
    r = _run("unpack", artifact, "-o", artifact, "--force")
    assert r.exit_code == 2 and "input" in _one_error_line(r)
    assert artifact.read_bytes() == before


def test_an_unwritable_destination_is_one_line_naming_it(ckpt, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = _run("pack", ckpt, "-o", blocker / "x.rnpk")
    assert r.exit_code == 1 and str(blocker / "x.rnpk") in _one_error_line(r)
    r = _run("pack", ckpt, "-o", tmp_path, "--force")  # a directory
    assert r.exit_code == 2 and "directory" in _one_error_line(r) and str(tmp_path) in r.stderr  # refused up front
    r = _run("pack", ckpt, "-o", "/proc/recurnorm-test.rnpk")
    assert r.exit_code == 1 and "/proc/recurnorm-test.rnpk" in _one_error_line(r)
    if os.geteuid() != 0:  # root writes through permissions
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            r = _run("pack", ckpt, "-o", ro / "x.rnpk")
            assert r.exit_code == 1 and str(ro / "x.rnpk") in _one_error_line(r)
        finally:
            ro.chmod(0o700)
    with pytest.raises(WriteError, match="cannot write"):
        io.atomic_write_bytes(blocker / "y", b"data")


def test_a_killed_write_leaves_a_temp_file_the_next_write_removes(tmp_path):
    """kill -9 between writing the temp file and renaming it: the next write cleans up."""
    dest = tmp_path / "out.bin"
    code = (
        "import os, signal, sys\n"
        "from recurnorm import io\n"
        "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"io.atomic_write_bytes({str(dest)!r}, b'partial')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    left = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and not dest.exists()
    io.atomic_write_bytes(dest, b"whole")
    assert dest.read_bytes() == b"whole"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_a_running_writers_temp_file_is_left_alone(tmp_path):
    dest = tmp_path / "out.bin"
    mine = tmp_path / f".out.bin.{os.getppid()}.abcd.tmp"  # a live process: maybe mid-write
    mine.write_bytes(b"x")
    io.atomic_write_bytes(dest, b"whole")
    assert mine.exists()


def test_check_writable_rules(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutputExistsError, match="--force"):
        io.check_writable(f)
    assert io.check_writable(f, force=True) == f
    with pytest.raises(OutputExistsError, match="input"):
        io.check_writable(tmp_path / "." / "f", force=True, inputs=[f])


# ------------------------------------------------------------------ inputs and options


def test_code_takes_regular_files_only(ckpt, artifact, tmp_path):
    r = _run("verify", artifact, "--code", "/dev/zero")
    assert r.exit_code == 2 and "not a regular file" in _one_error_line(r)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = _run("pack", ckpt, "-o", tmp_path / "x.rnpk", "--code", fifo)
    assert r.exit_code == 2 and "not a regular file" in r.stderr
    assert not (tmp_path / "x.rnpk").exists()


def test_a_code_file_over_the_cap_is_counted_not_read(tmp_path):
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB that reading would have to allocate
    from recurnorm.budget.cap import code_bytes

    assert code_bytes([big], limit=16_000_000) == 1 << 30


def test_artifacts_are_read_as_regular_files():
    r = _run("verify", "/dev/zero")
    assert r.exit_code == 4 and "regular file" in r.stderr
    r = _run("unpack", "/dev/zero", "-o", "/dev/null/x")
    assert r.exit_code == 4 and "regular file" in _one_error_line(r)


@pytest.mark.parametrize("cmd", ["pack", "verify", "inspect"])
@pytest.mark.parametrize("cap", ["0", "-1"])
def test_caps_of_zero_or_less_are_usage_errors(cmd, cap, artifact, ckpt):
    r = _run(cmd, ckpt if cmd == "pack" else artifact, "--max-bytes", cap)
    assert r.exit_code == 2 and "--max-bytes" in r.output + r.stderr
    with pytest.raises(ConfigError):
        Budget(max_bytes=0)


def test_unsupported_checkpoint_dtypes_name_the_tensor(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    save_file({"ok": torch.zeros(2), "f8": torch.zeros(4).to(torch.float8_e4m3fn)}, d / "model.safetensors")
    r = _run("pack", d)
    assert r.exit_code == 1 and "'f8'" in _one_error_line(r) and "float8_e4m3fn" in r.stderr
    torch.save({"c": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "c.pt")
    r = _run("pack", tmp_path / "c.pt")
    assert r.exit_code == 1 and "'c'" in _one_error_line(r) and "complex64" in r.stderr


@pytest.mark.parametrize(
    "config,field",
    [("[1, 2]", "JSON object"), ('"text"', "JSON object"), ('{"qat": [1]}', "qat"), ("{nope", "not valid JSON")],
)
def test_a_malformed_config_names_the_field(ckpt, config, field):
    (ckpt / "config.json").write_text(config)
    r = _run("pack", ckpt)
    assert r.exit_code in (1, 2) and field in _one_error_line(r)


def test_pickles_are_refused_in_one_line_of_our_own(tmp_path):
    import datetime

    p = tmp_path / "obj.pt"
    with open(p, "wb") as f:
        pickle.dump({"w": datetime.date(2020, 1, 1)}, f)
    r = _run("pack", p)
    line = _one_error_line(r)
    assert r.exit_code == 1 and "never unpickles" in line and "weights_only=False" not in r.stderr


# ------------------------------------------------------------------ escaping


def test_control_characters_in_names_are_escaped_for_terminals_and_xml(tmp_path):
    name = "evil\x1b[31m\x07\x00\n\u202ename"
    art = tmp_path / "e.rnpk"
    art.write_bytes(pack_qtensors({name: QTensor("raw", (2,), "int8", torch.zeros(1, 2, dtype=torch.int8).numpy())}))
    junit, report = tmp_path / "j.xml", tmp_path / "r.json"
    r = _run("inspect", art)
    assert r.exit_code == 0 and "\x1b" not in r.output and "\\x1b" in r.output
    over = _run("verify", art, "--max-bytes", "10", "--junit", junit, "--report", report)
    assert over.exit_code == 3
    assert "\x1b" not in over.stderr and "\x07" not in over.stderr and "\u202e" not in over.stderr
    ET.parse(junit)  # valid XML
    assert json.loads(report.read_text())["artifacts"][0]["tensors"][0]["name"] == name  # JSON keeps it exact


def test_printable_keeps_text_and_escapes_controls():
    from recurnorm.display import printable

    assert printable("blocks.0.attn ü ∆") == "blocks.0.attn ü ∆"
    assert printable("a\x1b[2Jb\n") == "a\\x1b[2Jb\\n"
    assert printable("x\u202ey\udcff") == "x\\u202ey\\udcff"


def test_verify_reports_missing_files_as_before(tmp_path):
    r = _run("verify", tmp_path / "missing.rnpk")
    assert r.exit_code == 4 and "cannot read" in r.stderr
    assert Path(tmp_path / "missing.rnpk").exists() is False


def test_unpack_writes_safetensors_that_load_back(tmp_path):
    """The streaming writer: every dtype, empty and tied tensors, read by safetensors itself."""
    from helpers import write_safetensors
    from safetensors.torch import load_file

    tensors = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "f16": torch.randn(2).half(),
        "f64": torch.randn(2, dtype=torch.float64),
        "i64": torch.arange(-3, 3),
        "u8": torch.arange(4, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "u64": torch.tensor([2**63], dtype=torch.uint64),
        "scalar": torch.tensor(1.5),
        "strided": torch.randn(4, 6)[:, ::2],
    }
    tensors["tied"] = tensors["f32"]
    with open(tmp_path / "w.safetensors", "wb") as f:
        write_safetensors(f, tensors)
    back = load_file(tmp_path / "w.safetensors")
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape and torch.equal(back[name], t), name


# ------------------------------------------------------------------ round two (issue 25)


def test_unpack_never_writes_its_config_over_its_weights(ckpt, tmp_path):
    art = tmp_path / "c.rnpk"
    assert _run("pack", ckpt, "-o", art).exit_code == 0
    out = tmp_path / "u" / "config.json"
    r = _run("unpack", art, "-o", out)
    assert r.exit_code == 2 and "config.json" in _one_error_line(r)
    assert not out.exists()
    assert _run("unpack", art, "-o", tmp_path / "u" / "w.safetensors").exit_code == 0


@pytest.mark.parametrize("pair", [("--report", "--junit"), ("--report", "--summary"), ("--junit", "--summary")])
def test_verify_refuses_two_outputs_on_one_path(artifact, tmp_path, pair):
    out = tmp_path / "out"
    r = _run("verify", artifact, pair[0], out, pair[1], tmp_path / "." / "out", "--force")
    assert r.exit_code == 2 and pair[0] in _one_error_line(r) and pair[1] in r.stderr
    assert not out.exists()


def test_finetune_refuses_an_export_over_its_own_run_files(tmp_path):
    (tmp_path / "ck").mkdir()
    r = _run(
        "finetune",
        tmp_path / "ck",
        "-q",
        "int4",
        "--out",
        tmp_path / "run",
        "--export",
        tmp_path / "run" / "config.json",
    )
    assert r.exit_code == 2 and "--export" in _one_error_line(r) and "config.json" in r.stderr


def _exclusive_writer(path: str, data: bytes, start, results) -> None:
    start.wait()
    try:
        io.atomic_write_bytes(path, data, exclusive=True)
        results.put(data)
    except OutputExistsError:
        results.put(None)


def test_exclusive_writes_started_together_leave_exactly_one_winner(tmp_path):
    """No-clobber holds as the file appears: of N writers released at once, one writes and
    every other gets OutputExistsError; the file is the winner's, whole; no temp is left."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    start, results = ctx.Barrier(8), ctx.Queue()
    dest = tmp_path / "out.bin"
    procs = [
        ctx.Process(target=_exclusive_writer, args=(str(dest), bytes([i]) * 100_000, start, results)) for i in range(8)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    winners = [g for g in got if g is not None]
    assert len(winners) == 1 and dest.read_bytes() == winners[0]
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]
    io.atomic_write_bytes(dest, b"forced")  # without exclusive (--force): an atomic replace
    assert dest.read_bytes() == b"forced"


@pytest.mark.slow  # four CLI processes
def test_packs_without_force_started_together_write_exactly_once(ckpt, tmp_path):
    out = tmp_path / "x.rnpk"
    cmd = [sys.executable, "-m", "recurnorm.cli.main", "pack", str(ckpt), "-o", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    runs = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in runs) == [0, 2, 2, 2], runs
    assert all("exists" in err and "--force" in err for code, err in runs if code == 2)
    assert _run("verify", out).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".x.rnpk")) == []


def test_temp_cleanup_removes_only_its_own_stale_files(tmp_path):
    """A user's files that look like temp files stay; a killed writer's own temp goes."""
    dest = tmp_path / "out.rnpk"
    users = [".out.rnpk.99999999.tmp", ".out.rnpk.4194000.mine.tmp", f".out.rnpk.{io.TEMP_MARKER}-99999999-x.tmp"]
    for name in users:
        (tmp_path / name).write_text("mine")
    stale = tmp_path / f".out.rnpk.{io.TEMP_MARKER}-{_dead_pid()}-abcd_123.tmp"
    stale.write_text("left by a killed write")
    io.atomic_write_bytes(dest, b"new")
    assert all((tmp_path / name).read_text() == "mine" for name in users)
    assert not stale.exists() and dest.read_bytes() == b"new"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------ pack on odd inputs


def _ckpt(folder, tensors: dict, config: str | None = None):
    d = folder / "odd"
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, d / "model.safetensors")
    if config is not None:
        (d / "config.json").write_text(config)
    return d


def test_a_config_nested_thousands_deep_is_one_line(tmp_path):
    d = _ckpt(tmp_path, {"w": torch.randn(8, 8)}, '{"a":' * 3000 + "1" + "}" * 3000)
    r = _run("pack", d, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 1 and "nests" in _one_error_line(r) and "config.json" in r.stderr
    d = _ckpt(tmp_path, {"w": torch.randn(8, 8)}, '{"a":' * 70 + "1" + "}" * 70)  # valid JSON, too deep to carry
    r = _run("pack", d, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 1 and "60 levels" in _one_error_line(r)
    d = _ckpt(tmp_path, {"w": torch.randn(8, 8)}, json.dumps({"v": ["x" * 20] * 420_000}))  # 9.7 MB: too big
    r = _run("pack", d, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 1 and "8,388,608" in _one_error_line(r) and "config.json" in r.stderr


def test_a_policy_nested_thousands_deep_is_a_usage_error(ckpt, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text("rules = " + "[" * 3000 + "]" * 3000 + "\n")
    r = _run("pack", ckpt, "--policy", policy, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 2 and "nests too deeply" in _one_error_line(r)
    policy.write_text("keep_float = 5\n")
    r = _run("pack", ckpt, "--policy", policy, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 2 and "keep_float" in _one_error_line(r)


@pytest.mark.parametrize("spec", ["int4:group=" + "1" + "0" * 23, "int4:group=20000000", "int8:group=-3"])
def test_huge_integer_options_are_usage_errors(ckpt, tmp_path, spec):
    r = _run("pack", ckpt, "-q", spec, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 2 and "group" in _one_error_line(r)
    assert len(_one_error_line(r)) < 200  # a 24-digit value is shown cut


def test_a_safetensors_header_of_a_million_keys_is_refused_before_parsing(tmp_path):
    import struct

    d = tmp_path / "meta"
    d.mkdir()
    meta = {f"k{i}": "v" for i in range(300_000)}
    header = {"__metadata__": meta, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    text = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    r = _run("pack", d, "-o", tmp_path / "x.rnpk")
    assert r.exit_code == 1 and "262,144 keys" in _one_error_line(r)


@pytest.mark.slow  # a 6 MB manifest, packed and verified
def test_valid_odd_checkpoints_pack_and_verify(tmp_path):
    """A 6 MB config.json, a config nested 40 deep, tensors with a zero dimension (one of
    2^27 rows): pack writes, verify says ok, unpack reads it back; never exit 4."""
    deep = {}
    node = deep
    for _ in range(39):
        node["a"] = node = {}
    configs = {
        "big": json.dumps({"vocab": [f"tok{i:07d}" for i in range(480_000)]}),
        "deep": json.dumps(deep),
    }
    tensors = {
        "w": torch.randn(8, 8),
        "rows": torch.zeros(1 << 27, 0),
        "cols": torch.zeros(0, 7),
        "mask": torch.zeros(3, 0, dtype=torch.bool),
    }
    for name, config in configs.items():
        d = _ckpt(tmp_path / name, tensors, config)
        art = tmp_path / f"{name}.rnpk"
        r = _run("pack", d, "-o", art)
        assert r.exit_code == 0, r.stderr
        assert _run("verify", art).exit_code == 0
        out = tmp_path / name / "u" / "w.safetensors"
        assert _run("unpack", art, "-o", out).exit_code == 0
        from safetensors.torch import load_file

        back = load_file(str(out))
        assert back["rows"].shape == (1 << 27, 0) and back["mask"].dtype == torch.bool
        assert json.loads((out.parent / "config.json").read_text()) == json.loads(config)
    assert len(configs["big"]) > 6_000_000


def test_names_and_values_readers_refuse_are_refused_at_pack(tmp_path):
    d = _ckpt(tmp_path, {"__metadata__x": torch.ones(2), "w": torch.randn(4, 4)})
    assert _run("pack", d, "-o", tmp_path / "ok.rnpk").exit_code == 0
    import numpy as np

    from recurnorm.errors import QuantError

    for name in ("__metadata__", "\ud800"):
        with pytest.raises(QuantError, match="rename it"):
            pack_qtensors({name: QTensor("raw", (3,), "int64", np.arange(3).reshape(1, 3))})
    w = torch.randn(8, 8).half()
    w[0, 0] = 65504  # int8's fp16 scale lands past float16's range: refused, with the way out
    d = _ckpt(tmp_path / "h", {"w": w})
    r = _run("pack", d, "-o", tmp_path / "h.rnpk")
    assert r.exit_code == 1 and "--keep-float 'w'" in _one_error_line(r)
    assert _run("pack", d, "-o", tmp_path / "h.rnpk", "--keep-float", "w").exit_code == 0
