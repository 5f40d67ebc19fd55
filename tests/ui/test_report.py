"""The report page's text is bounded and plain: a huge title is cut, and control characters (NUL, ESC) and
bidirectional overrides in any value never reach the HTML."""

from __future__ import annotations

from gencli.ui import report as page


def test_long_titles_are_cut_and_control_characters_never_reach_the_page():
    title = "\x00\x1b[31mred\u202eevil" + "t" * 1_000_000
    data = {"workdir": "/w\x1b]0;x\x07", "status": [], "problems": [{"file": "a\u2066b", "error": "e\x00"}],
            "training": [], "rankings": [], "blend": None, "probe": [],
            "examples": {"file": "recs.parquet", "k": 1, "users": [{"user_id": "u\u202e1", "history": [title] * 5,
                                                                      "items": [{"item_id": "i1", "title": title,
                                                                                 "score": 1.0}]}]}}
    text = page.render(data)
    assert len(text) < 50_000
    assert not page.CONTROL.search(text)
    assert "red\ufffdevil" in text and "\u2026" in text
