"""Exit codes, defined once.

The exit-code tables in README.md and docs/CI.md are markdown_table()'s text, pasted
between `<!-- exit-codes:begin -->` and `<!-- exit-codes:end -->`; tests/test_docs.py
fails when either differs from it.
"""

from __future__ import annotations

import re

from .. import errors

_OPTION = re.compile(r"--[a-z][a-z-]*")

OK = 0
FAILURE = errors.RecurnormError.exit_code  # any other library error (bad data, bad checkpoint, ...)
USAGE = errors.ConfigError.exit_code
OVER_CAP = errors.OverCapError.exit_code
CORRUPT = errors.ArtifactError.exit_code
LOSS_REGRESSION = errors.LossRegressionError.exit_code
INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + the signal's number, as shells report it

MEANING = {
    OK: "success: valid, under the cap, loss within the allowed delta",
    FAILURE: "error in the input (data, checkpoint, config); the message names it",
    USAGE: "usage error: bad option or argument, an output that exists without --force or is not a regular file, an input that is not a regular file",
    OVER_CAP: "artifact plus code exceeds the byte cap, or it decodes to more than the --max-decoded-bytes you set",
    CORRUPT: "artifact is corrupt, truncated or of an unsupported format/version",
    LOSS_REGRESSION: "post-export loss exceeds the reference by more than --max-loss-delta",
    INTERRUPTED: "interrupted (Ctrl-C, SIGINT); nothing half-written is left",
}


def markdown_table() -> str:
    """MEANING as the Markdown table the docs show, option names as code."""
    lines = ["| exit | meaning |", "|---:|---|"]
    for code in sorted(MEANING):
        lines.append(f"| {code} | " + _OPTION.sub(lambda m: f"`{m.group()}`", MEANING[code]) + " |")
    return "\n".join(lines) + "\n"


def for_error(exc: BaseException) -> int:
    """The exit code for an error: its type's own (recurnorm.errors), FAILURE for any other."""
    return exc.exit_code if isinstance(exc, errors.RecurnormError) else FAILURE
