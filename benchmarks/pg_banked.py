"""The best Parameter Golf record's own model and export vs recurnorm on its banked checkpoint.

openai/parameter-golf ``records/track_10min_16mb/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_
9HpStack_1.0611/train_gpt.py`` is read from a local clone or mirror of that repository (the
environment's PG_MIRROR; nothing is downloaded) into the benchmarks' cache folder
($RECURNORM_BENCH_CACHE, default ~/.cache/recurnorm-bench: pg_0427/), imported with flash-attention replaced by PyTorch's attention
and triton by a stub (never called: the fused paths are off on CPU), and its ``GPT`` is built
on CPU through its own hyperparameters (its README's command line, scaled down by the
environment variables in SCALED: 3 layers of width 384, 6 heads / 3 KV heads, MLP 3x, a
256-token byte vocabulary, sequences of 128). It is trained briefly (its own Muon and AdamW, at its learning rates) on
recurnorm's default corpus (CPython's documentation as bytes, which no one tuned this on),
saved banked as the record saves it, and exported twice:

- the record's own code run directly: its ``collect_hessians`` (16 calibration batches, the
  README's GPTQ_CALIBRATION_BATCHES), ``_unbank_state_dict``, ``gptq_mixed_quantize`` (GPTQ,
  SDClip per role, int7 embedding, int8 gates, asymmetric LQER on the top 3), its README's
  ``COMPRESSOR=pergroup`` (``lrzip -z -L 9`` per group after its row sort, brotli-11 the rest;
  where lrzip is not installed, its torch.save + brotli-11 path, and the output says so),
  ``dequantize_mixed`` and ``_rebank_state_dict``;
- ``recurnorm pack banked.safetensors -q @pg-record --gptq`` on the banked file, the model
  built by this file's ``build`` (``--model-factory``), calibrated on the same 32,768
  training tokens;
- ``recurnorm pack banked.safetensors --fit RECORD_BYTES --gptq`` with pack's defaults
  (candidates and sensitivities; ``--fit-sensitivity fisher`` bounds the time on 2 cores);
- between them, ``-q @pg-record --gptq --hessians`` on the record's own Hessians, which
  leaves GPTQ itself as the only difference.

It prints per-tensor bit equality against the record's dequantized weights, the
Hessian-weighted output error ‖(W−Ŵ)X‖²/‖WX‖² per group under the record's own Hessians,
bytes, wall time and validation bits per byte (byte tokens: bpb = loss / ln 2).

    PG_MIRROR=path/to/parameter-golf nice -n 10 python benchmarks/pg_banked.py [--steps 600] [--skip-fit] [--reuse]
        [--fit-sensitivity fisher]

--smoke: 2 training steps and the @pg-record pack alone (no --fit) when the record's script is
cached or PG_MIRROR is set; otherwise a note that it is skipped (the script is another project's,
not in this repository). Even then it takes a minute or more: the record's model is not shrunk.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

RECORD = "records/track_10min_16mb/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611/train_gpt.py"
MIRROR = os.environ.get("PG_MIRROR")  # a clone or bare mirror of openai/parameter-golf
CACHE = benchkit.CACHE / "pg_0427"
# The README's command line (the settings its export reads) ...
README = {
    "EMBED_BITS": "7",
    "MLP_CLIP_SIGMAS": "11.5",
    "ATTN_CLIP_SIGMAS": "13.0",
    "EMBED_CLIP_SIGMAS": "14.0",
    "GPTQ_CALIBRATION_BATCHES": "16",
    "GATED_ATTN_QUANT_GATE": "1",
    "SPARSE_ATTN_GATE_ENABLED": "1",
    "SPARSE_ATTN_GATE_SCALE": "0.5",
    "GATE_WINDOW": "12",
    "SMEAR_GATE_ENABLED": "1",
    "LQER_ENABLED": "1",
    "LQER_ASYM_ENABLED": "1",
    "LQER_RANK": "4",
    "LQER_FACTOR_BITS": "4",
    "LQER_ASYM_GROUP": "64",
    "LQER_TOP_K": "3",
    "COMPRESSOR": "brotli",
}
# ... scaled down through its own hyperparameters (every matrix still over its 65,536-value
# fp16 threshold, so that each is GPTQ'd as at full size)
SCALED = {
    "VOCAB_SIZE": "256",
    "NUM_LAYERS": "3",
    "MODEL_DIM": "384",
    "NUM_HEADS": "6",
    "NUM_KV_HEADS": "3",
    "MLP_MULT": "3",
    "TRAIN_SEQ_LEN": "128",
    "EVAL_SEQ_LEN": "128",
    "ROPE_TRAIN_SEQ_LEN": "128",
    "XSA_LAST_N": "3",
    "NUM_LOOPS": "1",
    "LOOP_START": "1",
    "LOOP_END": "1",
    "PARALLEL_START_LAYER": "2",
    "FUSED_CE_ENABLED": "0",
    "TRAIN_BATCH_TOKENS": "2048",
}
SEQ, CALIB_TOKENS = 128, 32768
GROUPS = ("tok_emb", "c_q", "c_k", "c_v", "mlp.proj", "attn.proj", "fc")  # mlp.proj before attn.proj


def script_path() -> Path:
    """The record's train_gpt.py, copied from the mirror into the cache once."""
    out = CACHE / "train_gpt.py"
    if not out.exists():
        if not MIRROR:
            raise SystemExit(f"{out} is missing: set PG_MIRROR to a clone of openai/parameter-golf to copy it")
        CACHE.mkdir(parents=True, exist_ok=True)
        text = subprocess.run(
            ["git", "-C", str(MIRROR), "show", f"HEAD:{RECORD}"], check=True, capture_output=True
        ).stdout
        out.write_bytes(text)
    return out


def _stubs() -> None:
    """flash_attn_interface on PyTorch attention; triton as names that are never run."""

    def flash_attn_func(q, k, v, causal=True):  # [B, T, H, D] as flash-attention takes them
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True
        )
        return y.transpose(1, 2)

    def unavailable(*_a, **_k):
        raise RuntimeError("flash_attn_varlen_func is not available on CPU")

    fa = types.ModuleType("flash_attn_interface")
    fa.flash_attn_func, fa.flash_attn_varlen_func = flash_attn_func, unavailable

    class Anything(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return object

    triton = Anything("triton")
    triton.jit = lambda fn=None, **_kw: fn if fn is not None else (lambda f: f)
    triton.cdiv = lambda a, b: -(-a // b)
    lang, tools, desc = (
        Anything("triton.language"),
        Anything("triton.tools"),
        Anything("triton.tools.tensor_descriptor"),
    )
    triton.language, triton.tools, tools.tensor_descriptor = lang, tools, desc
    sys.modules.update(
        {
            "flash_attn_interface": fa,
            "triton": triton,
            "triton.language": lang,
            "triton.tools": tools,
            "triton.tools.tensor_descriptor": desc,
        }
    )


def record_module():
    """The record's train_gpt.py as a module, its hyperparameters from README + SCALED."""
    if "pg_record_0427" in sys.modules:
        return sys.modules["pg_record_0427"]
    os.environ.update({**README, **SCALED})
    spec = importlib.util.spec_from_file_location("pg_record_0427", script_path())
    mod = importlib.util.module_from_spec(spec)
    saved, modules = torch.compile, dict(sys.modules)
    _stubs()
    torch.compile = lambda fn=None, **_kw: fn if fn is not None else (lambda f: f)  # eager on CPU
    try:
        spec.loader.exec_module(mod)
    finally:  # the stubs only for its import: torch must not take them for triton
        torch.compile = saved
        for name in (
            "flash_attn_interface",
            "triton",
            "triton.language",
            "triton.tools",
            "triton.tools.tensor_descriptor",
        ):
            sys.modules.pop(name, None)
            if name in modules:
                sys.modules[name] = modules[name]
    mod.BOS_ID = 1  # what its data loaders set (byte 1 never occurs in the corpus)
    sys.modules["pg_record_0427"] = mod
    return mod


def build(config=None):
    """--model-factory: the record's GPT (fp32, CPU), forward(x, y) -> its mean loss."""
    mod = record_module()
    model = mod.GPT(mod.Hyperparameters())
    for block in model.blocks:
        block.mlp.use_fused = False  # its triton MLP kernel: the plain path is the same math
    model.seq_len = SEQ
    return model


class Windows:
    """The record's loader interface (next_batch) over fixed training windows."""

    def __init__(self, tokens: np.ndarray, batch: int = 16):
        toks = torch.as_tensor(tokens[: CALIB_TOKENS + 1].astype(np.int64))
        self.x = toks[:CALIB_TOKENS].reshape(-1, SEQ)
        self.batch, self.i = batch, 0

    def next_batch(self, *_args):
        x = self.x[self.i : self.i + self.batch]
        self.i += self.batch
        return x, None


@torch.no_grad()
def bpb(model, val: np.ndarray, n_tokens: int = 16384) -> float:
    toks = torch.as_tensor(val[: n_tokens + 1].astype(np.int64))
    n = (toks.numel() - 1) // SEQ
    x, y = toks[: n * SEQ].reshape(n, SEQ), toks[1 : n * SEQ + 1].reshape(n, SEQ)
    model.eval()
    loss = sum(float(model(x[i : i + 8], y[i : i + 8])) * len(x[i : i + 8]) for i in range(0, n, 8)) / n
    return loss / math.log(2)


def train(model, tokens: np.ndarray, steps: int, seed: int = 0):
    """The record's own optimizers at its own learning rates: its Muon on the four banks, AdamW on
    the tied embedding and on every other parameter; 20 warm-up steps, the last 30% warmed down.
    (AdamW on everything, lr 2e-3, left a model whose int6 gap was +0.0002 bpb: too small to
    rank exports by; Muon's reaches 2.13 bpb in 600 steps, where its gap is +0.0035.)"""
    mod = record_module()
    h = mod.Hyperparameters()
    banks = [model.qo_bank, model.kv_bank, model.mlp_up_bank, model.mlp_down_bank]
    apart = {id(p) for p in banks} | {id(model.tok_emb.weight)}
    rest = [p for p in model.parameters() if id(p) not in apart]
    adam = {"betas": (h.beta1, h.beta2), "eps": h.adam_eps}
    opts = [
        mod.Muon(
            banks,
            lr=h.matrix_lr,
            momentum=h.muon_momentum,
            backend_steps=h.muon_backend_steps,
            weight_decay=h.muon_wd,
            row_normalize=h.muon_row_normalize,
        ),
        torch.optim.AdamW([model.tok_emb.weight], lr=h.tied_embed_lr, weight_decay=h.embed_wd, **adam),
        torch.optim.AdamW(rest, lr=h.scalar_lr, weight_decay=h.adam_wd, **adam),
    ]
    base = [[group["lr"] for group in o.param_groups] for o in opts]
    g = torch.Generator().manual_seed(seed)
    toks = torch.as_tensor(tokens.astype(np.int64))
    model.train()
    for step in range(steps):
        frac = min(1.0, (step + 1) / 20) * min(1.0, (steps - step) / (0.3 * steps))
        for o, lrs in zip(opts, base, strict=True):
            for group, lr in zip(o.param_groups, lrs, strict=True):
                group["lr"] = lr * frac
        starts = torch.randint(0, toks.numel() - SEQ - 1, (8,), generator=g)
        w = torch.stack([toks[s : s + SEQ + 1] for s in starts])
        loss = model(w[:, :-1], w[:, 1:])
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"  step {step + 1}/{steps} loss {loss.item():.3f}", file=sys.stderr, flush=True)
    return model.eval()


def group_of(name: str) -> str | None:
    for g in GROUPS:
        if f".{g}." in name or name.startswith(g):
            return g
    return None


def weighted_error(W, W_hat, H) -> tuple[float, float]:
    D = W.double() - W_hat.double()
    Hd = H.double()
    return float(torch.einsum("ij,jk,ik->", D, Hd, D)), float(torch.einsum("ij,jk,ik->", W.double(), Hd, W.double()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--skip-fit", action="store_true")
    ap.add_argument("--fit-sensitivity", choices=["direct", "fisher", "hessian"], help="default: pack's own")
    ap.add_argument("--reuse", action="store_true", help="the cached banked checkpoint instead of training")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        if not MIRROR and not (CACHE / "train_gpt.py").exists():
            benchkit.skipped("pg_banked", "the record's train_gpt.py is not cached and PG_MIRROR is not set")
            return
        args.steps, args.skip_fit = 2, True
    torch.manual_seed(0)
    torch.set_num_threads(2)
    from recurnorm.train.data import load_corpus

    corpus = load_corpus("default")
    mod = record_module()
    h = mod.Hyperparameters()
    model = build()
    n_params = sum(p.numel() for p in model.parameters())
    CACHE.mkdir(parents=True, exist_ok=True)
    banked = CACHE / "banked.safetensors"
    from safetensors.torch import load_file, save_file

    t = time.perf_counter()
    if args.reuse and banked.exists():
        model.load_state_dict(load_file(str(banked)))
        model.eval()
    else:
        print(f"record GPT on CPU: {n_params:,} parameters; training {args.steps} steps", file=sys.stderr)
        train(model, corpus.train_tokens, args.steps)
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(banked))
    train_s = time.perf_counter() - t
    pre = bpb(model, corpus.val_tokens)

    # -- the record's own export, run directly
    t = time.perf_counter()
    hessians = mod.collect_hessians(model, Windows(corpus.train_tokens), h, torch.device("cpu"), 16)
    sd_flat = mod._unbank_state_dict(model.state_dict(), h.num_layers)
    result, meta = mod.gptq_mixed_quantize(sd_flat, hessians, h)
    if shutil.which("lrzip"):  # its README's COMPRESSOR=pergroup: lrzip -z -L 9 per group, brotli the rest
        compressor = "pergroup (lrzip)"
        with tempfile.TemporaryDirectory(prefix="pgrp_") as tmp:
            record_bytes = len(mod._serialize_pergroup(result, meta, h.num_layers, tmp))
    else:
        compressor = "brotli (lrzip is not installed: apt-get install lrzip for the record's pergroup)"
        buf = io.BytesIO()
        torch.save({"w": result, "m": meta}, buf)
        record_bytes = len(mod._compress(buf.getvalue(), "brotli"))
    record_s = time.perf_counter() - t
    hessians_file = CACHE / "record_hessians.safetensors"  # (for the run that isolates GPTQ itself)
    save_file({n: H.float().contiguous() for n, H in hessians.items()}, str(hessians_file))
    rec_flat = mod.dequantize_mixed(result, meta, sd_flat)
    hidden = h.model_dim * h.mlp_mult
    kv_dim = h.model_dim // h.num_heads * h.num_kv_heads
    rec_banked = mod._rebank_state_dict(rec_flat, h.num_layers, h.model_dim, kv_dim, int(hidden))
    rec_model = build()
    rec_model.load_state_dict(rec_banked)
    rec_bpb = bpb(rec_model, corpus.val_tokens)
    print(
        f"pre {pre:.4f} bpb; record export ({compressor}) {record_bytes:,} B in {record_s:.1f} s, {rec_bpb:.4f} bpb",
        file=sys.stderr,
    )

    # -- recurnorm on the banked checkpoint
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    factory = f"{Path(__file__).resolve()}:build"
    calib = ["--calib-data", "default", "--calib-tokens", str(CALIB_TOKENS), "--model-factory", factory]
    from recurnorm.budget.api import read_artifact
    from recurnorm.quant import dequantize_all

    rows = []
    lq = {n for n, m in meta.items() if "lqer" in m}

    def analyse(label, out, wall, policy, shown):
        data = out.read_bytes()
        deq = dequantize_all(read_artifact(data).qtensors)
        ours_flat = mod._unbank_state_dict(
            {k: v for k, v in deq.items() if not k.endswith((".lqer_l", ".lqer_r"))}, h.num_layers
        )
        equal = sum(torch.equal(ours_flat[n].float(), rec_flat[n].float()) for n in rec_flat)
        differ = [n for n in rec_flat if n not in lq and not torch.equal(ours_flat[n].float(), rec_flat[n].float())]
        equal_non_lqer = len(rec_flat) - len(lq) - len(differ)
        per = {}
        for n, H in hessians.items():
            g = group_of(n)
            W = sd_flat[n].float()
            a, base = weighted_error(W, ours_flat[n].float(), H)
            b, _ = weighted_error(W, rec_flat[n].float(), H)
            acc = per.setdefault(g, [0.0, 0.0, 0.0])
            acc[0] += a
            acc[1] += b
            acc[2] += base
        m = build()
        m.load_state_dict({k: v.float() for k, v in deq.items() if k in m.state_dict()})
        row = {
            "run": label,
            "command": shown,
            "bytes": len(data),
            "wall_s": round(wall, 1),
            "bpb": round(bpb(m, corpus.val_tokens), 4),
            "equal": f"{equal}/{len(rec_flat)}",
            "equal_non_lqer": f"{equal_non_lqer}/{len(rec_flat) - len(lq)}",
            "differ_non_lqer": differ if len(differ) <= 3 else f"{len(differ)} tensors",
            "error_vs_record": {
                g: f"{v[0] / v[2]:.3g} vs {v[1] / v[2]:.3g} ({v[0] / v[1]:.4f}x)" for g, v in per.items()
            },
            "policy": policy,
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    # Our calibration (the default corpus's first CALIB_TOKENS) and the record's own Hessians:
    # the second leaves only GPTQ itself to differ.
    cmds = {
        "@pg-record --gptq": ["-q", "@pg-record", "--gptq", *calib],
        "@pg-record --gptq --hessians (the record's)": ["-q", "@pg-record", "--gptq", "--hessians", str(hessians_file)],
    }
    if not args.skip_fit:
        sensitivity = ["--fit-sensitivity", args.fit_sensitivity] if args.fit_sensitivity else []
        cmds["--fit record bytes --gptq"] = ["--fit", str(record_bytes), "--gptq", *sensitivity, *calib]
    for i, (label, extra) in enumerate(cmds.items()):
        out = CACHE / f"run{i}.rnpk"
        cmd = [
            sys.executable,
            "-m",
            "recurnorm.cli.main",
            "pack",
            str(banked),
            *extra,
            "-o",
            str(out),
            "--force",
        ]
        t = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if r.returncode:
            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
            print(f"{label}: exit {r.returncode}", file=sys.stderr)
            continue
        policy = next((ln for ln in r.stdout.splitlines() if ln.startswith("export policy")), "")
        print(f"{label}: {out.stat().st_size:,} B in {wall:.1f} s; {policy}", file=sys.stderr, flush=True)
        analyse(
            label,
            out,
            wall,
            policy,
            " ".join(["recurnorm pack", "banked.safetensors", *extra]).replace(factory, "pg_banked.py:build"),
        )

    print(
        json.dumps(
            {
                "params": n_params,
                "train_steps": args.steps,
                "train_s": round(train_s, 1),
                "bpb_pre": round(pre, 4),
                "record": {
                    "compressor": compressor,
                    "bytes": record_bytes,
                    "wall_s": round(record_s, 1),
                    "bpb": round(rec_bpb, 4),
                    "lqer": sorted(lq),
                },
                "recurnorm": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
