#!/usr/bin/env bash
# Train, pack with the code and the loader counted, verify, then evaluate through the loader alone.
set -euo pipefail
cd "$(dirname "$0")"
recurnorm loader --compact -o rnpk_load.py --force
python train_gpt.py train --out model.safetensors
recurnorm pack model.safetensors -q int8 -o final_model.rnpk --force \
    --code train_gpt.py --loader rnpk_load.py --max-bytes 16000000
recurnorm verify final_model.rnpk --code train_gpt.py --loader rnpk_load.py --max-bytes 16000000
python train_gpt.py eval --artifact final_model.rnpk
