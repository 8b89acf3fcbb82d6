"""Counted code made small: a Python program minified, compressed and written as one
self-extracting file that runs exactly that program, and the check that proves it.

Parameter Golf counts every byte of `train_gpt.py`. `wrap` drops comments, docstrings and
blank space (keeping line numbers unless asked), compresses with lzma (or brotli where
the program imports brotli) and stores the bytes in one UTF-8 string literal, 7.1 bits a
byte (12.6% over the compressed size; base85 is 25%); `--codec cm` (cm.py) is smaller still,
for seconds of start-up. `check` reads a wrapped file without running it and compares
its program's AST with the source's. The compact standalone loader (`recurnorm loader
--compact`) is this same file with the loader as its program.
"""

from .api import Checked, Wrapped, check, same_program, wrap
from .minify import minify, minify_renamed
from .selfextract import CODECS, Payload

__all__ = ["CODECS", "Checked", "Payload", "Wrapped", "check", "minify", "minify_renamed", "same_program", "wrap"]
