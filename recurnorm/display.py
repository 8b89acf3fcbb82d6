"""Text from artifacts and paths, made safe to print or embed in XML.

Tensor names and paths come from strangers' files: a name holding ESC sequences would
drive the terminal, one holding a NUL or a form feed makes JUnit XML invalid. Every
character that is not printable (controls, format characters such as bidi overrides,
surrogates, unassigned code points) is shown as a Python escape, so the text stays one
line and its meaning stays visible.
"""

from __future__ import annotations

import unicodedata

# Categories shown as-is: letters, marks, numbers, punctuation, symbols and the plain space.
_SAFE_CATEGORIES = frozenset(
    {
        "Lu",
        "Ll",
        "Lt",
        "Lm",
        "Lo",
        "Mn",
        "Mc",
        "Me",
        "Nd",
        "Nl",
        "No",
        "Pc",
        "Pd",
        "Ps",
        "Pe",
        "Pi",
        "Pf",
        "Po",
        "Sm",
        "Sc",
        "Sk",
        "So",
    }
)


def printable(text: object) -> str:
    """str(text) with every non-printable character escaped (\\x1b, \\n, \\u202e, ...)."""
    s = str(text)
    if s.isascii() and s.isprintable():
        return s  # the common case, fast
    out = []
    for ch in s:
        if ch == " " or unicodedata.category(ch) in _SAFE_CATEGORIES:
            out.append(ch)
        else:
            out.append(
                ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                if ord(ch) < 0xD800 or ord(ch) > 0xDFFF
                else f"\\u{ord(ch):04x}"
            )
    return "".join(out)


def echo(message: object = "", err: bool = False, **kwargs) -> None:
    """click.echo with every line made printable: the one way human-readable output leaves
    the CLI, so a tensor name, config key, metadata value or path from someone's file never
    drives the terminal, wherever a table or message quotes it. Line breaks stay."""
    import click

    click.echo("\n".join(printable(line) for line in str(message).split("\n")), err=err, **kwargs)
