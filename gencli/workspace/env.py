"""What a step records about the environment that produced it."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

PACKAGES = ("gencli", "torch", "transformers", "sentence-transformers", "polars", "numpy", "tokenizers")


def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
