"""The standalone loader (rnpk_load.py, readable and compact): it runs without recurnorm,
zstandard or constriction, and its tensors equal recurnorm.load's bit for bit."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers import IMPORT_BLOCKER, embedding_like, joint_like, standalone_loader

from recurnorm.budget import format as fmt
from recurnorm.budget import pack_qtensors, read_artifact, spec, unpack
from recurnorm.budget.loader import compact_loader, loader_source, minified_loader
from recurnorm.cli.main import main
from recurnorm.export.pack import export_qtensors
from recurnorm.export.policy import ExportPolicy
from recurnorm.quant.qtensor import QTensor


def _state() -> dict:
    """Float tensors of every original dtype and a 0-d one, tied weights, integer and bool tensors."""
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(96, 40, generator=g)
    state = {
        "embed.weight": emb,
        "head.weight": emb,  # tied: one stored tensor, an alias
        "w32": torch.randn(48, 64, generator=g) * torch.linspace(0.2, 3, 64),
        "w16": torch.randn(33, 21, generator=g).half(),
        "wbf": torch.randn(40, 30, generator=g).bfloat16(),
        "w64": torch.randn(16, 8, generator=g).double(),
        "vec": torch.randn(50, generator=g),
        "gate": torch.tensor(0.25),  # 0-d, as a scalar gate: it comes back 0-d
        "ids": torch.arange(300).reshape(3, 100) - 7,
        "mask": torch.rand(37, generator=g) > 0.5,
        "small": (torch.arange(400) * 7 % 200).to(torch.int16),  # 200 values in int16
        "walk": torch.randn(64, 32, generator=g).cumsum(0),  # smooth rows: each predicted by the one above
        # rows that are multiples of earlier rows, plus noise (effort max predicts them from those)
        "related": torch.randn(40, 48, generator=g)[torch.randint(0, 40, (300,), generator=g)]
        * torch.rand(300, 1, generator=g).add(0.5)
        + 0.2 * torch.randn(300, 48, generator=g),
    }
    return state


def _artifacts() -> dict[str, bytes]:
    """Every quantizer the packer writes, and every portable codec, layout and context."""
    state = _state()
    out = {}
    for q, opts in (
        ("int8", {}),
        ("int4", {}),
        ("int6", {"asymmetric": True}),
        ("int5", {}),
        ("int3", {}),
        ("int2", {"asymmetric": True}),
        ("int7", {}),
        ("ternary", {}),
        ("ternary", {"group": 64}),
        ("nf4", {}),
        ("int8_pg", {}),
        ("fp16", {}),
        ("bf16", {}),
        ("fp32", {}),
    ):
        policy = ExportPolicy(quantizer=q, options=opts, keep_float_max_numel=0)
        qts = export_qtensors(state, q, policy)
        out[f"{q}{opts}"] = pack_qtensors(qts, {"quant": q})
        if q == "int8":  # rows predicted from earlier rows the search found
            out["int8 effort max"] = pack_qtensors(qts, effort="max")
        for codecs in (("deflate", "raw"), ("lzma", "raw"), ("raw",)):
            out[f"{q}{opts} {codecs[0]}"] = pack_qtensors(qts, codecs=codecs)
    # rans contexts: grid (embedding-like), row/col (structured), scale (varied row scales)
    rng = np.random.default_rng(3)
    emb = embedding_like()
    cols = np.clip(np.round(rng.normal(size=(200, 300)) * np.where(rng.random(300) < 0.3, 0.3, 3)), -7, 7).astype(
        np.int8
    )
    rows = np.clip(np.round(rng.normal(size=(300, 200)) * np.where(rng.random((300, 1)) < 0.3, 0.3, 3)), -7, 7).astype(
        np.int8
    )
    scale = np.exp(rng.normal(0, 1.5, 256)).astype(np.float16)
    by_scale = np.clip(np.round(rng.normal(size=(256, 64)) * scale[:, None].astype(float)), -60, 60)
    out["contexts"] = pack_qtensors(
        {
            "grid": QTensor("ternary", emb.shape, "float32", emb.reshape(1, -1), np.ones(1, np.float32)),
            "joint": QTensor(
                "ternary",
                (2048, 256),
                "float32",
                joint_like().reshape(1, -1),  # > 64 contexts
                np.ones(1, np.float32),
            ),
            "col": QTensor("int4", cols.shape, "float32", cols, np.ones(200, np.float16)),
            "row": QTensor("int4", rows.shape, "float32", rows, np.ones(300, np.float16)),
            "scale": QTensor("int8", (256, 64), "float32", by_scale.astype(np.int8), scale),
            "big": QTensor(
                "ternary",
                (1000, 1050),
                "bfloat16",
                rng.integers(-1, 2, (1, 1_050_000)).astype(np.int8),
                np.ones(1, np.float32),
            ),
        }
    )
    # LQER corrections (factors listed before their tensor; bfloat16 and float32 weights; a tied one)
    state = _state()
    spec = ExportPolicy(
        quantizer="int4",
        options={"lqer": 3, "lqer_l": "int2", "lqer_r": "int8"},
        embedding_format="int6",
        embedding_options={"lqer": 2},
        keep_float_max_numel=0,
    )
    out["lqer"] = pack_qtensors(export_qtensors(state, policy=spec))
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("artifacts")
    arts = _artifacts()
    for i, data in enumerate(arts.values()):
        (folder / f"{i:03d}.rnpk").write_bytes(data)
    return {"folder": folder, "bytes": arts}


def test_the_matrix_covers_every_portable_codec_layout_and_context(artifacts):
    seen = set()
    for data in artifacts["bytes"].values():
        manifest = read_artifact(data).manifest
        for t in manifest["tensors"]:
            for side in ("parents", "scales"):  # (fields scales: the loader's first rans round)
                if side in t.get("streams", {}):
                    seen.add((side, t["streams"][side]["codec"]))
            for s in t.get("streams", {}).values():
                p = s["params"]
                seen.add((s["codec"], p.get("layout") or p.get("context", "none") if s["codec"] != "raw" else ""))
                if p.get("tuple", 1) > 1:
                    seen.add(("rans", "tuple"))
                if p.get("k", 1) > 64:
                    seen.add(("rans", "wide"))
        assert manifest["version"] == spec.VERSION == 3
    want = {("rans", c) for c in ("none", "scale", "row", "col", "grid", "tuple", "wide")}
    want |= {(c, lay) for c in ("deflate", "lzma") for lay in ("plain", "shuffle")}
    want |= {("parents", c) for c in ("rans", "deflate", "lzma")} | {("scales", "fields")}
    assert want <= seen, want - seen
    assert ("raw", "") in seen and not any(c == "zstd" for c, _ in seen)


@pytest.mark.slow  # the numpy loader decodes every codec layout in a child
@pytest.mark.parametrize("compact", [False, True])
def test_loader_alone_equals_unpack_bit_for_bit(artifacts, tmp_path, compact):
    (tmp_path / "rnpk_load.py").write_bytes(compact_loader() if compact else loader_source().encode())
    script = IMPORT_BLOCKER + textwrap.dedent(f"""
        import glob, os, torch
        sys.path.insert(0, {str(tmp_path)!r})
        import rnpk_load
        for path in sorted(glob.glob(os.path.join({str(artifacts["folder"])!r}, "*.rnpk"))):
            sd = rnpk_load.load(path)
            assert sd["head.weight"] is sd["embed.weight"] if "head.weight" in sd else True  # tied: one tensor
            torch.save(sd, path + ".pt")
        import recurnorm  # the blocker holds: this must fail
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert "blocked: recurnorm" in run.stderr, run.stderr[-2000:]  # got to the end, blocked there
    for i, data in enumerate(artifacts["bytes"].values()):
        ref = unpack(data)
        got = torch.load(artifacts["folder"] / f"{i:03d}.rnpk.pt", weights_only=True)
        assert list(got) == list(ref)
        for name, t in ref.items():
            g = got[name]
            assert g.dtype == t.dtype and g.shape == t.shape, name
            assert torch.equal(g.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
        if "head.weight" in ref:  # tied weights come back as one tensor
            assert got["head.weight"].data_ptr() == got["embed.weight"].data_ptr()


def test_compact_form_is_the_same_program_smaller():
    from recurnorm.codewrap import same_program
    from recurnorm.codewrap.selfextract import read

    readable = loader_source()
    compact = compact_loader()
    assert len(compact) <= 4000 < 0.4 * len(readable.encode())  # the shipping target
    # It is the file `recurnorm wrap` writes (latin-1 literal, lzma), holding the minified loader.
    payload, _ = read(compact)
    assert compact.startswith(b"#coding:latin1\n") and payload.codec == "lzma"
    assert payload.files == (("<rnpk_load.py>", minified_loader()),)
    # The minified program keeps its public API and compiles.
    small = minified_loader()
    compile(small, "rnpk_load_min.py", "exec")
    assert not same_program(readable, small, False)[0]  # renamed: the same behaviour, not the same AST
    assert "def load(src,max_bytes=" in small and "def decode(src,max_bytes=" in small
    assert len(small) < len(readable)


def _damage(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x40
    return bytes(b)


def test_damaged_artifacts_raise_and_never_return_weights(artifacts):
    from recurnorm.budget import rnpk_load

    data = artifacts["bytes"]["contexts"]
    mlen = spec.HEADER.unpack_from(data, 0)[3]
    for at, why in (
        (spec.HEADER_SIZE + 3, "payload hash mismatch"),
        (len(data) - 10, "manifest hash mismatch"),
        (0, "not a format-3"),
        (20, "manifest hash mismatch"),
    ):
        with pytest.raises(ValueError, match=why):
            rnpk_load.load(_damage(data, at))
    for cut in (data[:-5], data[: spec.HEADER_SIZE + mlen - 1]):  # truncated: the manifest is not where it says
        with pytest.raises(ValueError, match="manifest hash mismatch|not a format-3"):
            rnpk_load.load(cut)
    # Re-signed damage inside a stream: the stream's own hash (or the coder's end state) catches it.
    manifest, payload = fmt.split_container(data)
    s = manifest["tensors"][0]["streams"]["codes"]
    bad = bytearray(payload)
    bad[s["offset"] + s["length"] - 3] ^= 0x10
    forged = fmt.write_container(manifest, bytes(bad))
    with pytest.raises(ValueError, match="rnpk"):
        rnpk_load.load(forged)


def test_loader_refuses_zstd_and_decoded_sizes_over_its_limit():
    from recurnorm.budget import rnpk_load

    qts = {"w": QTensor("fp16", (64, 64), "float32", (np.arange(4096) % 7).astype(np.uint16).reshape(1, -1) + 15360)}
    with pytest.raises(ValueError, match="zstd is not portable"):
        rnpk_load.load(pack_qtensors(qts, codecs=("zstd",)))
    data = pack_qtensors(qts)
    assert rnpk_load.load(data)["w"].shape == (64, 64)
    with pytest.raises(ValueError, match="max_bytes"):
        rnpk_load.load(data, max_bytes=1000)


def test_cli_loader_writes_both_forms_and_pack_verify_inspect_count_it(tmp_path):
    runner = CliRunner()
    readable, compact = tmp_path / "rnpk_load.py", tmp_path / "rnpk_small.py"
    r = runner.invoke(main, ["loader", "-o", str(readable)])
    assert r.exit_code == 0 and readable.read_text() == loader_source()
    r = runner.invoke(main, ["loader", "--compact", "-o", str(compact), "--json"])
    assert r.exit_code == 0 and compact.read_bytes() == compact_loader()
    assert runner.invoke(main, ["loader", "-o", str(readable)]).exit_code == 2  # no clobber
    assert runner.invoke(main, ["loader", "-o", str(readable), "--force"]).exit_code == 0
    ckpt = tmp_path / "ckpt.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.randn(64, 64)}, str(ckpt))
    art = tmp_path / "a.rnpk"
    r = runner.invoke(main, ["pack", str(ckpt), "-o", str(art), "--loader", str(compact), "--json"])
    assert r.exit_code == 0, r.output
    n = len(compact.read_bytes())
    import json

    cap = json.loads(r.output[r.output.index("{") :])
    assert cap["loader_bytes"] == n and cap["total_bytes"] == art.stat().st_size + n
    r = runner.invoke(
        main, ["verify", str(art), "--loader", str(compact), "--max-bytes", str(art.stat().st_size + n - 1)]
    )
    assert r.exit_code == 3
    r = runner.invoke(main, ["verify", str(art), "--loader", str(compact), "--max-bytes", str(art.stat().st_size + n)])
    assert r.exit_code == 0
    r = runner.invoke(main, ["inspect", str(art), "--loader", str(compact)])  # counted as verify counts it
    assert r.exit_code == 0 and f"(loader {len(compact_loader()):,})" in r.output


def test_verify_with_a_loader_refuses_what_the_loader_cannot_read():
    from recurnorm.budget import Budget, verify_bytes

    qts = {"w": QTensor("fp16", (64, 64), "float32", (np.arange(4096) % 7).astype(np.uint16).reshape(1, -1) + 15360)}
    zstd = pack_qtensors(qts, codecs=("zstd",))
    assert verify_bytes(zstd).ok  # the library reads it
    rep = verify_bytes(zstd, Budget(loader=4000))
    assert rep.exit_code == 4 and "standalone loader" in rep.reason and "zstd" in rep.reason
    assert verify_bytes(pack_qtensors(qts), Budget(loader=4000)).ok


def test_one_error_type_and_the_librarys_decode_limit(artifacts, tmp_path):
    """RnpkError (a ValueError) for every malformed input; the loader's decoded-bytes sum is
    never above the library's, so max_bytes = what verify needs reads what verify reads."""
    from recurnorm.budget import rnpk_load, validate

    assert issubclass(rnpk_load.RnpkError, ValueError)
    assert "RnpkError" in minified_loader()  # its public name survives the compact form
    data = artifacts["bytes"]["contexts"]
    need = validate.check_manifest(fmt.split_container(data)[0])
    assert rnpk_load.decode(data, max_bytes=need)[0]
    for bad in (b"", b"RNPK", data[:100], b"x" * 48):
        with pytest.raises(rnpk_load.RnpkError):
            rnpk_load.decode(bad)
    big = tmp_path / "big.rnpk"
    with open(big, "wb") as f:  # sparse: a file past max_bytes is refused from its size, unread
        f.write(data[:48])
        f.truncate(3 << 30)
    with pytest.raises(rnpk_load.RnpkError, match="larger than max_bytes"):
        rnpk_load.decode(big)
    with pytest.raises(rnpk_load.RnpkError, match="larger than max_bytes"):
        rnpk_load.decode(data, max_bytes=len(data) - (8 << 20) - 49)
    with pytest.raises(FileNotFoundError):  # not an artifact at all: the OS's own error
        rnpk_load.decode(tmp_path / "missing.rnpk")


def _loader_literals() -> tuple[dict[str, set], list, str]:
    """rnpk_load.py's literals: {expression: the constants it is compared with}, every constant
    expression's value, and its source as ast prints it (it imports nothing of the spec)."""
    tree, compared, values = ast.parse(loader_source()), {}, []
    for node in ast.walk(tree):
        try:  # constant expressions only: a name or a call of one is undefined here
            values.append(eval(compile(ast.Expression(node), "rnpk_load", "eval"), {"__builtins__": {}}))
        except Exception:
            pass
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            for a, b in zip(parts, parts[1:], strict=False):
                for x, c in ((a, b), (b, a)):
                    try:
                        v = eval(compile(ast.Expression(c), "rnpk_load", "eval"), {"__builtins__": {}})
                    except Exception:
                        continue
                    compared.setdefault(ast.unparse(x), set()).update(v if isinstance(v, tuple) else {v})
    return compared, values, ast.unparse(tree)


def test_the_standalone_loaders_literal_limits_are_the_specs():
    """rnpk_load.py spells the wire spec's facts as literals (it ships alone, in counted code):
    each must equal recurnorm.budget.spec's, or the loader and the library read different files."""
    from recurnorm.budget.validate import DEFAULT_MAX_DECODED_BYTES, TABLE_ENTRY_BYTES
    from recurnorm.quant.passthrough import FLOAT_FORMATS

    compared, values, src = _loader_literals()
    assert spec.MAGIC in compared["magic"] and spec.VERSION in compared["ver"]
    assert spec.HEADER.format in values and f"data[{spec.HEADER_SIZE}:e]" in src  # (format 3: the manifest last)
    assert compared["e"] == {spec.HEADER_SIZE}
    assert f"MANIFEST = {spec.MAX_MANIFEST_BYTES >> 20} << 20" in src
    assert compared["flags"] == {(spec.MANIFEST_COMPRESSOR_MASK | sum(spec.FIELD_FLAGS.values())) + 1}
    assert spec.MAX_TUPLE + 1 in compared["t"] and spec.MAX_CONTEXTS + 1 in compared["k"]
    assert compared["prec"] == {0, spec.MAX_PREC + 1} and compared["nsym ** t"] == {spec.MAX_ALPHABET}
    assert f"units <= lanes << {spec.MAX_STEPS.bit_length() - 1}" in src
    p = "s['params']"
    assert f"min({p}['nsym'], {spec.MAX_ALPHABET + 1}) ** min({p}.get('tuple', 1), {spec.MAX_TUPLE + 1})" in src
    assert f"{TABLE_ENTRY_BYTES} * {p}.get('k', 1)" in src
    assert f"max_bytes=1 << {DEFAULT_MAX_DECODED_BYTES.bit_length() - 1}" in src
    # compressors: deflate and lzma as the spec writes them, zstd refused
    portable = {spec.NAMES[k]: k for k in spec.PORTABLE}
    assert portable in values and compared["kind"] == {spec.ZSTD, spec.DEFLATE}  # (zstd: refused; else lzma)
    assert (
        f"zlib.decompressobj({spec.DEFLATE_WBITS})" in src
        and f"'dict_size': 1 << {spec.LZMA_DICT.bit_length() - 1}" in src
    )
    # codecs, stream kinds and rans contexts
    assert set(portable) | compared["s['codec']"] == set(spec.PORTABLE_CODECS)
    assert (spec.STREAM_KINDS[:3], spec.STREAM_KINDS[3:]) in values
    assert compared["var"] | {"grid"} == set(spec.CONTEXTS)
    assert tuple(FLOAT_FORMATS) in values  # (quant.passthrough's, as the loader dequantizes them)
    assert {f"p[{c.extra!r}]" for c in spec.CONTEXTS.values() if c.extra in ("kc", "rb")} <= {
        s for s in ("p['kc']", "p['rb']") if s in src
    }


def test_a_view_larger_than_its_codes_is_refused_before_its_contexts_are_made():
    """A forged view (spec.FIELD_FLAGS) whose rows x cols exceed the stream's codes: the class ids
    would broadcast to rows x cols bytes (64 MiB here, terabytes for a bigger forgery); the loader
    refuses it before making any of them. (The compact loader is this code, minified and renamed.)"""
    import tracemalloc

    contexts = standalone_loader(False)["contexts"]
    ids = np.zeros(2 * 8192, np.uint8)  # the rows' classes, then the columns'
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):
            contexts({"context": "grid", "kc": 2}, 4, ids, 4000, 1, [8192, 8192], 4000, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
