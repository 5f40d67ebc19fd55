"""A diverged training through the real CLI: exit 1 naming the step, the iteration and the learning rate; the
previous model and its manifest entry untouched; the checkpoints before it kept for the rerun. And every reader of
a model (eval, export, promotion, a bundle) refuses one with non-finite weights."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from click.testing import CliRunner
from helpers.workdirs import EVAL, refused, run
from safetensors.torch import load_file, save_file

from gencli.cli import cli
from gencli.errors import EXIT_FAILED


@pytest.fixture
def wd(trained_small, tmp_path):
    shutil.copytree(trained_small, tmp_path / "copy")
    return tmp_path / "copy" / "work"


def _tree(folder) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


DIVERGE = ["sft", "--lr", "1e6", "--max-steps", "30", "--save-every", "1", "--eval-users", "5"]


def test_a_diverged_sft_keeps_the_previous_model_and_leaves_a_resumable_state(wd):
    model_before = _tree(wd / "sft")
    entry_before = json.loads((wd / "manifest.json").read_text())["steps"]["sft"]
    r, p = run(wd, *DIVERGE, "--force")
    assert r.exit_code == EXIT_FAILED and p["exit_code"] == EXIT_FAILED, r.output
    error = p["error"]
    assert error.startswith("sft diverged at iteration ") and " of 30: " in error
    assert "the workdir is as it was before this run (the sft model of an earlier run" in error
    assert "learning rate (--lr 1e+06" in error and "rerun with a lower --lr and --force" in error
    assert "Traceback" not in r.output
    assert _tree(wd / "sft") == model_before  # the good model is still the step's output
    entry = json.loads((wd / "manifest.json").read_text())["steps"]["sft"]
    failure = entry.pop("last_failure")
    assert entry == entry_before and failure["resumable"] and "TrainingDiverged" in failure["error"]
    staging = wd / ".staging" / "sft"
    kept = sorted(p.name for p in (staging / "checkpoints").iterdir())
    assert kept and f"resumes from {staging / 'checkpoints' / kept[-1]}" in error
    assert json.loads((staging / "step.json").read_text())["status"] == "failed"
    assert not (staging / "model").exists()  # best/ may hold a validated step before it: finite, as checked

    status = run(wd, "status")[1]
    assert next(s for s in status["steps"] if s["step"] == "sft")["state"] == "done"

    human = CliRunner().invoke(cli, [*DIVERGE, "--workdir", str(wd)])  # the plain rerun resumes, and stops again
    assert human.exit_code == EXIT_FAILED and "Traceback" not in human.output
    assert human.stderr.count("error (exit 1)") == 1 and "sft diverged at iteration" in human.stderr
    assert _tree(wd / "sft") == model_before
    r, p = run(wd, *EVAL)  # the previous model still evaluates
    assert r.exit_code == 0 and p["metrics"]["model_step"] == "sft", r.output


def _poison(model_dir) -> None:
    """One NaN in the sft model's weights, at the same file size (what a diverged run used to commit)."""
    file = model_dir / "model.safetensors"
    weights = load_file(file)
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, file, metadata={"format": "pt"})


def test_eval_export_and_recommend_refuse_a_model_with_non_finite_weights(wd):
    _poison(wd / "sft" / "model")
    names = [wd / "sft" / "model", "non-finite weights", "gencli sft --force", "lower --lr"]
    refused(wd, *EVAL, names=names)
    refused(wd, "recommend", "--user", "u0001", names=names)
    out = wd.parent / "nan-bundle"
    refused(wd, "export", str(out), names=names)
    assert not out.exists() and not list(wd.parent.glob(".nan-bundle*"))


def test_promotion_refuses_it_and_the_link_stays(wd, tmp_path):
    link = tmp_path / "current"
    link.symlink_to(wd.parent / "bundle", target_is_directory=True)
    _poison(wd / "sft" / "model")
    config = tmp_path / "p.toml"
    config.write_text('steps = ["sft"]\n[sft]\nmax-steps = 2\neval-users = 5\nsave-every = 1\n'
                      'keep-checkpoints = 2\n', encoding="utf-8")
    r, p = run(wd, "run", str(config), "--promote", str(link))
    assert r.exit_code == 2, r.output
    assert "non-finite weights" in json.dumps(p) and "Traceback" not in r.output
    assert link.resolve() == (wd.parent / "bundle").resolve()


def test_a_bundle_with_non_finite_weights_is_refused_at_load(wd):
    bundle = wd.parent / "bundle"
    file = bundle / "model" / "model.safetensors"
    _poison(bundle / "model")
    from gencli import Recommender
    from gencli.core.artifacts import model_id
    from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest
    from gencli.errors import ArtifactError

    meta = json.loads((bundle / "gencli.json").read_text())  # re-signed: only the weights are wrong
    meta["sha256"]["model/model.safetensors"] = hashlib.sha256(file.read_bytes()).hexdigest()
    meta["model_id"] = model_id(meta["source"]["model_step"], meta["sha256"])  # the id of the files, as export's
    meta[CHECKSUM] = manifest_digest(meta)
    (bundle / "gencli.json").write_text(json.dumps(meta))

    with pytest.raises(ArtifactError, match="non-finite weights"):
        Recommender.load(bundle, device="cpu")


@pytest.mark.parametrize(("option", "method"), [("--kl", "grpo"), ("--beta", "dpo")])
def test_a_diverged_rl_names_the_option_far_outside_its_range_not_the_learning_rate(wd, option, method):
    r, p = run(wd, "rl", "--method", method, option, "1e300", "--max-steps", "2", "--batch-size", "4",
               "--eval-users", "0", "--rollouts", "8", "--negatives", "2")  # 8: rollouts that hold the target
    assert r.exit_code == EXIT_FAILED and p["error"].startswith("rl diverged at iteration "), r.output
    assert f"The likely cause is {option} 1e+300, far above its usual range" in p["error"], p["error"]
    assert f"rerun with a smaller {option} and --force" in p["error"] and "--lr" not in p["error"]
