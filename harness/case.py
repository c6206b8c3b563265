"""The public API for adapter authors (a stable import path): `Case`, the JSON-serializable spec of one case. It
lives in `harness.core.case`; code inside the harness imports it from there, kernel packages from here."""

from harness.core.case import OPS, Case

__all__ = ["OPS", "Case"]
