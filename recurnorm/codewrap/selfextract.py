"""A self-extracting Python file: compressed sources in one string literal, and a stub
that decompresses, compiles and runs them.

By default the file is UTF-8 (PEP 3120's default: linters, `inspect.getsource`, diff views
and a program reading its own `__file__` as UTF-8 all read it). The compressed bytes are cut
into 7-bit chunks; a chunk is one ASCII character of a triple-quoted literal, except the
three a literal cannot hold as they are (NUL is refused in source, CR reads as LF, the
backslash escapes): such a chunk and the next one share one 2-byte character, U+0100 to
U+027F (letters, never a control or a line break). 7 bits a byte everywhere: 14.3% over the
compressed bytes, against base85's 25% (measured on 100 KB of random bytes: 14.3% and
25.0%; the UTF-8 capacity of 1- and 2-byte characters is 7.12 bits, 1.7% better, only
with an arithmetic coder in the stub). `ascii` escapes those chunks instead (`\\0`, `\\r`,
`\\\\`): pure ASCII, 3/128 of the chunks cost two bytes (17.0%). One decoder reads both.

`latin1` declares `#coding:latin1`, so each of the 256 byte values is one character;
only the backslash, CR, NUL and closing quotes are escaped (~1.2%). It is 12% smaller, but
the file is not UTF-8: a program that reads its own file as UTF-8 crashes, and linters and
`inspect.getsource` on it fail. The compact loader (a module nothing reads as text) uses it.

The payload is `name\\0source` pairs: modules first (`sys.modules[name]`), then the
program, which runs in the stub's own globals, so `__name__`, `__file__`, `__spec__` and
sys.argv are those of the file Python was given. Each source is compiled under its own
name and put in `linecache`: tracebacks name it with its own line numbers and show its
lines, and `inspect.getsource` (Triton's `@jit`, TorchScript) finds the code. In the
7-bit encodings the pairs' most frequent words are single bytes before compression
(`words_out`).
"""

from __future__ import annotations

import ast
import lzma
import re
import warnings
from collections import Counter
from dataclasses import dataclass

from ..errors import DataError

CODECS = ("lzma", "brotli")
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
_BAD = (0, 13, 92)  # the 7-bit chunks a literal cannot hold as they are: NUL, CR, backslash
_ESCAPE = {0: "\\0", 13: "\\r", 92: "\\\\"}
_WIDE = 256  # a bad chunk k and the next one w: chr(_WIDE + 128 * _BAD.index(k) + w), 2 UTF-8 bytes
# The stub of the 7-bit encodings: the literal's characters to bits to the compressed bytes
# (their count is written in: pack7's leading zero bits and the blob's zero bytes go), then
# `words_out` undone, then each source registered with linecache and compiled under its own
# name; modules are run into sys.modules, the program is returned to run in these globals.
_STUB7 = (
    "def __(b):\n"
    " import sys,linecache as L;b=''.join(f'{{o:07b}}'if o<128 else f'{{(0,13,92)[o//128-2]:07b}}{{o%128:07b}}'"
    "for o in map(ord,b));x,w,t=__import__('{codec}').decompress(int(b,2).to_bytes({n},'big')).split(b'\\1',2)\n"
    " for k,y in zip([k for k in range(128,256)if k not in x],w.split()):t=t.replace(bytes([k]),y)\n"
    " d=t.decode().split('\\0')\n"
    " for f,s in zip(d[::2],d[1::2]):L.cache[f]=0,None,s.splitlines(1),f;c=compile(s,f,'exec');"
    "f==d[-2]or exec(c,vars(sys.modules.setdefault(f,type(sys)(f))))\n"
    " return c\n"
    "exec(globals().pop('__')(globals().pop('_')))\n"
)
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
    """The smallest stream of `codec` that its plain `decompress(data)` reads back."""
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


def words_out(data: bytes) -> bytes:
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
    words = sorted((w for w in counts if gain[w] > 0), key=lambda w: (-gain[w], w))[: len(codes)]
    table = {w: bytes([k]) for w, k in zip(words, codes, strict=False)}
    return held + b"\1" + b" ".join(words) + b"\1" + _WORD.sub(lambda m: table.get(m.group(), m.group()), data)


def words_in(raw: bytes) -> bytes:
    """The inverse of `words_out` (what the stub does)."""
    held, words, text = raw.split(b"\1", 2)
    for k, word in zip([k for k in range(128, 256) if k not in held], words.split(), strict=False):
        text = text.replace(bytes([k]), word)
    return text


def decompress(blob: bytes, codec: str) -> bytes:
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


def pack7(blob: bytes, wide: bool = True) -> str:
    """`blob` as the characters of a str literal's value, 7 bits each (see the module's doc):
    a NUL, CR or backslash chunk shares a 2-byte character with the next (`wide`), or stays
    one character for `literal` to escape (the last chunk always does)."""
    n = 8 * len(blob)
    bits = (
        f"{int.from_bytes(blob, 'big'):0{n + -n % 7}b}" if blob else ""
    )  # zero bits first: the stub's int() drops them
    chunks = [int(bits[i : i + 7], 2) for i in range(0, len(bits), 7)]
    out, i = [], 0
    while i < len(chunks):
        k = chunks[i]
        if wide and k in _BAD and i + 1 < len(chunks):
            out.append(chr(_WIDE + 128 * _BAD.index(k) + chunks[i + 1]))
            i += 2
        else:
            out.append(chr(k))
            i += 1
    return "".join(out)


def unpack7(text: str, n: int) -> bytes:
    """What the stub does to the literal (the inverse of `pack7`), for `read`; any text
    pack7 never writes raises or reads as other bytes, which `read`'s rebuild tells."""
    bits = "".join(f"{o:07b}" if o < 128 else f"{_BAD[o // 128 - 2]:07b}{o % 128:07b}" for o in map(ord, text))
    return int(bits, 2).to_bytes(n, "big")


def literal(value: str) -> str:
    """`value` as a triple-quoted str literal, escaping NUL, CR, backslash and a quote that
    would close it (on whichever quote needs fewer)."""
    best = None
    for q in "'\"":
        out = []
        for i, c in enumerate(value):
            o = ord(c)
            if o in _ESCAPE:
                out.append("\\000" if o == 0 and value[i + 1 : i + 2] in tuple("01234567") else _ESCAPE[o])
            elif c == q and (value[i + 1 : i + 3] == q * 2 or value[i:].strip(q) == ""):
                out.append("\\" + q)  # it would close the literal: a third quote in a row, or the last
            else:
                out.append(c)
        text = q * 3 + "".join(out) + q * 3
        best = text if best is None or len(text) < len(best) else best
    return best


def build(payload: Payload, blob: bytes) -> bytes:
    """The self-extracting file for `payload`, compressed as `blob`."""
    if payload.encoding == "latin1":
        head, blob_expr = _LATIN1.encode() + b"_=" + latin1_literal(blob) + b"\n", "globals().pop('_').encode('l1')"
    elif payload.encoding in ("utf8", "ascii"):
        head = "_=" + literal(pack7(blob, wide=payload.encoding == "utf8")) + "\n"
        return (head + _STUB7.format(codec=payload.codec, n=len(blob))).encode("utf-8")
    else:
        raise DataError(f"unknown encoding {payload.encoding!r} (one of {', '.join(ENCODINGS)})")
    decode = _DECODE.format(codec=payload.codec, blob=blob_expr)
    return head + (_ONE if len(payload.files) == 1 else _MANY).format(payload=decode).encode()


def make(payload: Payload) -> bytes:
    """Compress the payload's files and write them as a self-extracting file."""
    for name, text in payload.files:
        if "\0" in name + text:
            raise DataError(f"{name}: contains NUL, which no Python source can")
    data = "\0".join(x for pair in payload.files for x in pair).encode("utf-8")
    if payload.encoding != "latin1":  # (the latin-1 stub, the compact loader's, stays as it was)
        data = words_out(data)
    return build(payload, compress(data, payload.codec))


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
    codecs = [c for c in CODECS if f"__import__('{c}')" in text]
    sizes = [  # the stub's `to_bytes(n,'big')`: the blob's length (the rebuild below proves it)
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "to_bytes" and n.args
        if isinstance(n.args[0], ast.Constant) and type(n.args[0].value) is int
    ]
    if not isinstance(value, str) or len(codecs) != 1:
        raise DataError(f"{where}: not a file written by recurnorm wrap")
    encodings = ["latin1"] if latin1 else ["utf8", "ascii"]
    try:
        blob = value.encode("latin-1") if latin1 else unpack7(value, sizes[0] if len(sizes) == 1 else -1)
        raw = decompress(blob, codecs[0])
        raw = raw if latin1 else words_in(raw)
        parts = raw.decode("utf-8").split("\0")
    except Exception as exc:  # any damage to the compressed bytes
        raise DataError(f"{where}: its payload does not decompress ({type(exc).__name__}: {exc})") from None
    if len(parts) < 2 or len(parts) % 2:
        raise DataError(f"{where}: its payload is not name/source pairs")
    files = tuple(zip(parts[::2], parts[1::2], strict=True))
    for encoding in encodings:  # byte for byte what wrap writes: nothing added, nothing edited
        payload = Payload(files, codecs[0], encoding)
        if build(payload, blob) == data:
            return payload, blob
    raise DataError(f"{where}: its code differs from the stub recurnorm wrap writes")
