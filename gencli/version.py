"""gencli's version, at the bottom of the package so that any module may name it (a bundle records it)."""

__version__ = "0.1.0"
