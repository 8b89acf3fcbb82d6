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

# bitsandbytes' NF4 table, each the shortest decimal that rounds to the float32 it uses
NF4 = np.array(
    [
        -1,
        -0.6961928,
        -0.52507305,
        -0.3949175,
        -0.28444138,
        -0.18477343,
        -0.091050036,
        0,
        0.0795803,
        0.1609302,
        0.2461123,
        0.33791524,
        0.44070983,
        0.562617,
        0.72295684,
        1,
    ],
    np.float32,
)
BF16 = np.dtype("<u2", metadata={"bf16": 1})  # numpy has no bfloat16: its bits, marked
PACKED = {"trit5": (5, 1), "bits2": (4, 1), "nib4": (2, 1), "pack6": (4, 3), "byte": (1, 1)}  # symbols, bytes


def need(ok, why):
    if not ok:
        raise ValueError("rnpk: " + why)


def inflate(kind, blob, limit):
    """Compressor ids: 0 raw, 2 raw deflate, 3 raw LZMA2 (1 = zstd is not portable)."""
    out = bytes(blob)
    if kind:
        need(kind > 1, "zstd is not portable")
        d = (
            zlib.decompressobj(-15)
            if kind == 2
            else lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 22}])
        )
        out = d.decompress(out, limit + 1)
        need(d.eof and not d.unused_data, "bad deflate/lzma data")
    need(len(out) <= limit, "too long")
    return out


def varints(b, n):
    """n LEB128 numbers (< 2**35) filling b."""
    b = np.frombuffer(b, np.uint8).astype(int)
    ends = np.flatnonzero(b < 128)
    need(len(ends) == n, "bad table")
    starts = np.r_[0, ends[:-1] + 1][:n]
    out = np.zeros(n, int)
    for j in range(5):  # (a longer or damaged varint decodes wrong: the stream's hash catches it)
        has = starts + j <= ends
        out[has] |= (b[starts[has] + j] & 127) << 7 * j
    return out


def unpack_layout(raw, layout, n, dt):
    """A zstd/deflate/lzma stream's layout: plain, shuffle (byte-grouped) or packed symbols."""
    if layout == "plain":
        return np.frombuffer(raw, dt)
    if layout == "shuffle":
        return np.frombuffer(np.frombuffer(raw, np.uint8).reshape(dt.itemsize, -1)[::-1].T.tobytes(), dt)
    per, size = PACKED[layout]
    b = np.frombuffer(raw, np.uint8).astype(int)
    if per == 5:
        d = b[:, None] // 3 ** np.arange(5) % 3
    else:  # little-endian words of `size` bytes, first symbol in the low bits
        bits = 8 * size // per
        w = (b.reshape(-1, size) << 8 * np.arange(size)).sum(1)
        d = w[:, None] >> bits * np.arange(per) & (1 << bits) - 1
    return d.ravel()[:n]


def contexts(p, k, ids, n, t, tshape, L, scales):
    """Context id of code positions 0, t, 2t, ... < n (see recurnorm's rans.context_vector)."""
    pos = np.arange(0, n, t)
    var = p.get("context", "none")
    if var == "scale":  # the code row's rank by |scale| (stable), cut into k equal runs
        rank = np.empty(len(scales), int)
        rank[np.argsort(np.abs(scales.astype(float)), kind="stable")] = np.arange(len(scales)) * k // len(scales)
        return rank[pos // L]
    if var == "none":
        return 0 * pos
    rows, cols = tshape[0], int(np.prod(tshape[1:]))  # the tensor as a matrix
    c, ins = 0 * pos, pos < rows * cols  # padding positions: context 0
    r, q = pos[ins] // cols, pos[ins] % cols
    c[ins] = ids[r] if var == "row" else ids[q] if var == "col" else ids[r] * p["kc"] + ids[rows + q]
    return c


class Stream:
    """One rANS stream: its tables, per-unit contexts, lanes and coder words. (Nothing here
    is trusted: a stream that does not decode exactly, or decodes to codes whose hash differs,
    raises.)"""

    def __init__(self, body, p, n, tshape, L, scales, done):
        self.t, self.nsym, self.prec, self.lanes = p.get("tuple", 1), p["nsym"], p["prec"], p["lanes"]
        k, nt = p.get("k", 1), self.nsym**self.t
        b = np.frombuffer(body, np.uint8)
        head = np.flatnonzero(b[:10] < 128)[1] + 1  # two varints: 4 * length + compressor id
        (tl, tz), (il, iz) = [(v >> 2, v & 3) for v in varints(b[:head], 2)]
        self.f = varints(inflate(tz, b[head : head + tl], 5 * k * nt), k * nt).reshape(k, nt)
        ids = np.frombuffer(inflate(iz, b[head + tl : head + tl + il], 1 << 24), np.uint8).astype(int)
        self.ctx = contexts(p, k, ids, n, self.t, tshape, L, scales)
        coder = b[head + tl + il :]
        self.x, self.words = coder[: 4 * self.lanes].view("<u4"), coder[4 * self.lanes :].view("<u2")
        self.steps = -(-len(self.ctx) // self.lanes)
        need(len(self.x) == self.lanes and self.steps <= 65536 and self.prec <= 16, "bad rans data")
        self.n, self.done = n, done


def decode_rans(streams):
    """Decode every stream together: lane j of a stream takes units j, j + lanes, ...; each
    step advances every lane of every stream that still has units, in one set of numpy calls."""
    streams.sort(key=lambda s: -s.steps)  # lanes still at work are then a prefix
    keys, freq, sym, rowkey, rows, units = [], [], [], [], 0, 0
    for s in streams:
        k, nt = s.f.shape
        # One sorted key per (table row, symbol): row << 17 | its cumulative count, so one
        # searchsorted finds the symbol of every lane in every stream's tables. Row `rows` has
        # one symbol owning all 2**prec slots: the padding units after a stream's last one
        # leave the lane's state as it is.
        keys += [[rows << 17], ((np.arange(k)[:, None] + rows + 1) << 17 | np.cumsum(s.f, 1) - s.f).ravel()]
        freq += [[1 << s.prec], s.f.ravel()]
        sym += [[0], np.tile(np.arange(nt), k)]
        rk = np.full(s.lanes * s.steps, rows << 17)  # units laid out [step, lane]
        rk[: len(s.ctx)] = s.ctx + rows + 1 << 17
        rowkey.append(rk)
        s.at, rows, units = units, rows + k + 1, units + len(rk)

    def cat(a):
        return np.concatenate([np.asarray(v, int) for v in a] or [[]]).astype(int)

    keys, freq, sym, rowkey = map(cat, (keys, freq, sym, rowkey))
    W = [s.lanes for s in streams]
    lane0 = np.cumsum([0] + W)  # each stream's first lane
    sid = np.repeat(np.arange(len(W)), W)
    stride, shift = np.repeat(W, W), np.repeat([s.prec for s in streams], W)
    base = np.arange(lane0[-1]) - lane0[sid] + cat([[s.at] * s.lanes for s in streams])[: lane0[-1]]
    x, words = cat([s.x for s in streams]), cat([s.words for s in streams] + [[0]])
    wend = np.cumsum([len(s.words) for s in streams])
    wptr = wend - [len(s.words) for s in streams]
    out = np.zeros(units, int)
    cs = np.zeros(len(x) + 1, int)
    ns = len(streams)
    for t in range(streams[0].steps if ns else 0):
        while streams[ns - 1].steps <= t:  # streams whose units are all decoded drop out
            ns -= 1
        a = lane0[ns]
        xa = x[:a]
        u = base[:a] + t * stride[:a]
        key = rowkey[u] | xa & (1 << shift[:a]) - 1  # the lane's table row and slot
        g = keys.searchsorted(key, "right") - 1
        out[u] = g
        xa[:] = freq[g] * (xa >> shift[:a]) + key - keys[g]
        low = xa < 65536  # these lanes read their stream's next word, in lane order
        np.cumsum(low, out=cs[1 : a + 1])
        i = np.flatnonzero(low)
        xa[i] = xa[i] << 16 | words.take((wptr - cs[lane0[:-1]])[:ns][sid[i]] + cs[i], mode="clip")
        wptr[:ns] += cs[lane0[1 : ns + 1]] - cs[lane0[:ns]]
    need((x == 1 << 16).all() and (wptr == wend).all(), "bad rans data")
    for s in streams:
        v = sym[out[s.at : s.at + len(s.ctx)]]
        if s.t > 1:  # units are tuples of t symbols, first in the low digit
            v = (v[:, None] // s.nsym ** np.arange(s.t) % s.nsym).ravel()
        s.done(v[: s.n])


def decode(src, max_bytes=1 << 30):
    """({name: numpy array}, metadata) of an artifact (a path or its bytes)."""
    data = memoryview(src if isinstance(src, (bytes, bytearray, memoryview)) else open(src, "rb").read())
    try:
        magic, ver, flags, mlen, sha = struct.unpack_from("<4sHHQ32s", data)
        need(magic == b"RNPK" and ver == 2 and flags < 4, "not a format-2 .rnpk")
        m = bytes(data[48 : 48 + mlen])
        need(hashlib.sha256(m).digest() == sha, "manifest hash mismatch")
        man = json.loads(inflate(flags, m, 1 << 26))
        pay = data[48 + mlen :]
        need(hashlib.sha256(pay).hexdigest() == man["payload_sha256"], "payload hash mismatch")
        todo = [t for t in man["tensors"] if "alias_of" not in t]
        size = sum(np.prod(t["shape"]) * np.dtype(t["dtype"].replace("bf", "f")).itemsize for t in todo)
        need(size <= max_bytes, "decodes to more than max_bytes")
        arrays, rans = {}, []

        def stream(t, kind):
            s = t["streams"][kind]
            dt, n, p, key = np.dtype(s["dtype"]).newbyteorder("<"), np.prod(s["shape"]), s["params"], (t["name"], kind)
            body = pay[s["offset"] : s["offset"] + s["length"]]

            def done(sym):  # packed symbols + offset = the codes; then their hash
                off = p.get("offset", 0)
                a = (sym + off if off else sym).astype(dt).reshape(s["shape"])
                need(hashlib.sha256(a.tobytes()).hexdigest() == s["sha256"], f"{key} hash mismatch")
                arrays[key] = a

            if s["codec"] == "rans":
                L = s["shape"][1] if len(s["shape"]) == 2 else n
                return rans.append(Stream(body, p, n, t["shape"], L, arrays.get((t["name"], "scales")), done))
            kind = {"raw": 0, "deflate": 2, "lzma": 3}.get(s["codec"], 1)  # zstd is not portable
            lay = p.get("layout", "plain")
            per, size = PACKED.get(lay, (1, dt.itemsize))
            done(unpack_layout(inflate(kind, body, -(-n // per) * size), lay, n, dt))

        for t in todo:
            for kind in ("scales", "zeros", "codes"):
                if kind in t["streams"]:
                    stream(t, kind)
        decode_rans(rans)
        out = {}
        for t in man["tensors"]:
            name = t["name"]
            out[name] = (
                out[t["alias_of"]]
                if "alias_of" in t
                else dequantize(t, *(arrays.get((name, k)) for k in ("codes", "scales", "zeros")))
            )
        return out, man.get("metadata", {})
    except (LookupError, TypeError, AttributeError, ArithmeticError, struct.error) as e:
        raise ValueError(f"rnpk: malformed artifact ({type(e).__name__}: {e})") from None


def dequantize(t, codes, scales, zeros):
    """The tensor (numpy; bfloat16 as its uint16 bits, dtype BF16) in its original dtype and shape."""
    fmt, n, dtype = t["format"], int(np.prod(t["shape"])), t["dtype"]
    if fmt in ("fp32", "fp16", "bf16"):
        bits = codes.ravel()[:n]
        v = (
            bits.view(np.float32)
            if fmt == "fp32"
            else bits.view(np.float16).astype(np.float32)
            if fmt == "fp16"
            else (bits.astype(np.uint32) << 16).view(np.float32)
        )
    elif fmt == "raw":
        v = codes.ravel()[:n]
        return (v != 0 if dtype == "bool" else v.astype(dtype)).reshape(t["shape"])
    elif fmt == "nf4":
        v = (NF4[codes] * scales.astype(np.float32)[:, None]).ravel()[:n]
    else:  # scale-and-round grids: intN, int8_pg, ternary
        c, s = codes.astype(np.float32), scales.astype(np.float32)[:, None]
        v = ((c if zeros is None else c - zeros.astype(np.float32)[:, None]) * s).ravel()[:n]
    if dtype == "bfloat16":  # round to nearest even, as torch does (weights are finite)
        b = v.astype(np.float32).view(np.uint32).astype(int)
        v = ((b + 0x7FFF + (b >> 16 & 1)) >> 16).astype(BF16)
    else:
        v = v.astype(dtype)
    return v.reshape(t["shape"])


def load(src, max_bytes=1 << 30):
    """{name: torch.Tensor} of an artifact (a path or its bytes): dequantized, original
    dtypes and shapes, tied names sharing one tensor."""
    import torch

    arrays, seen = decode(src, max_bytes)[0], {}
    for v in arrays.values():
        if id(v) not in seen:
            seen[id(v)] = (
                torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
                if v.dtype.metadata
                else torch.from_numpy(np.ascontiguousarray(v))
            )
    return {k: seen[id(v)] for k, v in arrays.items()}
