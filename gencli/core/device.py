"""Device and dtype resolution shared by every step that touches a model, and the process's peak memory."""

from __future__ import annotations

import sys

import torch

from gencli.errors import InputError


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when available, else cpu. 'cuda' without a GPU is a user error. Plain cuda is the current
    device (under torchrun ``cuda:LOCAL_RANK``, set by :func:`gencli.core.dist.start`)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but no CUDA device is visible; use --device cpu or auto")
    if name == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA (when supported), float32 on CPU."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def peak_rss_mib() -> float | None:
    """This process's peak resident set size so far in MiB (``getrusage``: KiB on Linux, bytes on macOS); None where
    the ``resource`` module does not exist (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


def set_threads(threads: int | None) -> int:
    """Give torch ``threads`` CPU threads in this process (``torch.set_num_threads``): None = the query default
    (:data:`gencli.threads.QUERY_THREADS`), 0 = leave torch's setting as it is; returns the count in effect. Anything
    but a whole number in [0, MAX_THREADS] is an InputError saying so."""
    from gencli.threads import QUERY_THREADS, thread_problem

    if threads is None:
        threads = QUERY_THREADS
    problem = thread_problem(threads)
    if problem:
        raise InputError(f"threads: {problem}")
    if threads:
        limit_threads(threads)
    return torch.get_num_threads()


def limit_threads(n: int) -> None:
    """Cap this process's math at ``n`` threads: torch's intra-op pool and every BLAS already loaded (numpy's
    OpenBLAS: numpy is imported first so its library is among them). A product's result depends on how its rows are
    split among threads, so a BLAS left at one thread per core made quantize's SIDs follow the machine's core count
    (docs/usage.md, "Same seed, same results")."""
    import numpy  # noqa: F401  (loads numpy's BLAS, so threadpoolctl finds and caps it)
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(limits=n, user_api="blas")

