"""Chart builders: polars frames in, Altair charts out (usable in Jupyter).

Every builder takes a frame with the documented columns (extra columns are
ignored), aggregates it for display and returns an Altair chart; none reads
the database or computes attribution: the seconds per category and per phase
come from :mod:`analyze` (see :mod:`reports.data`). Durations come in as
seconds and are drawn in milliseconds.

Display aggregation keeps pages small: a run of 1M iterations becomes at most
:data:`DEFAULT_BINS` points per stage (DESIGN.md, "Budgets": reports
aggregate, never embed a point per iteration past a few thousand). Each bin
keeps the mean of each category and, beside it, the 95th percentile and the
maximum iteration time, so a 3 s stall every fourth iteration stays visible
after averaging.

>>> import polars as pl
>>> iters = pl.DataFrame({"stage": ["drafter"] * 4, "rank": [0] * 4, "iter": [0, 1, 2, 3],
...     "dur": [0.1, 0.1, 0.4, 0.1], "starvation_s": [0.0, 0.0, 0.3, 0.0],
...     "backpressure_s": [0.0] * 4, "compute_s": [0.1] * 4, "sync_s": [0.0] * 4,
...     "unaccounted_s": [0.0] * 4})
>>> chart = timeline_chart(iters, bins=2)   # an altair.VConcatChart
>>> bin_iterations(iters, bins=2)["dur_max_s"].to_list()
[0.1, 0.4]
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import polars as pl

from dflash_runtime.format import CATEGORIES

#: Bins per stage in the iteration timeline and per queue in the queue chart.
#: Source: DESIGN.md "Budgets" (no point per iteration past a few thousand);
#: 300 bins keep each chart near 1,500 values and fill an 860-pixel-wide plot
#: at about 3 pixels per bin.
DEFAULT_BINS = 300

#: At most this many events are drawn (the longest first); the rest are counted in the title.
MAX_EVENTS = 200

#: Events are labelled with their name on the chart only up to this many
#: (more labels overlap); past it, names are in the tooltips and the title.
MAX_EVENT_LABELS = 12

#: At most this many phases per stage in the rank x phase heatmap (largest first).
MAX_HEATMAP_PHASES = 25

#: Most cells per stage in the heatmap and most points in the queue chart: with
#: many ranks (or queues) there are fewer phases (bins) each, never under
#: :data:`MIN_HEATMAP_PHASES` phases or :data:`MIN_QUEUE_BINS` bins. Source:
#: DESIGN.md "Budgets" (a few thousand points per chart at most).
MAX_CHART_POINTS = 4000
MIN_HEATMAP_PHASES = 3
MIN_QUEUE_BINS = 20

#: At most this many phase contributions in the comparison chart (largest |change| first).
MAX_CONTRIBUTORS = 20

#: Category colours (Tableau 10, the Vega default palette): waiting reads warm, work cool.
CATEGORY_COLORS: dict[str, str] = {
    "starvation": "#e45756",
    "backpressure": "#f58518",
    "compute": "#4c78a8",
    "sync": "#b279a2",
    "unaccounted": "#9d9d9d",
}

#: Columns of a per-iteration attribution frame: ``<category>_s`` for each category.
CATEGORY_COLUMNS: tuple[str, ...] = tuple(f"{c}_s" for c in CATEGORIES)

#: When left-out bins (warm-up, events) reach more than this many times the
#: slowest steady bin, the timeline's y axis stops just above the steady bins
#: and the left-out peaks are cut (the title says so): a 6 s warm-up
#: iteration would otherwise flatten the steady state the verdict is about.
LEFT_OUT_CLIP_FACTOR = 2.0

#: Plot width in pixels (fits the report's 1,200-pixel column with its legend).
WIDTH = 860

_MS = 1000.0


def _category_scale() -> alt.Scale:
    return alt.Scale(domain=list(CATEGORIES), range=[CATEGORY_COLORS[c] for c in CATEGORIES])


def spec(chart: alt.TopLevelMixin) -> dict:
    """The Vega-Lite specification of ``chart`` (``chart.to_dict()``) without
    Altair's 5,000-row guard: the builders bound their data themselves
    (:data:`DEFAULT_BINS`, :data:`MAX_CHART_POINTS`), and an extreme run (thousands
    of ranks) should give a large chart, not an error."""
    with alt.data_transformers.disable_max_rows():
        return chart.to_dict()


def _require(frame: pl.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        msg = f"{what}: the frame lacks the column(s) {', '.join(missing)}"
        raise ValueError(msg)
    if frame.height == 0:
        msg = f"{what}: the frame is empty"
        raise ValueError(msg)


def _round(frame: pl.DataFrame, digits: int = 4) -> pl.DataFrame:
    """Round float columns (display only: keeps the embedded JSON small)."""
    return frame.with_columns(pl.col(pl.Float64, pl.Float32).round(digits))


def _stages(frame: pl.DataFrame) -> list[str]:
    return frame.get_column("stage").unique(maintain_order=True).to_list()


#: Column holding each row's position in the drawing order (:func:`_by_position`).
POSITION = "_pos"


def _by_position(frame: pl.DataFrame, column: str, order: Sequence[str]) -> pl.DataFrame:
    """``frame`` with :data:`POSITION`: the index in ``order`` of each row's
    ``column`` value (its first occurrence; rows whose value is not in
    ``order`` get ``len(order)``).

    Axes are ordered by this integer column (:func:`_position_sort`), never by
    a list of names: Vega-Lite compiles a list sort into a Vega expression
    (``indexof([...], datum.phase)``) whose string literals Vega's expression
    parser rejects when a name holds U+2028 or U+2029 (JSON leaves them
    unescaped, JavaScript's grammar calls them line terminators), which broke
    the chart in the browser and in ``--png``/``--svg``. With an
    integer field no name from a log ever enters an expression.
    """
    first: dict[str, int] = {}
    for i, value in enumerate(order):
        first.setdefault(value, i)
    pos = pl.Series(POSITION, [first.get(v, len(order)) for v in frame.get_column(column)],
                    dtype=pl.Int64)
    return frame.with_columns(pos)


def _position_sort() -> alt.EncodingSortField:
    """Sort a nominal axis by :data:`POSITION` (see :func:`_by_position`)."""
    return alt.EncodingSortField(field=POSITION, op="min", order="ascending")


# --------------------------------------------------------------------------- timeline


def bin_iterations(iters: pl.DataFrame, *, bins: int = DEFAULT_BINS) -> pl.DataFrame:
    """Aggregate per-iteration seconds into at most ``bins`` bins of iterations per stage.

    Args:
        iters: one row per worker and iteration, columns ``stage`` (str),
            ``iter`` (int), ``dur`` (s), ``starvation_s``, ``backpressure_s``,
            ``compute_s``, ``sync_s``, ``unaccounted_s`` (s, attributed by
            :mod:`analyze`) and optionally ``steady`` (bool: counted in the
            verdict; ``False`` for warm-up and event-overlapping iterations).
        bins: most bins per stage; a stage with fewer iterations gets one bin
            per iteration.

    Returns:
        One row per stage and bin, in stage order of first appearance:
        ``stage``, ``bin``, ``iter_start``, ``iter_end`` (inclusive),
        ``iterations`` (worker-iterations in the bin), ``dur_mean_s``,
        ``dur_p95_s``, ``dur_max_s``, the mean of each ``<category>_s``, and
        ``left_out`` (share of the bin's iterations not steady; 0 without a
        ``steady`` column).

    Raises:
        ValueError: a required column is missing, the frame is empty, or ``bins < 1``.
    """
    _require(iters, ["stage", "iter", "dur", *CATEGORY_COLUMNS], "bin_iterations")
    if bins < 1:
        msg = f"bins must be at least 1, not {bins}"
        raise ValueError(msg)
    steady = pl.col("steady").cast(pl.Float64) if "steady" in iters.columns else pl.lit(1.0)
    order = pl.DataFrame({"stage": _stages(iters)}).with_row_index("_order")
    spans = (
        iters.group_by("stage")
        .agg(pl.col("iter").min().alias("_lo"), pl.col("iter").max().alias("_hi"))
        .with_columns(
            ((pl.col("_hi") - pl.col("_lo") + 1 + bins - 1) // bins)
            .clip(lower_bound=1)
            .alias("_width")
        )
    )
    return (
        iters.lazy()
        .join(spans.lazy(), on="stage")
        .with_columns(((pl.col("iter") - pl.col("_lo")) // pl.col("_width")).alias("bin"))
        .group_by("stage", "bin")
        .agg(
            (pl.col("_lo").first() + pl.col("bin").first() * pl.col("_width").first()).alias(
                "iter_start"
            ),
            pl.min_horizontal(
                pl.col("_lo").first() + (pl.col("bin").first() + 1) * pl.col("_width").first() - 1,
                pl.col("_hi").first(),
            ).alias("iter_end"),
            pl.len().alias("iterations"),
            pl.col("dur").mean().alias("dur_mean_s"),
            pl.col("dur").quantile(0.95, interpolation="linear").alias("dur_p95_s"),
            pl.col("dur").max().alias("dur_max_s"),
            *[pl.col(c).mean() for c in CATEGORY_COLUMNS],
            (1.0 - steady.mean()).alias("left_out"),
        )
        .join(order.lazy(), on="stage")
        .sort("_order", "bin")
        .drop("_order")
        .collect()
    )


def _left_out_spans(binned: pl.DataFrame) -> pl.DataFrame:
    """Contiguous runs of bins where most iterations were left out of the verdict."""
    marked = binned.select("iter_start", "iter_end", (pl.col("left_out") >= 0.5).alias("out"))
    spans: list[tuple[int, int]] = []
    for start, end, out in marked.iter_rows():
        if not out:
            continue
        if spans and spans[-1][1] + 1 >= start:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return pl.DataFrame(
        {"from": [s for s, _ in spans], "to": [e + 1 for _, e in spans]},
        schema={"from": pl.Int64, "to": pl.Int64},
    )


def timeline_chart(
    iters: pl.DataFrame, *, bins: int = DEFAULT_BINS, height: int = 170
) -> alt.VConcatChart:
    """Time per iteration over the run, stacked by category, one panel per stage.

    The stacked area is the mean milliseconds per iteration of each category
    in each bin (so its top is the mean iteration time); the dashed and dotted
    lines are the bin's 95th percentile and maximum iteration time, which keep
    stalls visible. Bins where most iterations were left out of the verdict
    (warm-up, events) are shaded grey; when their peaks exceed
    :data:`LEFT_OUT_CLIP_FACTOR` times the slowest steady bin, they are cut at
    the top of the axis and the panel's title says so.

    Args:
        iters: see :func:`bin_iterations`.
        bins: most bins per stage.
        height: pixels per stage panel.
    """
    binned = bin_iterations(iters, bins=bins)
    panels = []
    for stage in _stages(binned):
        part = binned.filter(pl.col("stage") == stage)
        per_bin = int(part["iter_end"][0] - part["iter_start"][0] + 1)
        data = _round(
            part.select(
                "iter_start",
                "iter_end",
                "iterations",
                *[(pl.col(c) * _MS).alias(c.removesuffix("_s")) for c in CATEGORY_COLUMNS],
                (pl.col("dur_mean_s") * _MS).alias("mean_ms"),
                (pl.col("dur_p95_s") * _MS).alias("p95_ms"),
                (pl.col("dur_max_s") * _MS).alias("max_ms"),
            )
        )
        # Steps: each bin is drawn flat from its first iteration to the next
        # bin's; a closing point after the last bin gives that bin its width.
        closing = data.tail(1).with_columns(iter_start=pl.col("iter_end") + 1)
        data = pl.concat([data, closing])
        x = alt.X("iter_start:Q", title="iteration", scale=alt.Scale(nice=False, zero=False))
        steady_max = part.filter(pl.col("left_out") < 0.5)["dur_max_s"].max()
        all_max = part["dur_max_s"].max()
        cut = (
            steady_max is not None
            and steady_max > 0
            and all_max > LEFT_OUT_CLIP_FACTOR * steady_max
        )
        y_scale = alt.Scale(domain=[0, round(steady_max * _MS * 1.1, 3)]) if cut else alt.Undefined
        tooltip = [
            alt.Tooltip("iter_start:Q", title="from iteration"),
            alt.Tooltip("iter_end:Q", title="to iteration"),
            alt.Tooltip("iterations:Q", title="worker-iterations"),
            alt.Tooltip("mean_ms:Q", title="mean ms", format=".2f"),
            alt.Tooltip("p95_ms:Q", title="p95 ms", format=".2f"),
            alt.Tooltip("max_ms:Q", title="max ms", format=".2f"),
        ]
        area = (
            alt.Chart(data)
            .transform_fold(list(CATEGORIES), as_=["category", "ms"])
            .transform_calculate(order=f"indexof({list(CATEGORIES)!r}, datum.category)")
            .mark_area(interpolate="step-after", clip=True)
            .encode(
                x=x,
                y=alt.Y("ms:Q", stack="zero", title="ms per iteration", scale=y_scale),
                color=alt.Color(
                    "category:N", scale=_category_scale(), sort=list(CATEGORIES), title="category"
                ),
                order=alt.Order("order:Q"),
                tooltip=[
                    alt.Tooltip("category:N"),
                    alt.Tooltip("ms:Q", title="mean ms", format=".2f"),
                    *tooltip,
                ],
            )
        )
        stats = (
            alt.Chart(data)
            .transform_fold(["p95_ms", "max_ms"], as_=["statistic", "ms"])
            .transform_calculate(
                label="datum.statistic == 'p95_ms' ? 'p95 iteration' : 'max iteration'"
            )
            .mark_line(color="#222", strokeWidth=1, interpolate="step-after", clip=True)
            .encode(
                x=x,
                y=alt.Y("ms:Q"),
                strokeDash=alt.StrokeDash(
                    "label:N",
                    title="per bin",
                    scale=alt.Scale(
                        domain=["p95 iteration", "max iteration"], range=[[5, 3], [1, 2]]
                    ),
                ),
                tooltip=tooltip,
            )
        )
        layers: list[alt.Chart] = [area, stats]
        spans = _left_out_spans(part)
        if spans.height:
            # On top, translucent: the grey must show over the stacked area.
            layers.append(
                alt.Chart(spans)
                .mark_rect(color="#888", opacity=0.3)
                .encode(
                    x="from:Q",
                    x2="to:Q",
                    tooltip=[
                        alt.Tooltip("from:Q", title="left out of the verdict from iteration"),
                        alt.Tooltip("to:Q", title="up to (excluded)"),
                    ],
                )
            )
        title = f"{stage}: {per_bin} iteration{'s' if per_bin > 1 else ''} per bin"
        if cut:
            title += f"; left-out peaks up to {all_max * _MS:,.0f} ms cut at the top"
        panels.append(alt.layer(*layers).properties(width=WIDTH, height=height, title=title))
    return alt.vconcat(*panels).resolve_scale(color="shared", strokeDash="shared")


# --------------------------------------------------------------------------- system

#: Rows of the system panel: (name, title, frame column, factor to the unit drawn).
#: ``device memory`` reads ``cuda_allocated`` (torch's allocator) where a stage has
#: it, else ``gpu_mem_used`` (NVML, every process on the device).
SYSTEM_METRICS: tuple[tuple[str, str, str, float], ...] = (
    ("cpu", "process CPU, % of one core", "cpu_pct", 1.0),
    ("rss", "resident memory (RSS), MiB", "rss_bytes", 1.0 / (1 << 20)),
    ("gpu_util", "GPU utilisation, %", "gpu_util", 1.0),
    ("device_memory", "device memory, MiB", "cuda_allocated", 1.0 / (1 << 20)),
)


def bin_system(system: pl.DataFrame, iters: pl.DataFrame, *,
               bins: int = DEFAULT_BINS) -> pl.DataFrame:
    """Aggregate system samples into the timeline's bins of iterations, per stage.

    Args:
        system: one row per sample: ``stage``, ``iter`` (the last iteration its
            worker started; null rows are left out), and the columns of
            :data:`SYSTEM_METRICS` (null: not measured), plus ``gpu_mem_used``.
        iters: the timeline's frame (:func:`bin_iterations`): its ``stage`` and
            ``iter`` give each stage's first and last iteration, so a sample
            falls in the same bin as the iterations around it.
        bins: most bins per stage (as for the timeline).

    Returns:
        ``stage, metric, bin, iter_start, iter_end, mean, low, high, samples``:
        the mean, least and largest value (in the unit drawn) of the samples of
        every worker of the stage in the bin; metrics with no sample are left out.
    """
    _require(system, ["stage", "iter", *(m[2] for m in SYSTEM_METRICS), "gpu_mem_used"],
             "bin_system")
    _require(iters, ["stage", "iter"], "bin_system")
    spans = (
        iters.group_by("stage")
        .agg(pl.col("iter").min().alias("_lo"), pl.col("iter").max().alias("_hi"))
        .with_columns(
            ((pl.col("_hi") - pl.col("_lo") + 1 + bins - 1) // bins).clip(lower_bound=1)
            .alias("_width"))
    )
    has_cuda = system.group_by("stage").agg(
        pl.col("cuda_allocated").is_not_null().any().alias("_cuda"))
    frame = (
        system.filter(pl.col("iter").is_not_null())
        .join(spans, on="stage")
        .join(has_cuda, on="stage")
        .with_columns(
            ((pl.col("iter").clip(pl.col("_lo"), pl.col("_hi")) - pl.col("_lo"))
             // pl.col("_width")).alias("bin"),
            pl.when(pl.col("_cuda")).then(pl.col("cuda_allocated"))
            .otherwise(pl.col("gpu_mem_used")).alias("cuda_allocated"))
    )
    parts = []
    for name, _, column, factor in SYSTEM_METRICS:
        value = (pl.col(column).cast(pl.Float64) * factor).alias("_v")
        parts.append(
            frame.select("stage", "bin", "_lo", "_hi", "_width", value)
            .filter(pl.col("_v").is_not_null())
            .group_by("stage", "bin")
            .agg(
                (pl.col("_lo").first() + pl.col("bin").first() * pl.col("_width").first())
                .alias("iter_start"),
                pl.min_horizontal(
                    pl.col("_lo").first()
                    + (pl.col("bin").first() + 1) * pl.col("_width").first() - 1,
                    pl.col("_hi").first()).alias("iter_end"),
                pl.col("_v").mean().alias("mean"),
                pl.col("_v").min().alias("low"),
                pl.col("_v").max().alias("high"),
                pl.len().alias("samples"),
            )
            .with_columns(pl.lit(name).alias("metric"))
        )
    schema = {"stage": pl.String, "metric": pl.String, "bin": pl.Int64, "iter_start": pl.Int64,
              "iter_end": pl.Int64, "mean": pl.Float64, "low": pl.Float64,
              "high": pl.Float64, "samples": pl.UInt32}
    if not parts:
        return pl.DataFrame(schema=schema)
    order = {name: k for k, (name, *_rest) in enumerate(SYSTEM_METRICS)}
    out = pl.concat([p.select(list(schema)).cast(schema) for p in parts])  # type: ignore[arg-type]
    return out.sort(pl.col("stage"), pl.col("metric").replace_strict(order), pl.col("bin"))


def system_chart(system: pl.DataFrame, iters: pl.DataFrame, *, bins: int = DEFAULT_BINS,
                 height: int = 80) -> alt.VConcatChart:
    """The system panel: CPU, RSS, GPU utilisation and device memory against the
    iteration timeline, one row per measured metric, per stage.

    The x axis is the timeline's (:func:`timeline_chart`): iteration, from the
    stage's first to one past its last, same width, so a rise in memory or a
    drop in CPU lines up with the iterations it happened in. Line: the mean of
    the stage's workers' samples in each bin; band: their least to largest. On
    the CPU row a dashed rule marks the cores the process may use (``ncpu`` x
    100%): CPU use near it means the process has no more to get.

    Args:
        system: see :func:`bin_system` (and ``ncpu``).
        iters: the timeline's frame.
        bins: most bins per stage.
        height: pixels per metric row.

    Raises:
        ValueError: a required column is missing.
    """
    binned = bin_system(system, iters, bins=bins)
    titles = {name: title for name, title, *_ in SYSTEM_METRICS}
    spans = iters.group_by("stage").agg(pl.col("iter").min().alias("lo"),
                                        pl.col("iter").max().alias("hi"))
    panels = []
    for stage in _stages(iters):
        part = binned.filter(pl.col("stage") == stage)
        if part.height == 0:
            continue
        lo, hi = spans.filter(pl.col("stage") == stage).row(0)[1:]
        x = alt.X("iter_start:Q", title="iteration",
                  scale=alt.Scale(domain=[int(lo), int(hi) + 1], nice=False, zero=False))
        for name in part["metric"].unique(maintain_order=True).to_list():
            rows = part.filter(pl.col("metric") == name)
            data = _round(rows.select("iter_start", "iter_end", "mean", "low", "high",
                                      "samples"), 3)
            data = pl.concat([data, data.tail(1).with_columns(
                iter_start=pl.col("iter_end") + 1)])
            tip = [alt.Tooltip("iter_start:Q", title="from iteration"),
                   alt.Tooltip("iter_end:Q", title="to iteration"),
                   alt.Tooltip("mean:Q", format=",.1f"), alt.Tooltip("low:Q", format=",.1f"),
                   alt.Tooltip("high:Q", format=",.1f"), alt.Tooltip("samples:Q")]
            layers: list[alt.Chart] = [
                alt.Chart(data).mark_area(opacity=0.25, interpolate="step-after",
                                          color="#4c78a8")
                .encode(x=x, y=alt.Y("low:Q", title=None), y2="high:Q"),
                alt.Chart(data).mark_line(interpolate="step-after", color="#4c78a8")
                .encode(x=x, y="mean:Q", tooltip=tip),
            ]
            if name == "cpu":
                cores = system.filter(pl.col("stage") == stage)["ncpu"].max()
                if cores is not None:
                    layers.append(
                        alt.Chart(pl.DataFrame({"cap": [float(cores) * 100.0]}))
                        .mark_rule(strokeDash=[6, 4], color="#555")
                        .encode(y="cap:Q", tooltip=[alt.Tooltip(
                            "cap:Q", title="cores the process may use x 100%")]))
            panels.append(alt.layer(*layers).properties(
                width=WIDTH, height=height, title=f"{stage}: {titles[name]}"))
    return alt.vconcat(*panels)


# --------------------------------------------------------------------------- shares


def category_share_chart(shares: pl.DataFrame) -> alt.Chart:
    """Share of wall time by category, one bar per stage and per rank.

    Args:
        shares: columns ``stage`` (str), ``rank`` (int, null for the whole
            stage), ``category`` (one of :data:`dflash_runtime.format.CATEGORIES`),
            ``share`` (0..1 of that row's wall time). Rows keep their order: a
            stage's own bar, then its ranks.
    """
    _require(shares, ["stage", "rank", "category", "share"], "category_share_chart")
    data = shares.with_columns(
        pl.when(pl.col("rank").is_null())
        .then(pl.col("stage") + " (all ranks)")
        .otherwise(pl.col("stage") + " · rank " + pl.col("rank").cast(pl.String))
        .alias("row"),
        pl.col("category").map_elements(CATEGORIES.index, return_dtype=pl.Int64).alias("order"),
    ).select("row", "stage", "rank", "category", "order", pl.col("share").round(4))
    rows = data.get_column("row").unique(maintain_order=True).to_list()
    data = _by_position(data, "row", rows)
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=alt.Y("row:N", sort=_position_sort(), title=None, axis=alt.Axis(labelLimit=260)),
            x=alt.X(
                "share:Q", stack="normalize", title="share of wall time", axis=alt.Axis(format="%")
            ),
            color=alt.Color(
                "category:N", scale=_category_scale(), sort=list(CATEGORIES), title="category"
            ),
            order=alt.Order("order:Q"),
            tooltip=["stage:N", "rank:O", "category:N", alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(width=WIDTH - 160, height=alt.Step(22))
    )


def rank_phase_heatmap(
    phases: pl.DataFrame, *, max_phases: int = MAX_HEATMAP_PHASES
) -> alt.VConcatChart:
    """Rank x phase heatmap per stage: mean milliseconds per iteration, coloured
    by the ratio to the median rank of the stage, so a straggler's row stands out.

    Args:
        phases: one row per stage, rank and phase: ``stage``, ``rank`` (int),
            ``phase`` (str), ``seconds_per_iter`` (s, the rank's mean per iteration).
        max_phases: most phases per stage (largest total time first); fewer
            when ranks x phases would pass :data:`MAX_CHART_POINTS`.
    """
    _require(phases, ["stage", "rank", "phase", "seconds_per_iter"], "rank_phase_heatmap")
    panels = []
    for stage in _stages(phases):
        part = phases.filter(pl.col("stage") == stage)
        n_ranks = part.get_column("rank").n_unique()
        keep = min(max_phases, max(MIN_HEATMAP_PHASES, MAX_CHART_POINTS // n_ranks))
        ranked = (
            part.group_by("phase")
            .agg(pl.col("seconds_per_iter").sum().alias("_t"))
            .sort("_t", "phase", descending=[True, False])
            .head(keep)
        )
        order = ranked.get_column("phase").to_list()
        data = _by_position(
            _round(
                part.filter(pl.col("phase").is_in(order)).select(
                    "rank", "phase", (pl.col("seconds_per_iter") * _MS).alias("ms")
                )
            ),
            "phase",
            order,
        )
        base = (
            alt.Chart(data)
            .transform_joinaggregate(median_ms="median(ms)", groupby=["phase"])
            .transform_calculate(ratio="datum.median_ms > 0 ? datum.ms / datum.median_ms : 1")
            .encode(
                x=alt.X(
                    "phase:N",
                    sort=_position_sort(),
                    title=None,
                    axis=alt.Axis(labelAngle=-35, labelLimit=160),
                ),
                y=alt.Y("rank:O", title="rank"),
            )
        )
        cells = base.mark_rect().encode(
            color=alt.Color(
                "ratio:Q",
                title="x median rank",
                scale=alt.Scale(scheme="blueorange", domain=[0.5, 1.0, 1.5], clamp=True),
            ),
            tooltip=[
                alt.Tooltip("phase:N"),
                alt.Tooltip("rank:O"),
                alt.Tooltip("ms:Q", title="ms per iteration", format=".2f"),
                alt.Tooltip("ratio:Q", title="x median rank", format=".2f"),
            ],
        )
        labels = base.mark_text(fontSize=10).encode(
            text=alt.Text("ms:Q", format=".1f"),
            color=alt.condition(
                "abs(datum.ratio - 1) > 0.3", alt.value("white"), alt.value("#222")
            ),
        )
        panels.append(
            alt.layer(cells, labels).properties(
                title=f"{stage}: ms per iteration by rank",
                width=alt.Step(max(28, 640 // max(1, len(order)))),
                height=alt.Step(20),
            )
        )
    return alt.vconcat(*panels).resolve_scale(color="shared")


# --------------------------------------------------------------------------- queues


def bin_queue(queue: pl.DataFrame, *, t0: float, bins: int = DEFAULT_BINS) -> pl.DataFrame:
    """Aggregate queue depth samples into at most ``bins`` time bins per queue.

    Args:
        queue: ``name`` (str), ``ts`` (epoch s), ``depth`` (int), ``capacity``
            (int or null).
        t0: the run's start (epoch s); times become seconds since it.
        bins: most bins per queue.

    Returns:
        ``name``, ``t_s`` (bin start, s since ``t0``), ``t_end_s``,
        ``samples``, ``depth_mean``, ``depth_min``, ``depth_max``, ``capacity``
        (the largest capacity seen in the bin), ordered by name and time.
    """
    _require(queue, ["name", "ts", "depth", "capacity"], "bin_queue")
    span = float(queue["ts"].max() - queue["ts"].min())
    width = span / bins if span > 0 else 1.0
    lo = float(queue["ts"].min())
    return (
        queue.lazy()
        .with_columns(
            ((pl.col("ts") - lo) // width).cast(pl.Int64).clip(upper_bound=bins - 1).alias("_bin")
        )
        .group_by("name", "_bin")
        .agg(
            pl.len().alias("samples"),
            pl.col("depth").mean().alias("depth_mean"),
            pl.col("depth").min().alias("depth_min"),
            pl.col("depth").max().alias("depth_max"),
            pl.col("capacity").max().alias("capacity"),
        )
        .with_columns(
            (lo - t0 + pl.col("_bin") * width).alias("t_s"),
            (lo - t0 + (pl.col("_bin") + 1) * width).alias("t_end_s"),
        )
        .sort("name", "_bin")
        .select(
            "name", "t_s", "t_end_s", "samples", "depth_mean", "depth_min", "depth_max", "capacity"
        )
        .collect()
    )


def _events_frame(events: pl.DataFrame | None, t0: float) -> tuple[pl.DataFrame, int]:
    """Distinct events (several ranks log the same checkpoint), longest first, capped."""
    schema = {"name": pl.String, "t_s": pl.Float64, "t_end_s": pl.Float64, "dur_s": pl.Float64}
    if events is None or events.height == 0:
        return pl.DataFrame(schema=schema), 0
    _require(events, ["name", "ts", "dur"], "events")
    distinct = (
        events.select("name", pl.col("ts").round(1).alias("_ts"), "ts", "dur")
        .group_by("name", "_ts")
        .agg(pl.col("ts").min(), pl.col("dur").max())
    )
    total = distinct.height
    kept = distinct.sort("dur", "ts", descending=[True, False]).head(MAX_EVENTS).sort("ts")
    frame = _round(
        kept.select(
            "name",
            (pl.col("ts") - t0).alias("t_s"),
            (pl.col("ts") + pl.col("dur") - t0).alias("t_end_s"),
            pl.col("dur").alias("dur_s"),
        ),
        3,
    )
    return frame, total


def queue_chart(
    queue: pl.DataFrame,
    events: pl.DataFrame | None = None,
    *,
    t0: float | None = None,
    bins: int = DEFAULT_BINS,
    height: int = 220,
) -> alt.LayerChart:
    """Queue depth over time with events marked.

    Per queue: the band spans the minimum and maximum depth in each time bin
    and the line is the mean; the dashed line is the capacity. Events
    (checkpoints, warm-up end, evaluation) are grey bands over their duration
    with a rule at their start and, up to :data:`MAX_EVENT_LABELS` of them,
    their name.

    Args:
        queue: see :func:`bin_queue`.
        events: ``name`` (str), ``ts`` (epoch s), ``dur`` (s); optional. At
            most :data:`MAX_EVENTS` are drawn (the longest).
        t0: the run's start (epoch s); default the first sample or event.
        bins: most time bins per queue; fewer with many queues, so that the
            chart stays under :data:`MAX_CHART_POINTS` points.
        height: plot height in pixels.
    """
    _require(queue, ["name", "ts", "depth", "capacity"], "queue_chart")
    n_queues = queue.get_column("name").n_unique()
    bins = max(MIN_QUEUE_BINS, min(bins, MAX_CHART_POINTS // n_queues))
    if t0 is None:
        starts = [float(queue["ts"].min())]
        if events is not None and events.height:
            starts.append(float(events["ts"].min()))
        t0 = min(starts)
    binned = _round(bin_queue(queue, t0=t0, bins=bins), 3)
    x = alt.X("t_s:Q", title="seconds since run start")
    band = (
        alt.Chart(binned)
        .mark_area(opacity=0.25)
        .encode(
            x=x,
            y=alt.Y("depth_min:Q", title="queue depth (items)"),
            y2="depth_max:Q",
            color=alt.Color("name:N", title="queue"),
        )
    )
    line = (
        alt.Chart(binned)
        .mark_line()
        .encode(
            x=x,
            y="depth_mean:Q",
            color="name:N",
            tooltip=[
                alt.Tooltip("name:N", title="queue"),
                alt.Tooltip("t_s:Q", title="from s", format=".1f"),
                alt.Tooltip("t_end_s:Q", title="to s", format=".1f"),
                alt.Tooltip("depth_mean:Q", title="mean depth", format=".2f"),
                "depth_min:Q",
                "depth_max:Q",
                "capacity:Q",
                "samples:Q",
            ],
        )
    )
    layers: list[alt.Chart] = [band, line]
    caps = (
        binned.filter(pl.col("capacity").is_not_null())
        .group_by("name")
        .agg(pl.col("capacity").max())
    )
    if caps.height:
        layers.append(
            alt.Chart(caps)
            .mark_rule(strokeDash=[6, 4])
            .encode(y="capacity:Q", color="name:N", tooltip=["name:N", "capacity:Q"])
        )
    ev, total = _events_frame(events, t0)
    title = "queue depth"
    if ev.height:
        tip = [
            alt.Tooltip("name:N", title="event"),
            alt.Tooltip("t_s:Q", title="at s", format=".1f"),
            alt.Tooltip("dur_s:Q", title="lasting s", format=".2f"),
        ]
        layers += [
            alt.Chart(ev)
            .mark_rect(color="#888", opacity=0.18)
            .encode(x="t_s:Q", x2="t_end_s:Q", tooltip=tip),
            alt.Chart(ev).mark_rule(color="#555", strokeWidth=1).encode(x="t_s:Q", tooltip=tip),
        ]
        if ev.height <= MAX_EVENT_LABELS:
            layers.append(
                alt.Chart(ev)
                .mark_text(align="left", baseline="top", dx=3, dy=2, fontSize=10, color="#333")
                .encode(x="t_s:Q", y=alt.value(2), text="name:N")
            )
        else:
            names = ev.get_column("name").unique(maintain_order=True).to_list()
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            title += f"; grey: {shown} (hover for details)"
        if total > ev.height:
            title += f" ({ev.height} longest of {total} events shown)"
    return alt.layer(*layers).properties(width=WIDTH, height=height, title=title)


# --------------------------------------------------------------------------- phases


def top_phases_chart(top: pl.DataFrame) -> alt.VConcatChart:
    """The top phases of each stage: bar = mean ms per iteration, whisker = p50 to p95.

    Args:
        top: one row per stage and phase, in the order to draw (largest first):
            ``stage``, ``phase``, ``category``, ``mean_s``, ``p50_s``, ``p95_s``
            (seconds per iteration).
    """
    _require(top, ["stage", "phase", "category", "mean_s", "p50_s", "p95_s"], "top_phases_chart")
    panels = []
    for stage in _stages(top):
        part = top.filter(pl.col("stage") == stage)
        order = part.get_column("phase").to_list()
        data = _round(
            part.select(
                "phase",
                "category",
                *[
                    (pl.col(c) * _MS).alias(c.replace("_s", "_ms"))
                    for c in ("mean_s", "p50_s", "p95_s")
                ],
            )
        )
        data = _by_position(data, "phase", order)
        y = alt.Y("phase:N", sort=_position_sort(), title=None, axis=alt.Axis(labelLimit=240))
        tip = [
            "phase:N",
            "category:N",
            alt.Tooltip("mean_ms:Q", title="mean ms", format=".2f"),
            alt.Tooltip("p50_ms:Q", title="p50 ms", format=".2f"),
            alt.Tooltip("p95_ms:Q", title="p95 ms", format=".2f"),
        ]
        bars = (
            alt.Chart(data)
            .mark_bar(opacity=0.85)
            .encode(
                y=y,
                x=alt.X("mean_ms:Q", title="ms per iteration"),
                color=alt.Color(
                    "category:N", scale=_category_scale(), sort=list(CATEGORIES), title="category"
                ),
                tooltip=tip,
            )
        )
        whisker = (
            alt.Chart(data)
            .mark_rule(color="#222")
            .encode(y=y, x="p50_ms:Q", x2="p95_ms:Q", tooltip=tip)
        )
        p50 = (
            alt.Chart(data)
            .mark_point(shape="circle", filled=True, color="#222", size=30)
            .encode(y=y, x="p50_ms:Q", tooltip=tip)
        )
        p95 = (
            alt.Chart(data)
            .mark_tick(color="#222", thickness=2, size=14)
            .encode(y=y, x="p95_ms:Q", tooltip=tip)
        )
        panels.append(
            alt.layer(bars, whisker, p50, p95).properties(
                title=f"{stage}: top phases", width=WIDTH - 200, height=alt.Step(22)
            )
        )
    return alt.vconcat(*panels).resolve_scale(color="shared")


# --------------------------------------------------------------------------- comparison


def contribution_chart(
    contributors: pl.DataFrame, *, max_rows: int = MAX_CONTRIBUTORS
) -> alt.Chart:
    """Each phase's contribution to a throughput change, as a diverging bar chart.

    Bars to the right made the candidate slower (more ms per iteration), bars
    to the left faster; each label ends with the phase's share of the gap.

    Args:
        contributors: in the order to draw (the compare engine's order):
            ``stage``, ``phase``, ``category``, ``delta_s_per_iter`` (s,
            candidate minus baseline), ``share_of_gap`` (fraction, may be null).
        max_rows: most bars (the first ``max_rows`` rows).
    """
    _require(
        contributors,
        ["stage", "phase", "category", "delta_s_per_iter", "share_of_gap"],
        "contribution_chart",
    )
    share = pl.col("share_of_gap").cast(pl.Float64)
    share_text = (
        pl.when(share.is_null())
        .then(pl.lit(""))
        .otherwise(
            pl.lit(" (")
            + (share * 100).round(0).cast(pl.Int64).cast(pl.String)
            + pl.lit("% of gap)")
        )
    )
    data = _round(
        contributors.head(max_rows)
        .select(
            (pl.col("stage") + " · " + pl.col("phase") + share_text).alias("item"),
            "stage",
            "phase",
            "category",
            (pl.col("delta_s_per_iter") * _MS).alias("delta_ms"),
            share.alias("share_of_gap"),
        )
        .with_columns(
            pl.when(pl.col("delta_ms") > 0)
            .then(pl.lit("slower"))
            .otherwise(pl.lit("faster"))
            .alias("direction")
        )
    )
    data = _by_position(data, "item", data.get_column("item").to_list())
    y = alt.Y("item:N", sort=_position_sort(), title=None, axis=alt.Axis(labelLimit=340))
    bars = (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=y,
            x=alt.X("delta_ms:Q", title="change in ms per iteration (candidate - baseline)"),
            color=alt.Color(
                "direction:N",
                scale=alt.Scale(domain=["slower", "faster"], range=["#d62728", "#2ca02c"]),
                title=None,
                legend=alt.Legend(orient="top"),
            ),
            tooltip=[
                "stage:N",
                "phase:N",
                "category:N",
                alt.Tooltip("delta_ms:Q", title="change ms/iter", format="+.2f"),
                alt.Tooltip("share_of_gap:Q", title="share of gap", format=".1%"),
            ],
        )
    )
    zero = alt.Chart(pl.DataFrame({"x": [0.0]})).mark_rule(color="#333").encode(x="x:Q")
    return alt.layer(bars, zero).properties(width=WIDTH - 240, height=alt.Step(22))


def breakdown_comparison_chart(breakdown: pl.DataFrame) -> alt.Chart:
    """Both runs' time per iteration by category, side by side, per stage.

    Args:
        breakdown: ``run`` (label such as ``"baseline"``), ``stage``,
            ``category``, ``seconds_per_iter`` (s). Rows keep their run and
            stage order.
    """
    _require(
        breakdown, ["run", "stage", "category", "seconds_per_iter"], "breakdown_comparison_chart"
    )
    data = _round(
        breakdown.select(
            (pl.col("stage") + " · " + pl.col("run")).alias("row"),
            "run",
            "stage",
            "category",
            (pl.col("seconds_per_iter") * _MS).alias("ms"),
            pl.col("category").map_elements(CATEGORIES.index, return_dtype=pl.Int64).alias("order"),
        )
    )
    stages = data.get_column("stage").unique(maintain_order=True).to_list()
    runs = data.get_column("run").unique(maintain_order=True).to_list()
    rows = [f"{s} · {r}" for s in stages for r in runs]
    data = _by_position(data, "row", rows)
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=alt.Y("row:N", sort=_position_sort(), title=None, axis=alt.Axis(labelLimit=260)),
            x=alt.X("ms:Q", stack="zero", title="ms per iteration"),
            color=alt.Color(
                "category:N", scale=_category_scale(), sort=list(CATEGORIES), title="category"
            ),
            order=alt.Order("order:Q"),
            tooltip=["run:N", "stage:N", "category:N", alt.Tooltip("ms:Q", format=".2f")],
        )
        .properties(width=WIDTH - 200, height=alt.Step(22))
    )


__all__ = [
    "CATEGORY_COLORS",
    "CATEGORY_COLUMNS",
    "DEFAULT_BINS",
    "MAX_CONTRIBUTORS",
    "MAX_EVENTS",
    "MAX_HEATMAP_PHASES",
    "bin_iterations",
    "bin_queue",
    "breakdown_comparison_chart",
    "category_share_chart",
    "contribution_chart",
    "queue_chart",
    "rank_phase_heatmap",
    "timeline_chart",
    "top_phases_chart",
]
