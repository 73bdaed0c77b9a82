"""Altair charts for the dashboard (Altair ships with Streamlit; charts render offline).

Each function takes a DataFrame from ``dashboard.data`` and returns a chart; none computes a
number of its own.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard.data import LABEL_COLORS, LABELS

_LABEL_SCALE = alt.Scale(domain=list(LABELS), range=[LABEL_COLORS[k] for k in LABELS])


def sweep_chart(series: pd.DataFrame, metric: str) -> alt.Chart:
    """One sweep metric (``resident blocks lost`` or ``shortfall``) against usable blocks,
    one line per policy (``data.sweep_series``). Policies with equal values draw on top of
    each other: each has its own dash and point shape, and the tooltip names the run."""
    df = series[series["metric"] == metric]
    return alt.Chart(df, title=metric).mark_line(point=alt.OverlayMarkDef(size=60)).encode(
        x=alt.X("usable_blocks:Q", title="usable blocks", scale=alt.Scale(zero=False)),
        y=alt.Y("value:Q", title="blocks"),
        color=alt.Color("policy:N", title="policy"),
        strokeDash=alt.StrokeDash("policy:N", title="policy"),
        shape=alt.Shape("policy:N", title="policy"),
        tooltip=["run_id:N", "policy:N", "usable_blocks:Q", alt.Tooltip("value:Q", title=metric)],
    ).properties(height=300)


def claim_timeline_chart(lifecycle: pd.DataFrame, losses: pd.DataFrame) -> alt.LayerChart:
    """A claim over seq: a vertical rule per lifecycle event (``data.claim_lifecycle``) and a
    point per block loss at its position in the claim, coloured by label
    (``data.claim_losses``)."""
    events = lifecycle[["seq", "event"]]
    rules = alt.Chart(events).mark_rule(strokeDash=[4, 3], color="#444").encode(
        x=alt.X("seq:Q", title="seq"), tooltip=["event:N", "seq:Q"])
    names = alt.Chart(events).mark_text(angle=270, align="right", baseline="bottom", dx=-2,
                                        dy=-3, fontSize=11, color="#444").encode(
        x="seq:Q", y=alt.value(0), text="event:N")
    points = alt.Chart(losses[["seq", "position", "label", "block_id", "by_request_id"]]
                       ).mark_circle(size=45, opacity=0.9).encode(
        x=alt.X("seq:Q", title="seq"),
        y=alt.Y("position:Q", title="position in claim"),
        color=alt.Color("label:N", scale=_LABEL_SCALE, title="loss label"),
        tooltip=["seq:Q", "position:Q", "label:N", "block_id:Q", "by_request_id:N"])
    return alt.LayerChart(layer=[rules, names, points], height=320)


def occupancy_chart(occupancy: pd.DataFrame, usable: int | None) -> alt.LayerChart:
    """Cached blocks over seq (``data.pool_occupancy``), a step line, with the pool's usable
    blocks as a horizontal rule."""
    line = alt.Chart(occupancy).mark_line(interpolate="step-after").encode(
        x=alt.X("seq:Q", title="seq"), y=alt.Y("cached_blocks:Q", title="cached blocks"),
        tooltip=["seq:Q", "change:N", "cached_blocks:Q"])
    layers: list[alt.Chart] = [line]
    if usable is not None:
        layers.append(alt.Chart(pd.DataFrame({"usable_blocks": [usable]})).mark_rule(
            color="#d62728", strokeDash=[6, 4]).encode(y="usable_blocks:Q",
                                                        tooltip=["usable_blocks:Q"]))
    return alt.LayerChart(layer=layers, height=320)


def loss_label_chart(labels: pd.DataFrame) -> alt.Chart:
    """Blocks lost per run, stacked by label (``data.loss_labels``)."""
    return alt.Chart(labels).mark_bar().encode(
        y=alt.Y("run_id:N", title=None, sort=None,
                axis=alt.Axis(labelLimit=400, labelOverlap=False)),
        x=alt.X("blocks_lost:Q", title="blocks lost"),
        color=alt.Color("label:N", scale=_LABEL_SCALE, title="label"),
        order=alt.Order("label:N"),
        tooltip=["run_id:N", "label:N", "blocks_lost:Q", "first_seq:Q", "last_seq:Q",
                 "from_reset:Q"],
    ).properties(height=max(120, 24 * labels["run_id"].nunique()))
