"""Altair charts for the dashboard and the HTML report (one implementation for both).

Each function takes DataFrames from ``kvclaims.dashboard.data`` and returns a chart; none computes a
number of its own. The app draws them with ``st.altair_chart``; the report embeds the same
specs and draws them in the page with the inlined Vega libraries (``report.Charts``);
``to_png``/``to_svg`` render a spec offline (vl-convert). Timelines take ``axis="seq"`` or
``axis="utc"`` (wall-clock time; ``data.add_utc``) and zoom along x.

NOTE: colours are colour-blind safe (Okabe-Ito hues); harm (vermillion) is the one alarming
colour on every chart, and every lane state of one chart has its own colour.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from kvclaims.contract.vocabulary import CLAIM_OUTCOME, LABELS, REQUEST_OUTCOME
from kvclaims.dashboard.data import (LABEL_COLORS, OCCUPANCY, OCCUPANCY_COLORS,
                            OCCUPANCY_TITLES)

_LABEL_SCALE = alt.Scale(domain=list(LABELS), range=[LABEL_COLORS[k] for k in LABELS])
_OCC_DOMAIN = [OCCUPANCY_TITLES[k] for k in OCCUPANCY]
_OCC_SCALE = alt.Scale(domain=_OCC_DOMAIN, range=[OCCUPANCY_COLORS[k] for k in OCCUPANCY])
#: Lane states and their colours, claims and requests apart (each has its own chart and
#: legend). NOTE: Okabe-Ito hues and greys; every state of one chart has its own colour (a
#: demotion, an expiry and a release differ; served and deferred_then_served differ); none
#: is vermillion, which only harm uses.
CLAIM_STATE_COLORS: dict[str, str] = {
    "submitted": "#DDDDDD", "accepted": "#56B4E9", "in force": "#0072B2",
    CLAIM_OUTCOME.demoted: "#E69F00", CLAIM_OUTCOME.expired: "#F0E442",
    CLAIM_OUTCOME.released: "#999999", CLAIM_OUTCOME.rejected: "#000000"}
REQUEST_STATE_COLORS: dict[str, str] = {
    "queued": "#DDDDDD", "deferred": "#E69F00", "running": "#009E73",
    REQUEST_OUTCOME.served: "#000000", REQUEST_OUTCOME.deferred_then_served: "#56B4E9",
    REQUEST_OUTCOME.refused: "#CC79A7", REQUEST_OUTCOME.preempted: "#F0E442",
    REQUEST_OUTCOME.aborted: "#999999", REQUEST_OUTCOME.unknown: "#666666"}
#: Every lane state (a claim's or a request's) and its colour.
LANE_COLORS: dict[str, str] = {**CLAIM_STATE_COLORS, **REQUEST_STATE_COLORS}
#: A block position's state on a claim's block lane (``position_lanes_chart``).
POSITION_COLORS: dict[str, str] = {"resident": "#0072B2"}
#: At most this many points per series are sent to the browser (a step line keeps its shape).
MAX_POINTS = 3000
WIDTH = 1100


#: x axes a timeline can use: the trace's seq, or wall-clock time (UTC; a run with a clock).
AXES: tuple[str, ...] = ("seq", "utc")


def _x(field: str, axis: str, title: str | None = None, **kw: object) -> alt.X:
    """The x encoding of ``field`` on the ``seq`` axis, or of ``<field>_utc`` (a UTC
    timestamp column, ``data.add_utc``) on the wall-clock axis."""
    if axis == "utc":
        # NOTE: epoch milliseconds on a linear scale, labelled as UTC times: the axis reads
        # UTC in every viewer's time zone, and its ticks stay evenly spaced below a second
        # (a temporal scale leaves most sub-second ticks out)
        return alt.X(f"{field}_utc:Q", title=title or "time (UTC)",
                     scale=alt.Scale(zero=False),
                     axis=alt.Axis(labelExpr="utcFormat(datum.value, '%H:%M:%S.%L')",
                                   labelAngle=0, tickCount=6), **kw)
    return alt.X(f"{field}:Q", title=title or "seq", **kw)


def _x2(field: str, axis: str) -> alt.X2:
    return alt.X2(f"{field}_utc" if axis == "utc" else field)


def _zoom(name: str) -> alt.Parameter:
    """Zoom and pan along x with the mouse wheel and drag (double-click resets)."""
    return alt.selection_interval(name=name, bind="scales", encodings=["x"])


def _thin(df: pd.DataFrame, key: str = "seq") -> pd.DataFrame:
    """Keep at most ``MAX_POINTS`` rows, evenly by ``key`` order, always the last one."""
    if len(df) <= MAX_POINTS:
        return df
    step = -(-len(df) // MAX_POINTS)
    keep = df.iloc[::step]
    return pd.concat([keep, df.iloc[[-1]]]).drop_duplicates(subset=[key], keep="last")


def sweep_chart(series: pd.DataFrame, metric: str, unit: str = "blocks") -> alt.Chart:
    """One sweep metric (``resident blocks lost`` or ``shortfall``; a what-if's
    ``data.WHATIF_METRICS``) against usable blocks, one line per policy
    (``data.sweep_series``, ``data.whatif_series``), ``unit`` on the y axis. Policies with
    equal values draw on top of each other: each has its own dash and point shape, and the
    tooltip names the run."""
    df = series[series["metric"] == metric]
    return alt.Chart(df, title=metric).mark_line(point=alt.OverlayMarkDef(size=60)).encode(
        x=alt.X("usable_blocks:Q", title="usable blocks", scale=alt.Scale(zero=False)),
        y=alt.Y("value:Q", title=unit),
        color=alt.Color("policy:N", title="policy",
                        scale=alt.Scale(range=["#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                               "#56B4E9"])),
        strokeDash=alt.StrokeDash("policy:N", title="policy"),
        shape=alt.Shape("policy:N", title="policy"),
        tooltip=["run_id:N", "policy:N", "usable_blocks:Q", alt.Tooltip("value:Q", title=metric)],
    ).add_params(_zoom(f"zoom_{metric.replace(' ', '_')}")).properties(height=260)


def occupancy_chart(occ_long: pd.DataFrame, usable: int | None, losses: pd.DataFrame,
                    width: int | str = WIDTH, axis: str = "seq") -> alt.LayerChart:
    """The pool over seq or UTC (``data.occupancy_long``): a stacked step area (protected by
    claims, held by requests, cached-unreferenced, free), the usable blocks as a dashed line,
    and every loss (``data.run_losses``) as a tick above the pool, coloured by label. Zoom and
    pan along x; hover for the figures."""
    df = _thin_long(occ_long)
    when = [alt.Tooltip("seq_iso:N", title="UTC")] if axis == "utc" else []
    area = alt.Chart(df).mark_area(interpolate="step-after").encode(
        x=_x("seq", axis),
        y=alt.Y("blocks:Q", title="blocks", stack="zero"),
        color=alt.Color("category:N", scale=_OCC_SCALE, sort=_OCC_DOMAIN, title="pool"),
        order=alt.Order("order:Q"),
        tooltip=["seq:Q", *when, "category:N", "blocks:Q"]).add_params(_zoom("zoom_pool"))
    layers: list[alt.Chart] = [area]
    top = usable if usable is not None else int(occ_long.groupby("seq")["blocks"].sum().max())
    if usable is not None:
        layers.append(alt.Chart(pd.DataFrame({"usable_blocks": [usable]})).mark_rule(
            color="#000000", strokeDash=[6, 4]).encode(
            y="usable_blocks:Q", tooltip=[alt.Tooltip("usable_blocks:Q", title="usable blocks")]))
    if len(losses):
        marks = losses.assign(y=top * 1.04)
        layers.append(alt.Chart(marks).mark_tick(thickness=2, size=14).encode(
            x=_x("seq", axis), y=alt.Y("y:Q"),
            color=alt.Color("label:N", scale=_LABEL_SCALE, title="loss"),
            tooltip=["seq:Q", *when, "label:N", "blocks:Q",
                     alt.Tooltip("by_request_id:N", title="by request")]))
    return alt.layer(*layers).resolve_scale(color="independent").properties(
        width=width, height=260, title="pool occupancy (every loss marked above the pool)")


def _thin_long(df: pd.DataFrame) -> pd.DataFrame:
    order = {k: i for i, k in enumerate(_OCC_DOMAIN)}
    parts = [_thin(g) for _, g in df.groupby("category", sort=False)]
    out = pd.concat(parts) if parts else df
    return out.assign(order=out["category"].map(order))


def lanes_chart(lanes: pd.DataFrame, marks: pd.DataFrame | None, title: str,
                width: int | str = WIDTH, highlight: str | None = None,
                axis: str = "seq", colors: dict[str, str] | None = None) -> alt.LayerChart:
    """One lane per claim or request (``data.claim_lanes`` / ``data.request_lanes``): states
    as spans, end states as points, and (claims) each block loss as a tick coloured by label
    (``data.claim_loss_marks``). ``highlight`` dims every other lane; ``colors`` maps each
    state to its colour (default ``LANE_COLORS``)."""
    colors = colors or LANE_COLORS
    order = list(dict.fromkeys(lanes["lane"]))
    y = alt.Y("lane:N", sort=order, title=None,
              axis=alt.Axis(labelLimit=320, labelOverlap=False))
    opacity = (alt.condition(alt.datum.lane == highlight, alt.value(1.0), alt.value(0.35))
               if highlight else alt.value(1.0))
    spans = lanes[lanes["kind"] == "span"].dropna(subset=["end"])
    ends = lanes[lanes["kind"] == "mark"]
    present = [s for s in colors if s in set(lanes["state"])]
    present += sorted(set(lanes["state"]) - set(present))
    scale = alt.Scale(domain=present, range=[colors.get(s, "#666666") for s in present])
    layers: list[alt.Chart] = [
        alt.Chart(spans).mark_bar(height=10).encode(
            x=_x("start", axis), x2=_x2("end", axis), y=y,
            color=alt.Color("state:N", scale=scale, title=f"{title}: state"), opacity=opacity,
            tooltip=["lane:N", "tenant:N", "state:N", alt.Tooltip("start:Q", title="from seq"),
                     alt.Tooltip("end:Q", title="to seq")]
        ).add_params(_zoom(f"zoom_{title.replace(' ', '_')}")),
        alt.Chart(ends).mark_point(filled=True, size=80, shape="diamond").encode(
            x=_x("start", axis), y=y, color=alt.Color("state:N", scale=scale, legend=None),
            opacity=opacity,
            tooltip=["lane:N", "tenant:N", "state:N", alt.Tooltip("start:Q", title="seq")])]
    if marks is not None and len(marks):
        layers.append(alt.Chart(marks).mark_tick(thickness=3, size=16).encode(
            x=_x("seq", axis), y=alt.Y("lane:N", sort=order),
            color=alt.Color("label:N", scale=_LABEL_SCALE, legend=None),
            tooltip=["lane:N", "seq:Q", "label:N", "blocks:Q"]))
    # the loss ticks have their own (label) colours; the end marks share the spans' legend
    return alt.layer(*layers).resolve_scale(color="independent").properties(
        width=width, height=max(60, 22 * len(order)), title=title)


def timeline_chart(occ_long: pd.DataFrame, usable: int | None, losses: pd.DataFrame,
                   claim_lanes: pd.DataFrame, claim_marks: pd.DataFrame,
                   request_lanes: pd.DataFrame, highlight: str | None = None,
                   width: int | str = WIDTH, axis: str = "seq") -> alt.VConcatChart:
    """The block-level timeline: the pool, then one lane per claim, then one per request,
    on one shared x axis (seq, or UTC with ``axis="utc"``)."""
    parts: list[alt.TopLevelMixin] = [occupancy_chart(occ_long, usable, losses, width, axis)]
    if len(claim_lanes):
        parts.append(lanes_chart(claim_lanes, claim_marks, "claims", width, highlight, axis,
                                 CLAIM_STATE_COLORS))
    if len(request_lanes):
        parts.append(lanes_chart(request_lanes, None, "requests", width, None, axis,
                                 REQUEST_STATE_COLORS))
    return alt.vconcat(*parts, spacing=12).resolve_scale(x="shared", color="independent")


def position_lanes_chart(positions: pd.DataFrame, width: int | str = WIDTH,
                         axis: str = "seq", title: str = "the claim's blocks") -> alt.LayerChart:
    """One lane per position of one claim (``data.claim_position_lanes``): resident from its
    binding to its loss (or the end of the run), the loss a tick coloured by label."""
    spans = positions.dropna(subset=["end"])
    lost = positions.dropna(subset=["label"])
    y = alt.Y("position:O", title="position in claim", sort="ascending",
              axis=alt.Axis(labelOverlap=True))
    layers: list[alt.Chart] = [
        alt.Chart(spans).mark_bar(height=alt.RelativeBandSize(0.8)).encode(
            x=_x("start", axis), x2=_x2("end", axis), y=y,
            color=alt.value(POSITION_COLORS["resident"]),
            tooltip=["position:O", "block_id:Q", alt.Tooltip("start:Q", title="bound at seq"),
                     alt.Tooltip("end:Q", title="to seq")]).add_params(_zoom("zoom_blocks"))]
    if len(lost):
        layers.append(alt.Chart(lost).mark_tick(thickness=3).encode(
            x=_x("end", axis), y=y,
            color=alt.Color("label:N", scale=_LABEL_SCALE, title="loss label"),
            tooltip=["position:O", "block_id:Q", "label:N",
                     alt.Tooltip("end:Q", title="lost at seq"), "by_request_id:N"]))
    n = positions["position"].nunique()
    return alt.layer(*layers).properties(width=width, height=max(80, min(6 * n, 480)),
                                         title=title)


def claim_timeline_chart(lifecycle: pd.DataFrame, losses: pd.DataFrame) -> alt.LayerChart:
    """A claim over seq: a rule per lifecycle event (``data.claim_lifecycle``), coloured by
    event and named in the legend (labels never overprint), and a point per block loss at its
    position in the claim, coloured by label (``data.claim_losses``)."""
    events = lifecycle[["seq", "event"]]
    rules = alt.Chart(events).mark_rule(strokeDash=[4, 3], strokeWidth=2).encode(
        x=alt.X("seq:Q", title="seq"),
        color=alt.Color("event:N", title="lifecycle", scale=alt.Scale(
            range=["#999999", "#56B4E9", "#0072B2", "#009E73", "#E69F00", "#CC79A7",
                   "#000000", "#F0E442"])),
        tooltip=["event:N", "seq:Q"])
    points = alt.Chart(losses[["seq", "position", "label", "block_id", "by_request_id"]]
                       ).mark_circle(size=45, opacity=0.9).encode(
        x=alt.X("seq:Q", title="seq"),
        y=alt.Y("position:Q", title="position in claim"),
        color=alt.Color("label:N", scale=_LABEL_SCALE, title="loss label"),
        tooltip=["seq:Q", "position:Q", "label:N", "block_id:Q", "by_request_id:N"])
    return alt.layer(rules, points).resolve_scale(color="independent").properties(height=280)


def loss_label_chart(labels: pd.DataFrame) -> alt.Chart:
    """Blocks lost per run, stacked by label, harm first (``data.loss_labels``)."""
    order = {k: i for i, k in enumerate(LABELS)}
    df = labels.assign(order=labels["label"].map(order))
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("run_id:N", title=None, sort=None,
                axis=alt.Axis(labelLimit=0, labelOverlap=False)),
        x=alt.X("blocks_lost:Q", title="blocks lost"),
        color=alt.Color("label:N", scale=_LABEL_SCALE, title="label"),
        order=alt.Order("order:Q"),
        tooltip=["run_id:N", "label:N", "blocks_lost:Q", "first_seq:Q", "last_seq:Q",
                 "from_reset:Q"],
    ).properties(height=max(120, 24 * labels["run_id"].nunique()))


def headline_chart(headline: pd.DataFrame, width: int | str = WIDTH) -> alt.Chart:
    """Blocks lost per run by label (every loss in the run), harm first, runs in order."""
    rows = [{"run_id": r["run_id"], "label": k, "blocks": int(r[f"lost_{k}"]),
             "order": i} for _, r in headline.iterrows() for i, k in enumerate(LABELS)
            if r[f"lost_{k}"]]
    df = pd.DataFrame(rows, columns=["run_id", "label", "blocks", "order"])
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("run_id:N", title=None, sort=list(headline["run_id"]),
                axis=alt.Axis(labelLimit=0, labelOverlap=False)),
        x=alt.X("blocks:Q", title="blocks lost, by label"),
        color=alt.Color("label:N", scale=_LABEL_SCALE, title="label"),
        order=alt.Order("order:Q"),
        tooltip=["run_id:N", "label:N", "blocks:Q"],
    ).properties(width=width, height=max(60, 20 * len(headline)),
                 title="blocks lost per run (harm is the alarming colour)")


def to_svg(chart: alt.TopLevelMixin) -> str:
    """The chart as a standalone SVG, rendered offline (no network, no browser)."""
    import vl_convert

    return vl_convert.vegalite_to_svg(chart.to_json())


def to_png(chart: alt.TopLevelMixin, scale: float = 1.25) -> bytes:
    """The chart as a PNG, rendered offline with its own fonts (text laid out exactly as
    measured, whatever fonts the viewer has)."""
    import vl_convert

    return vl_convert.vegalite_to_png(chart.to_json(), scale=scale)
