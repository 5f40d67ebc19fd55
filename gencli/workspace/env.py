"""What a step records about the environment that produced it."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from gencli.mathmode import math_in_effect

PACKAGES = ("gencli", "torch", "transformers", "sentence-transformers", "polars", "numpy", "tokenizers")


def package_versions() -> dict[str, str | int | None]:
    versions: dict[str, str | int | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions["torch_threads"] = torch_threads()
    versions["blas_threads"] = blas_threads()
    versions.update(math_in_effect())  # the CPU and its kernels: another CPU may round otherwise (gencli --math)
    return versions


def blas_threads() -> int | None:
    """The threads of numpy's BLAS in this process (``--threads`` caps them too), or None when numpy is not loaded."""
    if "numpy" not in sys.modules:
        return None
    from threadpoolctl import threadpool_info

    counts = [lib["num_threads"] for lib in threadpool_info() if lib.get("user_api") == "blas"]
    return max(counts) if counts else None


def torch_threads() -> int | None:
    """torch's intra-op CPU threads in this process (``--threads``), or None when the step never loaded torch."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None
