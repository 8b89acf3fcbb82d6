"""Moved to `recurnorm.export.policy`; re-exported here because budget.api imports it from here."""

from ..export.policy import ExportPolicy  # noqa: F401
