"""A self-extracting Python file: compressed sources in one string literal, and a stub
that decompresses, compiles and runs them.

The file declares `#coding:latin1`, so each of the 256 byte values is one character of a
triple-quoted literal; only the backslash, CR (Python's reader turns CR and CRLF into LF,
even inside literals), NUL (refused in source) and quotes that would close the literal
are escaped: ~1.2% on compressed bytes, against base85's 25%. `ascii=True` writes base85
instead, for a file that must read as UTF-8.

The payload is `name\\0source` pairs: modules first (`sys.modules[name]`), then the
program, which runs in the stub's own globals, so `__name__`, `__file__`, `__spec__` and
sys.argv are those of the file Python was given. Each source is compiled under its own
name and put in `linecache`: tracebacks name it with its own line numbers and show its
lines, and `inspect.getsource` (Triton's `@jit`, TorchScript) finds the code.
"""

from __future__ import annotations

import ast
import base64
import lzma
import warnings
from dataclasses import dataclass

from ..errors import DataError

CODECS = ("lzma", "brotli")
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


@dataclass(frozen=True)
class Payload:
    """What a self-extracting file holds: (name, source) pairs, the program last."""

    files: tuple[tuple[str, str], ...]
    codec: str
    ascii: bool

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


def build(payload: Payload, blob: bytes) -> bytes:
    """The self-extracting file for `payload`, compressed as `blob`."""
    if payload.ascii:
        head, blob_expr = b"_='" + base64.b85encode(blob) + b"'\n", "__import__('base64').b85decode(globals().pop('_'))"
    else:
        head, blob_expr = _LATIN1.encode() + b"_=" + latin1_literal(blob) + b"\n", "globals().pop('_').encode('l1')"
    decode = _DECODE.format(codec=payload.codec, blob=blob_expr)
    return head + (_ONE if len(payload.files) == 1 else _MANY).format(payload=decode).encode()


def make(payload: Payload) -> bytes:
    """Compress the payload's files and write them as a self-extracting file."""
    for name, text in payload.files:
        if "\0" in name + text:
            raise DataError(f"{name}: contains NUL, which no Python source can")
    data = "\0".join(x for pair in payload.files for x in pair).encode("utf-8")
    return build(payload, compress(data, payload.codec))


def read(data: bytes, where: str = "the wrapped file") -> tuple[Payload, bytes]:
    """The payload of a file `make` wrote, and its compressed blob, without running it.
    DataError when the file is not exactly such a file (another stub, an edit around it)."""
    ascii = not data.startswith(_LATIN1.encode())
    text = data.decode("ascii" if ascii else "latin-1", errors="replace")
    try:
        with warnings.catch_warnings():  # a damaged literal may hold an invalid escape
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        raise DataError(f"{where}: not Python ({exc})") from None
    literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    codecs = [c for c in CODECS if f"__import__('{c}')" in text]
    if not literals or len(codecs) != 1:
        raise DataError(f"{where}: not a file written by recurnorm wrap")
    literal = max(literals, key=len)
    try:
        blob = base64.b85decode(literal) if ascii else literal.encode("latin-1")
        raw = decompress(blob, codecs[0])
        parts = raw.decode("utf-8").split("\0")
    except Exception as exc:  # any damage to the compressed bytes
        raise DataError(f"{where}: its payload does not decompress ({type(exc).__name__}: {exc})") from None
    if len(parts) < 2 or len(parts) % 2:
        raise DataError(f"{where}: its payload is not name/source pairs")
    payload = Payload(tuple(zip(parts[::2], parts[1::2], strict=True)), codecs[0], ascii)
    if build(payload, blob) != data:
        raise DataError(f"{where}: its code differs from the stub recurnorm wrap writes")
    return payload, blob
