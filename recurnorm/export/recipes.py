"""Named export recipes (``-q @NAME``): policies that reproduce a published export exactly.

``@pg-record`` is the export of the best Parameter Golf record (1.06108 bpb, 2026-04-27;
openai/parameter-golf ``records/track_10min_16mb/2026-04-27_SP8192_LQER_SparseGate_
BOSSmearFix_9HpStack_1.0611/train_gpt.py``, ``gptq_mixed_quantize`` with the settings of
its README's command line), decided tensor by tensor in its order:

1. a 2-D ``*attn_gate_w`` of 32..8,192 values   -> int8, one absmax scale per row
2. any float tensor of <= 65,536 values          -> fp16 (control tensors too)
3. the token embedding                           -> int7, clip ``std:14`` (SDClip)
4. attention matrices (``.attn.``)               -> int6, clip ``std:13``
5. MLP matrices (``.mlp.``)                      -> int6, clip ``std:11.5``
6. other matrices                                -> int6, clip ``std:12.85``

then LQER (rank 4) on the 3 quantized matrices (not the gates) of largest ``‖W − Ŵ‖``. The
record's banks (``qo_bank`` ...) are decided slice by slice under the names its own unbanking
gives them (export/banks.py), so the banked checkpoint gets the unbanked one's export. ``std:K`` is the
record's SDClip bit for bit (scale = K·std(row)/qmax in fp16, `quant/intn.py`); with
``--gptq`` the codes are GPTQ's, as in the record. Where recurnorm differs, by design:
its LQER factors are recurnorm's int2/int4 formats on ``[r, n]`` rows (the record: an
int2 A with one scale and an int4 B in groups of 64). ``--gptq`` GPTQs the tied embedding
against the head's inputs, as the record does, where the forward uses it as the head.
Roles are read from the name as the record does (``.attn.``, ``.mlp.``), plus the
spellings of recurnorm (``.attn.``, ``.mlp.``) and Hugging Face BERT/GPT models
(``.attention.``, ``.intermediate.``, ``.output.dense``, ``self_attn``).
User rules (``-q @pg-record,PATTERN=FORMAT``, ``--keep-float``) still come first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ..errors import ConfigError
from ..quant import extras, lqer
from ..quant.qtensor import QTensor
from .policy import ExportPolicy, Plan, name_matches

RECORD = {
    "small_max_numel": 65_536,  # INT8_KEEP_FLOAT_MAX_NUMEL's successor: `t.numel() <= 65536`
    "gate": ("int8", {"clip_percentile": None}),  # _quantize_gate_int8_row
    "embedding": ("int7", {"clip": "std:14"}),  # EMBED_BITS=7 EMBED_CLIP_SIGMAS=14.0
    "attention": ("int6", {"clip": "std:13"}),  # ATTN_CLIP_SIGMAS=13.0
    "mlp": ("int6", {"clip": "std:11.5"}),  # MLP_CLIP_SIGMAS=11.5
    "matrix": ("int6", {"clip": "std:12.85"}),  # MATRIX_CLIP_SIGMAS (default 12.85)
    "lqer": {"lqer": 4, "lqer_l": "int2", "lqer_r": "int4"},  # LQER_RANK=4, asym int2/int4
    "lqer_top_k": 3,  # LQER_TOP_K=3
}
# A stack's slices (export/banks.py) are named as the record names them (``blocks.{i}.attn.c_q``)
# when the stack is one of its banks, else ``NAME.i``: ``qo_bank.3`` and ``mlp_up_bank.0`` too.
ATTENTION = ("*.attn.*", "*.attention.*", "*self_attn*", "*qo_bank.*", "*kv_bank.*", "*attn*bank.*")
MLP = ("*.mlp.*", "*.intermediate.*", "*.output.dense.*", "*feed_forward*", "*.ffn.*", "*mlp*bank.*")
GATES = ("*attn_gate_w",)
RECIPE_REASON = "@pg-record"


def role(name: str) -> str:
    """attention, mlp or matrix: the record's clip role of a weight by its name."""
    if name_matches(name, ATTENTION):
        return "attention"
    return "mlp" if name_matches(name, MLP) else "matrix"


@dataclass
class RecordPolicy(ExportPolicy):
    """The best Parameter Golf record's export (module docstring); ``small_max_numel`` and
    ``lqer_top_k`` may be changed (a benchmark scales the first to a smaller model)."""

    recipe: dict[str, Any] = field(default_factory=lambda: dict(RECORD))

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("gate", "embedding", "attention", "mlp", "matrix"):
            extras.split(*self.recipe[key])

    def choose(self, name: str, t: Tensor) -> tuple[str, dict[str, Any], str]:
        forced = self.forced(name, t)
        if forced is not None:
            return forced
        r = self.recipe
        if t.dim() == 2 and name_matches(name, GATES) and 32 <= t.numel() <= 8192:
            return (*r["gate"], f"{RECIPE_REASON} gate")
        if t.numel() <= r["small_max_numel"]:
            return "fp16", {}, f"{RECIPE_REASON} <= {r['small_max_numel']:,} values"
        if name_matches(name, self.embedding_names):
            return (*r["embedding"], f"{RECIPE_REASON} embedding")
        kind = role(name)
        return (*r[kind], f"{RECIPE_REASON} {kind}")

    def finish(self, state_dict: dict[str, Tensor], qtensors: dict[str, QTensor], plan: Plan):
        """LQER on the recipe's quantized matrices of largest ‖W − Ŵ‖ (tied names once)."""
        k = self.recipe["lqer_top_k"]
        spec = lqer.split_options(self.recipe["lqer"])[1]
        mine = [
            n
            for n, (fmt, _, why) in sorted(plan.items())
            # the record's candidates are its GPTQ'd matrices: not the int8 gates
            if why.startswith(RECIPE_REASON)
            and fmt.startswith("int")
            and state_dict[n].dim() == 2
            and "gate" not in why
        ]
        errors: dict[int, tuple[float, str]] = {}
        for n in mine:
            errors.setdefault(id(qtensors[n]), (lqer.error_norm(state_dict[n], qtensors[n]), n))
        worst = sorted(errors.values(), key=lambda e: -e[0])[:k] if spec is not None else []
        qtensors, plan = dict(qtensors), dict(plan)
        for _, n in worst:
            old = qtensors[n]
            new = lqer.correct(state_dict[n], old, spec, name=n)
            for m in [m for m, v in qtensors.items() if v is old]:
                qtensors[m] = new
                fmt, opts, why = plan[m]
                plan[m] = (fmt, {**opts, **self.recipe["lqer"]}, f"{why} + lqer (top {k} error)")
        return qtensors, plan

    def summary(self, plan: Plan | None = None, aliases=()) -> str:
        if plan is not None:  # what each of the recipe's steps chose, as the base policy counts it
            return super().summary(plan, aliases)
        r = self.recipe
        parts = [
            "export policy: @pg-record (the 2026-04-27 Parameter Golf record's export)",
            f"gates {_spec(r['gate'])}",
            f"float tensors <= {r['small_max_numel']:,} fp16",
            f"embedding {_spec(r['embedding'])}",
            f"attention {_spec(r['attention'])}",
            f"mlp {_spec(r['mlp'])}",
            f"other matrices {_spec(r['matrix'])}",
            f"lqer rank {r['lqer']['lqer']} on the {r['lqer_top_k']} worst",
        ]
        parts += [f"rule {rule.label()}" for rule in self.rules]
        return "; ".join(parts)


def _spec(choice: tuple[str, dict]) -> str:
    from .policy import format_spec

    return format_spec(*choice)


RECIPES = {"pg-record": RecordPolicy}


def recipe_policy(name: str, **kw: Any) -> ExportPolicy:
    """The policy of ``-q @NAME``; ConfigError listing the recipes otherwise."""
    key = name.removeprefix("@")
    if key not in RECIPES:
        raise ConfigError(f"-q @{key}: unknown recipe; known: {', '.join('@' + k for k in sorted(RECIPES))}")
    return RECIPES[key](**kw)
