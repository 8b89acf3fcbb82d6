"""What a pack may spend for its bytes: one frozen PackOptions, handed from pack_qtensors to each
step that chooses (the context search, the race's shortcuts, the parents search, the float heads'
side data). No step reads a module knob or an effort's name: packs with other options may run at
once. `PackOptions()` is effort "normal"; variants come from `dataclasses.replace`."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import QuantError
from . import parents, spec
from .search import Effort


@dataclass(frozen=True)
class Gates:
    """The shortcuts of the codec race (race.py), each with what it saves of packing benchmarks/pack.py's
    >= 1M-code cases (one thread's CPU time, `python benchmarks/gates.py`: on and off interleaved, best
    of 3-5), and what it costs in bytes where it costs any. One that saves under 10% goes. None turns
    one off: that path then runs as effort "max" runs all of them."""

    # Float words over race.QUICK_MIN: no deflate/lzma where zstd-1 of 16 slices of this many bytes,
    # byte-grouped together (about deflate-1's size, 6x sooner), lands over the best (the fields
    # coding). Saves 96-98% on MiniLM and golf-shaped bf16/fp32; same bytes.
    float_probe: int | None = 1 << 12
    # Quantized codes from this many bytes on where zstd-1 finds no repetition: no deflate or lzma (rans codes
    # them under their order-0 bound, where deflate's Huffman and lzma's literals land above it). Saves 50% on
    # MiniLM int8, 45% on golf-shaped int8; same bytes. (Below it a table costs rans more than deflate's
    # Huffman: deflate won small int8 streams of the tiny models, 0.2% of their bytes.)
    codes_norep: int | None = 1 << 16
    # lzma on deflate's best layout only, where deflate is within this factor of the best (over
    # 256 KiB: where deflate leads). Saves 79% on MiniLM int4 (lzma-9e: ~0.3 s a MB), 86% on
    # golf-shaped int8, where it costs 0.04% of bytes.
    lzma_race: float | None = 1.02
    # Parents streams over race.QUICK_MIN: lzma on their byte groups only (it beat deflate's layouts
    # by 13% on MiniLM's). Saves 12-14% on MiniLM int4-int8 (0.1 s each); same bytes.
    parents_lzma: int | None = 1
    # Rows predicted from parents (tensors of 8 x race.SAMPLE_ROWS rows or more) race the codes as
    # they are on every 8th block of SAMPLE_ROWS rows first: a side ahead by this share of the bytes
    # there wins without the full race. Saves 20% on MiniLM int8, 15% on int4, 10% on int6; same bytes.
    parents_sample: float | None = 0.01
    # zstd-19 on the best zstd-3 layout only, where it is within this factor of the best. Saves
    # 78-80% on ship.py's 17M models (codecs rans, zstd, raw), costing 0.0005% of bytes.
    zstd_slow_race: float | None = 1.02
    # Float tails (low mantissa bits, signs) over race.QUICK_MIN: deflate-1 only on their chunks (of
    # compress.CHUNK bytes) where zstd-1 lands under this share of their size. Saves 48% on MiniLM
    # bf16, 66% on MiniLM fp32 (costing 0.007% of bytes), 42-70% on golf-shaped bf16/fp32.
    fields_tail: float | None = 0.99


@dataclass(frozen=True)
class PackOptions:
    """How hard pack_qtensors looks; `for_effort` gives the CLI's --effort."""

    search: Effort = Effort()  # how wide the rans search looks for quantized codes (search.py)
    # A float head's search: one grid (its axes' best class counts), 4 or 8 classes an axis on big
    # streams: heads took no more, and the next grids' estimates misled (MiniLM bf16 6 KB, fp32 12 KB
    # smaller without; golf-shaped bf16 +7 B). Saves 18% of golf bf16's pack time, 6-7% of MiniLM's.
    fields_search: Effort = Effort(grids=1, big_ks=(4, 8))
    # What a float head's tables and class ids may take: not lzma (lzma-9e's ~0.1 ms a blob bought
    # 0.008% of MiniLM bf16, 0.027% of golf bf16, for 8-9% of their pack time; codes' side data
    # races it: MiniLM int8 0.04%).
    fields_side_compressors: tuple[int, ...] = (spec.RAW, spec.DEFLATE)
    gates: Gates = Gates()
    # `parents.previous` proposes where row pairs' order-0 bits are under this share of the codes'. A
    # gate: every proposal is raced (a second encoding); without it every int8 matrix would be. Saves
    # 66% of pack time on MiniLM int8 and int4, 48% on golf-shaped int8, same bytes (benchmarks/gates.py).
    parents_smooth: float = 0.97
    # `parents.find` searches tensors of this many rows or more, `previous` the rest: saves 19-25%
    # of pack time on MiniLM int4-int8 (0.06-0.07% of bytes: its 1,536-row matrices are searched,
    # its 384-row ones not). 4,096 saved 35-39% but cost the best record's banked model 1.8%: its
    # 1,152-3,456 stacked rows have parents (benchmarks/gates.py, benchmarks/pg_banked.py).
    parents_search_rows: int = 1024
    parents_probes: int = parents.PROBES  # the clusters `find` looks in for each row's parent
    also_normal: bool = False  # also pack with PackOptions(), keep the smaller (estimates may mislead)

    @classmethod
    def for_effort(cls, effort: str) -> PackOptions:
        """ "normal": PackOptions(). "max", the last bytes under a hard cap: every k everywhere, every
        candidate scored fully, lzma on heads' side data, no shortcut, every int8 matrix's parents
        searched in 4 x PROBES clusters; and "normal"'s artifact where it is smaller."""
        if effort == "normal":
            return cls()
        if effort != "max":
            raise QuantError(f"effort {effort!r} is not one of normal, max")
        ks = (2, 4, 8, 16, 32)  # then leaders, finalists, k-means iterations:
        wide = Effort(ks[:4], ks, ks, 64, 8, 8, per_symbol=0, all_grids=True, sweep=False)
        parents_everywhere = {"parents_search_rows": 0, "parents_probes": 4 * parents.PROBES}
        no_gates = Gates(*(None for _ in fields(Gates)))  # every shortcut off
        return cls(wide, wide, spec.PORTABLE, no_gates, **parents_everywhere, also_normal=True)
