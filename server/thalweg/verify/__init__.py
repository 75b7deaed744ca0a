"""``twg verify``: prove from outside that every record is in every lane and every
exactly-once sink once (``docs/operations.md``, "Verifying exactness")."""

from thalweg.verify.report import Finding, Report
from thalweg.verify.run import verify

__all__ = ["Finding", "Report", "verify"]
