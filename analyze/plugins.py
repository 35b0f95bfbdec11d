"""Which rule plugins are installed, without loading them (standard library only).

:data:`RULES_GROUP` names the entry-point group plugin distributions declare
their rules under; :func:`rule_set_key` fingerprints what is installed there,
so that the stored diagnosis (``tlog.analyze.persist``) is recomputed when a
plugin is installed, upgraded or removed. Loading the rules is
``tlog.analyze.rules.plugin_rules``'s (it imports polars; this module must not,
so that ``tlog runs`` on fresh rows stays light).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

#: The entry-point group a distribution declares its rules under
#: (``[project.entry-points."tlog.rules"]``: a name = ``module:RuleClass``).
RULES_GROUP = "tlog.rules"


@cache
def rule_set_key() -> str:
    """The installed rule plugins as one text: ``name=value@dist==version``
    per entry point of :data:`RULES_GROUP`, sorted by name, ``;``-separated;
    ``""`` when none is installed. Read once per process, like
    ``plugin_rules`` (so the key always describes the rules diagnose ran)."""
    parts = []
    for ep in sorted(entry_points(group=RULES_GROUP), key=lambda e: (e.name, e.value)):
        dist = getattr(ep, "dist", None)
        where = f"{dist.metadata['Name']}=={dist.version}" if dist is not None else "?"
        parts.append(f"{ep.name}={ep.value}@{where}")
    return ";".join(parts)
