"""profile: real sft training steps per STAMP variant, timed phase by phase, with peak memory.

Every variant (base, sap, map, stamp; see :mod:`gencli.core.stamp.sap`) starts from the same
weights (loaded afresh from the model folder, which is never written), trains on the same
batches (the sft dataset and the engine's seeded batch order) with the engine's own
:func:`~gencli.core.train.loop.forward_backward` and AdamW, and is measured over
``cfg.steps`` optimizer steps after ``cfg.warmup_steps`` untimed ones.

Per step, the time is split into data (collate + host-to-device), forward, backward and
optimizer (clip + AdamW + zero_grad); on CUDA each phase ends with a synchronize. Tokens/s
counts real input tokens (padding excluded, before any pruning), like the engine's log.
``tokens_per_cpu_s`` divides by the process CPU time instead of wall time: on a CPU shared
with other jobs it is the steadier number (waiting for a core costs no CPU time).

Memory, two measures:

- ``peak_mem_mb``: on CUDA, ``max_memory_allocated`` during the timed steps minus what was
  allocated when they began (weights, gradients and optimizer state are already there after
  warmup, so this is activations + transients). On CPU, the peak process RSS sampled every
  2 ms by a thread during the timed steps, minus the RSS when they began; freed memory is
  handed back to the OS (``malloc_trim``) between variants so each starts from a fair
  baseline. RSS is coarse (allocator caching, pages touched once), so on CPU also:
- ``activation_mb``: the bytes autograd saves for backward in one step (the longest timed
  batch, run once more after the timed steps), counted with
  ``torch.autograd.graph.saved_tensors_hooks`` once per storage, parameters excluded. Exact and
  deterministic: the quantity SAP is meant to shrink. The hook is kept out of the timed steps.

Before the variants, one discarded pass of the first variant warms the device up, so the
first measured variant does not pay for CUDA initialisation or the first allocations.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gencli.config import ProfileConfig, SftConfig
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab, sid_rows
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.sap import resolve
from gencli.core.train.batches import collate, epoch_batches
from gencli.core.train.samples import SftExamples
from gencli.core.train.step import default_param_groups, make_loss, make_optimizer, train_step
from gencli.errors import InputError

PROFILE_JSON = "profile.json"


VARIANT_FLAGS = {"base": (False, False), "sap": (True, False), "map": (False, True), "stamp": (True, True)}


PHASES = ("data", "forward", "backward", "optimizer")


_MB = 1024 * 1024


def variant_config(train_cfg: SftConfig, variant: str) -> SftConfig:
    """``train_cfg`` with SAP/MAP switched as the variant says (its other STAMP settings kept)."""
    sap, mtp = VARIANT_FLAGS[variant]
    return dataclasses.replace(train_cfg, stamp=dataclasses.replace(train_cfg.stamp, sap=sap, map=mtp))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _release_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc only: hand freed heap pages back to the OS
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RssSampler:
    """Peak RSS above the RSS at ``start()``, sampled by a background thread (Linux /proc)."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s, self.base, self.peak = interval_s, 0, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.base = self.peak = _rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(self.interval_s)

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        return self.peak - self.base


@contextlib.contextmanager
def saved_activation_bytes(params: list[torch.Tensor]) -> Iterator[list[int]]:
    """Counts the bytes autograd saves for backward inside the block (each storage once, parameters excluded)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: set[int] = set()
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and ptr not in seen:
            seen.add(ptr)
            total[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


class PhaseClock:
    """Adds the time since the last mark to a phase; synchronizes CUDA so a phase owns its kernels."""

    def __init__(self, device: torch.device):
        self.device = device
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.last = time.perf_counter()

    def reset(self) -> None:
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.mark()

    def mark(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.totals[phase] += now - self.last
        self.last = now


def profile_variant(
    variant: str,
    train_cfg: SftConfig,
    model_dir: Path,
    dataset: SftExamples,
    batches: list[np.ndarray],
    pad_id: int,
    rows: list[int] | None,
    device: torch.device,
    warmup_steps: int,
    detail: bool = False,
) -> dict[str, Any]:
    """Train a fresh copy of the model for ``warmup_steps + len(batches)`` steps; measure the last ones."""
    cfg = variant_config(train_cfg, variant)
    _release_memory()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model, _ = load_model(model_dir, device, torch.float32)
    model.train()
    stamp = resolve(model, cfg.stamp)
    loss_fn = make_loss(stamp, rows)
    groups = default_param_groups(model, cfg.loop.weight_decay)
    params = [p for g in groups for p in g["params"]]
    optimizer = make_optimizer(groups, cfg.peak_lr, cfg.loop.weight_decay)
    amp_dtype = resolve_dtype(cfg.dtype, device)
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and amp_dtype == torch.float16)
    clock = PhaseClock(device)

    def step(indices: np.ndarray) -> tuple[float, int]:
        result = train_step(model, [collate(dataset, indices, pad_id)], loss_fn, optimizer, scaler,
                            cfg.loop.max_grad_norm, device, amp_dtype, clock=clock)
        return result.loss / max(1, result.n_targets), result.n_inputs

    for indices in batches[:warmup_steps]:
        step(indices)
    timed = batches[warmup_steps:]
    sampler = RssSampler()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base_alloc = torch.cuda.memory_allocated(device)
    else:
        _release_memory()
        sampler.start()
    clock.reset()
    cpu0 = time.process_time()
    losses, tokens = [], 0
    for indices in timed:
        loss, n = step(indices)
        losses.append(loss)
        tokens += n
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base_alloc
    else:
        peak = sampler.stop()
    cpu_seconds = time.process_time() - cpu0
    phase_totals = dict(clock.totals)
    seconds = sum(phase_totals.values())
    # saved activations on one more, untimed step of the longest batch: the hook runs Python per saved
    # tensor, which would slow the timed steps (badly on a GPU, where a small model is launch-bound)
    longest = max(timed, key=lambda idx: int(dataset.lengths()[idx].sum()))
    with saved_activation_bytes(params) as saved:
        step(longest)
    activation = saved[0]
    record: dict[str, Any] = {
        "variant": variant,
        "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
        "tokens_per_cpu_s": round(tokens / max(cpu_seconds, 1e-9), 1),
        "step_s": round(seconds / len(timed), 4),
        **{f"{phase}_s": round(phase_totals[phase] / len(timed), 4) for phase in PHASES},
        "peak_mem_mb": round(peak / _MB, 2),
        "activation_mb": round(activation / _MB, 3),
        "loss": round(float(np.mean(losses)), 4),
        "tokens": tokens,
        **({"stamp_layer": stamp.layer} if stamp.sap else {}),
    }
    if detail:
        record["top_ops"] = _top_ops(lambda: step(timed[0]), device)
    return record


def _top_ops(run_step: Callable[[], Any], device: torch.device, top: int = 10) -> list[dict[str, Any]]:
    """The ``top`` operators of one step by self time (CPU, or CUDA when on GPU)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        run_step()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)[:top]
    return [{"op": e.key, "self_ms": round(getattr(e, key, 0.0) / 1000, 3), "calls": e.count} for e in events]


def run(
    cfg: ProfileConfig,
    train_cfg: SftConfig,
    model_dir: Path,
    vocab_path: Path,
    item_codes: np.ndarray,
    train: pl.DataFrame,
    out_dir: Path,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    """Profile each variant of ``cfg.variants`` on sft batches of ``train``; write ``profile.json``.

    ``train_cfg`` is the sft configuration (batch size, history, lr, STAMP settings); its
    device is replaced by ``cfg.device``. Returns per-variant rows with speedup and memory
    reduction against the first variant (base when listed).
    """
    train_cfg = dataclasses.replace(train_cfg, device=cfg.device)
    vocab = load_sid_vocab(vocab_path)
    item_tokens = item_token_ids(item_codes, vocab)
    dataset = SftExamples(train["sequence"], item_tokens, vocab, train_cfg.max_history, train_cfg.max_prefixes,
                           train_cfg.samples)
    needed = cfg.warmup_steps + cfg.steps
    batch = train_cfg.micro_batch(len(dataset))
    order = epoch_batches(dataset.lengths(), batch, train_cfg.seed, 0) if len(dataset) else []
    if len(order) < needed:
        raise InputError(f"the train split gives {len(order)} batches of {batch} sft samples, but "
                         f"profile needs {needed} (--steps + --warmup-steps); lower them or the batch size")
    batches = order[:needed]
    device = resolve_device(cfg.device)
    rows = sid_rows(vocab) if train_cfg.sid_softmax else None
    results = []
    # a discarded pass first: CUDA context, kernel selection, allocator pools and CPU thread pools warm up
    # here, not inside the first measured variant (which would make base look slow and inflate speedups)
    profile_variant(cfg.variants[0], train_cfg, model_dir, dataset, batches[: cfg.warmup_steps + 1], vocab.pad_id,
                    rows, device, cfg.warmup_steps)
    with progress.track("profile", len(cfg.variants)) as advance:
        for variant in cfg.variants:
            results.append(profile_variant(variant, train_cfg, model_dir, dataset, batches, vocab.pad_id, rows,
                                           device, cfg.warmup_steps, cfg.detail))
            advance(1)
    reference = results[0]
    for r in results:
        r["speedup"] = round(r["tokens_per_s"] / max(reference["tokens_per_s"], 1e-9), 3)
        r["mem_reduction"] = _reduction(r["peak_mem_mb"], reference["peak_mem_mb"])
        r["activation_reduction"] = _reduction(r["activation_mb"], reference["activation_mb"])
    lengths = dataset.lengths()[np.concatenate(batches)]
    summary = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "steps": cfg.steps,
        "warmup_steps": cfg.warmup_steps,
        "batch_size": batch,
        "mean_tokens_per_sample": round(float(lengths.mean()), 1),
        "reference": reference["variant"],
        "stamp_settings": {
            # the layer --stamp-layer 0 (auto) resolved to, as SAP ran it
            "stamp_layer": next((r["stamp_layer"] for r in results if "stamp_layer" in r), train_cfg.stamp.layer),
            **{k: getattr(train_cfg.stamp, k) for k in ("keep_ratio", "recent_window", "score", "mtp_lambda",
                                                        "mtp_weight", "mtp_warmup")},
            "sid_softmax": train_cfg.sid_softmax,
        },
        "variants": results,
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / PROFILE_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _reduction(value: float, reference: float) -> float | None:
    """1 - value / reference (None when the reference measured nothing)."""
    return None if reference <= 0 else round(1.0 - value / reference, 3)


def run_step(cfg: ProfileConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The profile step: sft's settings (its recorded params when sft has run, else the defaults) on the model
    step it reads."""
    from gencli.config import from_dict

    train_cfg = from_dict(SftConfig, inputs.record("sft").get("params", {})) if inputs.done("sft") else SftConfig()
    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    metrics = run(cfg, train_cfg, model_dir, vocab_path, codes, inputs.split("train"), out_dir, progress)
    return {"model_step": inputs.model_step, **metrics}
