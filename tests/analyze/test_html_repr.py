"""``analyze.html_repr.diagnosis_html``: the notebook view of a diagnosis, every
text from the logs escaped (a run written by hand with a hostile stage name)."""

from __future__ import annotations

import html

from tlog.analyze import diagnose
from tlog.analyze.html_repr import diagnosis_html

from tests.support.runbuilder import RunBuilder, loop

STAGE = "<script>alert(1)</script>"


def test_the_view_shows_the_verdict_and_stage_and_escapes_names(build) -> None:
    b = RunBuilder("nb")
    # 30 iterations of 100 ms: 40 ms waiting for data, 60 ms forward
    loop(b, 30, [("next_batch", 0.04), ("forward", 0.06)], stage=STAGE)
    d = diagnose(build(b), "nb")
    page = diagnosis_html(d)
    assert page.startswith('<div class="tlog-diagnosis"') and page.endswith("</div>")
    assert "<script>" not in page and html.escape(STAGE) in page
    assert f"<b>{html.escape(d.verdict, quote=True)}</b>" in page
    assert "30 of 30 iterations steady" in page
    assert "no device times (sync is an upper bound)" in page
    # the stage's row: 1 worker, 10 it/s (three significant figures: "10"), the shares,
    # its top phase
    row = page[page.index("<tbody>"):page.index("</tbody>")]
    assert "<td>1</td>\n<td>10</td><td>-</td>" in row          # no tokens: "-"
    assert "<td>40%</td>" in row and "<td>60%</td>" in row
    assert "forward (60 ms/iter)" in row
    assert d._repr_html_() == page
