"""The command that repairs a damaged artifact, added to core's error where the step that wrote it is known.

Core names what is wrong (``model folder W/sft/model has no config.json``) and which folder (``damaged``); it
does not know the commands. Here the folder's place in a workdir names the step that wrote it: ``W/<step>/...``
is rerun with ``--force``; a checkpoint ``W/.staging/<step>/checkpoints/step-N`` cannot be resumed from, so the
step starts over.
"""

from __future__ import annotations

from pathlib import Path

from gencli.errors import ArtifactError


def writer(path: Path) -> tuple[str | None, bool]:
    """(the step whose folder holds ``path``, whether it is a training checkpoint); (None, ...) outside a step: a
    model folder ``W/<step>/model``, a checkpoint ``W/.staging/<step>/checkpoints/step-N``."""
    from gencli.steps import step_order

    path = Path(path)
    if path.parent.name == "checkpoints":
        step = path.parent.parent
        return (step.name if step.parent.name == ".staging" and step.name in step_order() else None), True
    return (path.parent.name if path.parent.name in step_order() else None), False


def add_fix(error: BaseException) -> BaseException:
    """``error`` with the repairing command appended to its message, once (an ArtifactError naming the folder)."""
    if not isinstance(error, ArtifactError) or error.damaged is None or error.fixed:
        return error
    step, checkpoint = writer(error.damaged)
    if checkpoint:
        again = f"`gencli {step} --force`" if step else "the same command"
        fix = f"training cannot resume from it: start over with {again} (without --resume)"
    else:
        fix = f"rerun `gencli {step} --force`" if step else "rerun the step that wrote it (e.g. `gencli init-vocab --force`)"
    error.args = (f"{error.args[0]}; {fix}", *error.args[1:])
    error.fixed = True
    return error
