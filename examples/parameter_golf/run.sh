#!/usr/bin/env bash
# Train, wrap the counted code (program + loader, one file), pack and verify with it counted,
# then evaluate through the loader alone.
set -euo pipefail
cd "$(dirname "$0")"
recurnorm loader --compact -o rnpk_load.py --force
python train_gpt.py train --out model.safetensors
recurnorm wrap train_gpt.py --loader -o submission/train_gpt.py --force
recurnorm pack model.safetensors -q int8 -o final_model.rnpk --force \
    --code submission/train_gpt.py --max-bytes 16000000
recurnorm verify final_model.rnpk --code submission/train_gpt.py --max-bytes 16000000
python train_gpt.py eval --artifact final_model.rnpk
