"""docs/cron.md run as written: its crontab line (which runs its nightly.sh) under cron's environment (env -i,
PATH=/usr/bin:/bin, HOME, SHELL=/bin/sh), on a fresh ROOT with gencli in ROOT/venv. /srv/reco becomes a temporary
folder; the test adds only DAY= (two nights on one calendar day) and THREADS=1 to the line.

- night one on a fresh machine: logs/ does not exist before the line runs, gencli is found by the virtualenv's path;
- each night's log starts and ends with a timestamped line (day, steps, exit code, decision); a skipped (locked)
  night and a killed night say so, and a rerun keeps the earlier attempts' files;
- (slow) two nights of the small sample, a killed and a skipped night among them, and the promoted bundle served
  by another account; and two nights of the whole sample: stable SIDs, reuse, warm start, the documented rule.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest
from helpers.nights import cut_day, ingest, pipeline_toml, small_night

CHECKOUT = Path(__file__).resolve().parents[2]
DOC = CHECKOUT / "docs" / "cron.md"
CUT = 1686300000  # whole-sample day 1: events before this (about 3/4 of the sample)
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}"
SMALL = small_night("export", recommend={"k": 3})


def nightly_script() -> str:
    match = re.search(r"<!-- nightly\.sh.*?-->\n```bash\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert match, "docs/cron.md lost its nightly.sh block"
    return match.group(1)


def crontab_command(root: Path) -> str:
    """The command of the documented crontab line (after its five time fields), /srv/reco replaced by ``root``."""
    match = re.search(r"<!-- crontab.*?-->\n```\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.S)
    assert match, "docs/cron.md lost its crontab line"
    fields = match.group(1).split(None, 5)
    assert len(fields) == 6 and fields[:5] == ["30", "2", "*", "*", "*"], fields
    return fields[5].replace("/srv/reco", str(root))


def fresh_root(root: Path, pipeline: str) -> None:
    """What docs/cron.md's setup leaves: ROOT with a virtualenv holding gencli, pipeline.toml and nightly.sh; no
    logs/ or runs/ yet. The venv's gencli is a console-script launcher (what pip writes: this interpreter by its
    absolute path) that imports this checkout."""
    bin_dir = root / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "gencli").write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(CHECKOUT)!r})\n"
                                    "from gencli.cli import main\nsys.exit(main())\n")
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for name in ("gencli", "python"):
        os.chmod(bin_dir / name, 0o755)
    (root / "nightly.sh").write_text(nightly_script())
    os.chmod(root / "nightly.sh", 0o755)
    (root / "pipeline.toml").write_text(pipeline)
    (root / "export").mkdir()
    assert not (root / "logs").exists()


def cron(root: Path, day: str, wait: bool = True):
    """Run the crontab line as cron does: /bin/sh -c, an empty environment but PATH=/usr/bin:/bin, HOME, SHELL,
    LOGNAME, in HOME. Returns the finished process, or the running one (its own process group) with wait=False."""
    env = ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={root}", "SHELL=/bin/sh", "LOGNAME=cron"]
    args = [*env, "/bin/sh", "-c", f"DAY={day} THREADS=1 {crontab_command(root)}"]
    if not wait:
        return subprocess.Popen(args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=1200)


def log_lines(root: Path, name: str) -> list[str]:
    return (root / "logs" / name).read_text(encoding="utf-8").splitlines()


def night_json(root: Path, day: str) -> dict:
    return json.loads((root / "logs" / f"{day}.json").read_text(encoding="utf-8"))


def test_night_one_on_a_fresh_machine_under_crons_environment(small_sample, tmp_path):
    """No pipeline to train (ingest only, so promotion has no model: exit 2), which is enough for the plumbing:
    the line runs with cron's PATH, the script makes logs/ before anything writes there, gencli is found (not 127),
    the log's first and last lines are timestamped, a second attempt keeps the first one's files, and a night that
    finds the lock held is skipped and says so."""
    root = tmp_path / "reco"
    root.mkdir()
    fresh_root(root, pipeline_toml(["ingest"], {"ingest": ingest("export")}))
    cut_day(small_sample.folder, root / "export")
    first = cron(root, "d1")
    assert first.returncode == 2, first.stderr  # 127 was "gencli: command not found", 1 "logs: Directory nonexistent"
    assert first.stdout == "" and first.stderr == f"night d1: exit 2, see {root}/logs/d1.log\n"  # what cron mails
    lines = log_lines(root, "d1.log")
    assert re.fullmatch(STAMP + rf" night d1: started \(pid \d+, {root}/venv/bin/gencli, first night: no --previous\)",
                        lines[0]), lines[0]
    assert re.fullmatch(STAMP + r" night d1: exit 2, failed: .*current is untouched; .*needs the output of 'init-vocab'.*", lines[-1]), \
        lines[-1]
    assert any(re.fullmatch(STAMP + r" step ingest: done in [\d.]+ s", line) for line in lines)
    assert any("validating rows: started" in line for line in lines)  # progress lines, although --json owns stdout
    assert night_json(root, "d1")["status"] == "error"

    again = cron(root, "d1")
    assert again.returncode == 2
    assert log_lines(root, "d1.1.log") == lines and (root / "logs" / "d1.1.json").is_file()  # kept, not overwritten
    started = STAMP + rf" night d1: started \(pid (\d+), {root}/venv/bin/gencli, first night: no --previous\)"
    second = re.fullmatch(started, log_lines(root, "d1.log")[0])  # the second attempt's own log: no current yet
    assert second and second.group(1) != re.fullmatch(started, lines[0]).group(1), log_lines(root, "d1.log")[0]

    with open(root / ".nightly.lock", "w") as held:  # the previous night still runs
        fcntl.flock(held, fcntl.LOCK_EX)
        skipped = cron(root, "d2")
    assert skipped.returncode == 3
    assert re.fullmatch(STAMP + rf" night d2: skipped: another night still runs \(it holds {root}/.nightly.lock\)",
                        log_lines(root, "d2.log")[-1])
    cron_log = log_lines(root, "cron.log")
    assert [re.sub(STAMP + r" ", "", line).split(":")[0] for line in cron_log] == [
        "night d1", "night d1", "night d1", "night d1", "night d2"]
    assert not (root / "runs" / "d2").exists()


@pytest.fixture
def shared_root():
    """A ROOT every account may enter (pytest's own temp folders are 0700): the serving account reads current/."""
    base = Path(tempfile.mkdtemp(prefix="gencli-cron-"))
    os.chmod(base, 0o755)
    yield base / "reco"
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow  # three small-sample pipelines and a killed one (~1 min on 1 thread)
def test_two_nights_a_killed_and_a_skipped_one_and_another_account_serves(small_sample, shared_root):
    from helpers.accounts import as_other_account

    root = shared_root
    root.mkdir()
    fresh_root(root, SMALL)
    cut_day(small_sample.folder, root / "export", items=30)
    night1 = cron(root, "day1")
    assert night1.returncode == 0, night1.stderr + (root / "logs" / "day1.log").read_text()
    lines = log_lines(root, "day1.log")
    assert re.fullmatch(STAMP + r" night day1: started .*first night: no --previous\)", lines[0])
    assert re.fullmatch(STAMP + r" night day1: exit 0, promoted \(or already promoted\); steps: ingest done, embed done, "
                                r"quantize done, init-vocab done, sft done, recommend done; promotion: promoted "
                                r"\(nothing promoted yet\)", lines[-1]), lines[-1]
    assert any("embedding items: started" in line for line in lines)

    cut_day(small_sample.folder, root / "export")  # day 2: every item, every event
    with open(root / ".nightly.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert cron(root, "day2").returncode == 3  # skipped: the lock is held
    killed = cron(root, "day2", wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and not any("step embed: started" in line for line in
                                             _lines_if_any(root / "logs" / "day2.log")):
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)  # the whole night: the script and gencli (a reboot, the OOM killer)
    killed.wait(timeout=60)
    deadline = time.time() + 60
    while time.time() < deadline:  # until the last of them is gone (it holds the night's lock until then)
        try:
            os.killpg(killed.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    partial = log_lines(root, "day2.log")
    assert "step embed: started" in partial[-1] or any("step embed: started" in line for line in partial)
    assert not any(" night day2: exit " in line for line in partial)

    night2 = cron(root, "day2")
    assert night2.returncode in (0, 4), night2.stderr + (root / "logs" / "day2.log").read_text()
    assert log_lines(root, "day2.1.log")[-1].endswith("skipped: another night still runs (it holds "
                                                      f"{root}/.nightly.lock)")
    assert log_lines(root, "day2.2.log") == partial  # the killed night's log, kept as it was
    lines = log_lines(root, "day2.log")
    decision = night_json(root, "day2")["promotion"]
    verdict = "promoted (or already promoted)" if decision["promoted"] else "trained, not promoted"
    assert re.fullmatch(STAMP + rf" night day2: started .*--previous {root}/current\)", lines[0])
    assert re.fullmatch(STAMP + rf" night day2: exit {night2.returncode}, {re.escape(verdict)}.*; steps: ingest (done|up-to-date), "
                                r"embed (done|up-to-date), .*; promotion: .*", lines[-1]), lines[-1]
    trail = [json.loads(line) for line in (root / "current.bundles" / "promotions.jsonl").read_text().splitlines()]
    assert [d["workdir"] for d in trail] == [str(root / "runs" / d) for d in ("day1", "day2")]

    served = as_other_account([sys.executable, "-m", "gencli", "recommend", "--bundle", str(root / "current"),
                               "--output", "-", "--k", "3"], cwd=root)
    assert served.returncode == 0, served.stderr[-2000:]
    answers = [json.loads(line) for line in served.stdout.splitlines()]
    serving = json.loads((root / "current" / "gencli.json").read_text())
    assert len(answers) == pl.read_parquet(Path(serving["source"]["workdir"]) / "ingest" / "users.parquet").height
    assert {a["model"] for a in answers} == {serving["model_id"]}


def _lines_if_any(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []


@pytest.mark.slow  # two sample-data pipelines (~1 min each on 1 thread)
def test_the_documented_nightly_script_on_two_nights_of_the_sample(sample_dir, tmp_path):
    root = tmp_path / "reco"
    root.mkdir()
    config = (sample_dir / "pipeline.toml").read_text()
    config = config.replace('items = "items.csv"', 'items = "export/items.csv"')
    config = config.replace('interactions = "interactions.csv"', 'interactions = "export/interactions.csv"')
    # a short budget (this tests the plumbing): 30 sft steps, 100 validation users, 200 test users
    config = "promote-users = 100\n" + config.replace("[sft]\n", "[sft]\nmax-steps = 30\neval-users = 100\n")
    for step in ("eval", "cold-eval"):
        config = config.replace(f"[{step}]\n", f"[{step}]\nmax-users = 200\n")
    assert "export/items.csv" in config and "max-steps = 30" in config and config.count("max-users = 200") == 2
    fresh_root(root, config)

    cut_day(sample_dir, root / "export", before=CUT)
    rc1 = cron(root, "day1").returncode
    night1 = night_json(root, "day1")
    assert rc1 == 0 and night1["promotion"]["promoted"] and night1["promotion"]["reason"] == "nothing promoted yet"
    assert "retrain" not in night1  # the first night starts fresh

    cut_day(sample_dir, root / "export")
    rc2 = cron(root, "day2").returncode
    night2 = night_json(root, "day2")
    runs = root / "runs"
    sids = [pl.read_parquet(runs / d / "quantize" / "sids.parquet") for d in ("day1", "day2")]
    before, after = ({i: tuple(c) for i, c in zip(s["item_id"], s["codes"].to_list(), strict=True)} for s in sids)
    kept = before.keys() & after.keys()
    assert len(after) > len(before) and all(before[i] == after[i] for i in kept)
    report = night2["retrain"]
    assert report["previous"] == str((runs / "day1").resolve())
    assert (report["items_added"], report["sid_changed"]) == (len(after.keys() - before.keys()), 0)
    assert report["embed.items_encoded"] == report["items_added"]  # texts are unchanged: only new items
    # the previous night's model step: sft (rl is not in the main job)
    assert report["init-vocab.warm_start_from"] == str((runs / "day1" / "sft").resolve())
    assert report["sft.started_from"] == "init-vocab"

    decision = night2["promotion"]
    new, current = decision["new"]["recall@10"], decision["current_scores"]["recall@10"]
    assert decision["promoted"] == (new >= current * 0.95)  # the documented rule, default tolerance 5%
    assert rc2 == (0 if decision["promoted"] else 4)
    serving = json.loads((root / "current" / "gencli.json").read_text())["source"]["workdir"]
    assert serving == str((runs / ("day2" if decision["promoted"] else "day1")).resolve())
    assert (runs / "day2" / "recommend").exists() == decision["promoted"]  # no lists of a model that does not serve
