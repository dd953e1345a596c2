"""The package version, in a module of its own so that every wing can read it without importing
the package facade (``aiogc/__init__.py``), which sits above them all."""

__version__ = "0.1.0"
