"""Training speed of each scheme against a plain GPT of the same size, side by side.

Two plain GPTs anchor the table, both with the same width, depth, heads,
sequence, batch, tied embeddings, RMSNorm, rotary positions, relu² MLP and SDPA
but none of the scheme machinery: `plain` (depth untied blocks, the target
anchor: ratio >= 0.85) and `plain_shared` (one block reused; same compute and
optimizer size as `shared`, so "vs plain_shared" isolates what the machinery
costs). Models are timed in interleaved rounds after a warm-up; ratios are the
median over rounds of the paired ratio, which cancels drift in machine load.

MFU (model FLOP utilization) is each model's counted training FLOPs per second
(recurnorm.train.flops.step_flops: forward + backward as PyTorch counts them)
over the machine's measured matmul peak in the training dtype (fp32 on CPU, bf16
on a GPU), so it says how much of what the hardware reaches the model uses.

    python benchmarks/train_speed.py --steps 10 --rounds 5 --schemes shared,norm,lora
    python benchmarks/train_speed.py --preset golf --device cuda --schemes shared  # on a GPU
    python benchmarks/train_speed.py --smoke   # every scheme at d=32, one step, one round: seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from recurnorm.model import ModelConfig, RecurrentLM, schemes  # noqa: E402
from recurnorm.model.layers import apply_rope, rope_tables  # noqa: E402
from recurnorm.train.flops import matmul_peak, step_flops  # noqa: E402
from recurnorm.train.presets import get_preset  # noqa: E402


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, d_mlp: int):
        super().__init__()
        self.n_heads = n_heads
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, d_mlp, bias=False)
        self.down = nn.Linear(d_mlp, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, D))
        return x + self.down(F.relu(self.up(self.n2(x))).square())


class PlainGPT(nn.Module):
    """A textbook pre-norm GPT with `depth` untied blocks (or one block reused)."""

    def __init__(self, c: ModelConfig, shared: bool = False):
        super().__init__()
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        n_blocks = 1 if shared else c.depth
        self.depth = c.depth
        self.blocks = nn.ModuleList(PlainBlock(c.d_model, c.n_heads, c.d_mlp) for _ in range(n_blocks))
        self.norm = nn.RMSNorm(c.d_model, eps=1e-6)
        cos, sin = rope_tables(c.seq_len, c.d_head)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx):
        x = self.embed(idx)
        for step in range(self.depth):
            x = self.blocks[step % len(self.blocks)](x, self.cos, self.sin)
        return F.linear(self.norm(x), self.embed.weight)


def make_step(model: nn.Module, batch: torch.Tensor, bf16: bool = False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = batch[:, :-1], batch[:, 1:]

    def step():
        with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if batch.device.type == "cuda":
            torch.cuda.synchronize()

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per model per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--schemes", default=",".join(schemes.available()))
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--preset", help="take the model shape (and micro-batch) from this preset")
    p.add_argument("--device", default="cpu", help="cpu or cuda (bf16 autocast on cuda)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain GPT anchors")
    benchkit.add_smoke(p)
    args = p.parse_args()
    if args.smoke:  # the smoke model's shape, one timed step of each model
        m = benchkit.SMOKE_MODEL
        args.d_model, args.depth, args.n_heads, args.seq_len = m["d_model"], m["depth"], m["n_heads"], m["seq_len"]
        args.steps, args.rounds, args.warmup, args.batch, args.threads, args.preset = 1, 1, 1, 4, 1, None
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.preset:
        pre = get_preset(args.preset)
        base = ModelConfig(**pre.model)
        args.seq_len, args.batch = base.seq_len, pre.hp.micro_batch or pre.hp.batch_size
        args.d_model, args.depth, args.n_heads = base.d_model, base.depth, base.n_heads
    else:
        base = ModelConfig(d_model=args.d_model, depth=args.depth, n_heads=args.n_heads, seq_len=args.seq_len)
    dev = torch.device(args.device)
    bf16 = dev.type == "cuda"
    torch.manual_seed(0)
    batch = torch.randint(0, base.vocab_size, (args.batch, args.seq_len + 1), device=dev)
    anchors = [] if args.no_plain else ["plain", "plain_shared"]
    names = anchors + [s for s in args.schemes.split(",") if s]
    models = {} if args.no_plain else {"plain": PlainGPT(base), "plain_shared": PlainGPT(base, shared=True)}
    for s in names[len(anchors) :]:
        models[s] = RecurrentLM(ModelConfig(**{**base.to_dict(), "scheme": s}))
    for m in models.values():
        m.to(dev)
    flops = {n: step_flops(m, batch, bf16=bf16) for n, m in models.items()}
    peak = matmul_peak(dev, torch.bfloat16 if bf16 else torch.float32)
    steps = {n: make_step(m, batch, bf16=bf16) for n, m in models.items()}
    for step in steps.values():
        for _ in range(args.warmup):
            step()

    tok_per_step = args.batch * args.seq_len
    rates: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[n]()
            rates[n].append(args.steps * tok_per_step / (time.perf_counter() - t0))

    print(
        f"d={args.d_model} depth={args.depth} heads={args.n_heads} seq={args.seq_len} "
        f"batch={args.batch} threads={torch.get_num_threads()} "
        f"steps={args.steps}x{args.rounds} rounds device={dev}"
    )
    print(
        f"measured matmul peak: {peak / 1e9:,.1f} GFLOP/s "
        f"({'bf16' if bf16 else 'fp32'}, {torch.get_num_threads()} thread(s) on CPU)"
    )
    print(
        f"{'model':<16} {'params':>10} {'tokens/s':>10} {'ratio':>6} {'vs plain_shared':>16} {'GFLOP/s':>9} {'MFU':>6}"
    )
    for n in names:
        if anchors:
            ratio, ratio_shared = (
                statistics.median(r / a for r, a in zip(rates[n], rates[anchor], strict=True)) for anchor in anchors
            )
        else:
            ratio = ratio_shared = float("nan")
        n_params = sum(t.numel() for t in models[n].parameters())
        flag = "" if not anchors or ratio >= 0.85 else "  < 0.85"
        rate = statistics.median(rates[n])
        achieved = flops[n] / tok_per_step * rate
        print(
            f"{n:<16} {n_params:>10} {rate:>10.0f} {ratio:>6.2f} {ratio_shared:>16.2f} "
            f"{achieved / 1e9:>9.1f} {achieved / peak:>6.1%}{flag}"
        )


if __name__ == "__main__":
    main()
