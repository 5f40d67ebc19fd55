"""Scripting and cron behaviour: bad options exit 2 before any work, Ctrl-C exits 130, status on a missing path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_data"


def _invoke(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("extra, named", [
    (["--set", "sft.epoch=3"], "--epoch"),
    (["--set", "quantize.codes=abc"], "--codes"),
    (["--set", "eval.k=abc"], "--k"),
])
def test_pipeline_with_a_bad_option_exits_2_before_any_step(tmp_path, extra, named):
    wd = tmp_path / "work"
    result = _invoke("run", str(SAMPLE / "pipeline.toml"), "--workdir", str(wd), "--json", *extra)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert named in error
    assert not wd.exists()  # ingest never ran
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_pipeline_toml_with_an_unknown_option_lists_it(tmp_path):
    config = tmp_path / "p.toml"
    config.write_text('steps = ["ingest", "embed"]\n[ingest]\nitems = "x.csv"\ninteractions = "y.csv"\n'
                      '[embed]\nbatch-sise = 8\n')
    result = _invoke("run", str(config), "--workdir", str(tmp_path / "w"))
    assert result.exit_code == EXIT_BAD_INPUT
    assert "--batch-sise" in result.output and "[embed]" in result.output
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("args, named", [
    (["quantize", "--codes", "abc"], "--codes"),
    (["quantize", "--levels", "-1"], "--levels"),
    (["eval", "--k", "abc"], "--k"),
    (["cold-eval", "--k", "5,x"], "--k"),
    (["sft", "--lr", "fast"], "--lr"),
])
def test_bad_option_values_exit_2_naming_the_option(tmp_path, args, named):
    result = _invoke(*args, "--workdir", str(tmp_path / "w"))
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert named in result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, (ValueError, TypeError))
    assert not (tmp_path / "w").exists()


def test_status_on_a_missing_workdir_exits_2(tmp_path):
    missing = tmp_path / "nope"
    result = _invoke("status", "--workdir", str(missing), "--json")
    assert result.exit_code == EXIT_BAD_INPUT
    assert str(missing) in json.loads(result.stdout)["error"]
    assert not missing.exists()


# Ctrl-C as on a terminal, even when the test runner was started with SIGINT ignored (which children inherit)
CTRL_C_ABLE = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "from gencli.cli import main; sys.argv[0] = 'gencli'; main()")


def test_ctrl_c_during_a_step_exits_130_and_keeps_nothing_half_written(tmp_path):
    """A real SIGINT to a real ``gencli ingest`` once its core is working (its first progress line says so): the
    interactions are 20 renamed copies of the sample's users, so ingest is still reading when the signal lands."""
    lines = (SAMPLE / "interactions.csv").read_text(encoding="utf-8").splitlines()
    interactions = tmp_path / "interactions.csv"
    interactions.write_text("\n".join([lines[0], *(f"copy{c}-{row}" for c in range(20) for row in lines[1:])]) + "\n",
                            encoding="utf-8")
    wd = tmp_path / "w"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GENCLI_NO_PROGRESS")}  # progress lines on stderr
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_ABLE, "--threads", "1", "ingest", "--items",
                             str(SAMPLE / "items.csv"), "--interactions", str(interactions), "--workdir", str(wd)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # the first task's "started" line is printed inside the core's run()
        seen.append(line)
        if ": started" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    err = "".join(seen) + err
    assert proc.returncode == EXIT_INTERRUPTED, f"stdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    assert "reading input: started" in err and "interrupted" in err
    assert not (wd / "ingest").exists() and not (wd / ".staging" / "ingest").exists()
    assert json.loads((wd / "manifest.json").read_text())["steps"]["ingest"]["status"] != "done"


def test_pipeline_tables_become_the_configs_the_options_build():
    from gencli.flow.plan import step_config

    cfg, problems = step_config("sft", {"sid-softmax": False, "sap": False, "eval-every": 5, "from": "init-vocab"},
                                SAMPLE)
    assert not problems and (cfg.sid_softmax, cfg.stamp.sap, cfg.validation.eval_every, cfg.start_from, cfg.step) == \
        (False, False, 5, "init-vocab", "sft")
    assert step_config("sft", {"full-softmax": True}, SAMPLE)[0].sid_softmax is False
    assert step_config("ingest", {"items": "items.csv", "interactions": "interactions.csv",
                                  "drop-short-users": False}, SAMPLE)[0].drop_short_users is False
    ingest = step_config("ingest", {"items": "items.csv", "interactions": "interactions.csv"}, SAMPLE)[0]
    assert ingest.items == str(SAMPLE / "items.csv")  # relative to the TOML's folder
    stamp = step_config("cpt", {"stamp": True}, SAMPLE)[0].stamp
    assert stamp.sap and stamp.map
    _, problems = step_config("eval", {"k": [5, "x"], "beams": "20", "prune": 1, "nope": 1}, SAMPLE)
    assert len(problems) == 3 and all(p.startswith("[eval] ") for p in problems)  # "20" parses as --beams 20
    quoted, problems = step_config("sft", {"lr": "0.003", "max-steps": "5"}, SAMPLE)  # as the option parses them
    assert not problems and (quoted.loop.lr, quoted.loop.max_steps) == (0.003, 5)
    _, problems = step_config("sft", {"lr": True, "max-steps": 2.5, "seed": "x", "batch-size": [1]}, SAMPLE)
    assert [p.split(":")[0] for p in problems] == ["[sft] --lr", "[sft] --max-steps", "[sft] --seed", "[sft] --batch-size"]
