"""Is the difference between two runs real? Statistics for runs over the same environments.

Reads `EpisodeRecord`s only; no model is ever called. The distributions come from scipy.stats.

- `logrank(a, b)`: the log-rank test between two runs' survival curves. The event is a CONFLICT
  at the episode's turn count; SURVIVAL, SUCCESS and ERROR are censored there (the Kaplan–Meier
  convention of `ncpbench.survival`). Returns the chi-square statistic (1 degree of freedom) and
  its p-value.
- `paired_differences(a, b)`: per environment, each run's mean of a metric over its scored
  replicates; the difference b − a averaged over the environments both runs scored; a percentile
  interval from a paired bootstrap over environments (environments drawn with replacement, the same
  draws for every metric, seeded, so the same records always give the same interval). The metrics:
  the published survival at t (share of episodes whose turn count is at least t), trajectory
  progress, satisfied share, and the conflict rates.
- `cohen_kappa(x, y)`: agreement of two labelings beyond chance (two auditors judging the same turns).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ncpbench.record import EpisodeRecord
from ncpbench.state import Outcome

DEFAULT_RESAMPLES = 2000
PAIRED_TURNS = (10, 20)


@dataclass(frozen=True)
class LogRank:
    statistic: float
    """Chi-square with one degree of freedom."""
    p_value: float
    n_a: int
    n_b: int


@dataclass(frozen=True)
class Difference:
    """Run b minus run a, averaged over the environments both scored, with a bootstrap interval."""

    metric: str
    value: float
    low: float
    high: float
    environments: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def logrank(a: Sequence[EpisodeRecord], b: Sequence[EpisodeRecord]) -> LogRank | None:
    """The log-rank test of two runs' survival curves; None when either run has no episode or no
    conflict happened in either (nothing to compare)."""
    from scipy import stats

    def data(records: Sequence[EpisodeRecord]) -> tuple[list[int], list[int]]:
        events = [r.turns for r in records if r.outcome is Outcome.CONFLICT]
        censored = [r.turns for r in records if r.outcome is not Outcome.CONFLICT]
        return events, censored

    (ea, ca), (eb, cb) = data(a), data(b)
    if not a or not b or not (ea or eb):
        return None
    result = stats.logrank(stats.CensoredData(uncensored=ea, right=ca), stats.CensoredData(uncensored=eb, right=cb))
    # scipy reports the signed normal statistic; its square is the usual chi-square (1 df).
    return LogRank(statistic=float(result.statistic) ** 2, p_value=float(result.pvalue), n_a=len(a), n_b=len(b))


def _episode_metrics(r: EpisodeRecord, turns_at: Sequence[int]) -> dict[str, float]:
    conflict = r.outcome is Outcome.CONFLICT
    out = {f"survival_at_{t}": float(r.turns >= t) for t in turns_at}
    out |= {"progress": r.progress, "satisfied": r.satisfied_share, "conflict_rate": float(conflict)}
    for kind in ("fact", "commitment", "player_input"):
        out[f"{kind}_conflict_rate"] = float(conflict and kind in r.conflict_kinds)
    return out


def per_environment(records: Iterable[EpisodeRecord], turns_at: Sequence[int] = PAIRED_TURNS
                    ) -> dict[str, dict[str, float]]:
    """Each environment's mean of every metric over its scored (non-ERROR) episodes."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in records:
        if r.outcome is not Outcome.ERROR:
            groups[r.env_id].append(_episode_metrics(r, turns_at))
    return {env: {k: float(np.mean([m[k] for m in ms])) for k in ms[0]} for env, ms in groups.items()}


def paired_differences(a: Iterable[EpisodeRecord], b: Iterable[EpisodeRecord], *,
                       turns_at: Sequence[int] = PAIRED_TURNS, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                       confidence: float = 0.95) -> list[Difference]:
    """b − a per metric, paired by environment (see the module docstring). Survival at t is only
    compared for t within both runs' turn limits."""
    a, b = list(a), list(b)
    limit = min((r.max_turns for r in [*a, *b]), default=0)
    turns_at = [t for t in turns_at if t <= limit]
    ea, eb = per_environment(a, turns_at), per_environment(b, turns_at)
    envs = sorted(set(ea) & set(eb))
    if not envs:
        return []
    metrics = list(ea[envs[0]])
    diffs: npt.NDArray[np.float64] = np.array([[eb[e][m] - ea[e][m] for m in metrics] for e in envs])
    means = diffs.mean(axis=0)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(envs), size=(resamples, len(envs)))
    boot = diffs[picks].mean(axis=1)  # (resamples, metrics)
    alpha = (1.0 - confidence) / 2
    lows, highs = np.quantile(boot, alpha, axis=0), np.quantile(boot, 1.0 - alpha, axis=0)
    return [Difference(metric=m, value=float(means[j]), low=min(float(lows[j]), float(means[j])),
                       high=max(float(highs[j]), float(means[j])), environments=len(envs))
            for j, m in enumerate(metrics)]


def cohen_kappa(x: Sequence[object], y: Sequence[object]) -> float:
    """Cohen's κ of two labelings of the same items: (p_o − p_e) / (1 − p_e). 1 when both labelings
    are one and the same constant (perfect agreement, no chance term to beat); NaN with no items."""
    if len(x) != len(y):
        raise ValueError(f"two labelings of different lengths ({len(x)} and {len(y)})")
    n = len(x)
    if n == 0:
        return math.nan
    observed = sum(p == q for p, q in zip(x, y, strict=True)) / n
    labels = set(x) | set(y)
    expected = sum((sum(p == lab for p in x) / n) * (sum(q == lab for q in y) / n) for lab in labels)
    if expected == 1.0:
        return 1.0
    return (observed - expected) / (1.0 - expected)
