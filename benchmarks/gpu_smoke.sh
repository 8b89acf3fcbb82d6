#!/usr/bin/env bash
# One prepared check for a GPU machine (not run in CI; there was no GPU where it was written):
#   1. train_speed on the golf preset: tokens/s and MFU against the measured bf16 matmul peak
#   2. golf preset for STEPS steps on 1 GPU (recurnorm train), then the same under torchrun
#      on every GPU present (recurnorm train --nproc N), from FineWeb SP8192 shards
#   3. pack the 1-GPU model at the default export (int8) and verify it against the 16 MB cap
#   4. eval_speed on the GPU: loss() vs a plain forward loop, peak memory per length
# Usage (from the repository root):  bash benchmarks/gpu_smoke.sh
# Environment: SHARDS=DIR of fineweb_{train,val}_*.bin (default: made here from the default
# corpus with the SP8192 tokenizer: a speed check, not a quality one), SP=tokenizer model
# (default fineweb_8192_bpe.model in the benchmarks' cache folder, $RECURNORM_BENCH_CACHE or
# ~/.cache/recurnorm-bench), STEPS (default 300), OUT (default gpu-smoke), PY (default
# .venv/bin/python, else python3).
# No --smoke or dry run: this script is itself the smoke check of a GPU machine and stops where
# torch sees no GPU. Its CPU parts have their own (train_speed.py --smoke, eval_speed.py --smoke),
# and the test suite runs train, pack and verify.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-gpu-smoke}
STEPS=${STEPS:-300}
SP=${SP:-${RECURNORM_BENCH_CACHE:-$HOME/.cache/recurnorm-bench}/fineweb_8192_bpe.model}
RN=("$PY" -m recurnorm.cli.main)
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }

"$PY" -c "import recurnorm" 2>/dev/null || "$PY" -m pip install -q -e . --no-deps
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
stamp "torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)'), $NGPU GPU(s)"
command -v nvidia-smi >/dev/null && nvidia-smi -L
[ "$NGPU" -ge 1 ] || { echo "no GPU visible to torch"; exit 1; }

if [ -z "${SHARDS:-}" ]; then
  SHARDS=$OUT/shards
  stamp "making shards from the default corpus with $SP"
  "${RN[@]}" shard --data default --tokenizer "$SP" --out "$SHARDS" --force --json > "$OUT/shards.json"
fi

stamp "train_speed: golf preset, shared scheme, bf16"
"$PY" benchmarks/train_speed.py --preset golf --device cuda --schemes shared,norm_gate \
  --steps 5 --rounds 3 --warmup 2 | tee "$OUT/train_speed.txt"

COMMON=(--preset golf --steps "$STEPS" --data "shards:$SHARDS" --tokenizer "$SP" --save-every 100
        --log-every 25 --no-progress --force --json)
stamp "golf on 1 GPU, $STEPS steps"
"${RN[@]}" train "${COMMON[@]}" --out "$OUT/golf1" > "$OUT/golf1.json"
stamp "golf under torchrun on $NGPU GPU(s), $STEPS steps (what recurnorm train --nproc runs)"
"$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" -m recurnorm.train \
  "${COMMON[@]}" --out "$OUT/golfN" > "$OUT/golfN.json"

stamp "pack + verify (int8, the default export)"
"${RN[@]}" pack "$OUT/golf1" -q int8 -o "$OUT/golf1.rnpk" --force | tail -3
"${RN[@]}" verify "$OUT/golf1.rnpk" --max-bytes 16000000 | tail -3

stamp "eval_speed on the GPU"
"$PY" benchmarks/eval_speed.py --device cuda --lengths 262144,1048576,4194304 \
  --speed-tokens 1048576 --batch 64 | tee "$OUT/eval_speed.txt"

stamp "summary"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
for name in ("golf1", "golfN"):
    try:
        text = open(f"{out}/{name}.json").read()
        s = json.loads(text[text.index("{"):])  # anything torchrun printed comes first
    except (OSError, ValueError):
        print(f"{name}: no summary"); continue
    log = [json.loads(x) for x in open(f"{out}/{name}/train_log.jsonl") if x.strip()]
    tps = [r["tokens_per_s"] for r in log if "tokens_per_s" in r][1:] or [s["tokens_per_s"]]
    print(f"{name}: ranks {s['ranks']}, {s['steps']} steps in {s['train_s']:.0f} s, "
          f"{sum(tps) / len(tps):,.0f} tokens/s after the first interval, val bpb "
          f"{s['val_bpb']:.4f}, est. artifact {s['estimated_artifact_bytes']:,} bytes")
PYEOF
grep -E "measured matmul peak|^shared|^norm_gate" "$OUT/train_speed.txt" || true
