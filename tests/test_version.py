"""One version: CHANGELOG.md's newest released section, ``gencli.version.__version__`` (which pyproject.toml reads
into the wheel's metadata), the installed distribution's metadata and ``gencli --version`` all name the same one."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from click.testing import CliRunner

from gencli.cli import cli
from gencli.version import __version__

ROOT = Path(__file__).resolve().parents[1]
# Keep a Changelog: "## [Unreleased]" on top, then "## [X.Y.Z] - YYYY-MM-DD" per release, newest first
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+(?:[-+.\w]*)?)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def releases(changelog: str) -> list[tuple[str, str]]:
    """(version, date) of every released section, in the file's order."""
    return RELEASE.findall(changelog)


def test_release_headings_are_read_newest_first():
    text = "## [Unreleased]\n\n## [0.2.0] - 2027-01-02\n- x\n\n## [0.1.0] - 2026-12-05\n- y\n"
    assert releases(text) == [("0.2.0", "2027-01-02"), ("0.1.0", "2026-12-05")]
    assert releases("## [0.1.0]\n## [Unreleased]\n") == []  # a release without its date is not one


def test_the_newest_release_of_the_changelog_is_gencli_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    found = releases(text)
    assert found, "CHANGELOG.md has no released section (## [X.Y.Z] - YYYY-MM-DD)"
    assert text.index("## [Unreleased]") < text.index(f"## [{found[0][0]}]"), "[Unreleased] comes first"
    assert found[0][0] == __version__, f"CHANGELOG's newest release is {found[0][0]}, gencli says {__version__}"
    assert [d for _, d in found] == sorted((d for _, d in found), reverse=True)


def test_the_installed_metadata_and_gencli_version_agree():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.strip().endswith(f"version {__version__}"), result.output
    try:
        installed = metadata.version("gencli")
    except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH without pip install: nothing else to agree
        return
    assert installed == __version__, (f"the installed gencli's metadata says {installed}, gencli/version.py "
                                      f"{__version__}: reinstall (pip install -e .)")
