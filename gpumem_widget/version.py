"""The package's version: read by the build (pyproject's dynamic version) and by the report."""

__version__ = "0.1.0"
