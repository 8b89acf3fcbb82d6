"""The library's own exception types.

Every error a user can cause (bad config, bad data, bad checkpoint, corrupt
artifact, over the cap) is one of these, raised where the bad input enters,
with a message that names the file, tensor or field. The CLI maps each type to
an exit code in one table (`recurnorm.cli.exitcodes`).
"""

from __future__ import annotations


class RecurnormError(Exception):
    """Base class of every error recurnorm raises on purpose."""


class ConfigError(RecurnormError, ValueError):
    """A model, training or export configuration is invalid."""


class DataError(RecurnormError, ValueError):
    """A corpus, text file, shard or tokenizer is missing or malformed."""


class CheckpointError(RecurnormError, ValueError):
    """A checkpoint cannot be read, or its config and tensors disagree."""


class QuantError(RecurnormError, ValueError):
    """A tensor cannot be quantized (NaN/Inf, bad shape, bad options)."""


class ArtifactError(RecurnormError, ValueError):
    """An artifact is corrupt, truncated or of an unsupported format/version."""


class OverCapError(RecurnormError):
    """The artifact plus its code files exceed the byte cap."""

    def __init__(self, message: str, report: object | None = None):
        super().__init__(message)
        self.report = report


class LossRegressionError(RecurnormError):
    """Post-export loss exceeds the reference by more than the allowed delta."""


class OutputExistsError(RecurnormError, FileExistsError):
    """An output path exists and overwriting was not asked for (--force)."""


class WriteError(RecurnormError):
    """An output cannot be written (read-only filesystem, a parent that is a file, ...)."""
