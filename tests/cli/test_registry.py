"""The step registry (gencli/steps.py) is consistent and is what the CLI, run and status use."""

from __future__ import annotations

import click
import pytest

from gencli import steps
from gencli.cli import cli
from gencli.steps import REGISTRY, STEPS, model_candidates, model_steps, pipeline_steps, step_order


def test_every_step_reads_only_steps_registered_before_it():
    order = [s.name for s in REGISTRY]
    for step in REGISTRY:
        for up in (*step.inputs, *step.optional):
            up = up.partition("/")[0]  # "ingest/items.parquet": one artifact of ingest
            assert STEPS[up].recorded and order.index(up) < order.index(step.name), (step.name, up)


def test_model_steps_and_what_auto_tries():
    assert model_steps() == ("init-vocab", "cpt", "sft", "rl")
    assert model_candidates("sft") == ("cpt", "init-vocab")  # sft never starts from itself
    assert model_candidates("eval") == ("rl", "sft", "cpt", "init-vocab")
    assert all(STEPS[s].resumable == (s in ("embed", "cpt", "sft", "rl")) for s in STEPS)


def test_every_available_command_resolves_and_plain_commands_are_not_steps():
    ctx = click.Context(cli, info_name="gencli")
    assert set(cli.list_commands(ctx)) == set(steps.commands())
    for name in cli.list_commands(ctx):
        assert isinstance(cli.get_command(ctx, name), click.Command), name
    for name in ("run", "status", "models"):
        assert name not in step_order() and name not in pipeline_steps()
    assert {"ingest", "embed", "quantize", "init-vocab", "cpt", "sft", "eval", "cold-eval"} <= set(pipeline_steps())


def _done(root, step, inputs=None, digest=None):
    from gencli.workspace.manifest import Manifest

    (root / step).mkdir(parents=True, exist_ok=True)
    (root / step / "step.json").write_text("{}")
    Manifest(root).record_done(step, {"status": "done", "digest": digest or step, "inputs": inputs or {}})


def test_auto_picks_the_most_trained_model_step_the_consumer_may_read(tmp_path):
    from gencli.errors import ArtifactError
    from gencli.workspace import Workspace

    ws = Workspace(tmp_path)
    with pytest.raises(ArtifactError, match="gencli init-vocab"):
        ws.pick_model("auto", "sft")
    _done(tmp_path, "init-vocab")
    assert ws.pick_model("auto", "sft") == ws.pick_model("auto", "eval") == "init-vocab"
    _done(tmp_path, "cpt")
    assert ws.pick_model("auto", "sft") == "cpt"
    _done(tmp_path, "sft")
    assert ws.pick_model("auto", "sft") == "cpt"  # sft never starts from itself
    assert ws.pick_model("auto", "eval") == "sft"
    assert ws.pick_model("init-vocab", "eval") == "init-vocab"
    _done(tmp_path, "rl", inputs={"sft": {"step": "sft", "sha256": "sft"}})
    assert ws.pick_model("auto", "eval") == "rl"
    _done(tmp_path, "sft", digest="sft trained again")  # rl refines a model that is no longer sft's
    assert ws.pick_model("auto", "eval") == "sft"
    assert ws.pick_model("rl", "eval") == "rl"  # asked for by name: still there


def test_the_lists_of_steps_elsewhere_are_read_from_the_rows():
    """torchrun, promotion, `gencli run` overrides, STAMP's training options and --model-step all come from the
    registry's rows (one place for a step's facts)."""
    from gencli.config import MODEL_STEP_CHOICES, TRAIN_TASKS, TRAINING

    assert steps.distributed_steps() == ("embed", "cpt", "sft", "rl", "eval", "cold-eval", "recommend")
    assert steps.serving_steps() == ("recommend",)
    assert steps.overridden_by("seed") == ("quantize", "init-vocab", "cpt", "sft", "rl")
    assert steps.overridden_by("init") == steps.overridden_by("model") == ("init-vocab",)
    assert TRAINING == steps.token_training_steps() == ("cpt", "sft") and TRAIN_TASKS == ("cpt", "sft", "rl")
    assert MODEL_STEP_CHOICES == ("auto", "rl", "sft", "cpt", "init-vocab")
    assert [s.name for s in REGISTRY if s.retrain] == ["embed", "init-vocab", "sft", "rl"]
