"""A train_gpt.py-style script whose model ships as a recurnorm artifact.

Everything the evaluation needs is here plus rnpk_load.py (written by
`recurnorm loader --compact`): numpy and torch, no recurnorm. The tensor names
are the Parameter Golf baseline's (tok_emb, blocks.{i}.attn.c_q, ...).

    python train_gpt.py train --out model.safetensors   # a few steps on this file's own text
    python train_gpt.py eval --artifact final_model.rnpk  # loads through rnpk_load alone

run.sh packs and verifies the artifact with this file and the loader counted.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, KV_HEADS, MLP, LAYERS, VOCAB, SEQ = 128, 4, 2, 256, 3, 256, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Module()
        hd = D // HEADS
        self.attn.c_q = nn.Linear(D, D, bias=False)
        self.attn.c_k = nn.Linear(D, KV_HEADS * hd, bias=False)
        self.attn.c_v = nn.Linear(D, KV_HEADS * hd, bias=False)
        self.attn.proj = nn.Linear(D, D, bias=False)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(D, MLP, bias=False)
        self.mlp.proj = nn.Linear(MLP, D, bias=False)
        self.attn_scale = nn.Parameter(torch.ones(D))  # control tensors: kept in float
        self.mlp_scale = nn.Parameter(torch.ones(D))

    def forward(self, x):
        B, T, _ = x.shape
        hd = D // HEADS
        h = F.rms_norm(x, (D,))
        q = self.attn.c_q(h).view(B, T, HEADS, hd).transpose(1, 2)
        k = self.attn.c_k(h).view(B, T, KV_HEADS, hd).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, 1)
        v = self.attn.c_v(h).view(B, T, KV_HEADS, hd).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.attn_scale * self.attn.proj(y)
        return x + self.mlp_scale * self.mlp.proj(F.relu(self.mlp.fc(F.rms_norm(x, (D,)))).square())


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, idx):
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x)
        return F.rms_norm(x, (D,)) @ self.tok_emb.weight.T  # tied head


def batches(data, steps, batch=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, len(data) - SEQ - 1, (batch,), generator=g)
        yield torch.stack([data[j : j + SEQ] for j in i]), torch.stack([data[j + 1 : j + SEQ + 1] for j in i])


def bits_per_byte(model, data):
    """Mean cross-entropy over consecutive windows, in bits per byte (byte-level tokens)."""
    model.eval()
    n = (len(data) - 1) // SEQ * SEQ
    x, y = data[:n].view(-1, SEQ), data[1 : n + 1].view(-1, SEQ)
    with torch.no_grad():
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    return loss.item() / math.log(2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("train", "eval"))
    ap.add_argument("--out", default="model.safetensors")
    ap.add_argument("--artifact", default="final_model.rnpk")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    torch.manual_seed(0)
    data = torch.tensor(list(open(__file__, "rb").read()), dtype=torch.long)
    model = GPT()
    if args.mode == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for x, y in batches(data, args.steps):
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.out)
        print(f"trained {args.steps} steps: {bits_per_byte(model, data):.4f} bpb; wrote {args.out}")
        return
    from rnpk_load import load  # the shipped loader: numpy + torch only

    model.load_state_dict(load(args.artifact))
    print(f"loaded {args.artifact}: {bits_per_byte(model, data):.4f} bpb")


if __name__ == "__main__":
    main()
