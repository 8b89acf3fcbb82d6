"""Exit codes, defined once. The README's table is generated from this."""

from __future__ import annotations

from .. import errors

OK = 0
USAGE = 2
OVER_CAP = 3
CORRUPT = 4
LOSS_REGRESSION = 5
FAILURE = 1  # any other library error (bad data, bad checkpoint, ...)

MEANING = {
    OK: "success: valid, under the cap, loss within the allowed delta",
    FAILURE: "error in the input (data, checkpoint, config); the message names it",
    USAGE: "usage error: bad option or argument, or output exists without --force",
    OVER_CAP: "artifact plus code exceeds the byte cap",
    CORRUPT: "artifact is corrupt, truncated or of an unsupported format/version",
    LOSS_REGRESSION: "post-export loss exceeds the reference by more than --max-loss-delta",
}

# Most specific first: the first matching type decides the exit code.
BY_ERROR: list[tuple[type[BaseException], int]] = [
    (errors.OverCapError, OVER_CAP),
    (errors.ArtifactError, CORRUPT),
    (errors.LossRegressionError, LOSS_REGRESSION),
    (errors.OutputExistsError, USAGE),
    (errors.ConfigError, USAGE),
    (errors.RecurnormError, FAILURE),
]


def for_error(exc: BaseException) -> int:
    """The exit code for a library error."""
    for kind, code in BY_ERROR:
        if isinstance(exc, kind):
            return code
    return FAILURE
