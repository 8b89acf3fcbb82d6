"""The library's own exception types.

Every error a user can cause (bad config, bad data, bad checkpoint, corrupt
artifact, over the cap) is one of these, raised where the bad input enters,
with a message that names the file, tensor or field. Each type carries its
process exit code, defined here once; `recurnorm.cli.exitcodes` names them and
the library reports them (a verify report's exit_code) without importing the CLI.
"""

from __future__ import annotations


class RecurnormError(Exception):
    """Base class of every error recurnorm raises on purpose."""

    exit_code = 1  # an error in the input (data, checkpoint, config); the message names it


class ConfigError(RecurnormError, ValueError):
    """A model, training or export configuration is invalid."""

    exit_code = 2  # a usage error, like a bad option


class DataError(RecurnormError, ValueError):
    """A corpus, text file, shard or tokenizer is missing or malformed."""


class CheckpointError(RecurnormError, ValueError):
    """A checkpoint cannot be read, or its config and tensors disagree."""


class QuantError(RecurnormError, ValueError):
    """A tensor cannot be quantized (NaN/Inf, bad shape, bad options)."""


class ArtifactError(RecurnormError, ValueError):
    """An artifact is corrupt, truncated or of an unsupported format/version."""

    exit_code = 4


class DecodedLimitError(ArtifactError):
    """A valid-looking artifact decodes to more bytes than a limit the caller set
    (--max-decoded-bytes): over a cap the user chose, not corrupt."""

    exit_code = 3


class OverCapError(RecurnormError):
    """The artifact plus its code files exceed the byte cap."""

    exit_code = 3

    def __init__(self, message: str, report: object | None = None):
        super().__init__(message)
        self.report = report


class LossRegressionError(RecurnormError):
    """Post-export loss exceeds the reference by more than the allowed delta."""

    exit_code = 5


class OutputExistsError(RecurnormError, FileExistsError):
    """An output path exists and overwriting was not asked for (--force)."""

    exit_code = 2  # a usage error: pass --force


class WriteError(RecurnormError):
    """An output cannot be written (read-only filesystem, a parent that is a file, ...)."""
