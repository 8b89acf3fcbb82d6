#!/usr/bin/env bash
# The counted code is one file: the program and recurnorm's loader, wrapped. Train and pack
# in-process (that file counted; refused over the cap), check the artifact as the challenge
# counts it, then evaluate as it runs: the wrapped file alone, through its loader.
set -euo pipefail
cd "$(dirname "$0")"
recurnorm wrap train_gpt.py --loader -o submission/train_gpt.py --force
python train_gpt.py
recurnorm verify "${ARTIFACT:-final_model.rnpk}" --code submission/train_gpt.py --max-bytes "${MAX_BYTES:-16000000}"
python submission/train_gpt.py eval
