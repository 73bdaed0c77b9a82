"""``kvclaims whatif``: replay a recorded run under other policies or pool sizes, print the
comparison, the fidelity and (``--sweep``) the paper's sweep table and chart.

The replay itself is ``kvclaims.whatif`` (docs/whatif.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from kvclaims.cli.record import _engine_noise_aside, _names, _quiet_vllm, render_table, sweep_rows
from kvclaims.contract.policies import POLICIES
from kvclaims.contract.schema import InputError
from kvclaims.dashboard import charts
from kvclaims.reconstruct.loader import find_run_dirs, is_run_dir, read_manifest
from kvclaims.whatif import (SWEEP_CAPACITIES, SWEEP_POLICIES, WhatIf, render_comparison, to_json,
                             whatif)


# -- the sweep chart --------------------------------------------------------------------------------

def sweep_table(result: WhatIf) -> list[dict[str, Any]]:
    """The paper's sweep table (``capacity_sweep``) over the replayed points."""
    return sweep_rows([p.run_dir for p in result.points])


def draw_sweep(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """The dashboard's sweep chart (resident blocks lost, shortfall) for these rows, as SVG."""
    df = pd.DataFrame(list(rows))
    lost = df.assign(metric="resident blocks lost", value=df["resident_blocks_lost"])
    short = df.assign(metric="shortfall", value=df["shortfall_blocks"].fillna(0))
    series = pd.concat([lost, short])[["policy", "usable_blocks", "metric", "value", "run_id"]]
    series["value"] = series["value"].astype("int64")
    chart = alt.hconcat(charts.sweep_chart(series, "resident blocks lost"),
                        charts.sweep_chart(series, "shortfall"))
    path.write_text(charts.to_svg(chart))
    return path


# -- command line -----------------------------------------------------------------------------------

def register(sub: Any) -> None:
    """Add ``whatif``."""
    p = sub.add_parser(
        "whatif", help="replay a recorded run under other policies or pool sizes (no model)",
        description="Rebuild a recorded run's request stream and drive vLLM's own Scheduler "
                    "with the kvclaims recorder and arbiter attached, without a model, once "
                    "per (policy, usable blocks) point: a run directory per point under --out "
                    "(manifest evidence: replayed), audited by the reconstructor and printed "
                    "beside the recorded run. The point with the recorded policy and pool is "
                    "compared with the recording event by event (fidelity).")
    p.add_argument("run", type=Path, help="the recorded run directory")
    p.add_argument("--policy", default=None,
                   help="comma-separated run policies (default: the recorded one; with "
                        "--sweep: native,write_no_admit,hard_protected)")
    p.add_argument("--usable-blocks", default=None,
                   help="comma-separated usable block counts (default: the recorded one; "
                        "with --sweep: 80,90,100,110,120,130,150)")
    p.add_argument("--sweep", action="store_true",
                   help="the paper's grid of policies x capacities; prints its sweep table "
                        "and draws DIR/sweep.svg")
    p.add_argument("--out", required=True, type=Path, help="directory for the replayed runs")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--verbose", action="store_true", help="show vLLM's own log")
    p.set_defaults(func=_cli)


def _cli(args: Any) -> int:
    if args.out.exists() and any(args.out.iterdir()):
        raise InputError(f"{args.out} already exists and is not empty")
    workload_policy, workload_usable = _recorded_point(args.run)
    default_p = ",".join(SWEEP_POLICIES) if args.sweep else workload_policy
    default_c = ",".join(map(str, SWEEP_CAPACITIES)) if args.sweep else str(workload_usable)
    policies = _names(args.policy or default_p, POLICIES)
    capacities = _capacities(args.usable_blocks or default_c)
    _quiet_vllm(args.verbose)
    with _engine_noise_aside(args.verbose) as terminal:
        def progress(text: str) -> None:
            if not args.quiet and terminal.isatty():
                print(f"\rkvclaims whatif: {text}   ", end="", file=terminal, flush=True)

        result = whatif(args.run, policies, capacities, args.out, progress=progress)
        if not args.quiet and terminal.isatty():
            print(file=terminal)
    sweep = sweep_table(result) if args.sweep else None
    chart = draw_sweep(sweep, args.out / "sweep.svg") if sweep else None
    if args.json:
        print(json.dumps({**to_json(result), "sweep": sweep,
                          "sweep_chart": str(chart) if chart else None}, indent=2,
                         default=str))
        return 0
    out = sys.stdout
    print(f"what-if over {result.source} ({len(result.points)} points replayed through vLLM's "
          f"Scheduler in {result.seconds:.1f} s) into {result.out}", file=out)
    print(render_comparison(result.rows), file=out)
    notes = {n for p in result.points for n in p.approximations}
    if notes:
        print("approximate, because:", file=out)
        for n in sorted(notes):
            print(f"  - {n}", file=out)
    if result.fidelity is not None:
        print(_fidelity_line(result.fidelity), file=out)
    if sweep:
        print(render_table(sweep), file=out)
        print(f"sweep chart: {chart}", file=out)
    print(f"shown beside the recording by: kvclaims report|dashboard|explain {result.source} "
          f"--whatif {result.out}", file=out)
    return 0


def _capacities(text: str) -> list[int]:
    """``--usable-blocks``: comma-separated integers, each at least 2."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--usable-blocks must be comma-separated integers, got {text!r}") \
            from None
    if not values or min(values) < 2:
        raise InputError("--usable-blocks needs at least one value, each at least 2")
    return values


def _recorded_point(run: Path) -> tuple[str, int]:
    """The recorded policy and usable blocks (manifest), for the defaults."""
    if run.is_dir() and not is_run_dir(run):
        found = find_run_dirs(run)
        if found:
            raise InputError(f"{run} holds {len(found)} runs; whatif replays one run "
                             f"directory (e.g. {found[0]})")
    m = read_manifest(run)
    policy, usable = m.get("policy"), m.get("usable_blocks")
    if not isinstance(policy, str) or not isinstance(usable, int):
        raise InputError(f"{run}: the manifest names no policy or usable_blocks")
    return policy, usable


def _fidelity_line(fid: dict[str, Any]) -> str:
    """The fidelity of the replay under the recorded settings, in one line (+ differences)."""
    parts = [f"{k} {v['matched']}/{v['recorded']}" for k, v in fid["aspects"].items()
             if k != "steps"]
    head = ("fidelity (replay under the recorded policy and pool vs the recording): "
            + ("exact" if fid["exact"] else "DIFFERS") + "; " + ", ".join(parts)
            + ("; same steps" if fid["same_steps"] else "; steps differ"))
    diffs = [f"  {k}: only recorded {v['only_recorded']}, only replayed {v['only_replayed']}"
             for k, v in fid["aspects"].items() if v["only_recorded"] or v["only_replayed"]]
    return "\n".join([head, *diffs])
