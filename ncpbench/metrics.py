"""Benchmark metrics computed from episode records (DESIGN.md, "Metrics").

Reads `EpisodeRecord`s only (no model layer, agents or auditors). For a group of episodes — a
run, one environment, or one genre (an environment with two genres counts in both) —
`summarize` gives:

- average turns per episode (the conflicting turn counts);
- trajectory progress: completed / total nodes, averaged over episodes;
- satisfied commitments: satisfied / total commitments, averaged over episodes;
- fact / commitment / player-input conflict rate: the share of episodes that ended with a
  confirmed conflict of that kind (kinds can co-occur, so the rates can add up to more than the
  conflict share);
- conflict-free episodes: the count of episodes that did not end in CONFLICT;
- survival at turn t (the published definition): the share of scored episodes whose turn count is
  at least t. A conflict exactly at turn t still counts as alive at t; a SUCCESS that ended before
  t counts as not alive. Reported only for t up to the smallest turn limit of the group (None
  beyond it: no episode can reach a turn past its limit);
- beyond the paper, a Kaplan–Meier curve (`ncpbench.survival`: the event is a CONFLICT; SURVIVAL,
  SUCCESS and ERROR are censored at their turn count) with its median and restricted mean
  survival time up to a horizon (default: the group's turn limit).

ERROR episodes (infrastructure failures: an endpoint that kept failing, output that stayed
invalid) say nothing about the narrator, so they are **excluded** from every average, rate,
count and survival-at-t share above and reported separately (`errors`); `scored` is the number
of episodes the averages are over. In the Kaplan–Meier curve they are kept as observations
censored at the turn they reached, like SUCCESS, since up to that turn the narrator did survive.

Confidence intervals for the averages and shares are seeded percentile bootstraps (2000
resamples by default; episodes resampled with replacement, the same resamples for every metric
of a group), so the same records always give the same intervals.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ncpbench.record import EpisodeRecord
from ncpbench.state import Outcome
from ncpbench.survival import KaplanMeier, kaplan_meier

CONFLICT_KINDS = ("fact", "commitment", "player_input")
OUTCOMES = ("CONFLICT", "SUCCESS", "SURVIVAL", "ERROR")
SURVIVAL_TURNS = (5, 10, 20, 50, 100)
DEFAULT_RESAMPLES = 2000
NO_GENRE = "(none)"


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap percentile interval."""

    value: float
    low: float
    high: float
    n: int
    """Episodes it is computed over."""

    def as_dict(self) -> dict[str, float | int]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}


@dataclass(frozen=True)
class Summary:
    """Every metric of one group of episodes."""

    episodes: int
    """All episodes, ERROR ones included."""
    errors: int
    """ERROR episodes: excluded from the averages, censored in the Kaplan–Meier curve."""
    scored: int
    """Episodes the averages are over (episodes - errors)."""
    outcomes: dict[str, int]
    avg_turns: Estimate | None
    progress: Estimate | None
    satisfied: Estimate | None
    conflict_rates: dict[str, Estimate | None]
    conflict_free: int
    survival_at: dict[int, Estimate | None]
    km: KaplanMeier
    km_median: float | None
    rmst: float | None
    horizon: int
    """The RMST horizon (turns)."""
    max_turns: int
    """The largest turn limit in the group."""
    confidence: float = 0.95
    genres: list[str] = field(default_factory=list)
    env_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view (the curve as lists)."""
        def est(e: Estimate | None) -> dict[str, float | int] | None:
            return e.as_dict() if e is not None else None

        return {
            "episodes": self.episodes, "errors": self.errors, "scored": self.scored,
            "outcomes": dict(self.outcomes),
            "avg_turns": est(self.avg_turns), "progress": est(self.progress), "satisfied": est(self.satisfied),
            "conflict_rates": {k: est(v) for k, v in self.conflict_rates.items()},
            "conflict_free": self.conflict_free,
            "survival_at": {str(t): est(v) for t, v in self.survival_at.items()},
            "km": {"times": self.km.times.tolist(), "at_risk": self.km.at_risk.tolist(),
                   "events": self.km.events.tolist(), "censored": self.km.censored.tolist(),
                   "survival": self.km.survival.tolist(), "lower": self.km.lower.tolist(),
                   "upper": self.km.upper.tolist(), "confidence": self.km.confidence},
            "km_median": self.km_median, "rmst": self.rmst, "horizon": self.horizon,
            "max_turns": self.max_turns, "confidence": self.confidence,
            "genres": list(self.genres), "env_ids": list(self.env_ids),
        }


def survival_turns(max_turns: int, candidates: Sequence[int] = SURVIVAL_TURNS) -> tuple[int, ...]:
    """The turns to report survival at: the candidates up to the limit, plus the limit itself."""
    if max_turns <= 0:
        return ()
    return tuple(sorted({t for t in candidates if 0 < t <= max_turns} | {max_turns}))


def bootstrap_means(columns: npt.NDArray[np.float64], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                    confidence: float = 0.95) -> list[Estimate]:
    """Mean and percentile interval of every column of an (episodes x metrics) matrix.

    Each resample draws n episodes with replacement (kept as per-episode counts, in chunks so
    memory stays small for large runs); every column shares the same resamples.
    """
    n, k = columns.shape
    if n == 0:
        return [Estimate(math.nan, math.nan, math.nan, 0) for _ in range(k)]
    means = columns.mean(axis=0)
    if resamples <= 0 or n == 1:
        return [Estimate(float(m), float(m), float(m), n) for m in means]
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, 2_000_000 // n))
    parts = []
    done = 0
    while done < resamples:
        size = min(chunk, resamples - done)
        picks = rng.integers(0, n, size=(size, n)) + (np.arange(size) * n)[:, None]
        counts = np.bincount(picks.ravel(), minlength=size * n).reshape(size, n).astype(np.float64)
        parts.append(counts @ columns / n)
        done += size
    boot = np.concatenate(parts, axis=0)
    alpha = (1.0 - confidence) / 2
    lows = np.quantile(boot, alpha, axis=0)
    highs = np.quantile(boot, 1.0 - alpha, axis=0)
    constant = np.ptp(columns, axis=0) == 0
    out = []
    for j in range(k):
        if constant[j]:  # exact, without float noise from the resampled sums
            v = float(columns[0, j])
            out.append(Estimate(v, v, v, n))
        else:
            m = float(means[j])
            out.append(Estimate(m, min(float(lows[j]), m), max(float(highs[j]), m), n))
    return out


def summarize(records: Iterable[EpisodeRecord], *, at: Sequence[int] | None = None, horizon: int | None = None,
              resamples: int = DEFAULT_RESAMPLES, seed: int = 0, confidence: float = 0.95) -> Summary:
    """All metrics of one group of episodes (see the module docstring for the definitions).

    `at`: turns for survival at t (default: `survival_turns` of the largest limit);
    `horizon`: the RMST horizon (default: the largest limit).
    """
    recs = list(records)
    scored = [r for r in recs if r.outcome is not Outcome.ERROR]
    max_turns = max((r.max_turns for r in recs), default=0)
    min_limit = min((r.max_turns for r in scored), default=0)
    turns_at = tuple(at) if at is not None else survival_turns(max_turns)
    outcomes = {o: sum(r.outcome.value == o for r in recs) for o in OUTCOMES}

    turns = np.array([r.turns for r in scored], dtype=np.int64)
    dead = np.array([r.outcome is Outcome.CONFLICT for r in scored], dtype=bool)
    cols: list[npt.NDArray[np.float64]] = [
        turns.astype(np.float64),
        np.array([r.progress for r in scored], dtype=np.float64),
        np.array([r.satisfied_share for r in scored], dtype=np.float64),
    ]
    for kind in CONFLICT_KINDS:
        cols.append(np.array([r.outcome is Outcome.CONFLICT and kind in r.conflict_kinds for r in scored],
                             dtype=np.float64))
    valid_at = [t for t in turns_at if scored and t <= min_limit]
    for t in valid_at:  # the published survival at t (`ncpbench.survival.alive_share`), per episode
        cols.append((turns >= t).astype(np.float64))
    matrix = np.column_stack(cols) if scored else np.zeros((0, len(cols)))
    ests: list[Estimate | None] = list(bootstrap_means(matrix, resamples=resamples, seed=seed, confidence=confidence))
    if not scored:
        ests = [None] * len(cols)

    km = kaplan_meier([r.turns for r in recs], [r.outcome is Outcome.CONFLICT for r in recs], confidence=confidence)
    h = horizon if horizon is not None else max_turns
    return Summary(
        episodes=len(recs),
        errors=outcomes["ERROR"],
        scored=len(scored),
        outcomes=outcomes,
        avg_turns=ests[0],
        progress=ests[1],
        satisfied=ests[2],
        conflict_rates=dict(zip(CONFLICT_KINDS, ests[3:3 + len(CONFLICT_KINDS)], strict=True)),
        conflict_free=int(len(scored) - dead.sum()),
        survival_at={t: (ests[3 + len(CONFLICT_KINDS) + valid_at.index(t)] if t in valid_at else None)
                     for t in turns_at},
        km=km,
        km_median=km.median,
        rmst=km.rmst(h) if recs else None,
        horizon=h,
        max_turns=max_turns,
        confidence=confidence,
        genres=sorted({g for r in recs for g in (r.genres or [NO_GENRE])}),
        env_ids=sorted({r.env_id for r in recs}),
    )


def group_by(records: Iterable[EpisodeRecord], keys: Callable[[EpisodeRecord], Iterable[str]]
             ) -> dict[str, list[EpisodeRecord]]:
    """Records per key, keys sorted; a record with several keys lands in each group."""
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for r in records:
        for k in dict.fromkeys(keys(r)):
            groups[k].append(r)
    return {k: groups[k] for k in sorted(groups)}


def summarize_by_env(records: Iterable[EpisodeRecord], **kw: Any) -> dict[str, Summary]:
    """`summarize` per environment id."""
    return {k: summarize(v, **kw) for k, v in group_by(records, lambda r: [r.env_id]).items()}


def summarize_by_genre(records: Iterable[EpisodeRecord], **kw: Any) -> dict[str, Summary]:
    """`summarize` per genre: an environment with two genres counts in both."""
    return {k: summarize(v, **kw) for k, v in group_by(records, lambda r: r.genres or [NO_GENRE]).items()}
