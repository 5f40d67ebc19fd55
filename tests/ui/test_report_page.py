"""The report in a real browser (Debian's headless chromium; .ci/run installs it): the screenshot holds every chart,
pixel for pixel at the size it was drawn, and the page asks the network for nothing (Chromium's own net log: no
http(s) request that a page started; a copy of the page with one remote image, and no CSP, shows the check sees one).
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

from gencli.cli import cli

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("chromium") is None,
                                                   reason="needs chromium (apt-get install chromium; .ci/run does)")]
WIDTH, HEIGHT = 1200, 2400
LEFT = (WIDTH - 1100) // 2  # the page's body: max-width 1100 px, centred


def browse(page, tmp_path, name: str) -> tuple[np.ndarray, list[str]]:
    """(the screenshot as an RGB array, the http(s) URLs the page itself requested) of ``page`` in chromium."""
    from matplotlib import image

    shot, netlog = tmp_path / f"{name}.png", tmp_path / f"{name}.netlog.json"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / name}",
                    f"--log-net-log={netlog}", f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    # the browser's own traffic (updates, accounts) has no origin; a page's requests carry the page's
    asked = [e["params"]["url"] for e in log["events"] if e["type"] == start and "url" in e.get("params", {})
             and e["params"].get("initiator") != "not an origin"]
    return image.imread(shot)[..., :3], [u for u in asked if re.match(r"https?://", u)]


def where(shot: np.ndarray, chart: np.ndarray) -> int | None:
    """The row at which ``chart`` appears whole in ``shot`` at the body's left edge, or None."""
    h, w = chart.shape[:2]
    band = shot[:, LEFT : LEFT + w]
    row = h // 2
    for y in np.nonzero(np.abs(band - chart[row]).max(axis=(1, 2)) < 0.02)[0]:
        top = y - row
        if top >= 0 and top + h <= shot.shape[0] and np.abs(band[top : top + h] - chart).mean() < 0.01:
            return int(top)
    return None


def test_the_report_renders_its_charts_and_fetches_nothing(trained_small, tmp_path):
    from matplotlib import image

    out = tmp_path / "report.html"
    r = CliRunner().invoke(cli, ["report", "--workdir", str(trained_small / "work"), "--output", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    charts = [image.imread(io.BytesIO(base64.b64decode(s)), format="png")[..., :3]
              for s in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]
    assert [c.shape[:2] for c in charts] == [(240, 960), (160, 800)]
    shot, asked = browse(out, tmp_path, "report")
    assert asked == []
    tops = [where(shot, c) for c in charts]
    assert None not in tops and tops == sorted(tops), tops  # each chart on screen, whole, in page order
    for chart, top in zip(charts, tops, strict=True):
        assert shot[top : top + chart.shape[0], LEFT : LEFT + chart.shape[1]].std() > 0.05  # not blank

    canary = tmp_path / "canary.html"  # the check can fail: a remote image, the CSP removed
    canary.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page).replace(
        "<h1>", '<img src="http://127.0.0.1:9/canary.png"><h1>', 1), encoding="utf-8")
    assert browse(canary, tmp_path, "canary")[1] == ["http://127.0.0.1:9/canary.png"]
