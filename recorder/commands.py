"""CLI commands of the recorder: ``kvclaims record`` and ``kvclaims sweep``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from recorder.policies import POLICIES
from recorder.scenarios import SCENARIOS


def register(sub: argparse._SubParsersAction) -> None:
    """Add the recorder's subcommands."""
    p = sub.add_parser(
        "record", help="record a built-in scenario on a real vLLM engine",
        description="Record a built-in scenario into a run directory (one fresh vLLM engine; "
                    "the tiny local model unless --model is given), then print what happened "
                    "to its claims and requests.")
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--usable-blocks", type=int, default=None,
                   help="usable KV blocks (vLLM gets one more: its null block); "
                        "default: the scenario's own")
    p.add_argument("--policy", choices=sorted(POLICIES), default=None,
                   help="run policy; default: the scenario's own")
    p.add_argument("--out", required=True, type=Path, help="run directory to create")
    p.add_argument("--model", type=Path, default=None,
                   help="model folder (default: the tiny random-weight model, built locally)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_record)


def _record(args: argparse.Namespace) -> int:
    from recorder.scenarios import record

    view = record(args.scenario, args.usable_blocks, args.policy, args.out,
                  model_dir=args.model)
    summary = _summary(args.out, view)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_render(summary))
    return 0


def _summary(run_dir: Path, view: dict[str, Any]) -> dict[str, Any]:
    """The client's view plus the reconstructed outcome of every claim and loss."""
    from reconstruct import reconstruct_runs

    tables = reconstruct_runs([run_dir])
    return {**view, "run_dir": str(run_dir), **tables.summary()}


def _render(summary: dict[str, Any]) -> str:
    lines = [f"recorded {summary['scenario']} (policy {summary['policy']}, "
             f"{summary['usable_blocks']} usable blocks) -> {summary['run_dir']}"]
    for r in summary["requests"]:
        lines.append(f"  request {r['name']:<14} prompt {r['num_prompt_tokens']:>5} tokens  "
                     f"cached {r['num_cached_tokens']!s:>5}  finish {r['finish_reason']}"
                     + (f"  ({r['stop_reason']})" if r.get("stop_reason") else ""))
    for key in ("claims_text", "losses_text"):
        if summary.get(key):
            lines.append(summary[key])
    return "\n".join(lines)
