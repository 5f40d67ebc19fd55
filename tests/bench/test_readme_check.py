"""bench/readme_check.py, which CI runs after README's main job: it reads README's numbers from README itself (so a
re-measured README is what is checked), finds each in a workdir's records, and compares them at README's digits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def check(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import readme_check

    return readme_check


def test_it_reads_every_number_of_readmes_main_job_section(check):
    stated = check.parse((ROOT / "README.md").read_text(encoding="utf-8"))
    assert list(stated) == [name for names in check.NAMES for name in names] and len(stated) == 21
    assert stated["kernels"] == "portable"  # README's numbers hold on any x86-64 CPU only under portable kernels
    assert all(v.isdigit() for k, v in stated.items() if k.startswith("sft "))
    assert all(len(v) == 6 and v[1] == "." for k, v in stated.items() if not k.startswith(("sft ", "kernels")))


def test_the_numbers_follow_readme_and_changed_wording_is_an_error_naming_the_fix(check):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = check.parse(text)
    moved = text.replace(f"| gencli | {stated['served R@10']} |", "| gencli | 0.3001 |")
    assert check.parse(moved)["served R@10"] == "0.3001"
    with pytest.raises(ValueError, match="update SENTENCES"):
        check.parse(text.replace("| gencli |", "| gencli, served |"))


def _workdir(root: Path) -> Path:
    """A workdir's three records holding README's numbers as a run records them (unrounded floats)."""
    def blocks(exclude_seen: bool) -> dict:
        return {"exclude_seen": exclude_seen, "metrics": {
            "model_only": {"recall@10": 0.22625, "ndcg@10": 0.11956}, "content_baseline": {
                "recall@10": 0.19625, "ndcg@10": 0.096213}, "popularity_baseline": {"recall@10": 0.02375 + 1e-9,
                                                                                    "ndcg@10": 0.009252}}}
    ev = {**blocks(False), "served": {"recall@10": 0.27375 - 1e-9, "ndcg@10": 0.143078},
          "seen_ranked": {"recall@10": 0.27, "ndcg@10": 0.131073},
          "no_history": {"gencli": {"recall@10": 0.0275}, "popularity": {"recall@10": 0.0275}}}
    ev["other_policy"] = blocks(True)
    cold = {"exclude_seen": True, "metrics": {"model_only": {"recall@10": 0.0}, "content_baseline": {
        "recall@10": 0.26437}, "popularity_baseline": {"recall@10": 0.0}},
            "served": {"recall@10": 0.413793}, "seen_ranked": {"recall@10": 0.275862}}
    for step, name, data in (("eval", "metrics.json", ev), ("cold-eval", "metrics.json", cold),
                             ("sft", "step.json", {"metrics": {"epochs": 7.0, "steps": 854, "peak_step": 610},
                                                   "versions": {"math": "portable"}}),
                             ("quantize", "step.json", {"metrics": {"n_unique_sids": 241}, "versions": {
                                 "cpu": "Some CPU", "math": "portable", "aten_kernels": "AVX2", "torch_threads": 1,
                                 "blas_threads": 1}})):
        (root / step).mkdir(parents=True)
        (root / step / name).write_text(json.dumps(data))
    return root


MEASURED = ["portable", "7", "854", "610", "0.2737", "0.1431", "0.4138", "0.2700", "0.1311", "0.2759", "0.2263", "0.1196",
            "0.0000", "0.1963", "0.0962", "0.2644", "0.0238", "0.0093", "0.0000", "0.0275", "0.0275"]
PARAGRAPH = """The numbers below are measured with `gencli --threads 1 --math {} run sample_data/pipeline.toml`.

- **sft** trains to the plateau: patience stopped it at {} epochs, {} steps. Its best checkpoint (step {}) stays
  the model.

| ranking | Recall@10 | NDCG@10 | cold cohort Recall@10 |
| --- | ---: | ---: | ---: |
| gencli | {} | {} | {} |
| gencli, seen items ranked (the usual protocol) | {} | {} | {} |
| the model alone | {} | {} | {} |
| the content nearest-neighbour | {} | {} | {} |
| popularity | {} | {} | {} |

A visitor without history gets Recall@10 {} (popularity's is {}).
"""


def test_a_workdir_is_compared_at_readmes_digits_and_one_differing_number_fails(check, tmp_path):
    """README's numbers as measured on 2026-12-04 against a workdir recording those numbers unrounded."""
    work = _workdir(tmp_path / "work")
    readme = tmp_path / "README.md"
    readme.write_text(PARAGRAPH.format(*MEASURED))
    run = [sys.executable, str(ROOT / "bench" / "readme_check.py"), str(work), "--readme", str(readme)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "21 of 21 numbers as README states" in done.stdout, done.stdout
    assert done.stdout.startswith("workdir ran on: Some CPU, kernels portable (ATen AVX2), torch threads 1, BLAS "
                                  "threads 1; quantize drew 241 distinct SIDs\n"), done.stdout
    readme.write_text(PARAGRAPH.format(*MEASURED[:5], "0.1432", *MEASURED[6:]))  # one number re-measured
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout.rstrip().endswith("differ: served N@10"), done.stdout
    assert "| served N@10 | 0.1432 | 0.1431 | DIFFERS |" in done.stdout
    readme.write_text(PARAGRAPH.format("native", *MEASURED[1:]))  # README measured under the native kernels
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "| kernels | native | portable | DIFFERS |" in done.stdout, done.stdout
    gone = subprocess.run([*run[:2], str(tmp_path / "nothing"), "--readme", str(readme)], capture_output=True,
                          text=True, timeout=60)
    assert gone.returncode == 2 and "readme_check: FileNotFoundError" in gone.stderr
