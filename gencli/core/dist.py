"""torchrun support: the process group from torchrun's environment, and the few collectives gencli needs.

Under ``torchrun --nproc_per_node N -m gencli STEP`` every process runs the same command. Rank 0 owns the
workdir (lock, manifest, logs, checkpoints); every rank computes: training shards each global batch across
ranks (:func:`shard`), decoding shards batches of users and gathers them back in order (:func:`gather`), embed
encodes every N-th chunk of items and rank 0 receives them in order (:func:`gather_to_main`).
Without torchrun (``WORLD_SIZE`` unset or 1) every helper here is the identity, and nothing is initialised.

The backend is NCCL when the step runs on CUDA, else gloo; on CUDA each process takes ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")

TIMEOUT_MINUTES = 60  # a rank waits this long for the others (rank 0's validation or checkpoint) before failing


def launched() -> bool:
    """True inside a torchrun job of more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank() -> int:
    d = _dist()
    return d.get_rank() if d else 0


def world_size() -> int:
    d = _dist()
    return d.get_world_size() if d else 1


def is_main() -> bool:
    return rank() == 0


def start(device: str = "auto") -> bool:
    """Join torchrun's process group (once per process); False when not launched by torchrun.

    ``device`` is the step's device option: NCCL when it resolves to CUDA, gloo otherwise.
    """
    if not launched():
        return False
    if _dist() is not None:
        return True
    import torch
    import torch.distributed as dist

    cuda = device != "cpu" and torch.cuda.is_available() and not device.startswith("mps")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=TIMEOUT_MINUTES))
    return True


def stop() -> None:
    """Leave the process group (the end of a command)."""
    d = _dist()
    if d is not None:
        d.destroy_process_group()


def barrier() -> None:
    d = _dist()
    if d is not None:
        d.barrier()


def broadcast(value: T) -> T:
    """Rank 0's ``value`` on every rank (any picklable object)."""
    d = _dist()
    if d is None:
        return value
    box = [value]
    d.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank."""
    d = _dist()
    if d is None:
        return [value]
    out: list[Any] = [None] * d.get_world_size()
    d.all_gather_object(out, value)
    return out


def gather_to_main(value: T) -> list[T] | None:
    """Every rank's ``value`` in rank order on rank 0, None on the others (any picklable object)."""
    d = _dist()
    if d is None:
        return [value]
    out: list[Any] | None = [None] * d.get_world_size() if d.get_rank() == 0 else None
    d.gather_object(value, out, dst=0)
    return out


def all_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sum of ``values`` over the ranks (float64, so token counts stay exact)."""
    d = _dist()
    if d is None:
        return list(values)
    import torch

    t = torch.tensor(list(values), dtype=torch.float64)
    if d.get_backend() == "nccl":
        t = t.cuda()
    d.all_reduce(t)
    return t.cpu().tolist()


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of a global batch: every ``world_size``-th element starting at its rank."""
    return list(items[rank() :: world_size()])
