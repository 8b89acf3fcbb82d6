"""Load a recurnorm artifact (.rnpk, format 2) with the standard library and numpy alone.

    from rnpk_load import load
    state_dict = load("model.rnpk")  # or the artifact's bytes; {name: torch.Tensor}

This file is standalone: `recurnorm loader` writes it for the code that ships with a
model (e.g. a Parameter Golf train_gpt.py). It needs numpy, and torch only to hand
back tensors (`decode` returns numpy arrays; bfloat16 as its uint16 bits). Every
hash in the artifact is checked: a damaged artifact raises ValueError, never wrong
weights. It reads what recurnorm writes by default (the portable profile: raw,
deflate, lzma, rans); docs/FORMAT.md in recurnorm is the byte layout.
"""

import hashlib
import json
import lzma
import struct
import zlib

import numpy as np

NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
PACKED = {"trit5": (5, 1), "bits2": (4, 1), "nib4": (2, 1), "pack6": (4, 3), "byte": (1, 1)}  # symbols, bytes


def need(ok, why):
    if not ok:
        raise ValueError("rnpk: " + why)


def inflate(kind, blob, limit):
    """Compressor ids: 0 raw, 2 raw deflate, 3 raw LZMA2 (1 = zstd is not portable)."""
    out = bytes(blob)
    if kind:
        need(kind in (2, 3), "zstd-compressed data (repack with recurnorm's default codecs)")
        d = zlib.decompressobj(-15) if kind == 2 else lzma.LZMADecompressor(
            lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 22}])
        out = d.decompress(out, limit + 1)
        need(d.eof and not d.unused_data, "damaged compressed data")
    need(len(out) <= limit, "compressed data too large")
    return out


def varints(b, n):
    """n LEB128 numbers (< 2**35) filling b."""
    b = np.frombuffer(b, np.uint8).astype(np.int64)
    ends = np.flatnonzero(b < 128)
    need(len(ends) == n and (not n or ends[-1] == len(b) - 1), "bad table")
    starts = np.r_[0, ends[:-1] + 1][:n]
    out = np.zeros(n, np.int64)
    for j in range(5):
        has = starts + j <= ends
        out[has] |= (b[starts[has] + j] & 127) << 7 * j
    need(not n or (ends - starts).max() < 5, "bad table")
    return out


def unpack_layout(raw, layout, n, dt):
    """A zstd/deflate/lzma stream's layout: plain, shuffle (byte-grouped) or packed symbols."""
    if layout == "plain":
        return np.frombuffer(raw, dt)
    if layout == "shuffle":
        return np.frombuffer(np.frombuffer(raw, np.uint8).reshape(dt.itemsize, -1)[::-1].T.tobytes(), dt)
    per, size = PACKED[layout]
    b = np.frombuffer(raw, np.uint8).astype(np.int64)
    if per == 5:
        d = b[:, None] // 3 ** np.arange(5) % 3
    else:  # little-endian words of `size` bytes, first symbol in the low bits
        bits = 8 * size // per
        w = (b.reshape(-1, size) << 8 * np.arange(size)).sum(1)
        d = w[:, None] >> bits * np.arange(per) & (1 << bits) - 1
    return d.ravel()[:n]


def contexts(p, k, ids, n, t, rows, cols, L, scales):
    """Context id of code positions 0, t, 2t, ... < n (see rans.context_vector)."""
    pos = np.arange(0, n, t)
    var = p.get("context", "none")
    if var == "scale":
        a = np.abs(scales.astype(np.float64))
        order = np.argsort(np.where(np.isfinite(a), a, 0), kind="stable")
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order)) * k // max(len(order), 1)
        return rank[pos // L]
    c = np.zeros(len(pos), np.int64)
    if var != "none":
        ins = pos < rows * cols
        r, q = pos[ins] // cols, pos[ins] % cols
        kc = p.get("kc", 1)
        c[ins] = {"row": lambda: ids[r], "col": lambda: ids[q],
                  "grid": lambda: ids[r] * kc + ids[rows + q]}[var]()
    return c


class Rans:
    """Every rANS stream of an artifact, decoded together in one lock-step loop."""

    def __init__(self):
        self.jobs = []

    def add(self, body, p, n, tshape, L, scales, done):
        t, nsym, prec, lanes = p.get("tuple", 1), p["nsym"], p["prec"], p["lanes"]
        k, nt = p.get("k", 1), p["nsym"] ** p.get("tuple", 1)
        need(0 < prec <= 16 and 0 < lanes <= 4096 and nt <= 4096 and k <= 64, "bad rans params")
        rows, cols = (tshape[0], int(np.prod(tshape[1:]))) if len(tshape) > 1 else (1, n)
        pos = 0
        heads = []
        for _ in range(2):
            v, j = 0, 0
            while True:
                v |= (body[pos] & 127) << 7 * j
                pos, j = pos + 1, j + 1
                if body[pos - 1] < 128:
                    break
            heads.append((v >> 2, v & 3))
        (tl, tz), (il, iz) = heads
        tables = varints(inflate(tz, body[pos:pos + tl], 5 * k * nt), k * nt).reshape(k, nt)
        nid = {"row": rows, "col": cols, "grid": rows + cols}.get(p.get("context"), 0)
        ids = np.frombuffer(inflate(iz, body[pos + tl:pos + tl + il], nid), np.uint8).astype(np.int64)
        need(len(ids) == nid, "bad class ids")
        ctx = contexts(p, k, ids, n, t, rows, cols, L, scales)
        need(not len(ctx) or (ctx.min() >= 0 and ctx.max() < k), "bad contexts")
        need((tables.sum(1)[np.unique(ctx)] == 1 << prec).all(), "bad table sums")
        coder = np.frombuffer(body[pos + tl + il:], np.uint8)
        need(len(coder) >= 4 * lanes and len(coder) % 2 == 0, "bad rans stream")
        units = len(ctx)
        steps = -(-units // lanes)
        need(steps <= 65536, "bad rans stream")
        self.jobs.append(dict(tables=tables, ctx=ctx, prec=prec, lanes=lanes, units=units, steps=steps,
                              x=coder[:4 * lanes].view("<u4"), words=coder[4 * lanes:].view("<u2"),
                              nsym=nsym, t=t, n=n, done=done))

    def run(self):
        """Decode every job; job["done"](symbols) receives each stream's code symbols."""
        jobs = sorted(self.jobs, key=lambda j: -j["steps"])  # active lanes are then a prefix
        keys, freqs, symof, rowkey, x, words = [], [], [], [], [], []
        base, stride, shift, wstart, lane0, rows = [], [], [], [], [], 0
        nunits = nlanes = nwords = 0
        ident = {}  # a no-op row per precision: padding units leave a lane's state alone
        for j in jobs:
            p = j["prec"]
            if p not in ident:
                ident[p] = rows
                keys.append([rows << 17])
                freqs.append([1 << p])
                symof.append([0])
                rows += 1
            f = j["tables"]
            k, nt = f.shape
            # One sorted key per (row, symbol): row << 17 | its cumulative count, so a
            # searchsorted finds every lane's symbol in every stream's tables at once.
            keys.append(((np.arange(k)[:, None] + rows) << 17 | np.cumsum(f, 1) - f).ravel())
            freqs.append(f.ravel())
            symof.append(np.tile(np.arange(nt), k))
            W, S = j["lanes"], j["steps"]
            rk = np.full(W * S, ident[p] << 17, np.int64)  # units laid out [step, lane], padded
            rk[:j["units"]] = (j["ctx"] + rows) << 17
            rows += k
            rowkey.append(rk)
            j["at"] = nunits
            base.append(nunits + np.arange(W))
            stride += [W] * W
            shift += [p] * W
            lane0.append(nlanes)
            wstart.append(nwords)
            x.append(j["x"])
            words.append(j["words"])
            nunits, nlanes, nwords = nunits + W * S, nlanes + W, nwords + len(j["words"])
        cat = lambda a: np.concatenate([np.asarray(v, np.int64) for v in a]) if a else np.zeros(0, np.int64)
        keys, freqs, symof, rowkey, x, base = map(cat, (keys, freqs, symof, rowkey, x, base))
        stride, shift, lane0 = cat([stride]), cat([shift]), cat([lane0 + [nlanes]])
        mask = (1 << shift) - 1
        sid = np.repeat(np.arange(len(jobs)), [j["lanes"] for j in jobs])
        wptr, wend = cat([wstart]), cat([wstart[1:] + [nwords]])
        words = cat(words + [[0]])
        out = np.zeros(nunits, np.int64)
        cs = np.zeros(nlanes + 1, np.int64)
        steps = [j["steps"] for j in jobs]
        ns = len(jobs)
        for t in range(steps[0] if jobs else 0):
            while steps[ns - 1] <= t:  # streams whose units are all decoded drop out
                ns -= 1
            a = lane0[ns]
            xa = x[:a]
            u = base[:a] + t * stride[:a]
            key = rowkey[u] | xa & mask[:a]  # the lane's row and slot
            g = keys.searchsorted(key, "right") - 1
            out[u] = g
            xa[:] = freqs[g] * (xa >> shift[:a]) + key - keys[g]
            # Lanes below 2**16 read the next word of their stream, in lane order.
            low = xa < 65536
            np.cumsum(low, out=cs[1:a + 1])
            i = np.flatnonzero(low)
            if len(i):
                at = wptr[:ns] - cs[lane0[:ns]]
                xa[i] = xa[i] << 16 | words.take(at[sid[i]] + cs[i], mode="clip")
                wptr[:ns] += cs[lane0[1:ns + 1]] - cs[lane0[:ns]]
        need((x == 1 << 16).all() and (wptr == wend).all(), "rans stream does not decode")
        for j in jobs:
            sym, s, t = symof[out[j["at"]:j["at"] + j["units"]]], j["nsym"], j["t"]
            if t > 1:
                sym = (sym[:, None] // s ** np.arange(t) % s).ravel()
            j["done"](sym[:j["n"]])


def decode(src, max_bytes=1 << 30):
    """({name: numpy array}, metadata) of an artifact (a path or its bytes)."""
    data = memoryview(src if isinstance(src, (bytes, bytearray, memoryview)) else open(src, "rb").read())
    try:
        return _decode(data, max_bytes)
    except (KeyError, IndexError, TypeError, AttributeError, struct.error, OverflowError) as e:
        raise ValueError(f"rnpk: malformed artifact ({type(e).__name__}: {e})") from None


def _decode(data, max_bytes):
    magic, ver, flags, mlen, sha = struct.unpack_from("<4sHHQ32s", data)
    need(magic == b"RNPK" and ver == 2 and flags < 4, "not a recurnorm format-2 artifact")
    m = bytes(data[48:48 + mlen])
    need(len(m) == mlen and hashlib.sha256(m).digest() == sha, "manifest hash mismatch")
    man = json.loads(inflate(flags, m, 1 << 26))
    pay = data[48 + mlen:]
    need(man["payload_length"] == len(pay) and hashlib.sha256(pay).hexdigest() == man["payload_sha256"],
         "payload hash mismatch")
    todo = [t for t in man["tensors"] if "alias_of" not in t]
    size = sum(int(np.prod(t["shape"])) * np.dtype(t["dtype"].replace("bfloat", "float")).itemsize
               for t in todo)
    need(size <= max_bytes, f"{size} decoded bytes exceed max_bytes={max_bytes}")
    arrays, rans = {}, Rans()

    def stream(t, kind):
        s = t["streams"][kind]
        dt = np.dtype(s["dtype"]).newbyteorder("<")
        n = int(np.prod(s["shape"]))
        body = pay[s["offset"]:s["offset"] + s["length"]]
        p = s["params"]
        key = (t["name"], kind)

        def done(sym, off=p.get("offset", 0)):  # packed symbols + offset = codes
            a = (sym + off if off else sym).astype(dt).reshape(s["shape"])
            need(hashlib.sha256(a.tobytes()).hexdigest() == s["sha256"], f"{key} hash mismatch")
            arrays[key] = a

        if s["codec"] == "raw":
            need(len(body) == n * dt.itemsize, f"{key}: bad length")
            return done(np.frombuffer(body, dt), 0)
        if s["codec"] == "rans":
            L = s["shape"][1] if len(s["shape"]) == 2 else n
            return rans.add(body, p, n, t["shape"], L, arrays.get((t["name"], "scales")), done)
        need(s["codec"] in ("deflate", "lzma"), f"{key}: codec {s['codec']} is not portable")
        lay = p["layout"]
        per, size = PACKED.get(lay, (1, dt.itemsize))
        nb = -(-n // per) * size
        raw = inflate(2 if s["codec"] == "deflate" else 3, body, nb)
        need(len(raw) == nb, f"{key}: bad length")
        done(unpack_layout(raw, lay, n, dt), 0 if lay in ("plain", "shuffle") else p.get("offset", 0))

    for t in todo:
        for kind in ("scales", "zeros", "codes"):
            if kind in t["streams"]:
                stream(t, kind)
    rans.run()
    out = {}
    for t in man["tensors"]:
        name = t["name"]
        if "alias_of" in t:
            out[name] = out[t["alias_of"]]
            continue
        out[name] = dequantize(t, *(arrays.get((name, k)) for k in ("codes", "scales", "zeros")))
    return out, man.get("metadata", {})


def dequantize(t, codes, scales, zeros):
    """The tensor (numpy; bfloat16 as uint16 bits) in its original dtype and shape."""
    fmt, n, dtype = t["format"], int(np.prod(t["shape"])), t["dtype"]
    if fmt in ("fp32", "fp16", "bf16"):
        bits = codes.ravel()[:n]
        v = (bits.view(np.float32) if fmt == "fp32" else bits.view(np.float16).astype(np.float32)
             if fmt == "fp16" else (bits.astype(np.uint32) << 16).view(np.float32))
    elif fmt == "raw":
        v = codes.ravel()[:n]
        return (v != 0 if dtype == "bool" else v.astype(dtype)).reshape(t["shape"])
    elif fmt == "nf4":
        v = (NF4[codes] * scales.astype(np.float32)[:, None]).ravel()[:n]
    else:  # scale-and-round grids: intN, int8_pg, ternary
        c, s = codes.astype(np.float32), scales.astype(np.float32)[:, None]
        v = ((c if zeros is None else c - zeros.astype(np.float32)[:, None]) * s).ravel()[:n]
    if dtype == "bfloat16":  # round to nearest even, as torch does (NaN: 0x7FC0)
        b = v.astype(np.float32).view(np.uint32).astype(np.int64)
        v = np.where(np.isnan(v), 0x7FC0, (b + 0x7FFF + (b >> 16 & 1)) >> 16).astype(np.uint16)
    else:
        v = v.astype(dtype)
    return v.reshape(t["shape"])


def load(src, max_bytes=1 << 30):
    """{name: torch.Tensor} of an artifact (a path or its bytes): dequantized, original
    dtypes and shapes, tied names sharing one tensor."""
    import torch

    out, seen = {}, {}
    for k, v in decode(src, max_bytes)[0].items():
        if id(v) not in seen:  # uint16 only holds bfloat16 bits (torch has no other use for it here)
            seen[id(v)] = (torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) if v.dtype == np.uint16
                           else torch.from_numpy(np.ascontiguousarray(v)))
        out[k] = seen[id(v)]
    return out
