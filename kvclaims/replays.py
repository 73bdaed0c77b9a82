"""Computed what-ifs: the replay run directories of a recorded run, and their comparison with it.

A what-if is *computed* when ``kvclaims whatif`` (``kvclaims.whatif``) has written a run
directory whose manifest says ``evidence: "replayed"`` and names the ``source_run_id`` of a
recorded run. This module finds such directories (``find_replays``), compares each with its
recorded run (``summarize``: one computation, printed by ``kvclaims whatif``, shown by the
report and the dashboard), and reads what a tenant's explanation may cite of them
(``ReplayFacts``): every figure is read from the reconstructed replay, never assumed.
docs/whatif.md ("Where a what-if is shown").

NOTE: nothing here imports vLLM or the recorder: the report, the dashboard and ``explain`` read
replays offline; only ``kvclaims.whatif`` computes them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvclaims
from kvclaims.contract.vocabulary import CLAIM_OUTCOME, LABEL, fill_sql
from kvclaims.contract.schema import InputError
from kvclaims.reconstruct.loader import find_run_dirs, read_manifest

#: The manifest's ``evidence`` of a run written by a replay.
REPLAYED = "replayed"


@dataclass(frozen=True)
class Replay:
    """One computed what-if point: a replayed run directory, as its manifest describes it."""

    run_dir: Path
    run_id: str
    source_run_id: str
    policy: str | None
    usable_blocks: int | None
    exact: bool
    approximations: tuple[str, ...]
    computed_utc: str | None  # the replay's own wall-clock start (manifest ``clock.utc``)

    @property
    def point(self) -> str:
        """``policy@usable_blocks``, as ``kvclaims whatif`` names its points."""
        return f"{self.policy}@{self.usable_blocks}"


def replay_of(run_dir: Path, manifest: dict[str, Any]) -> Replay | None:
    """The ``Replay`` a manifest describes, or None when the run is not a replay (a recording,
    an import) or names no source run."""
    source = manifest.get("source_run_id")
    if manifest.get("evidence") != REPLAYED or not isinstance(source, str):
        return None
    replay = manifest.get("replay") if isinstance(manifest.get("replay"), dict) else {}
    clock = manifest.get("clock") if isinstance(manifest.get("clock"), dict) else {}
    usable = manifest.get("usable_blocks")
    notes = replay.get("approximations")
    utc = clock.get("utc")
    return Replay(
        run_dir=Path(run_dir), run_id=str(manifest.get("run_id") or Path(run_dir).name),
        source_run_id=source, policy=manifest.get("policy"),
        usable_blocks=usable if isinstance(usable, int) else None,
        exact=replay.get("exact") is True,
        approximations=tuple(str(n) for n in notes) if isinstance(notes, list) else (),
        # NOTE: to the second, in UTC ("2026-12-01T19:08:18Z"): when the what-if was computed
        computed_utc=utc[:19] + "Z" if isinstance(utc, str) and len(utc) >= 19 else None)


def find_replays(paths: Iterable[str | Path]) -> list[Replay]:
    """Every replayed run directory under ``paths`` (run or folder paths, e.g. a ``kvclaims
    whatif --out`` folder), in path order; recordings among them are skipped. ``InputError``
    (one line) for a path that does not exist or holds no run directory at all."""
    out: list[Replay] = []
    seen: set[Path] = set()
    for p in paths:
        for d in find_run_dirs(p):  # NOTE: a path without any run is the loader's one line
            if d.resolve() in seen:
                continue
            seen.add(d.resolve())
            r = replay_of(d, read_manifest(d))
            if r is not None:
                out.append(r)
    return out


def replays_in(audit: Any) -> list[Replay]:
    """The replays among the runs of an open audit (``kvclaims.open``): a ``kvclaims whatif``
    folder given beside the recorded run is found there. An audit without run directories (a
    fleet dataset) has none."""
    out = []
    dirs = getattr(audit, "run_dirs", None) or {}
    for rid, manifest in audit.manifests.items():
        run_dir = dirs.get(rid)
        r = replay_of(run_dir, manifest) if run_dir is not None else None
        if r is not None:
            out.append(r)
    return out


def gather(audit: Any, whatif_paths: Iterable[str | Path] = ()) -> list[Replay]:
    """The computed what-ifs a command shows: those among the audited runs and those under
    ``whatif_paths`` (``--whatif DIR``), each directory once. ``InputError`` (one line) for a
    ``--whatif`` path that holds no replay (a recording given there by mistake)."""
    found = replays_in(audit)
    seen = {r.run_dir.resolve() for r in found}
    for p in whatif_paths:
        named = find_replays([p])
        if not named:
            raise InputError(f"--whatif {p}: no replayed run there (kvclaims whatif --out "
                             "writes them)")
        found += [r for r in named if r.run_dir.resolve() not in seen]
        seen.update(r.run_dir.resolve() for r in named)
    return found


def replays_of(replays: Iterable[Replay], source_run_id: str) -> list[Replay]:
    """The replays of one recorded run, by policy then usable blocks."""
    return sorted((r for r in replays if r.source_run_id == source_run_id),
                  key=lambda r: (str(r.policy), r.usable_blocks or 0, r.run_id))


# -- the comparison: the recorded run beside each replayed point -----------------------------------

#: Columns of the comparison, in print order.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "point", "policy", "usable_blocks", "claims_preserved", "claims_harmed", "claims_demoted",
    "claims_other", "served", "deferred", "refused", "preempted", "lost_harm", "lost_expiry",
    "lost_relaxation", "lost_eviction", "lost_unknown", "cached_tokens", "value_lost_by_tenant",
    "exact")

#: Loss labels in the comparison's column order (harm first: what a what-if is asked about).
_LOST_ORDER: tuple[str, ...] = (LABEL.harm, LABEL.expiry, LABEL.relaxation, LABEL.eviction,
                                LABEL.unknown)

_REQUESTS_SQL = fill_sql("""
    SELECT run_id,
           count(*) FILTER (WHERE outcome IN ({request_outcome.served},
                                              {request_outcome.deferred_then_served})),
           count(*) FILTER (WHERE deferrals > 0),
           count(*) FILTER (WHERE outcome = {request_outcome.refused}),
           count(*) FILTER (WHERE preemptions > 0),
           coalesce(sum(num_cached_tokens), 0)
    FROM requests GROUP BY run_id""")


def summarize(run_dirs: Sequence[str | Path], points: Sequence[str]) -> list[dict[str, Any]]:
    """One comparison row per run directory (named by ``points``), every number from the
    reconstructor (claims, requests, losses by label, cached tokens, value lost per tenant);
    one audit over all of them."""
    dirs = [Path(d) for d in run_dirs]
    audit = kvclaims.open(dirs)
    try:
        # NOTE: runs are told apart by directory: two what-ifs may reuse a run id (a sweep's
        # points keep their grid names), which the audit then qualifies with the path
        by_dir = {Path(d).resolve(): rid for rid, d in audit.run_dirs.items()}
        runs = {rid: (pol, usable) for rid, pol, usable in audit.sql(fill_sql(
            "SELECT run_id, policy, usable_blocks FROM events "
            "WHERE event = {event.run_started}")).fetchall()}
        claims = _by_run(audit.sql("SELECT run_id, outcome, count(*) FROM claim_outcomes "
                                   "GROUP BY ALL").fetchall())
        reqs = {r[0]: r[1:] for r in audit.sql(_REQUESTS_SQL).fetchall()}
        labels = _by_run(audit.sql("SELECT run_id, label, count(*) FROM losses "
                                   "GROUP BY ALL").fetchall())
        values = _by_run(audit.sql("SELECT run_id, coalesce(tenant, '-'), sum(value_lost) "
                                   "FROM claim_outcomes GROUP BY ALL ORDER BY 2").fetchall())
    finally:
        audit.close()
    rows = []
    main = (CLAIM_OUTCOME.preserved, CLAIM_OUTCOME.harmed, CLAIM_OUTCOME.demoted)
    for run_dir, point in zip(dirs, points):
        manifest = json.loads((run_dir / "manifest.json").read_text())
        rid = by_dir.get(run_dir.resolve(), manifest["run_id"])
        policy, usable = runs.get(rid, (manifest.get("policy"), manifest.get("usable_blocks")))
        outcomes = Counter(claims.get(rid, {}))
        served, deferred, refused, preempted, cached = reqs.get(rid, (0, 0, 0, 0, 0))
        lost = labels.get(rid, {})
        exact = manifest.get("replay", {}).get("exact") \
            if manifest.get("evidence") == REPLAYED else None
        rows.append({
            "point": point, "run_dir": str(run_dir), "run_id": manifest["run_id"],
            "policy": policy, "usable_blocks": usable,
            "claims_preserved": outcomes[CLAIM_OUTCOME.preserved],
            "claims_harmed": outcomes[CLAIM_OUTCOME.harmed],
            "claims_demoted": outcomes[CLAIM_OUTCOME.demoted],
            "claims_other": sum(v for k, v in outcomes.items() if k not in main),
            "served": int(served), "deferred": int(deferred), "refused": int(refused),
            "preempted": int(preempted),
            **{f"lost_{lab}": int(lost.get(lab, 0)) for lab in _LOST_ORDER},
            "cached_tokens": int(cached),
            "value_lost_by_tenant": {t: round(float(v), 6)
                                     for t, v in values.get(rid, {}).items() if v},
            "exact": exact})
    return rows



def compare(source_dir: str | Path, replays: Sequence[Replay]) -> list[dict[str, Any]]:
    """The recorded run in ``source_dir`` (row ``recorded``) beside each replay of it (row
    ``policy@usable``): ``summarize`` over them."""
    return summarize([Path(source_dir), *[r.run_dir for r in replays]],
                     ["recorded", *[r.point for r in replays]])


def _by_run(rows: Iterable[tuple[Any, Any, Any]]) -> dict[str, dict[Any, Any]]:
    out: dict[str, dict[Any, Any]] = {}
    for rid, key, value in rows:
        out.setdefault(rid, {})[key] = value
    return out


#: Column titles of the printed comparison (and of the report's and dashboard's tables).
TITLES: dict[str, str] = {
    "point": "point", "policy": "policy", "usable_blocks": "usable",
    "claims_preserved": "preserved", "claims_harmed": "harmed", "claims_demoted": "demoted",
    "claims_other": "other claims", "served": "served", "deferred": "deferred",
    "refused": "refused", "preempted": "preempted", "lost_harm": "harm", "lost_expiry": "expiry",
    "lost_relaxation": "relax", "lost_eviction": "evict", "lost_unknown": "unknown",
    "cached_tokens": "cached tok", "value_lost_by_tenant": "value lost", "exact": "exact"}


def cell(v: Any) -> str:
    """One comparison value as text: missing as ``-``, value per tenant as ``t=v,...``,
    exactness as ``yes`` / ``no (approximate)``."""
    if v is None:
        return "-"
    if isinstance(v, dict):
        return ",".join(f"{k}={x:g}" for k, x in v.items()) or "0"
    if isinstance(v, bool):
        return "yes" if v else "no (approximate)"
    return str(v)


def render_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as a fixed-width text table (the recorded run first)."""
    lines = [tuple(TITLES[c] for c in SUMMARY_COLUMNS)]
    lines += [tuple(cell(r.get(c)) for c in SUMMARY_COLUMNS) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(SUMMARY_COLUMNS))]
    left = {"point", "policy", "value_lost_by_tenant", "exact"}
    return "\n".join("  ".join(c.ljust(w) if name in left else c.rjust(w)
                               for c, w, name in zip(line, widths, SUMMARY_COLUMNS)).rstrip()
                     for line in lines)


# -- what one tenant's explanation may cite -------------------------------------------------------

@dataclass(frozen=True)
class Counts:
    """What one run did to requests and claims, counted (never named): the tenant's own
    requests refused or deferred, and everyone else's requests refused, deferred or preempted
    and claims harmed or demoted: the cost to others a citation sets beside the recording."""

    own_refused: int
    own_deferred: int
    others_refused: int
    others_deferred: int
    others_preempted: int
    others_harmed: int
    others_demoted: int


@dataclass(frozen=True)
class RequestFate:
    """What one run did with one request: its reconstructed outcome and how often it was
    deferred and preempted (the ``requests`` table)."""

    outcome: str
    deferrals: int
    preemptions: int


_CLAIMS_SQL = """
    SELECT run_id, claim_id, claim_seq, outcome,
           row_number() OVER (PARTITION BY run_id, claim_id ORDER BY claim_seq) AS nth
    FROM claims"""

# NOTE: a replay submits every recorded request under its recorded id (kvclaims.whatif), so a
# request is matched by id; one the replay never submitted has no row
_FATES_SQL = "SELECT run_id, request_id, outcome, deferrals, preemptions FROM requests"

# NOTE: a request is the tenant's own when it carries the tenant or submitted one of its
# claims (the explanation's own rule); every other request, tenant or not, is someone else's,
# and so is every claim that is not the tenant's
_COUNTS_SQL = fill_sql("""
    WITH own AS (SELECT run_id, request_id FROM requests WHERE tenant = $t
                 UNION SELECT run_id, request_id FROM claims
                       WHERE tenant = $t AND request_id IS NOT NULL),
         r AS (SELECT q.run_id, q.outcome, q.deferrals, q.preemptions,
                      o.request_id IS NOT NULL AS mine
               FROM requests q LEFT JOIN own o USING (run_id, request_id)
               WHERE q.run_id = $r),
         c AS (SELECT count(*) FILTER (WHERE outcome = {claim_outcome.harmed}) AS harmed,
                      count(*) FILTER (WHERE outcome = {claim_outcome.demoted}) AS demoted
               FROM claims WHERE run_id = $r AND tenant IS DISTINCT FROM $t)
    SELECT count(*) FILTER (WHERE mine AND outcome = {request_outcome.refused}),
           count(*) FILTER (WHERE mine AND deferrals > 0),
           count(*) FILTER (WHERE NOT mine AND outcome = {request_outcome.refused}),
           count(*) FILTER (WHERE NOT mine AND deferrals > 0),
           count(*) FILTER (WHERE NOT mine AND preemptions > 0),
           any_value(c.harmed), any_value(c.demoted)
    FROM c LEFT JOIN r ON true""")


class ReplayFacts:
    """The reconstructed replays of an audit's runs, opened once: for each replay, the outcome
    of a claim instance, what it did with a request, and the requests it refused, deferred or
    preempted and the claims it harmed or demoted, counted by whose they are.

    NOTE: one per command or page, shared by every tenant it explains (``explain``'s
    ``replay_facts``): opening the replays is the expensive part. Close it (or use ``with``).
    """

    def __init__(self, replays: Sequence[Replay]) -> None:
        self.replays = list(replays)
        self._audit = kvclaims.open([r.run_dir for r in self.replays]) if self.replays else None
        by_dir = ({Path(d).resolve(): rid for rid, d in self._audit.run_dirs.items()}
                  if self._audit is not None else {})
        #: the audit's run id of each replay (the manifest's, unless two share it)
        self._rid = {r.run_dir.resolve(): by_dir.get(r.run_dir.resolve(), r.run_id)
                     for r in self.replays}
        self._claims: dict[tuple[str, str, int], str] = {}
        self._fates: dict[tuple[str, str], RequestFate] = {}
        self._counts: dict[tuple[str, str], Counts] = {}
        if self._audit is not None:
            for rid, cid, _seq, outcome, nth in self._audit.sql(_CLAIMS_SQL).fetchall():
                self._claims[(rid, cid, int(nth))] = outcome
            for rid, qid, outcome, deferrals, preemptions in self._audit.sql(
                    _FATES_SQL).fetchall():
                self._fates[(rid, qid)] = RequestFate(str(outcome), int(deferrals or 0),
                                                      int(preemptions or 0))

    def of(self, source_run_id: str) -> list[Replay]:
        """The replays of one recorded run (``replays_of``)."""
        return replays_of(self.replays, source_run_id)

    def claim_outcome(self, replay: Replay, claim_id: str, nth: int) -> str | None:
        """The outcome, in ``replay``, of the ``nth`` (1-based) instance of ``claim_id``; None
        when the replay has no such instance (its request was never submitted)."""
        return self._claims.get((self._rid[replay.run_dir.resolve()], claim_id, nth))

    def request_fate(self, replay: Replay, request_id: str) -> RequestFate | None:
        """What ``replay`` did with the request ``request_id`` (a replay keeps the recorded
        request ids); None when the replay never submitted it."""
        return self._fates.get((self._rid[replay.run_dir.resolve()], request_id))

    def counts(self, replay: Replay, tenant: str) -> Counts:
        """The replay's refused / deferred / preempted requests and harmed / demoted claims,
        the tenant's own requests apart (computed once per replay and tenant)."""
        assert self._audit is not None
        key = (self._rid[replay.run_dir.resolve()], tenant)
        if key not in self._counts:
            self._counts[key] = counts(self._audit.con, key[0], tenant)
        return self._counts[key]

    def close(self) -> None:
        """Release the replays' audit."""
        if self._audit is not None:
            self._audit.close()
            self._audit = None

    def __enter__(self) -> ReplayFacts:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def counts(con: Any, run_id: str, tenant: str) -> Counts:
    """The same counts for a run of an open audit connection (the recorded run), so that a
    replay's figures stand beside the recorded ones."""
    row = con.execute(_COUNTS_SQL, {"t": tenant, "r": run_id}).fetchone()
    return Counts(*(int(v or 0) for v in row))
