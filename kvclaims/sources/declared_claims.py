"""Claims declared beside the engine: a claims file, vLLM's block-hash scheme, and binding.

An operator who cannot change the engine declares what must stay resident in a claims file
(JSON Lines, or YAML) and ``kvclaims listen`` writes the claims into the observed run as
``claim_submitted`` / ``claim_accepted`` / ``claim_bound`` (and ``claim_released`` at ``until``,
``claim_expired`` at ``from + ttl_s`` for an ``expiring`` claim). One claim per line::

    {"claim_id": "sys-prompt", "tenant": "acme", "mode": "hard_protected",
     "threshold_blocks": 60, "from": "start", "until": "2026-11-30T05:00:00Z",
     "token_ids": [1, 17, ...]}

The claimed content is exactly one of ``token_ids`` (what the engine saw), ``text`` (plus a
local ``tokenizer`` folder; ``add_special_tokens`` defaults to true like vLLM's completions
endpoint), or ``block_hashes`` (a known chain of vLLM's published 64-bit hashes, position 0
first). Content is bound to the recorded chain **by hash**: token ids are hashed with vLLM's own
scheme (``hash_block_tokens``: ``H((parent_digest, tuple(block_tokens), extra_keys))``, the
first block's parent being ``NONE_HASH = H(seed)``), and the low 64 bits of each digest are what
vLLM publishes in its KV events (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the default).

Times (``from``, ``until``): ``"start"`` (``from`` only: from the start of the run), an ISO 8601
time with a timezone, or Unix seconds. They are compared with the engine's own batch times
(vLLM stamps each event batch with ``time.time()``): a claim takes force before the first batch
stamped at or after its ``from``.

NOTE: only full blocks are hashed (vLLM caches only full blocks); LoRA adapters, multimodal
inputs and ``cache_salt`` change vLLM's ``extra_keys`` and are not supported here (declare such
content by ``block_hashes``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from kvclaims.contract.schema import InputError, hash64
from kvclaims.contract.vocabulary import PROTECTION_MODES
from kvclaims.contract.trace_writer import open_regular

HASH_ALGOS: Final[tuple[str, ...]] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
# vLLM's NONE_HASH seed for the cryptographic algorithms when PYTHONHASHSEED is not set
# (vllm/v1/core/kv_cache_utils.py: DEFAULT_NONE_HASH_SEED). The xxhash algorithms draw a random
# seed per process unless PYTHONHASHSEED is set: their hashes can only be reproduced with it.
DEFAULT_NONE_HASH_SEED: Final[str] = "vllm-none-hash"
DEFAULT_MODE: Final[str] = "hard_protected"  # the native policy's default (kvclaims/contract/policies.py)
START: Final[int] = -1  # wall time of "from": "start" (before any batch)

_FIELDS: Final[frozenset[str]] = frozenset({
    "claim_id", "tenant", "mode", "threshold_blocks", "from", "until", "ttl_s", "value",
    "token_ids", "text", "tokenizer", "add_special_tokens", "block_hashes"})
_CONTENT: Final[tuple[str, ...]] = ("token_ids", "text", "block_hashes")


# -- vLLM's block-hash scheme -----------------------------------------------------------------

def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's ``--prefix-caching-hash-algo`` function, reimplemented (vllm/utils/hashing.py) so
    the listener needs no vLLM; tests compare it with vLLM's own ``hash_block_tokens``."""
    if algo == "sha256":
        return lambda obj: hashlib.sha256(
            pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    if algo == "sha256_cbor":
        cbor2 = _optional("cbor2", algo)
        return lambda obj: hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    if algo in ("xxhash", "xxhash_cbor"):
        xxh = _optional("xxhash", algo)
        if algo == "xxhash":
            return lambda obj: xxh.xxh3_128_digest(
                pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        cbor2 = _optional("cbor2", algo)
        return lambda obj: xxh.xxh3_128_digest(cbor2.dumps(obj, canonical=True))
    raise InputError(f"unknown hash algorithm {algo!r}; choose one of {list(HASH_ALGOS)}")


def _optional(module: str, algo: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError(f"hash algorithm {algo} needs the Python package {module!r} "
                         f"(pip install {module})") from None


@dataclass(frozen=True)
class HashScheme:
    """One engine's block-hash scheme: algorithm, NONE_HASH seed, block size."""

    algo: str = "sha256"
    seed: str = DEFAULT_NONE_HASH_SEED

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fn", hash_function(self.algo))
        object.__setattr__(self, "_none", self._fn(self.seed))  # type: ignore[attr-defined]

    def block(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        """The full digest of one block (``hash_block_tokens`` with no extra keys)."""
        return self._fn((parent or self._none, tuple(tokens), None))  # type: ignore[attr-defined]

    def chain(self, token_ids: Sequence[int], block_size: int) -> list[bytes]:
        """Full digests of every *full* block of ``token_ids``, position 0 first."""
        out: list[bytes] = []
        parent: bytes | None = None
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = self.block(parent, token_ids[start:start + block_size])
            out.append(parent)
        return out

    def chain64(self, token_ids: Sequence[int], block_size: int) -> list[int]:
        """The 64-bit hashes vLLM publishes for the full blocks of ``token_ids``."""
        return [hash64(d) for d in self.chain(token_ids, block_size)]

    def describe(self) -> dict[str, Any]:
        """For the manifest; the seed is named only when it is vLLM's public default."""
        return {"algo": self.algo, "seed": ("default" if self.seed == DEFAULT_NONE_HASH_SEED
                                            else "operator-supplied")}


# -- the claims file --------------------------------------------------------------------------

@dataclass
class DeclaredClaim:
    """One claim of the claims file (``where``: FILE:LINE for messages)."""

    claim_id: str
    tenant: str
    mode: str
    threshold_blocks: int | None
    from_ns: int  # wall-clock ns, or START
    until_ns: int | None
    ttl_s: float | None
    value: float | None
    token_ids: list[int] | None = None
    block_hashes: list[int] | None = None
    text: str | None = None
    tokenizer: str | None = None
    add_special_tokens: bool = True
    where: str = ""
    _hashes: list[int] | None = field(default=None, repr=False)

    def hashes(self, scheme: HashScheme, block_size: int | None,
               default_tokenizer: str | None = None) -> list[int]:
        """The claim's 64-bit block hashes by position (computed once)."""
        if self._hashes is not None:
            return self._hashes
        if self.block_hashes is not None:
            hashes = list(self.block_hashes)
        else:
            if block_size is None:
                raise InputError(f"{self.where}: the block size is not known yet")
            tokens = self.token_ids
            if tokens is None:
                tokens = tokenize(self.text or "", self.tokenizer or default_tokenizer,
                                  self.add_special_tokens, self.where)
            hashes = scheme.chain64(tokens, block_size)
            if not hashes:
                raise InputError(f"{self.where}: claimed content is shorter than one block "
                                 f"({len(tokens)} tokens, block size {block_size})")
        if self.threshold_blocks is not None and self.threshold_blocks > len(hashes):
            raise InputError(f"{self.where}: threshold_blocks {self.threshold_blocks} exceeds "
                             f"the {len(hashes)} full blocks of the claimed content")
        self._hashes = hashes
        return hashes


def tokenize(text: str, tokenizer: str | None, add_special_tokens: bool, where: str) -> list[int]:
    """Token ids of ``text`` with a tokenizer from a local folder (never downloaded)."""
    if not tokenizer:
        raise InputError(f"{where}: 'text' needs a local 'tokenizer' folder (or --tokenizer)")
    if not Path(tokenizer).is_dir():
        raise InputError(f"{where}: tokenizer folder {tokenizer} does not exist")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure is one line for the user
        raise InputError(f"{where}: cannot load tokenizer {tokenizer}: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    return list(tok(text, add_special_tokens=add_special_tokens)["input_ids"])


def parse_time(value: Any, name: str, where: str) -> int:
    """``"start"``, ISO 8601 with a timezone, or Unix seconds -> wall-clock ns."""
    if value == "start" and name == "from":
        return START
    if isinstance(value, bool):
        raise InputError(f"{where}: '{name}' must be a time, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise InputError(f"{where}: '{name}' must be Unix seconds >= 0, got {value!r}")
        return int(value * 1e9)
    if isinstance(value, datetime):  # YAML parses timestamps itself
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"{where}: '{name}' is not a time: {value!r} (use \"start\", "
                             "ISO 8601 with a timezone, or Unix seconds)") from None
    else:
        raise InputError(f"{where}: '{name}' must be a time, got {type(value).__name__}")
    if dt.tzinfo is None:
        raise InputError(f"{where}: '{name}' {value!r} has no timezone (add Z or +00:00)")
    return int(dt.timestamp() * 1_000_000) * 1000


def _int_list(value: Any, name: str, where: str, lo: int, hi: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: '{name}' must be a non-empty list of integers")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < hi:
            raise InputError(f"{where}: '{name}' holds {v!r}, not an integer in [{lo}, {hi})")
    return list(value)


def parse_claim(obj: Any, where: str) -> DeclaredClaim:
    """Validate one claims-file entry; every error is one line naming FILE:LINE and the field."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (fields: {sorted(_FIELDS)})")
    for key in ("claim_id", "tenant"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise InputError(f"{where}: '{key}' must be a non-empty string")
    mode = obj.get("mode", DEFAULT_MODE)
    if mode not in PROTECTION_MODES:
        raise InputError(f"{where}: 'mode' {mode!r} is not one of {list(PROTECTION_MODES)}")
    threshold = obj.get("threshold_blocks")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int)
                                  or not 1 <= threshold < 2**31):
        raise InputError(f"{where}: 'threshold_blocks' must be an integer >= 1")
    given = [k for k in _CONTENT if obj.get(k) is not None]
    if len(given) != 1:
        raise InputError(f"{where}: give exactly one of {list(_CONTENT)} (got {given or 'none'})")
    ttl, value = obj.get("ttl_s"), obj.get("value")
    for key, num in (("ttl_s", ttl), ("value", value)):
        if num is not None and (isinstance(num, bool) or not isinstance(num, (int, float))
                                or not math.isfinite(num) or num < 0):
            raise InputError(f"{where}: '{key}' must be a finite number >= 0")
    if mode == "expiring" and ttl is None:
        raise InputError(f"{where}: mode 'expiring' needs 'ttl_s'")
    from_ns = parse_time(obj.get("from", "start"), "from", where)
    until_ns = None if obj.get("until") is None else parse_time(obj["until"], "until", where)
    if until_ns is not None and until_ns <= from_ns:
        raise InputError(f"{where}: 'until' is not after 'from'")
    text = obj.get("text")
    if text is not None and not isinstance(text, str):
        raise InputError(f"{where}: 'text' must be a string")
    tokenizer = obj.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, str):
        raise InputError(f"{where}: 'tokenizer' must be a folder path")
    special = obj.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise InputError(f"{where}: 'add_special_tokens' must be true or false")
    return DeclaredClaim(
        claim_id=obj["claim_id"], tenant=obj["tenant"], mode=mode, threshold_blocks=threshold,
        from_ns=from_ns, until_ns=until_ns,
        ttl_s=None if ttl is None else float(ttl), value=None if value is None else float(value),
        token_ids=(None if obj.get("token_ids") is None
                   else _int_list(obj["token_ids"], "token_ids", where, 0, 2**31)),
        block_hashes=(None if obj.get("block_hashes") is None
                      else _int_list(obj["block_hashes"], "block_hashes", where, 0, 2**64)),
        text=text, tokenizer=tokenizer, add_special_tokens=special, where=where)


def load_claims(path: str | Path) -> list[DeclaredClaim]:
    """Read a claims file: JSON Lines (one object per line), or YAML (``.yaml``/``.yml``: a
    list of objects, or ``{claims: [...]}``). Raises ``InputError`` (one line) on any fault."""
    p = Path(path)
    try:
        with open(open_regular(p), encoding="utf-8") as fh:   # NOTE: never waits on a FIFO
            text = fh.read(64 * 1024 * 1024)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read claims file: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    entries: list[tuple[str, Any]] = []
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml

            doc = yaml.safe_load(text)
        except ImportError:
            raise InputError(f"{p}: YAML claims files need PyYAML (pip install pyyaml)") from None
        except Exception as exc:  # noqa: BLE001 - yaml.YAMLError and friends
            raise InputError(f"{p}: invalid YAML: {str(exc).splitlines()[0]}") from None
        if isinstance(doc, dict) and "claims" in doc:
            doc = doc["claims"]
        if not isinstance(doc, list):
            raise InputError(f"{p}: expected a list of claims (or 'claims:' with one)")
        entries = [(f"{p}: claim #{i}", obj) for i, obj in enumerate(doc, start=1)]
    else:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            where = f"{p}:{lineno}"
            try:
                entries.append((where, json.loads(line)))
            except ValueError as exc:
                raise InputError(f"{where}: invalid JSON: {exc}") from None
    claims = [parse_claim(obj, where) for where, obj in entries]
    if not claims:
        raise InputError(f"{p}: no claims in the file")
    seen: dict[str, str] = {}
    for c in claims:
        if c.claim_id in seen:
            raise InputError(f"{c.where}: claim_id {c.claim_id!r} already declared at "
                             f"{seen[c.claim_id]}")
        seen[c.claim_id] = c.where
    return claims


# -- claims as events -------------------------------------------------------------------------

@dataclass(order=True)
class Action:
    """Something a claim does at a wall time: start (submit/accept/bind), expire, release."""

    wall_ns: int
    order: int
    kind: str = field(compare=False)
    claim: DeclaredClaim = field(compare=False)


def schedule(claims: Sequence[DeclaredClaim], start_wall_ns: int) -> list[Action]:
    """Every claim's actions, in time order (ties: file order; start before its own end).

    ``start_wall_ns``: when the run started (the base of ``ttl_s`` for ``"from": "start"``).
    """
    actions: list[Action] = []
    for i, c in enumerate(claims):
        actions.append(Action(c.from_ns, 3 * i, "start", c))
        if c.mode == "expiring" and c.ttl_s is not None:
            base = start_wall_ns if c.from_ns == START else c.from_ns
            actions.append(Action(base + int(c.ttl_s * 1e9), 3 * i + 1, "expire", c))
        if c.until_ns is not None:
            actions.append(Action(c.until_ns, 3 * i + 2, "release", c))
    return sorted(actions)


def action_events(action: Action, hashes: list[int] | None) -> list[tuple[str, dict[str, Any]]]:
    """The events one action writes (``hashes``: the claim's chain, for ``start``).

    NOTE: a declared claim has no request (``request_id`` NULL): it was declared beside the
    engine, not by a request the engine saw. Nothing enforced it, so the run's policy is
    ``native``: a loss that breaks its predicate while in force is harm.
    """
    c = action.claim
    if action.kind == "start":
        assert hashes is not None
        out: list[tuple[str, dict[str, Any]]] = [
            ("claim_submitted", {"claim_id": c.claim_id, "tenant": c.tenant,
                                 "protection_mode": c.mode,
                                 "threshold_blocks": c.threshold_blocks or len(hashes),
                                 "ttl_s": c.ttl_s, "value": c.value}),
            ("claim_accepted", {"claim_id": c.claim_id})]
        out += [("claim_bound", {"claim_id": c.claim_id, "block_hash": h, "position": pos})
                for pos, h in enumerate(hashes)]
        return out
    if action.kind == "expire":
        return [("claim_expired", {"claim_id": c.claim_id, "reason": "ttl_s elapsed"})]
    return [("claim_released", {"claim_id": c.claim_id, "reason": "until (claims file)",
                                "released_by": "operator"})]
