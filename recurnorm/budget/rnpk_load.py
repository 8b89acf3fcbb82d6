"""Load a recurnorm artifact (.rnpk, format 3) with the standard library and numpy alone.

    from rnpk_load import load
    state_dict = load("model.rnpk")  # or the artifact's bytes; {name: torch.Tensor}

This file is standalone: `recurnorm loader` writes it for the code that ships with a
model (e.g. a Parameter Golf train_gpt.py). It needs numpy, and torch only to hand
back tensors (`decode` returns numpy arrays; bfloat16 as its uint16 bits). It reads
what recurnorm writes by default (the portable profile: raw, deflate, lzma, rans, fields);
docs/FORMAT.md in recurnorm is the byte layout.

Artifacts may come from strangers, so reading is bounded as recurnorm's own reader is:
the file, the manifest (8 MiB) and every field are checked, and the bytes
decoding needs (`max_bytes`, 1 GiB by default: recurnorm's decoded-bytes sum) are
summed from the manifest before any array is made; every hash is checked (the payload's
before anything is decompressed). Any malformed artifact raises RnpkError, a
ValueError: never another exception, never wrong weights.
"""

import hashlib
import json
import lzma
import math
import struct
import zlib

import numpy as np

# bitsandbytes' NF4 table, each the shortest decimal that rounds to the float32 it uses
# fmt: off
NF4 = np.array([-1, -0.6961928, -0.52507305, -0.3949175, -0.28444138, -0.18477343, -0.091050036, 0, 0.0795803,
                0.1609302, 0.2461123, 0.33791524, 0.44070983, 0.562617, 0.72295684, 1], np.float32)
# fmt: on
BF16 = np.dtype("<u2", metadata={"bf16": 1})  # numpy has no bfloat16: its bits, marked
MANIFEST = 8 << 20  # the manifest's bytes, stored and decompressed


class RnpkError(ValueError):
    """What every malformed artifact raises."""


def need(ok, why):
    if not ok:
        raise RnpkError("rnpk: " + why)


def inflate(kind, blob, limit):
    """Compressor ids: 0 raw, 2 raw deflate, 3 raw LZMA2 (1 = zstd is not portable)."""
    out = blob
    if kind:
        need(kind > 1, "zstd is not portable")
        d = (
            zlib.decompressobj(-15)
            if kind == 2
            else lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 22}])
        )
        out = d.decompress(out, limit + 1)
        need(d.eof and not d.unused_data, "bad data")
    need(len(out) <= limit, "bad data")
    return out


def varints(b, n):
    """n LEB128 numbers (< 2**35) filling b."""
    b = np.frombuffer(b, np.uint8)
    ends = np.flatnonzero(b < 128)
    need(len(ends) == n, "bad data")
    starts = np.r_[0, ends[:-1] + 1][:n]
    out = np.zeros(n, int)
    for j in range(5):  # (a longer or damaged varint decodes wrong: the stream's hash catches it)
        has = starts + j <= ends
        out[has] |= (b[starts[has] + j] & 127).astype(int) << 7 * j
    return out


def dims(shape):
    """The element count of a shape (a negative dim would hide others' bytes from the sum)."""
    need(min(shape, default=0) >= 0, "bad data")
    return math.prod(shape)


def unpack_layout(raw, layout, dt):
    """A deflate/lzma stream's layout: plain, or shuffle (byte-grouped, high bytes first)."""
    need(layout == "plain" or layout == "shuffle" and dt.itemsize > 1, "bad data")
    if layout == "shuffle":
        raw = np.frombuffer(raw, np.uint8).reshape(dt.itemsize, -1)[::-1].T.tobytes()
    return np.frombuffer(raw, dt)


def contexts(p, k, ids, n, t, tshape, L, scales):
    """Context ids (uint8) of code positions 0, t, 2t, ... < n (see recurnorm's rans.Geometry.context_vector)."""
    var = p.get("context", "none")
    if var == "scale":  # the code row's rank by |scale| (stable), cut into k equal runs
        rank = np.empty(len(scales), np.uint8)
        rank[np.argsort(np.abs(scales.astype(float)), kind="stable")] = np.arange(len(scales)) * k // len(scales)
        c = np.repeat(rank, L)[:n]
    elif var == "none":
        c = np.zeros(n, np.uint8)
    else:  # the tensor as a matrix (its view's rows x cols: no more than n); padding positions get context 0
        rows, cols = tshape[0], math.prod(tshape[1:])
        pad = np.zeros(n - rows * cols, np.uint8)
        c = (
            ids[:rows, None]
            if var == "row"
            else ids[None, :cols]
            if var == "col"
            else ids.reshape(-1, cols)[np.arange(rows) // p["rb"]]
            if var == "block"
            else ids[rows:].reshape(-1, cols)[ids[:rows]]
            if var == "map"
            else ids[:rows, None] * p["kc"] + ids[rows:][None]
        )
        c = np.r_[np.broadcast_to(c, (rows, cols)).ravel(), pad]
    return c[::t]


class Stream:
    """One rANS stream: its tables, per-unit contexts, lanes and coder words. (Nothing here
    is trusted: the parameters are bounded before anything is made from them, and a stream
    that does not decode exactly, or decodes to codes whose hash differs, raises.)"""

    def __init__(self, body, p, n, tshape, L, scales, done):
        self.t, self.nsym, self.prec, self.lanes = t, nsym, prec, lanes = (
            p.get("tuple", 1),
            p["nsym"],
            p["prec"],
            p["lanes"],
        )
        k, units = p.get("k", 1), -(-n // t)  # (t = 0: ZeroDivisionError, malformed as any)
        need(0 < t < 9 and 0 < k < 257 and 0 < prec < 17 and nsym**t <= 4096 and units <= lanes << 16, "bad data")
        nt = nsym**t
        b = np.frombuffer(body, np.uint8)
        head = np.flatnonzero(b[:10] < 128)[1] + 1  # two varints: 4 * length + compressor id
        (tl, tz), (il, iz) = [(v >> 2, v & 3) for v in varints(b[:head], 2)]
        self.f = varints(inflate(tz, b[head : head + tl], 5 * k * nt), k * nt).reshape(k, nt)
        coder = b[head + tl + il :]
        self.x, self.words = coder[: 4 * lanes].view("<u4"), coder[4 * lanes :].view("<u2")
        need(len(self.x) == lanes and len(self.words) <= units, "bad data")  # a unit takes <= 1 word
        ids = np.frombuffer(inflate(iz * (il > 0), b[head + tl : head + tl + il], 2 * n), np.uint8)
        self.ctx = contexts(p, k, ids, n, t, tshape, L, scales)
        self.steps = -(-units // lanes)
        self.n, self.done = n, done


def fields(body, p, n, dt, done):
    """A fields stream: float words as a tail (the low mantissa bits in byte planes, then bit
    planes, then the sign's bit plane) and a rans stream of head symbols (the exponent above
    the `hi` top mantissa bits). (The rans body, and the head symbols'
    callback, which fills each word in place; a tail of the wrong size raises.)"""
    m, h, w, o = p["mant"], p["hi"], 8 * dt.itemsize, p["tail"]
    need(m < w - 1, "bad data")
    (q, r), c = divmod(m - h, 8), -(-n // 8)

    def fill(sym):  # (the tail inflated only now: one stream's at a time)
        tail = inflate(p["tz"], body[:o], q * n + r * c + c)
        x = sym.astype(f"<u{dt.itemsize}")
        x += p["lo"]
        x <<= m - h
        for j in range(q + r + 1):  # byte plane j: bits 8j..; bit plane j - q: bit j + 7q; the sign
            y = np.frombuffer(tail, np.uint8, n if j < q else c, min(j, q) * n + max(j - q, 0) * c)
            k = 8 * j if j < q else w - 1 if j == q + r else j + 7 * q
            x.view(np.uint8).reshape(n, -1)[:, k // 8] |= (y if j < q else np.unpackbits(y)[:n]) << k % 8
        done(x.view(dt) if dt.kind == "f" else x)  # (float words: a quantizer's scales)

    return body[o:], fill


def tables(streams):
    """Every stream's tables as one sorted key per (table row, symbol): row << 17 | its cumulative
    count, so one searchsorted finds the symbol of every lane in every stream's tables. Row `rows`
    has one symbol owning all 2**prec slots: the padding units after a stream's last one leave the
    lane's state as it is. Also each unit's slot, [step, lane]: its context + 1 (0: padding)."""
    keys, freq, sym, rows, units, small = [], [], [], 0, 0, 1
    for s in streams:
        k, nt = s.f.shape
        keys += [[rows << 17], ((np.arange(k)[:, None] + rows + 1) << 17 | np.cumsum(s.f, 1) - s.f).ravel()]
        freq += [[1 << s.prec], s.f.ravel()]
        sym += [[0], np.tile(np.arange(nt), k)]
        s.at, s.row = units, rows
        rows += k + 1
        units += s.lanes * s.steps
        small &= k < 255 and nt < 257
    a = np.zeros(units, np.uint8 if small else np.uint16)
    for s in streams:
        v = a[s.at : s.at + len(s.ctx)]
        v[:] = s.ctx
        v += 1
        s.ctx = len(v)
    return *map(np.concatenate, (keys, freq, sym)), a


def decode_rans(streams):
    """Decode every stream together: lane j of a stream takes units j, j + lanes, ...; each
    step advances every lane of every stream that still has units, in one set of numpy calls."""
    if not streams:
        return
    streams.sort(key=lambda s: -s.steps)  # lanes still at work are then a prefix
    keys, freq, sym, a = tables(streams)  # a: each unit's context + 1, replaced by its symbol once decoded
    W = [s.lanes for s in streams]
    lane0 = np.cumsum([0] + W)  # each stream's first lane
    sid = np.repeat(np.arange(len(W)), W)
    stride = np.repeat(W, W)
    shift = np.repeat([s.prec for s in streams], W)
    row = np.repeat([s.row for s in streams], W)
    base = np.arange(lane0[-1]) - lane0[sid] + np.repeat([s.at for s in streams], W)
    x = np.concatenate([s.x for s in streams]).astype(int)
    words = np.concatenate([s.words for s in streams] + [np.zeros(1, np.uint16)])
    wend = np.cumsum([len(s.words) for s in streams])
    wptr = wend - [len(s.words) for s in streams]
    cs = np.zeros(len(x) + 1, int)
    ns = len(streams)
    for t in range(streams[0].steps):
        while streams[ns - 1].steps <= t:  # streams whose units are all decoded drop out
            ns -= 1
        m = lane0[ns]
        xa = x[:m]
        u = base[:m] + t * stride[:m]
        key = (a[u] + row[:m]) << 17 | xa & (1 << shift[:m]) - 1  # the lane's table row and slot
        g = keys.searchsorted(key, "right") - 1
        a[u] = sym[g]
        xa[:] = freq[g] * (xa >> shift[:m]) + key - keys[g]
        low = xa < 65536  # these lanes read their stream's next word, in lane order
        np.cumsum(low, out=cs[1 : m + 1])
        i = np.flatnonzero(low)
        xa[i] = xa[i] << 16 | words.take((wptr - cs[lane0[:-1]])[:ns][sid[i]] + cs[i], mode="clip")
        wptr[:ns] += cs[lane0[1 : ns + 1]] - cs[lane0[:ns]]
    need((x == 1 << 16).all() and (wptr == wend).all(), "bad data")
    for s in streams:
        v = a[s.at : s.at + s.ctx]
        if s.t > 1:  # units are tuples of t symbols, first in the low digit
            v = (v[:, None] // s.nsym ** np.arange(s.t, dtype=v.dtype) % s.nsym).ravel()
        s.done(v[: s.n])


def needs(t):
    """The bytes decoding a stored tensor needs, from its entry, before any array is made: its
    output (at least 4 bytes a weight when quantized) or its streams and rans tables (32 bytes
    an entry), whichever is more (recurnorm's sum, never above it)."""
    return max(
        dims(t["shape"]) * max(np.dtype(t["dtype"].replace("bf", "f")).itemsize, 4 * (t["format"] != "raw")),
        sum(
            dims(s["shape"]) * np.dtype(s["dtype"]).itemsize
            + (
                "nsym" in s["params"]
                and 32 * s["params"].get("k", 1) * min(s["params"]["nsym"], 4097) ** min(s["params"].get("tuple", 1), 9)
            )
            for s in t["streams"].values()
        ),
    )


def stream(pay, t, kind, arrays, rans):
    """One stream of a tensor: decoded into arrays now, or its rans stream appended to rans."""
    s = t["streams"][kind]
    dt, n, p, key = np.dtype(s["dtype"]).newbyteorder("<"), dims(s["shape"]), s["params"], (t["name"], kind)
    body = pay[s["offset"] : s["offset"] + s["length"]]

    def done(sym):  # symbols + offset (wrapping in the dtype's width) = the codes; then their hash
        a = sym.astype(dt, copy=sym.base is not None)  # (a fields stream's words: as they are)
        off = p.get("offset", 0)
        if off:
            v = a.view(f"<u{dt.itemsize}")
            v += v.dtype.type(off % 256**dt.itemsize)
        a = a.reshape(s["shape"])
        need(hashlib.sha256(a).hexdigest() == s["sha256"], f"{key} hash mismatch")
        arrays[key] = a

    if s["codec"] in ("rans", "fields"):
        L = s["shape"][-1]  # (streams are [G, L] codes or 1-D)
        if s["codec"] == "fields":
            body, done = fields(body, p, n, dt, done)
        return rans.append(Stream(body, p, n, t.get("view", t["shape"]), L, arrays.get((t["name"], "scales")), done))
    kind = {"raw": 0, "deflate": 2, "lzma": 3}.get(s["codec"], 1)  # zstd is not portable
    done(unpack_layout(inflate(kind, body, n * dt.itemsize), p.get("layout", "plain"), dt))


def decode(src, max_bytes=1 << 30):
    """({name: numpy array}, metadata) of an artifact (a path or its bytes)."""
    limit = max_bytes + MANIFEST + 48
    if not isinstance(src, (bytes, bytearray, memoryview)):
        with open(src, "rb") as f:  # (its size first: a read of limit bytes would allocate them)
            need(f.seek(0, 2) <= limit, "larger than max_bytes allows")
            f.seek(0)
            src = f.read()
    data = memoryview(src)
    try:
        need(len(data) <= limit, "larger than max_bytes allows")
        magic, ver, flags, mlen, sha = struct.unpack_from("<4sHHQ32s", data)
        # flags: the manifest's compressor (bits 0-1), some tensor has lowrank (4) or view (8)
        e = len(data) - mlen  # the manifest: the last mlen bytes; the payload: from 48 to there
        need(magic == b"RNPK" and ver == 3 and flags < 16 and mlen <= MANIFEST and e >= 48, "not a format-3 .rnpk")
        m = bytes(data[e:])
        need(hashlib.sha256(m).digest() == sha, "manifest hash mismatch")
        man = json.loads(inflate(flags & 3, m, MANIFEST), parse_constant=int)  # (no NaN/Infinity)
        pay = data[48:e]
        need(hashlib.sha256(pay).hexdigest() == man["payload_sha256"], "payload hash mismatch")
        todo = [t for t in man["tensors"] if "alias_of" not in t]
        need(sum(map(needs, todo)) <= max_bytes, "larger than max_bytes allows")
        arrays = {}
        for kinds in (("scales", "zeros", "parents"), ("codes",)):  # (a codes stream's contexts need its scales)
            rans = []
            for t in todo:
                for kind in kinds:
                    if kind in t["streams"]:
                        stream(pay, t, kind, arrays, rans)
            decode_rans(rans)
        out = {}
        for t in man["tensors"]:
            name = t["name"]
            out[name] = (
                out[t["alias_of"]]
                if "alias_of" in t
                else dequantize(
                    t,
                    restore(
                        arrays.pop((name, "codes")), arrays.pop((name, "parents"), None), t.get("view", t["shape"])
                    ),
                    *(arrays.pop((name, k), None) for k in ("scales", "zeros")),
                    [*map(out.pop, t.get("lowrank", []))],
                )
            )
        return out, man.get("metadata", {})
    except RnpkError:
        raise
    except Exception as e:  # whatever else a malformed artifact trips: the same error
        raise RnpkError(f"rnpk: malformed artifact ({e!r})") from None


def restore(c, P, shape):
    """int8 codes whose rows (the tensor's [rows, cols], or its view's) are residuals from earlier rows,
    P their [rows, 2] distances back (0: none) and multipliers k: prediction (k * parent + 16) >> 5, wrapping."""
    if P is not None:
        need(len(shape) > 1 and P.shape == (shape[0], 2), "bad data")
        c, s = c.reshape(len(P), -1).copy(), c.shape
        for i, (d, k) in enumerate(P.tolist()):
            if d:
                need(0 < d <= i and -65 < k < 65, "bad data")
                c[i] += (k * c[i - d].astype("i4") + 16 >> 5).astype("i1")
        c = c.reshape(s)
    return c


def dequantize(t, codes, scales, zeros, lr):
    """The tensor (numpy; bfloat16 as its uint16 bits, dtype BF16) in its original dtype and shape;
    lr: its LQER factors L [r, rows] and R [r, cols] (listed, and so decoded, right before it)."""
    fmt, n, dtype = t["format"], dims(t["shape"]), t["dtype"]
    if fmt in ("fp32", "fp16", "bf16"):
        bits = codes.ravel()[:n]
        v = (
            bits.view(np.float32)
            if fmt == "fp32"
            else bits.view(np.float16).astype(np.float32)
            if fmt == "fp16"
            else np.left_shift(bits, 16, dtype=np.uint32).view(np.float32)
        )
    elif fmt == "raw":
        v = codes.ravel()[:n]
        return (v != 0 if dtype == "bool" else v.astype(dtype, copy=False)).reshape(t["shape"])
    elif fmt == "nf4":
        v = NF4[codes]
        v *= scales.astype(np.float32)[:, None]
    else:  # scale-and-round grids: intN, int8_pg, ternary
        v = codes.astype(np.float32)
        if zeros is not None:
            v -= zeros.astype(np.float32)[:, None]
        v *= scales.astype(np.float32)[:, None]
    v = v.ravel()[:n]
    # + L[k]ᵀ R[k], rank by rank in float32: recurnorm's order and bits (equal ranks: validated)
    for a, b in zip(*lr):  # noqa: B905
        v = v + np.outer(a, b).ravel()
    if dtype == "bfloat16":  # round to nearest even, as torch does: in place, a piece at a time
        b = v.view(np.uint32)
        for i in range(0, n, 1 << 20):
            c = b[i : i + (1 << 20)]
            c += 0x7FFF + (c >> 16 & 1)
    else:
        v = v.astype(dtype, copy=False)
    # (bfloat16: the high halves hold it, and the float32 they start is as finite as it is)
    need(np.isfinite(v).all(), "bad data")
    return (v.view("<u2")[1::2].astype(BF16) if dtype == "bfloat16" else v).reshape(t["shape"])


def load(src, max_bytes=1 << 30):
    """{name: torch.Tensor} of an artifact (a path or its bytes): dequantized, original
    dtypes and shapes, tied names sharing one tensor. RnpkError (a ValueError) when the
    artifact is malformed or decodes to more than max_bytes."""
    import torch

    arrays, seen = decode(src, max_bytes)[0], {}
    for v in arrays.values():
        need(v.dtype.num in (*range(13), 23), "bad data")  # numpy's bool/int/float, as torch: no "object"
        if id(v) not in seen:
            seen[id(v)] = (
                torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
                if v.dtype.metadata
                else torch.from_numpy(v)  # (not ascontiguousarray: it made a 0-d tensor 1-d)
            )
    return {k: seen[id(v)] for k, v in arrays.items()}
