"""The notebook view of a diagnosis: :func:`diagnosis_html` (``Diagnosis._repr_html_``).

A short HTML summary a notebook shows when a cell ends with a
:class:`~tlog.analyze.verdict.Diagnosis`: the verdict, the stages with their
throughput and category shares, the stragglers, the findings and the
what-if gains. Every text comes from logs (run ids, stage, phase and worker
names, finding messages that quote them) and is escaped by Jinja2's
autoescaping; no script, no style sheet beyond inline styles, nothing
fetched. Figures are written by :mod:`tlog.analyze.text`, as in the CLI.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from tlog.analyze.text import ms, pct, speedup

if TYPE_CHECKING:
    import jinja2
    from tlog.analyze.verdict import Diagnosis

_CATEGORIES = ("starvation", "backpressure", "compute", "sync", "unaccounted")

_TEMPLATE = """\
<div class="tlog-diagnosis" style="font-family: sans-serif; line-height: 1.35">
<p style="margin: 0 0 .4em 0"><b>{{ d.verdict }}</b></p>
<p style="margin: 0 0 .6em 0; color: #555">run <code>{{ d.run_id }}</code> &middot;
{{ d.iterations.steady }} of {{ d.iterations.total }} iterations steady &middot;
confidence {{ d.confidence }}{% if d.confidence_reasons %} ({{ d.confidence_reasons | join("; ") }}){% endif %}
&middot; {{ devices }}</p>
{% if d.stages %}<table style="border-collapse: collapse; margin-bottom: .6em">
<thead><tr><th style="text-align: left">stage</th><th>workers</th><th>it/s</th>
<th>tokens/s</th>{% for c in categories %}<th>{{ c }}</th>{% endfor %}<th style="text-align: left">top phase</th></tr></thead>
<tbody>{% for s in d.stages %}<tr{% if s.stage == limiting %} style="font-weight: bold"{% endif %}>
<td style="text-align: left">{{ s.stage }}</td><td>{{ s.workers }}</td>
<td>{{ rate(s.throughput.iters_per_s) }}</td><td>{{ rate(s.throughput.tokens_per_s) }}</td>
{% for c in categories %}<td>{{ pct(s.categories[c]) }}</td>{% endfor %}
<td style="text-align: left">{% if s.top_phases %}{{ s.top_phases[0].phase }} ({{ ms(s.top_phases[0].seconds_per_iter) }}/iter){% endif %}</td>
</tr>{% endfor %}</tbody></table>{% endif %}
{% if d.stragglers %}<p style="margin: .2em 0"><b>Stragglers</b></p><ul style="margin: 0">
{% for s in d.stragglers %}<li>{{ s.stage }} rank {{ s.rank }} ({{ s.worker }}): {{ s.kind }}{% if s.phase %} in {{ s.phase }}{% endif %}, {{ ms(s.own_s) }} vs {{ ms(s.peers_s) }} per iteration ({{ s.severity }})</li>
{% endfor %}</ul>{% endif %}
{% if d.findings %}<p style="margin: .2em 0"><b>Findings</b></p><ul style="margin: 0">
{% for f in d.findings %}<li><span style="color: {{ colour(f.severity) }}">{{ f.severity }}</span> {{ f.message }}</li>
{% endfor %}</ul>{% endif %}
{% if d.what_if %}<p style="margin: .2em 0"><b>What if (pipeline model)</b></p><ul style="margin: 0">
{% for w in d.what_if %}<li>remove {{ w.stage }}/{{ w.phase }} ({{ ms(w.seconds_per_iter) }}/iter): {{ speedup(w.throughput_gain) }} throughput; halve it: {{ speedup(w.throughput_gain_halved) }}</li>
{% endfor %}</ul>{% endif %}
</div>"""

_COLOURS = {"critical": "#b00020", "warning": "#a06000", "info": "#006080"}


@cache
def _template() -> jinja2.Template:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(_TEMPLATE)


def _rate(value: float | None) -> str:
    """A throughput cell: three significant figures, thousands separated; ``-`` when unknown."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def diagnosis_html(d: Diagnosis) -> str:
    """``d`` as an HTML fragment (module docstring); every text escaped.

    Returns:
        One ``<div class="tlog-diagnosis">`` element, as a string.
    """
    devices = ("device times recorded" if d.device_times else
               "host only (sync shares exact)" if d.host_only else
               "timer log, device-synchronised timers (sync shares exact)" if d.timers_synced else
               "no device times (sync is an upper bound)")
    context: dict[str, Any] = {
        "d": d, "devices": devices, "categories": _CATEGORIES,
        "limiting": d.bottleneck.stage if d.bottleneck is not None else None,
        "pct": pct, "ms": ms, "speedup": speedup, "rate": _rate,
        "colour": lambda severity: _COLOURS.get(str(severity), "#333"),
    }
    return _template().render(**context)
