"""A self-extracting Python file: compressed sources in one string literal, and a stub
that decompresses, compiles and runs them.

By default the file is UTF-8 (PEP 3120's default: linters, `inspect.getsource`, diff views
and a program reading its own `__file__` as UTF-8 all read it). The literal's characters are
the 124 ASCII characters a triple-quoted literal holds as they are (all but NUL, refused in
source; CR, read as LF; the backslash; the quote) and the 1,920 2-byte characters
U+0080-U+07FF. Each 1,024-byte block of the compressed bytes is one number, written as the
string of that rank among all the strings of as many UTF-8 bytes (`pack_text`): 7.105 bits a
byte, the capacity of that alphabet (log2 of x, x^2 = 124x + 1920) less < 1 byte a block:
12.6% over the compressed bytes, against 14.3% for 7-bit chunks and base85's 25%. The stub
sums the ranks back, one block at a time, so its work stays linear (~0.02 s for 30 KB).
`ascii` is the same with the ASCII characters alone (log2 124 = 6.954 bits, 15.0%): one
decoder reads both.

`latin1` declares `#coding:latin1`, so each of the 256 byte values is one character;
only the backslash, CR, NUL and closing quotes are escaped (~1.2%). It is 12% smaller, but
the file is not UTF-8: a program that reads its own file as UTF-8 crashes, and linters and
`inspect.getsource` on it fail. The compact loader (a module nothing reads as text) uses it.

The payload is `name\\0source` pairs: modules first (`sys.modules[name]`), then the
program, which runs in the stub's own globals, so `__name__`, `__file__`, `__spec__` and
sys.argv are those of the file Python was given. Each source is compiled under its own
name and put in `linecache`: tracebacks name it with its own line numbers and show its
lines, and `inspect.getsource` (Triton's `@jit`, TorchScript) finds the code. In the
UTF-8 encodings the pairs' most frequent words are single bytes before compression
(`words_out`).
"""

from __future__ import annotations

import ast
import lzma
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from functools import cache

from ..errors import DataError
from . import cm

CODECS = ("lzma", "brotli", "cm")
ENCODINGS = ("utf8", "ascii", "latin1")
_LZMA1 = {"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME, "lp": 0, "pb": 0}  # text: no 2/4-byte structure
_LZMA_LC = (0, 1, 2, 3, 4)  # literal context bits tried, the smallest output kept

# The compressed bytes come first, as `_`; the stub's one line pops them from globals, so
# a traceback shows that line, never the bytes, and nothing is left in the program's globals.
# One source: a lambda registers it with linecache and returns its code to exec.
_ONE = (
    "exec((lambda f,s:(__import__('linecache').cache.update({{f:(0,None,s.splitlines(1),f)}}),"
    "compile(s,f,'exec'))[1])(*{payload}.split('\\0')))\n"
)
# Modules, then the program: the helper removes itself from globals before it runs anything.
_MANY = (
    "def __(d):\n"
    " import sys,linecache as L;d=d.split('\\0')\n"
    " for f,s in zip(d[::2],d[1::2]):L.cache[f]=0,None,s.splitlines(1),f;c=compile(s,f,'exec');"
    "f==d[-2]or exec(c,vars(sys.modules.setdefault(f,type(sys)(f))))\n"
    " return c\n"
    "exec(globals().pop('__')({payload}))\n"
)
_LATIN1 = "#coding:latin1\n"
_DECODE = "__import__('{codec}').decompress({blob}).decode()"
# The literal's characters: ASCII but NUL (refused in source), CR (read as LF, even inside a
# literal), the quote (the literal is '''...''') and the backslash; and in utf8, the 1,920
# 2-byte characters U+0080-U+07FF. Each 1,024-byte block of the compressed bytes is one
# number, written as the string of that rank among all strings of `_block_chars` UTF-8 bytes
# (a mixed radix: N(m) strings of m bytes, N(m) = 124 N(m-1) + 1920 N(m-2)).
_ASCII = tuple(c for c in range(1, 128) if c not in (13, 39, 92))  # 124
_RANK = {c: i for i, c in enumerate(_ASCII)}
_TWO = {"utf8": 1920, "ascii": 0}  # 2-byte characters, U+0080 on
_BLOCK = 1024  # bytes a number: the rounding costs < 1 literal byte a block; the stub's work stays linear
# The stub of the UTF-8 encodings: the literal's characters to numbers to the compressed bytes
# (their count is written in: a block's leading zero bytes are its number's), then
# `words_out` undone, then each source registered with linecache and compiled under its own
# name; modules are run into sys.modules, the program is returned to run in these globals.
_STUB_MIXED = (
    "def __(b):\n"
    " import sys,linecache as L;N=[1,124];exec('N+=124*N[-1]+{two}*N[-2],;'*{chars});b=b.encode();o=b''\n"
    " while b:\n"
    "  v=m=0\n"
    "  for c in map(ord,b[:{chars}].decode()[::-1]):k=c>127;v+=k*124*N[m+1]+(c-128 if k else c-1-(c>13)-(c>39)-(c>92))*N[m];m+=1+k\n"
    "  o+=v.to_bytes(min({block},{n}-len(o)),'big');b=b[{chars}:]\n"
    " x,w,t={decompress}.split(b'\\1',2)\n"
    " for k,y in zip([k for k in range(128,256)if k not in x],w.split()):t=t.replace(bytes([k]),y)\n"
    " d=t.decode().split('\\0')\n"
    " for f,s in zip(d[::2],d[1::2]):L.cache[f]=0,None,s.splitlines(1),f;c=compile(s,f,'exec');"
    "f==d[-2]or exec(c,vars(sys.modules.setdefault(f,type(sys)(f))))\n"
    " return c\n"
    "exec(globals().pop('__')(globals().pop('_')))\n"
)
# --codec cm: the blob is the decoder's source (lzma) and the coded bytes; the stub runs the one on the other
_CM = "(exec(__import__('lzma').decompress(o[:{k}]),g:={{}})or g['D'](o[{k}:],{size}))"
_CM_MAX = 2_000_000  # bytes a cm payload may claim: wrap reads sources of at most 1,000,000
_CM_WORDS = 16  # cm models words itself: 16 words, not 128, are 0.9% smaller on the records
_CM_RE = re.compile(r"g\['D'\]\(o\[(\d+):\],(\d+)\)")
_STUB_RE = re.compile(r"N\+=124\*N\[-1\]\+(\d+)\*N.*?to_bytes\(min\(\d+,(\d+)-len", re.S)
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,}")


@dataclass(frozen=True)
class Payload:
    """What a self-extracting file holds: (name, source) pairs, the program last, and how
    its compressed bytes are written (`ENCODINGS`)."""

    files: tuple[tuple[str, str], ...]
    codec: str
    encoding: str = "utf8"

    @property
    def program(self) -> tuple[str, str]:
        return self.files[-1]


def compress(data: bytes, codec: str) -> bytes:
    """The smallest stream of `codec` that its plain `decompress(data)` reads back (cm: the
    decoder's source, compressed, then the coded bytes; `decompress` needs their size)."""
    if codec == "cm":
        return _cm_decoder() + cm.compress(data)
    if codec == "brotli":
        import brotli

        return brotli.compress(data, quality=11, lgwin=24)
    if codec != "lzma":
        raise DataError(f"unknown codec {codec!r} (one of {', '.join(CODECS)})")
    # .lzma ("alone") keeps the stub short: lzma.decompress finds the format itself. The
    # dictionary is only as large as the data, so decompressing allocates no more.
    dict_size = max(4096, 1 << (len(data) - 1).bit_length())
    return min(
        (
            lzma.compress(data, format=lzma.FORMAT_ALONE, filters=[{**_LZMA1, "dict_size": dict_size, "lc": lc}])
            for lc in _LZMA_LC
        ),
        key=len,
    )


def words_out(data: bytes, limit: int = 128) -> bytes:
    """`data` with its most frequent words (3+ identifier characters) as the bytes 128-255 it
    does not hold: `absent\\1words\\1text`, `absent` the bytes >= 128 that `data` holds (a
    UTF-8 source's other characters), `words` space-separated in the order of the codes left.
    On the top five Parameter Golf records' train_gpt.py (minified, locals renamed, with the
    loader) brotli-11 then writes 2.2-2.5% fewer bytes, the word list included: brotli's
    matches cost more than one literal in context."""
    held = bytes(sorted({b for b in data if b >= 128}))
    codes = [k for k in range(128, 256) if k not in held]
    counts = Counter(_WORD.findall(data))
    gain = {w: (len(w) - 1) * n - len(w) - 1 for w, n in counts.items()}  # bytes saved before compression
    words = sorted((w for w in counts if gain[w] > 0), key=lambda w: (-gain[w], w))[: min(limit, len(codes))]
    table = {w: bytes([k]) for w, k in zip(words, codes, strict=False)}
    return held + b"\1" + b" ".join(words) + b"\1" + _WORD.sub(lambda m: table.get(m.group(), m.group()), data)


def words_in(raw: bytes) -> bytes:
    """The inverse of `words_out` (what the stub does)."""
    held, words, text = raw.split(b"\1", 2)
    for k, word in zip([k for k in range(128, 256) if k not in held], words.split(), strict=False):
        text = text.replace(bytes([k]), word)
    return text


@cache
def _cm_decoder() -> bytes:
    return compress(cm.DECODER.encode(), "lzma")


def decompress(blob: bytes, codec: str, size: int = -1) -> bytes:
    if codec == "cm":  # the decoder the file carries must be this one: it is what runs
        if not 0 <= size <= _CM_MAX:  # a size written in the stub: its coder runs that long
            raise DataError(f"its cm payload claims {size:,} bytes (at most {_CM_MAX:,})")
        k = len(_cm_decoder())
        if lzma.decompress(blob[:k]) != cm.DECODER.encode():
            raise DataError("its cm decoder is not recurnorm's")
        return cm.decompress(blob[k:], size)
    if codec == "brotli":
        import brotli

        return brotli.decompress(blob)
    return lzma.decompress(blob)


def latin1_literal(blob: bytes) -> bytes:
    """`blob` as a triple-quoted str literal of a latin-1 source file, escaped where needed."""
    best = None
    for q in b"'\"":
        out = bytearray()
        for i, b in enumerate(blob):
            if b == 0x5C:
                out += b"\\\\"
            elif b == 0x0D:
                out += b"\\r"
            elif b == 0:
                out += b"\\000" if blob[i + 1 : i + 2] in (b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7") else b"\\0"
            elif b == q and (blob[i + 1 : i + 3] == bytes([q, q]) or blob[i:].strip(bytes([q])) == b""):
                out += bytes([0x5C, q])  # it would close the literal: a third quote in a row, or the last
            else:
                out.append(b)
        out = bytes([q]) * 3 + out + bytes([q]) * 3
        best = out if best is None or len(out) < len(best) else best
    return best


def _counts(two: int, size: int) -> list[int]:
    """N(m) for m < size: how many strings of m UTF-8 bytes the alphabet spells."""
    n = [1, len(_ASCII)]
    while len(n) < size:
        n.append(len(_ASCII) * n[-1] + two * n[-2])
    return n


def _block_chars(size: int, two: int) -> int:
    """The UTF-8 bytes a block of `size` bytes takes: the fewest m with N(m) >= 256**size."""
    top, n = 256**size, _counts(two, 2 * size + 2)
    return next(m for m, count in enumerate(n) if count >= top)


def pack_text(blob: bytes, encoding: str = "utf8") -> str:
    """`blob` as the value of a triple-quoted str literal (see _ASCII): each block of _BLOCK
    bytes is a number, written as the string of that rank among the strings of its length;
    utf8 carries 7.105 bits a UTF-8 byte (12.6% over the blob), ascii 6.954 (15.0%)."""
    two = _TWO[encoding]
    n, out = _counts(two, 2 * _BLOCK + 2), []
    for start in range(0, len(blob), _BLOCK):
        chunk = blob[start : start + _BLOCK]
        value, m = int.from_bytes(chunk, "big"), _block_chars(len(chunk), two)
        while m:  # rank -> string, first character first (unpack_text's sum, inverted)
            if value < len(_ASCII) * n[m - 1]:
                c, value = divmod(value, n[m - 1])
                out.append(chr(_ASCII[c]))
                m -= 1
            else:
                c, value = divmod(value - len(_ASCII) * n[m - 1], n[m - 2])
                out.append(chr(128 + c))
                m -= 2
    return "".join(out)


def unpack_text(text: str, size: int, encoding: str = "utf8") -> bytes:
    """What the stub does to the literal (the inverse of `pack_text`), for `read`; text that
    pack_text never writes raises or reads as other bytes, which `read`'s rebuild tells."""
    two = _TWO[encoding]
    chars = _block_chars(_BLOCK, two)
    n, data, out = _counts(two, chars + 2), text.encode("utf-8"), b""
    for start in range(0, len(data), chars):
        value = m = 0
        for c in map(ord, reversed(data[start : start + chars].decode("utf-8"))):
            wide = c > 127
            value += wide * len(_ASCII) * n[m + 1] + (c - 128 if wide else _RANK[c]) * n[m]
            m += 1 + wide
        out += value.to_bytes(min(_BLOCK, size - len(out)), "big")
    return out


def build(payload: Payload, blob: bytes) -> bytes:
    """The self-extracting file for `payload`, compressed as `blob`."""
    if payload.encoding == "latin1":
        head, blob_expr = _LATIN1.encode() + b"_=" + latin1_literal(blob) + b"\n", "globals().pop('_').encode('l1')"
    elif payload.encoding in ("utf8", "ascii"):
        two = _TWO[payload.encoding]
        decode = f"__import__('{payload.codec}').decompress(o)"
        if payload.codec == "cm":
            decode = _CM.format(k=len(_cm_decoder()), size=len(raw_bytes(payload)))
        stub = _STUB_MIXED.format(
            decompress=decode, n=len(blob), two=two, chars=_block_chars(_BLOCK, two), block=_BLOCK
        )
        return ("_='''" + pack_text(blob, payload.encoding) + "'''\n" + stub).encode("utf-8")
    else:
        raise DataError(f"unknown encoding {payload.encoding!r} (one of {', '.join(ENCODINGS)})")
    if payload.codec == "cm":
        raise DataError("the cm codec is written in the UTF-8 encodings only (not latin1)")
    decode = _DECODE.format(codec=payload.codec, blob=blob_expr)
    return head + (_ONE if len(payload.files) == 1 else _MANY).format(payload=decode).encode()


def make(payload: Payload) -> bytes:
    """Compress the payload's files and write them as a self-extracting file."""
    for name, text in payload.files:
        if "\0" in name + text:
            raise DataError(f"{name}: contains NUL, which no Python source can")
    return build(payload, compress(raw_bytes(payload), payload.codec))


def raw_bytes(payload: Payload) -> bytes:
    """The bytes compressed: the name/source pairs, and in the UTF-8 encodings `words_out`."""
    data = "\0".join(x for pair in payload.files for x in pair).encode("utf-8")
    if payload.encoding != "latin1":  # (the latin-1 stub, the compact loader's, stays as it was)
        data = words_out(data, _CM_WORDS if payload.codec == "cm" else 128)
    return data


def read(data: bytes, where: str = "the wrapped file") -> tuple[Payload, bytes]:
    """The payload of a file `make` wrote, and its compressed blob, without running it.
    DataError when the file is not exactly such a file (not UTF-8 unless it declares
    latin-1, another stub, any code added or edited around it)."""
    latin1 = data.startswith(_LATIN1.encode())
    try:
        text = data.decode("latin-1" if latin1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 ({exc}), and it declares no other encoding") from None
    try:
        with warnings.catch_warnings():  # a damaged literal may hold an invalid escape
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        raise DataError(f"{where}: not Python ({exc})") from None
    first = tree.body[0] if tree.body else None  # `_="..."`: the literal
    value = first.value.value if isinstance(first, ast.Assign) and isinstance(first.value, ast.Constant) else None
    coded = _CM_RE.search(text)  # cm's stub imports lzma, for its decoder
    codecs = ["cm"] if coded else [c for c in CODECS if f"__import__('{c}')" in text]
    # the stub's alphabet (how many 2-byte characters) and the blob's length: the rebuild
    # below proves both, and everything else
    stub = _STUB_RE.search(text)
    if not isinstance(value, str) or len(codecs) != 1 or not (latin1 or stub):
        raise DataError(f"{where}: not a file written by recurnorm wrap")
    encoding = "latin1" if latin1 else {str(v): k for k, v in _TWO.items()}.get(stub[1], "utf8")
    try:
        blob = value.encode("latin-1") if latin1 else unpack_text(value, int(stub[2]), encoding)
        raw = decompress(blob, codecs[0], int(coded[2]) if coded else -1)
        raw = raw if latin1 else words_in(raw)
        parts = raw.decode("utf-8").split("\0")
    except Exception as exc:  # any damage to the compressed bytes
        raise DataError(f"{where}: its payload does not decompress ({type(exc).__name__}: {exc})") from None
    if len(parts) < 2 or len(parts) % 2:
        raise DataError(f"{where}: its payload is not name/source pairs")
    payload = Payload(tuple(zip(parts[::2], parts[1::2], strict=True)), codecs[0], encoding)
    if build(payload, blob) == data:  # byte for byte what wrap writes: nothing added, nothing edited
        return payload, blob
    raise DataError(f"{where}: its code differs from the stub recurnorm wrap writes")
