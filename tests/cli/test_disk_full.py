"""A full disk is one clear message naming the path and the fix (exit 1), never a traceback or "unexpected
OSError", and nothing is lost: the rerun with space again finishes (a training step from its checkpoints).

The messages are checked on real ENOSPC errors of /dev/full (fast); the commands run end to end in a small tmpfs
mounted in a private user and mount namespace (slow: a gencli process per command; skipped where the kernel or
the container does not allow unprivileged namespaces)."""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from helpers.workdirs import SFT

from gencli.cli.common import message
from gencli.errors import EXIT_FAILED, storage_message


def _real_enospc() -> OSError:
    try:
        with open("/dev/full", "w") as f:
            f.write("x" * 65536)
            f.flush()
    except OSError as exc:
        return exc
    pytest.skip("/dev/full did not refuse a write")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_one_message_naming_the_path_and_the_fix(tmp_path):
    error = _real_enospc()
    assert error.errno == errno.ENOSPC and error.filename is None  # a write() failure says no file
    code, text = message(error, json_mode=True, where=tmp_path / "work")
    assert code == EXIT_FAILED
    assert text.startswith(f"no space left on the device holding {tmp_path / 'work'} (No space left on device)")
    assert f"df -h {tmp_path / 'work'}" in text and "rerun the same command" in text
    try:  # a failure while handling it (the step's own cleanup) chains a second error: still the same message
        try:
            raise error
        except OSError:
            raise RuntimeError("while saving the failure record") from None
    except RuntimeError as chained:
        chained.__context__ = error
        assert message(chained, json_mode=True, where="W")[1].startswith("no space left on the device holding W")
    try:  # polars reports it in its own error type and words
        pl.DataFrame({"a": list(range(10_000))}).write_parquet("/dev/full")
    except Exception as polars_error:  # noqa: BLE001
        assert storage_message(polars_error, "out.parquet").startswith("no space left on the device holding "
                                                                      "out.parquet")
    assert storage_message(ValueError("no such thing")) is None


def _namespaces_work() -> bool:
    if not shutil.which("unshare") or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not _namespaces_work(), reason="unprivileged user+mount namespaces unavailable")
GENCLI = f"{shlex.quote(sys.executable)} -m gencli --threads 1"


def _in_small_disk(tmp_path: Path, script: str) -> None:
    """Run ``script`` (sh) with $SMALL a tmpfs of its own in a private namespace (gone when it ends)."""
    small = tmp_path / "small"
    small.mkdir()
    env = {**os.environ, "SMALL": str(small), "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr


SAVE_ON_A_FULL_DISK = """
import json, sys, torch
from pathlib import Path
from gencli.cli.common import message
from gencli.core.train.checkpoints import save_atomic

def write(path):  # a checkpoint's trainer_state.pt: torch.save names no errno when the disk fills
    torch.save({"optimizer": torch.zeros(1 << 20)}, path / "trainer_state.pt")

final = Path(sys.argv[1]) / "checkpoints" / "step-000003"
try:
    save_atomic(final, write)
except Exception as error:
    code, text = message(error, json_mode=True, where=sys.argv[1])
    left = sorted(p.name for p in final.parent.iterdir())
    print(json.dumps({"type": type(error).__name__, "code": code, "text": text, "left": left}))
"""


@needs_namespaces
def test_torch_save_filling_the_disk_is_the_full_disk_message_and_leaves_no_partial_checkpoint(tmp_path):
    """torch.save raises RuntimeError ("[enforce fail at inline_container.cc:672] . unexpected pos"), not OSError,
    on ENOSPC: sft's checkpoint save gave two tracebacks and "unexpected RuntimeError"."""
    (tmp_path / "save.py").write_text(SAVE_ON_A_FULL_DISK)
    _in_small_disk(tmp_path, "set -e\nmount -t tmpfs -o size=256k tmpfs $SMALL\n"
                   f"{shlex.quote(sys.executable)} $OUT/save.py $SMALL > $OUT/save.out\n")
    outcome = json.loads((tmp_path / "save.out").read_text())
    assert outcome["type"] == "OSError" and outcome["code"] == EXIT_FAILED, outcome
    assert outcome["text"].startswith(f"no space left on the device holding {tmp_path / 'small' / 'checkpoints'}")
    assert "rerun the same command" in outcome["text"] and "continues from its last checkpoint" in outcome["text"]
    assert outcome["left"] == []  # the half-written .tmp-step-000003 is gone: it held the space


def _outcome(tmp_path: Path, name: str) -> tuple[int, dict, str]:
    out = (tmp_path / f"{name}.out").read_text()
    return (int((tmp_path / f"{name}.rc").read_text()), json.loads(out.strip().splitlines()[-1]) if out.strip()
            else {}, (tmp_path / f"{name}.err").read_text())


def _cmd(name: str, args: str) -> str:
    return f"{GENCLI} {args} --json > $OUT/{name}.out 2> $OUT/{name}.err; echo $? > $OUT/{name}.rc\n"


def _refused_clearly(tmp_path: Path, name: str, path: str) -> None:
    code, payload, err = _outcome(tmp_path, name)
    assert code == EXIT_FAILED and payload["exit_code"] == EXIT_FAILED, (payload, err)
    assert payload["error"].startswith("no space left on the device holding "), payload
    assert path in payload["error"] and "rerun the same command" in payload["error"]
    assert "Traceback" not in err and "unexpected" not in payload["error"], err


@pytest.mark.slow
@needs_namespaces
def test_ingest_on_a_full_disk_says_so_and_the_rerun_finishes(tmp_path, small_sample):
    args = " ".join(shlex.quote(a) for a in small_sample.ingest_args())
    _in_small_disk(tmp_path, "set -e\nmount -t tmpfs -o size=16k tmpfs $SMALL\nset +e\n"
                   + _cmd("first", f"{args} --workdir $SMALL/work")
                   + "mount -o remount,size=64m $SMALL\n"
                   + _cmd("again", f"{args} --workdir $SMALL/work")
                   + "cp -r $SMALL/work $OUT/work\n")
    _refused_clearly(tmp_path, "first", "small/work")
    code, payload, err = _outcome(tmp_path, "again")
    assert code == 0 and payload["status"] == "done", err
    assert json.loads((tmp_path / "work" / "manifest.json").read_text())["steps"]["ingest"]["status"] == "done"


@pytest.mark.slow
@needs_namespaces
def test_export_sft_and_recommend_on_a_full_disk_say_so_and_lose_nothing(tmp_path, trained_small):
    root = tmp_path / "copy"
    shutil.copytree(trained_small, root)
    work = root / "work"
    size_kb = sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) // 1024 + 512
    sft = " ".join([*SFT[:2], "3", *SFT[3:]])  # 3 steps: not the finished run's options, so it runs
    _in_small_disk(tmp_path, "set -e\nmount -t tmpfs -o size=256k tmpfs $SMALL\nset +e\n"
                   + _cmd("export", f"export $SMALL/bundle --workdir {work}")
                   + "dd if=/dev/zero of=$SMALL/filler bs=4k 2> /dev/null\n"  # nothing left at all
                   + _cmd("recommend", f"recommend --output $SMALL/recs.parquet --workdir {work}")
                   + "rm $SMALL/filler\nls -A $SMALL > $OUT/left.txt\n"
                   + f"mount -o remount,size={size_kb}k $SMALL\ncp -r {work} $SMALL/work\n"
                   + _cmd("sft", f"{sft} --workdir $SMALL/work")
                   + "mount -o remount,size=512m $SMALL\n"
                   + _cmd("sft_again", f"{sft} --workdir $SMALL/work")
                   + "cp -r $SMALL/work $OUT/after\n")
    _refused_clearly(tmp_path, "export", "small/bundle")
    _refused_clearly(tmp_path, "recommend", "small/recs.parquet")
    assert (tmp_path / "left.txt").read_text().split() == []  # no partial bundle or output file left
    _refused_clearly(tmp_path, "sft", "small/work")
    code, payload, err = _outcome(tmp_path, "sft_again")
    assert code == 0 and payload["metrics"]["steps"] == 3, err
    after = tmp_path / "after"
    assert (after / "sft" / "model" / "model.safetensors").is_file()
    for step in ("ingest", "embed", "quantize", "init-vocab"):  # what had finished is untouched
        assert (after / step / "step.json").read_bytes() == (work / step / "step.json").read_bytes()
