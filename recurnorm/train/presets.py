"""Named training presets: a model shape plus the TrainConfig that goes with it.

``tiny`` is the CPU preset every test, benchmark and scheme comparison uses;
it is tuned for stability over speed (in our own paired runs at AdamW 3e-3 the
per-step gains made scheme differences flip sign between seeds).
``sweep`` is a narrower tiny (d=64) on an eighth of its tokens per step, for
studies that train many models at several lengths on CPU. ``small`` is sized for one GPU. ``golf`` fills the Parameter Golf budget: with
the SP8192 tokenizer (FineWeb shards) its shared scheme packs at int8 to a
predicted 14.67 MB of the 16,000,000-byte cap (recurnorm.export.plan, printed
when training starts), and it is sized to train on one GPU in about ten
minutes (``torchrun`` on more GPUs takes the same steps with the batch split).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from .config import DEFAULT, TrainConfig

# The training fields that name one run rather than a preset's recipe: recorded apart by the
# studies (roundtrip, lr sweep) that train the same recipe at several seeds.
PER_RUN_FIELDS = ("seed", "batch_seed", "pair_init", "compile")


@dataclass(frozen=True)
class Preset:
    """A named model shape (fields of ModelConfig) and the TrainConfig that goes with it."""

    model: dict = field(default_factory=dict)
    hp: TrainConfig = DEFAULT

    def with_overrides(self, **kw) -> Preset:
        """A copy with some training hyper-parameters replaced (None values ignored)."""
        return replace(self, hp=replace(self.hp, **{k: v for k, v in kw.items() if v is not None}))

    def train_kwargs(self) -> dict:
        """The recipe's hyper-parameters as a dict (the per-run fields left out), as studies record them."""
        return {k: v for k, v in self.hp.to_dict().items() if k not in PER_RUN_FIELDS}


# ~230k parameters with a shared block. 600 steps take ~4 min on two CPU cores
# (0.42 s/step measured; ~150 steps already reach < 3.5 bpb). lr 2e-3 (not 3e-3) because in our own paired runs per-step
# gains destabilized training at 3e-3. Its training is TrainConfig's defaults (AdamW), pinned:
# `make demo`, the tests and every recorded tiny result use them.
TINY = Preset(model=dict(vocab_size=256, d_model=128, n_heads=4, depth=6, seq_len=128, mlp_ratio=4.0), hp=DEFAULT)

# The GPU presets' optimizer is benchmarks/optimizers.py's winner: Muon (matrices at 10x the
# lr, AdamW for the rest) beat AdamW by 0.20-0.38 bpb at 120 tiny-preset steps on three
# paired seeds, beyond either optimizer's seed spread (AdamW's: 0.20 bpb).
MUON = replace(DEFAULT, optimizer="muon", muon_lr_mult=10.0)


PRESETS: dict[str, Preset] = {
    "tiny": TINY,
    # Many models at several lengths on CPU (docs/RESULTS.md: 6 schemes x 3 seeds x
    # 150/600/2400 steps x 2 corpora, 113,400 training steps in all): tiny at half the
    # width (d=64, depth 6) on 64-token windows, 8 per step. Measured (one thread, shared
    # machine): 44 ms of CPU per step, vs 64 at d=96, 93 at d=128 and ~360 for tiny; the
    # study needs ~5,000 CPU-s of training at d=64 against ~10,500 at d=128.
    "sweep": Preset(model={**TINY.model, "d_model": 64, "seq_len": 64}, hp=replace(DEFAULT, batch_size=8)),
    # One GPU: d=512, 8 block applications, 1024-token windows.
    "small": Preset(
        model=dict(vocab_size=256, d_model=512, n_heads=8, depth=8, seq_len=1024, mlp_ratio=4.0),
        hp=replace(MUON, steps=5000, batch_size=32, lr=1e-3, warmup=200, eval_every=500, log_every=50),
    ),
    # The 16 MB artifact: vocab 8192 (SP8192), one shared block of d=864 (12 heads of 72)
    # applied 8 times: 16.04M parameters, est. 15.45 MB at int8 (7.7 bits/weight measured).
    # Compute: 557 MFLOP per training token (flops.step_flops on the meta device); 4,000 steps
    # of 64 x 1024 tokens are 262M tokens = 1.46e17 FLOP: ten minutes at 25% of a H100/H200's
    # 989 TFLOP/s dense bf16. That utilization is an assumption until benchmarks/gpu_smoke.sh
    # has run on a GPU; scale steps by (600 s x its tokens/s / 65,536) once it has.
    "golf": Preset(
        model=dict(vocab_size=8192, d_model=864, n_heads=12, depth=8, seq_len=1024, mlp_ratio=4.0),
        hp=replace(
            MUON,
            steps=4000,
            batch_size=64,
            micro_batch=32,
            lr=1.5e-3,
            warmup=100,
            eval_every=0,  # the FineWeb validation split is 62M tokens: score it once, at the end
            save_every=500,
            log_every=50,
        ),
    ),
}


def get_preset(name: str) -> Preset:
    """The preset called name; ConfigError listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
