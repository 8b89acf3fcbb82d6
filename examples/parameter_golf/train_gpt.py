"""A Parameter Golf train_gpt.py that ships its model as a recurnorm artifact.

The model is the challenge baseline's (openai/parameter-golf train_gpt.py): 9 blocks of width
512, 8 attention heads sharing 4 KV heads, a 2x relu^2 MLP, a 1024-token vocabulary with the
embedding tied to the output, and its control tensors (attn_scale, mlp_scale, resid_mix,
q_gain, skip_weights); forward(x, y) returns the loss. Every size is an environment variable,
as in the baseline.

After training, the script packs its own model in-process with a recipe after the records'
(int6 matrices with their clip constants per role, but as recurnorm's `sigma:K`, capped at
the row's absmax, not the records' SDClip `std:K`; the embedding int8, controls fp32, GPTQ
with GPTQ=1; `RECIPE=@pg-record` is the 2026-04-27 record's export exactly), counts the
code against the cap, refuses to write an artifact over it, and
evaluates the model loaded back through rnpk_load alone (numpy + torch; no recurnorm on the
evaluation machine). The counted code is submission/train_gpt.py when it exists (`recurnorm
wrap train_gpt.py --loader` writes it: this program and the loader in one file), else this
file and rnpk_load.py (which the script writes beside it).

    # the full size (a GPU; FineWeb SP1024 shards as the baseline reads them):
    DATA_PATH=./data/datasets/fineweb10B_sp1024 ITERATIONS=20000 GPTQ=1 bash run.sh
    # without shards it trains on CPython's own documentation, bytes as tokens:
    NUM_LAYERS=2 MODEL_DIM=64 ITERATIONS=20 TRAIN_SEQ_LEN=64 TRAIN_BATCH_TOKENS=2048 bash run.sh
    python submission/train_gpt.py eval   # the evaluation alone, as the challenge runs it
"""

import glob
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

E = os.environ.get
VOCAB_SIZE, NUM_LAYERS, MODEL_DIM = int(E("VOCAB_SIZE", 1024)), int(E("NUM_LAYERS", 9)), int(E("MODEL_DIM", 512))
NUM_HEADS, NUM_KV_HEADS, MLP_MULT = int(E("NUM_HEADS", 8)), int(E("NUM_KV_HEADS", 4)), int(E("MLP_MULT", 2))
TRAIN_SEQ_LEN, TRAIN_BATCH_TOKENS = int(E("TRAIN_SEQ_LEN", 1024)), int(E("TRAIN_BATCH_TOKENS", 524_288))
ITERATIONS, LR, SEED = int(E("ITERATIONS", 20000)), float(E("LR", 3e-3)), int(E("SEED", 1337))
DATA_PATH, ARTIFACT = E("DATA_PATH", ""), E("ARTIFACT", "final_model.rnpk")
MAX_BYTES, GPTQ = int(E("MAX_BYTES", 16_000_000)), E("GPTQ", "0") == "1"
SUBMISSION = E("SUBMISSION", "submission/train_gpt.py")  # the wrapped file: what the challenge counts
# After the records' export (the April 2026 records): their clip constants by role, as recurnorm's
# sigma:K (capped at the row's absmax; the records' own SDClip is std:K, and -q @pg-record the
# whole record), the embedding at 8 bits. The first matching rule wins; controls stay fp32.
RECIPE = E(
    "RECIPE",
    "tok_emb.weight=int8:clip=sigma:20,blocks.*.attn.*=int6:clip=sigma:13,"
    "blocks.*.mlp.*=int6:clip=sigma:10,int6:clip=sigma:12.85",
)


def tokens(split):
    """FineWeb shards (256 int32 header, then uint16 tokens), or the stdlib's own docs as bytes."""
    files = sorted(glob.glob(os.path.join(DATA_PATH, f"fineweb_{split}_*.bin"))) if DATA_PATH else []
    if files:
        return np.concatenate([np.fromfile(f, dtype="<u2", offset=1024).astype(np.int64) for f in files])
    from pydoc_data.topics import topics

    data = np.frombuffer("".join(topics[k] for k in sorted(topics)).encode(), dtype=np.uint8).astype(np.int64)
    cut = len(data) * 9 // 10
    return data[:cut] if split == "train" else data[cut:]


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.hd = MODEL_DIM // NUM_HEADS
        self.c_q = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.c_k = nn.Linear(MODEL_DIM, NUM_KV_HEADS * self.hd, bias=False)
        self.c_v = nn.Linear(MODEL_DIM, NUM_KV_HEADS * self.hd, bias=False)
        self.proj = nn.Linear(MODEL_DIM, MODEL_DIM, bias=False)
        self.q_gain = nn.Parameter(torch.full((NUM_HEADS,), 1.5))
        inv = 1.0 / 10000 ** (torch.arange(0, self.hd, 2).float() / self.hd)
        self.register_buffer("inv_freq", inv, persistent=False)

    def rope(self, x):
        f = torch.outer(torch.arange(x.shape[2], device=x.device).float(), self.inv_freq)
        cos, sin = f.cos().to(x.dtype), f.sin().to(x.dtype)
        a, b = x.chunk(2, dim=-1)
        return torch.cat((a * cos + b * sin, b * cos - a * sin), dim=-1)

    def forward(self, x):
        B, T, D = x.shape
        q = self.c_q(x).view(B, T, NUM_HEADS, self.hd).transpose(1, 2)
        k = self.c_k(x).view(B, T, NUM_KV_HEADS, self.hd).transpose(1, 2)
        v = self.c_v(x).view(B, T, NUM_KV_HEADS, self.hd).transpose(1, 2)
        q = self.rope(F.rms_norm(q, (self.hd,))) * self.q_gain.to(x.dtype)[None, :, None, None]
        k, rep = self.rope(F.rms_norm(k, (self.hd,))), NUM_HEADS // NUM_KV_HEADS
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(MODEL_DIM, MLP_MULT * MODEL_DIM, bias=False)
        self.mlp.proj = nn.Linear(MLP_MULT * MODEL_DIM, MODEL_DIM, bias=False)
        self.attn_scale = nn.Parameter(torch.ones(MODEL_DIM))
        self.mlp_scale = nn.Parameter(torch.ones(MODEL_DIM))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(MODEL_DIM), torch.zeros(MODEL_DIM))))

    def forward(self, x, x0):
        x = self.resid_mix[0] * x + self.resid_mix[1] * x0
        x = x + self.attn_scale * self.attn(F.rms_norm(x, (MODEL_DIM,)))
        h = F.relu(self.mlp.fc(F.rms_norm(x, (MODEL_DIM,))))
        return x + self.mlp_scale * self.mlp.proj(h.square())


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq_len = TRAIN_SEQ_LEN  # recurnorm's GPTQ calibrates on windows this long
        self.tok_emb = nn.Embedding(VOCAB_SIZE, MODEL_DIM)
        nn.init.normal_(self.tok_emb.weight, std=0.005)
        self.blocks = nn.ModuleList(Block() for _ in range(NUM_LAYERS))
        self.skip_weights = nn.Parameter(torch.ones(NUM_LAYERS // 2, MODEL_DIM))
        for b in self.blocks:  # the output projections start at zero, as in the baseline
            nn.init.zeros_(b.attn.proj.weight)
            nn.init.zeros_(b.mlp.proj.weight)

    def forward(self, x, y):
        x = x0 = F.rms_norm(self.tok_emb(x), (MODEL_DIM,))
        enc, skips = NUM_LAYERS // 2, []  # the first half's outputs feed the second half, last first
        for i, block in enumerate(self.blocks):
            if i >= enc and skips:
                x = x + self.skip_weights[i - enc] * skips.pop()
            x = block(x, x0)
            if i < enc:
                skips.append(x)
        logits = F.rms_norm(x, (MODEL_DIM,)) @ self.tok_emb.weight.T  # tied output
        logits = 30.0 * torch.tanh(logits / 30.0)  # the baseline's logit softcap
        return F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), y.reshape(-1))


@torch.no_grad()
def val_loss(model, data, device, batch=8):
    n = (len(data) - 1) // TRAIN_SEQ_LEN * TRAIN_SEQ_LEN
    x = torch.from_numpy(data[:n]).view(-1, TRAIN_SEQ_LEN)
    y = torch.from_numpy(data[1 : n + 1]).view(-1, TRAIN_SEQ_LEN)
    model.eval()
    losses = [model(x[i : i + batch].to(device), y[i : i + batch].to(device)).item() for i in range(0, len(x), batch)]
    return sum(losses) / len(losses)


def export(model, train):
    """Pack the model in-process (recurnorm is on the training machine only), count the code
    against the cap, and write the artifact only when it fits."""
    from recurnorm.budget import Budget
    from recurnorm.budget.loader import compact_loader
    from recurnorm.export.ship import ship_model
    from recurnorm.io import atomic_write_bytes

    atomic_write_bytes("rnpk_load.py", compact_loader())  # for this file's own evaluation below
    model = model.cpu().float()
    packed = ship_model(model, RECIPE, name=os.path.basename(__file__), gptq=GPTQ, train_tokens=train)
    wrapped = os.path.exists(SUBMISSION)
    budget = Budget(MAX_BYTES, [SUBMISSION] if wrapped else [__file__], None if wrapped else "rnpk_load.py")
    cap = budget.check(len(packed.data), packed.rows)
    atomic_write_bytes(ARTIFACT, packed.data)
    print(packed.policy_line)
    counted = SUBMISSION if wrapped else f"{os.path.basename(__file__)} + rnpk_load.py"
    print(
        f"artifact {cap['artifact_bytes']:,} + code {cap['code_bytes']:,} ({counted}) = "
        f"{cap['total_bytes']:,} of {MAX_BYTES:,} bytes; wrote {ARTIFACT}"
    )


def evaluate(device):
    """The evaluation machine's view: the artifact through rnpk_load (numpy + torch) alone."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rnpk_load import load

    model = GPT().to(device)
    model.load_state_dict(load(ARTIFACT))
    return val_loss(model, tokens("val"), device)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if sys.argv[1:] == ["eval"]:
        print(f"loaded {ARTIFACT}: val_loss {evaluate(device):.4f}")
        return
    torch.manual_seed(SEED)
    train, val = tokens("train"), tokens("val")
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    rows, g = max(1, TRAIN_BATCH_TOKENS // TRAIN_SEQ_LEN), torch.Generator().manual_seed(SEED)
    t0 = time.time()
    for step in range(ITERATIONS):
        starts = torch.randint(0, len(train) - TRAIN_SEQ_LEN - 1, (rows,), generator=g).numpy()
        xy = torch.from_numpy(np.stack([train[s : s + TRAIN_SEQ_LEN + 1] for s in starts])).to(device)
        for group in opt.param_groups:  # linear warmdown over the last fifth
            group["lr"] = LR * min(1.0, 5 * (ITERATIONS - step) / ITERATIONS)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(xy[:, :-1], xy[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == ITERATIONS - 1:
            print(f"step {step} train_loss {loss.item():.4f} ({time.time() - t0:.0f} s)")
    before = val_loss(model, val, device)
    export(model, train)
    after = evaluate(device)
    print(
        f"roundtrip: val_loss {before:.4f} before export, {after:.4f} through rnpk_load "
        f"({after - before:+.4f}; {after / math.log(2):.4f} bits per token)"
    )


if __name__ == "__main__":
    main()
