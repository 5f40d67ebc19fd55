"""Under ``CI=true`` a skipped test is a failed one, except the few below: a test that silently skips in CI tests
nothing there, and its name in a green run says otherwise (the disk-full and other-account tests skipped unseen).

A plugin (``tests/conftest.py`` loads it): each entry names the tests it covers (node id prefixes), the skip reason
they may give (a substring of it: a skip for any other reason still fails) and why that is acceptable in CI.
"""

from __future__ import annotations

import os

import pytest

ALLOWED_SKIPS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("tests/cli/test_disk_full.py::",), "unprivileged user+mount namespaces unavailable",
     "a small disk of its own needs a tmpfs in a private namespace, which some kernels and containers forbid to "
     "every account; .ci/run installs unshare (util-linux) and says when the machine still refuses it"),
    (("tests/cli/test_file_modes.py::", "tests/cli/test_cron_doc.py::", "tests/workspace/test_workspace.py::"),
     "only root can run a command as another account here",
     "another account (nobody) can be entered only by root: CI under an ordinary account cannot"),
    (("tests/cli/test_file_modes.py::", "tests/cli/test_cron_doc.py::", "tests/workspace/test_workspace.py::"),
     "the other account cannot run this interpreter or read the checkout",
     "a Python installed under a private home (pyenv in /root, 0700) cannot be run by nobody, whatever CI installs"),
)


def ci() -> bool:
    """Whether this is a CI run (``CI=true``, as .ci/run and the common CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def refusal(nodeid: str, reason: str) -> str | None:
    """Why a skip of ``nodeid`` with ``reason`` fails under CI (None: it is allowed)."""
    for prefixes, allowed_reason, _why in ALLOWED_SKIPS:
        if nodeid.startswith(prefixes) and allowed_reason in reason:
            return None
    return (f"skipped under CI=true ({reason}), and tests/helpers/skips.py ALLOWED_SKIPS does not allow it: make it "
            "run in CI (install what it needs in .ci/run) or add it there with the reason")


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip under CI outside :data:`ALLOWED_SKIPS` becomes a failure naming the reason and the fix."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and ci() and not hasattr(report, "wasxfail"):
        problem = refusal(report.nodeid, _reason(report))
        if problem is not None:
            report.outcome = "failed"
            report.longrepr = problem
