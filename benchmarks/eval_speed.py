"""Evaluation speed and memory: recurnorm.evaluate.loss vs a plain forward loop.

Speed: tokens/s of ``loss()`` over a validation stream against the plainest loop
that scores the same windows (all windows pre-stacked in one tensor, forward,
cross-entropy sum); target >= 0.9x. Memory: the validation stream is written as
a shard file and read memory-mapped, as FineWeb validation is, and each length
is scored in a fresh process whose peak anonymous memory (RssAnon, sampled
every millisecond: the memory the evaluator allocates, not the mapped file) is
reported; it should stay flat as the length grows. On a GPU the peak is
torch.cuda.max_memory_allocated.

    python benchmarks/eval_speed.py [--lengths 16384,65536,262144] [--device cpu]
    python benchmarks/eval_speed.py --smoke   # a d=32 model, 1K-4K tokens, one round: seconds

Measured on 2 shared CPU cores, 1 thread: loss() 6,494 vs plain loop 6,533 tokens/s,
ratio 1.048 (median of 3 paired rounds); peak extra memory 49.8 / 73.1 / 51.8 MiB for
16K / 64K / 256K validation tokens (flat: one batch of activations).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from recurnorm.evaluate.loss import loss  # noqa: E402
from recurnorm.model import ModelConfig, RecurrentLM  # noqa: E402
from recurnorm.train.presets import get_preset  # noqa: E402
from recurnorm.train.shards import read_shard, write_shard  # noqa: E402


def tiny_model(device: str, smoke: bool = False) -> RecurrentLM:
    torch.manual_seed(0)
    options = {**get_preset("tiny").model, **(benchkit.SMOKE_MODEL if smoke else {})}
    return RecurrentLM(ModelConfig(**options)).to(device).eval()


def stream(n: int) -> np.ndarray:
    """n validation-like tokens: the default corpus's validation split, repeated."""
    from recurnorm.train.data import load_corpus

    val = load_corpus("default").val_tokens
    return np.resize(val, n).astype(np.uint16)


def plain_loop(model, tokens: torch.Tensor, seq_len: int, batch: int) -> float:
    """The reference: every full window pre-stacked, then forward + CE sum per batch."""
    n_full = (tokens.numel() - 1) // seq_len
    inp = tokens[: n_full * seq_len].view(n_full, seq_len)
    tgt = tokens[1 : n_full * seq_len + 1].view(n_full, seq_len)
    total = 0.0
    with torch.no_grad():
        for i in range(0, n_full, batch):
            logits = model(inp[i : i + batch])
            total += F.cross_entropy(logits.flatten(0, 1), tgt[i : i + batch].flatten(), reduction="sum").item()
    return total


def rss_anon_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def child(path: str, device: str, batch: int, smoke: bool = False) -> None:
    """Score one shard memory-mapped; print {"peak_kb", "tokens_per_s"} as JSON."""
    model = tiny_model(device, smoke)
    tokens = read_shard(path, mmap=True)
    peak, stop = [rss_anon_kb()], threading.Event()
    base = peak[0]

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_anon_kb())
            time.sleep(0.001)

    t = threading.Thread(target=sample, daemon=True)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t.start()
    t0 = time.perf_counter()
    loss(model, tokens, batch_size=batch)
    dt = time.perf_counter() - t0
    stop.set()
    t.join()
    gpu = torch.cuda.max_memory_allocated() // 1024 if device.startswith("cuda") else None
    print(json.dumps({"peak_kb": peak[0] - base, "gpu_peak_kb": gpu, "tokens_per_s": (len(tokens) - 1) / dt}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16384,65536,262144")
    ap.add_argument("--speed-tokens", type=int, default=65536)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child, args.device, args.batch, args.smoke)
        return
    if args.smoke:
        args.lengths, args.speed_tokens, args.rounds, args.batch = "1024,4096", 4096, 1, 8

    model = tiny_model(args.device, args.smoke)
    seq_len = model.config.seq_len
    toks = torch.from_numpy(stream(args.speed_tokens).astype(np.int64))
    n_scored = ((toks.numel() - 1) // seq_len) * seq_len
    ratios, ours, plain = [], [], []
    loss(model, toks[: seq_len * 4 + 1], batch_size=args.batch)  # warm-up
    for _ in range(args.rounds):  # interleaved rounds: load drift hits both alike
        t0 = time.perf_counter()
        loss(model, toks, batch_size=args.batch)
        a = (toks.numel() - 1) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        plain_loop(model, toks, seq_len, args.batch)
        b = n_scored / (time.perf_counter() - t0)
        ours.append(a)
        plain.append(b)
        ratios.append(a / b)
    ratios.sort()
    print(
        f"speed ({args.speed_tokens:,} tokens, {'smoke model' if args.smoke else 'tiny preset'}, {args.device}, batch {args.batch}): "
        f"loss() {max(ours):,.0f} tokens/s, plain loop {max(plain):,.0f} tokens/s, "
        f"ratio (median of {args.rounds} paired rounds) {ratios[len(ratios) // 2]:.3f} "
        "(target >= 0.9)"
    )

    print("| validation tokens | peak extra memory (RssAnon) | GPU peak | tokens/s |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.lengths.split(",")):
            path = Path(tmp) / f"fineweb_val_{n}.bin"
            write_shard(path, stream(n))
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(path),
                    "--device",
                    args.device,
                    "--batch",
                    str(args.batch),
                    "--threads",
                    str(args.threads),
                    *(["--smoke"] if args.smoke else []),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            gpu = f"{r['gpu_peak_kb'] / 1024:.1f} MiB" if r["gpu_peak_kb"] is not None else "-"
            print(f"| {n:,} | {r['peak_kb'] / 1024:.1f} MiB | {gpu} | {r['tokens_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
