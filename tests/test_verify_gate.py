"""recurnorm verify as a CI gate: JUnit XML, JSON report, job summary, several artifacts, loss gate, model factory."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from recurnorm.cli.main import main

REPO = Path(__file__).resolve().parents[1]
FACTORY = str(Path(__file__).with_name("foreign_model.py")) + ":build"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one torch thread is fastest and does not fight other jobs for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _small_text(path: Path) -> Path:
    """~25 KB of pydoc topics, blank-line separated: a quick validation split."""
    from recurnorm.train.data import default_documents

    docs = [" ".join(d.split())[:500] for d in default_documents()[:60]]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tiny trained RecurrentLM checkpoint, its int8 and ternary artifacts, a corrupt one and the data file."""
    from recurnorm.model import ModelConfig, save_checkpoint
    from recurnorm.train.config import TrainConfig
    from recurnorm.train.data import load_corpus
    from recurnorm.train.loop import train

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("gate")
    text = _small_text(d / "val.txt")
    corpus = load_corpus(str(text))
    config = ModelConfig(d_model=32, n_heads=2, depth=2, seq_len=32, scheme="norm")
    hp = TrainConfig(steps=80, batch_size=16, lr=5e-3, warmup=10, seed=0, log_every=1000)
    model = train(config, corpus, hp, progress=False).model
    ckpt = save_checkpoint(model.eval(), d / "ckpt")
    arts = {}
    for q in ("int8", "ternary"):
        arts[q] = d / f"{q}.rnpk"
        # Tiny tensors stay float by default; make ternary bite everywhere.
        r = _run("pack", ckpt, "-q", q, "-o", arts[q], "--keep-float-max-numel", 0 if q == "ternary" else 65536)
        assert r.exit_code == 0, r.output
    data = arts["int8"].read_bytes()
    arts["corrupt"] = d / "corrupt.rnpk"
    arts["corrupt"].write_bytes(data[:-10] + bytes([data[-10] ^ 0x40]) + data[-9:])
    return {"dir": d, "ckpt": ckpt, "text": text, "corpus": corpus, **arts}


def _junit(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases)
        assert int(suite.get("errors")) == sum(c.find("error") is not None for c in cases)
        assert int(suite.get("skipped")) == sum(c.find("skipped") is not None for c in cases)
        for c in cases:
            assert c.get("name") and c.get("classname")
    for key in ("tests", "failures", "errors", "skipped"):
        assert int(root.get(key)) == sum(int(s.get(key)) for s in root.findall("testsuite"))
    return root


def test_several_artifacts_json_report_junit(env, tmp_path):
    rep, junit = tmp_path / "out" / "r.json", tmp_path / "j.xml"
    r = _run("verify", env["int8"], env["corrupt"], env["ternary"], "--json", "--report", rep, "--junit", junit)
    assert r.exit_code == 4  # one corrupt artifact decides the exit code
    doc = json.loads(rep.read_text())
    assert doc == json.loads(r.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 4
    assert [a["exit_code"] for a in doc["artifacts"]] == [0, 4, 0]
    assert doc["artifacts"][0]["cap"]["headroom_bytes"] > 0
    assert [c["status"] for c in doc["artifacts"][1]["checks"]] == ["failed", "skipped"]
    root = _junit(junit)
    assert [s.get("name") for s in root.findall("testsuite")] == [str(env[k]) for k in ("int8", "corrupt", "ternary")]
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("6", "1", "0", "1")
    fail = root.find("testsuite[2]/testcase[@name='integrity']/failure")
    assert "checksum" in fail.get("message") and fail.get("type") == "ArtifactError"

    # Over the cap: exit 3, the size cap testcase fails, the summary says how many bytes are missing.
    size = env["int8"].stat().st_size
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    again = _run("verify", env["int8"], "--max-bytes", size - 100, "--junit", junit)
    assert again.exit_code == 2 and "--force" in again.output  # junit exists: no clobber
    r = _run("verify", env["int8"], "--max-bytes", size - 100, "--junit", junit, "--summary", summary, "--force")
    assert r.exit_code == 3
    root = _junit(junit)
    assert root.get("failures") == "1"
    assert "exceed the cap" in root.find(".//testcase[@name='size cap']/failure").get("message")
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, as $GITHUB_STEP_SUMMARY is
    assert "over the cap" in text and "bytes missing" in text and f"{size:,}" in text and "**100**" in text
    assert "bits/weight" in text and "| `" in text

    # Over the cap beats nothing; corrupt beats over the cap.
    r = _run("verify", env["int8"], env["corrupt"], "--max-bytes", size - 100)
    assert r.exit_code == 4


def test_loss_gate_fails_damaged_passes_good(env, tmp_path):
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    gate = ("--reference", env["ckpt"], "--data", env["text"], "--max-loss-delta", "0.01")
    r = _run("verify", env["int8"], *gate, "--summary", summary)
    assert r.exit_code == 0, r.output
    assert "loss gate: artifact" in r.output
    r = _run("verify", env["ternary"], *gate)
    assert r.exit_code == 5, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and "regressed" in r.stderr
    r = _run(
        "verify", env["int8"], env["ternary"], env["corrupt"], *gate, "--junit", junit, "--summary", summary, "--json"
    )
    assert r.exit_code == 4  # corrupt outranks the loss regression
    doc = json.loads(r.stdout)
    a, t, c = doc["artifacts"]
    assert a["loss_gate"]["passed"] and a["exit_code"] == 0 and abs(a["loss_gate"]["delta"]) < 0.01
    assert not t["loss_gate"]["passed"] and t["exit_code"] == 5 and t["loss_gate"]["delta"] > 0.01
    assert c["loss_gate"] is None
    root = _junit(junit)
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("9", "2", "2")
    assert root.find("testsuite[2]/testcase[@name='loss gate']/failure").get("type") == "LossRegressionError"
    r = _run("verify", env["int8"], env["ternary"], *gate)
    assert r.exit_code == 5
    text = summary.read_text()
    assert text.count("**Loss gate** ✅") == 2 and "**Loss gate** ❌" in text and "loss regression" in text


def test_usage_errors(env, tmp_path):
    assert _run("verify", env["int8"], "--reference", env["ckpt"]).exit_code == 2
    assert _run("verify", env["int8"], "--max-loss-delta", "0.1").exit_code == 2
    assert _run("verify", env["int8"], "--model-factory", FACTORY).exit_code == 2
    assert _run("verify", env["int8"], "--reference", env["ckpt"], "--max-loss-delta", "-1").exit_code == 2
    assert _run("verify").exit_code == 2
    r = _run(
        "verify",
        env["int8"],
        "--reference",
        env["ckpt"],
        "--max-loss-delta",
        "0.1",
        "--model-factory",
        "no_such_module_xyz:build",
    )
    assert r.exit_code == 2 and "no_such_module_xyz" in r.output
    # A data error is reported for the loss gate (exit 1) while the report is still written.
    rep = tmp_path / "r.json"
    r = _run(
        "verify",
        env["int8"],
        "--reference",
        env["ckpt"],
        "--max-loss-delta",
        "0.1",
        "--data",
        tmp_path / "missing.txt",
        "--report",
        rep,
    )
    assert r.exit_code == 1
    doc = json.loads(rep.read_text())
    assert doc["artifacts"][0]["checks"][-1]["status"] == "error"
    assert "does not exist" in doc["artifacts"][0]["loss_gate_error"]


@pytest.fixture(scope="module")
def foreign(env):
    """A TinyGPT (not a RecurrentLM) trained a few steps, saved as a .pt state dict, packed int8 and ternary."""
    import foreign_model

    torch.manual_seed(0)
    model = foreign_model.build(None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.as_tensor(env["corpus"].train_tokens, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        starts = torch.randint(0, tokens.numel() - 33, (16,), generator=g)
        batch = torch.stack([tokens[s : s + 33] for s in starts.tolist()])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    d = env["dir"] / "foreign"
    d.mkdir()
    torch.save(model.state_dict(), d / "ref.pt")
    arts = {}
    for q in ("int8", "ternary"):
        arts[q] = d / f"{q}.rnpk"
        r = _run("pack", d / "ref.pt", "-q", q, "-o", arts[q], "--keep-float-max-numel", 0 if q == "ternary" else 65536)
        assert r.exit_code == 0, r.output
    return d / "ref.pt", arts


def test_model_factory_foreign_baseline(env, foreign, tmp_path):
    ref, arts = foreign
    gate = ("--reference", ref, "--data", env["text"], "--max-loss-delta", "0.01", "--model-factory", FACTORY)
    r = _run("verify", arts["int8"], *gate, "--json")
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)["artifacts"][0]["loss_gate"]
    assert g["passed"] and 1.0 < g["bpb_reference"] < 8.0
    r = _run("verify", arts["ternary"], *gate)
    assert r.exit_code == 5, r.output
    # module:function form, the tests folder being importable under pytest.
    r = _run("verify", arts["int8"], *gate[:-1], "foreign_model:build")
    assert r.exit_code == 0, r.output
    # Without the factory the artifact cannot be rebuilt as a RecurrentLM: unsupported, not a pass.
    r = _run("verify", arts["int8"], *gate[:-2])
    assert r.exit_code == 4 and "no model config" in r.stderr
    # A factory whose model does not fit the tensors is named as such.
    r = _run(
        "verify",
        env["int8"],
        "--reference",
        env["ckpt"],
        "--data",
        env["text"],
        "--max-loss-delta",
        "0.01",
        "--model-factory",
        FACTORY,
    )
    assert r.exit_code != 0 and "the model factory failed" in r.stderr and "d_model" in r.stderr
    # Same config, other shapes: the strict load names the misfit.
    wide = arts["int8"].with_name("wide.pt")
    torch.save(foreign_model_state(n_embd=64), wide)
    r = _run(
        "verify",
        arts["int8"],
        "--reference",
        wide,
        "--data",
        env["text"],
        "--max-loss-delta",
        "0.01",
        "--model-factory",
        FACTORY,
    )
    assert r.exit_code == 1 and "do not fit the factory's model" in r.stderr


def foreign_model_state(**overrides) -> dict:
    """A random TinyGPT state dict with some sizes changed."""
    import foreign_model

    return foreign_model.TinyGPT(**{**foreign_model.DEFAULTS, **overrides}).state_dict()


def _write_shards(d: Path, train_tokens, val_tokens) -> str:
    from recurnorm.train.shards import write_shard

    d.mkdir(parents=True, exist_ok=True)
    write_shard(d / "fineweb_train_000000.bin", np.asarray(train_tokens, dtype=np.uint16))
    write_shard(d / "fineweb_val_000000.bin", np.asarray(val_tokens, dtype=np.uint16))
    return f"shards:{d}/fineweb_*.bin"


def test_gate_on_byte_shards(env, tmp_path):
    c = env["corpus"]
    spec = _write_shards(tmp_path / "bytes", c.train_tokens, c.val_tokens)
    r = _run("verify", env["int8"], "--reference", env["ckpt"], "--data", spec, "--max-loss-delta", "0.01", "--json")
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)["artifacts"][0]["loss_gate"]
    assert g["data"].startswith("shards:") and g["val_bytes"] == c.val_tokens.size - 1


@pytest.mark.slow  # evaluates on real SP8192 shards
def test_gate_on_sentencepiece_shards(env, tmp_path, sp8192_model):
    from recurnorm.model import ModelConfig, save_checkpoint
    from recurnorm.train.config import TrainConfig
    from recurnorm.train.data import load_corpus
    from recurnorm.train.loop import train
    from recurnorm.train.sentencepiece import SentencePieceTokenizer

    tok = SentencePieceTokenizer(sp8192_model)
    docs = env["text"].read_text(encoding="utf-8").split("\n\n")
    ids = [[tok.bos_id, *tok.encode(doc)] for doc in docs]
    cut = int(len(ids) * 0.8)
    spec = _write_shards(tmp_path / "sp", sum(ids[:cut], []), sum(ids[cut:], []))
    corpus = load_corpus(spec, tokenizer=str(sp8192_model))
    assert corpus.vocab_size == 8192 and int(corpus.val_bytes.sum()) > corpus.val_tokens.size  # pieces span bytes
    config = ModelConfig(vocab_size=8192, d_model=32, n_heads=2, depth=2, seq_len=32, scheme="norm")
    hp = TrainConfig(steps=30, batch_size=8, lr=5e-3, warmup=5, seed=0, log_every=1000)
    model = train(config, corpus, hp, progress=False).model
    ckpt = save_checkpoint(model.eval(), tmp_path / "ckpt")
    art = tmp_path / "sp.rnpk"
    assert _run("pack", ckpt, "-q", "int8", "-o", art).exit_code == 0
    gate = ("--reference", ckpt, "--data", spec, "--max-loss-delta", "0.01")
    r = _run("verify", art, *gate, "--tokenizer", sp8192_model, "--json")
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)["artifacts"][0]["loss_gate"]
    assert g["passed"] and g["val_bytes"] == int(corpus.val_bytes[1:].sum())
    # Without the tokenizer the shards' bytes are unknown: an input error, not a silent pass.
    r = _run("verify", art, *gate)
    assert r.exit_code == 1 and "--tokenizer" in r.stderr
