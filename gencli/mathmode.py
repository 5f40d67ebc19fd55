"""Which CPU math kernels a gencli process runs: the machine's fastest (native) or ones every x86-64 CPU runs alike.

Float sums round differently under another CPU's vector instructions: MKL (torch's matrix products), ATen's own
kernels (softmax, norms) and OpenBLAS (numpy) each pick the widest the CPU has, so the same seed draws other SIDs on an
Intel and on an AMD machine (docs/usage.md, "Same seed, same results"). ``portable`` pins each library to one code
path both run: MKL's conditional numerical reproducibility branch COMPATIBLE (SSE2, no approximate reciprocals),
ATen's and oneDNN's AVX2 kernels, OpenBLAS's Haswell ones. It is slower (sft about 2x on the sample) and must be set
before torch or numpy is imported, so only the CLI applies it (``gencli --math portable``). No torch here.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

MODES = ("native", "portable")
DEFAULT_MODE = "native"
# The variables portable sets, each read once when its library loads; one the user set already is kept.
PORTABLE_ENV = {
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}
# The libraries that read them at load: once one is imported, setting its variable changes nothing.
READERS = ("torch", "numpy")


def math_problem(mode: str) -> str | None:
    """What keeps a process from running ``mode``'s kernels (an unknown mode, another CPU, a loaded library), or None."""
    if mode not in MODES:
        return f"{mode!r} is not a math mode; use one of {', '.join(MODES)}"
    if mode == "native":
        return None
    problem = cpu_problem()
    if problem:
        return problem
    loaded = [name for name in READERS if name in sys.modules]
    if loaded:
        return (f"{', '.join(loaded)} is already imported in this process, so its kernels are chosen: set "
                f"{', '.join(f'{k}={v}' for k, v in PORTABLE_ENV.items())} before it is")
    return None


def cpu_problem() -> str | None:
    """Why this machine cannot run the portable kernels (not x86-64, no AVX2 and FMA), or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"portable math pins x86-64 kernels; this machine is {platform.machine()}: use --math native"
    flags = cpu_flags()
    if flags is not None and not {"avx2", "fma"} <= flags:
        return "portable math needs a CPU with AVX2 and FMA; this one lacks them: use --math native"
    return None


def apply_math(mode: str) -> None:
    """Set ``mode``'s variables in this process's environment (inherited by the processes it starts).

    Raises ValueError with :func:`math_problem`'s message when the mode cannot take effect here."""
    problem = math_problem(mode)
    if problem:
        raise ValueError(problem)
    if mode == "portable":
        for name, value in PORTABLE_ENV.items():
            os.environ.setdefault(name, value)


def cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first CPU's ``name`` line of /proc/cpuinfo ("flags", "model name"), "" when it has none, or None where
    the file is absent (not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def cpu_flags() -> set[str] | None:
    """The first CPU's feature flags, or None where /proc/cpuinfo is absent."""
    flags = cpuinfo_field("flags")
    return None if flags is None else set(flags.split())


def math_in_effect() -> dict[str, str | None]:
    """What this process runs, for step.json: the CPU, ATen's kernel level (once torch is loaded), the pins set, and
    the mode they make (``portable`` when every portable pin holds its value, else ``native``)."""
    cpu = cpuinfo_field("model name") or platform.processor() or None
    torch = sys.modules.get("torch")
    aten = torch.backends.cpu.get_cpu_capability() if torch is not None else None
    pinned = ",".join(f"{name}={os.environ[name]}" for name in PORTABLE_ENV if name in os.environ) or None
    portable = all(os.environ.get(name) == value for name, value in PORTABLE_ENV.items())
    return {"cpu": cpu, "aten_kernels": aten, "pinned": pinned, "math": "portable" if portable else "native"}
