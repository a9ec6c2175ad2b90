"""Survival analysis of episodes: Kaplan–Meier curves, their bands, median and restricted mean.

Our own implementation, pure numpy/math (no lifelines). Time is measured in turns. The event is a
CONFLICT ending at `turns` (the conflicting turn counts); every other ending is *censored* at its
turn count: SURVIVAL at the turn limit, SUCCESS when the story was finished early, ERROR when the
infrastructure failed (the callers count SUCCESS and ERROR separately).

- `kaplan_meier(times, events)`: the product-limit estimate S(t) = prod_{t_j <= t} (1 - d_j / n_j),
  where n_j episodes are at risk at t_j (time >= t_j) and d_j of them end in an event at t_j.
  At a tie, events come first: an episode censored at t_j is still at risk at t_j.
- Bands: log-log ("exponential Greenwood") pointwise bands. With Greenwood's
  V(t) = sum_{t_j <= t} d_j / (n_j (n_j - d_j)) and se = sqrt(V) / |log S(t)|, the band is
  [S^exp(+z se), S^exp(-z se)]; it stays inside [0, 1]. Where S = 1 (no event yet) the band is [1, 1];
  where S = 0 it is [0, 0].
- `median`: the smallest event time with S(t) <= 0.5, None when the curve never gets there.
- `rmst(horizon)`: the restricted mean survival time, the area under the step curve from 0 to the
  horizon (= E[min(T, horizon)]); without censoring it equals the mean of min(turns, horizon).
- `alive_share(times, t)`: the published "survival at turn t": the share of scored episodes whose
  turn count is at least t. An episode whose conflict comes exactly at turn t still counts at t (it
  lived to play turn t); a SUCCESS that ended before t does not. This is not the Kaplan–Meier
  S(t), which treats SUCCESS as censored; reports show both, each under its own name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

Z95 = 1.959963984540054
"""The two-sided 95% standard normal quantile."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class KaplanMeier:
    """A fitted product-limit curve: one row per distinct observed time (events or censorings)."""

    times: IntArray
    """Distinct observed times, ascending."""
    at_risk: IntArray
    """n_j: observations with time >= t_j."""
    events: IntArray
    """d_j: events (conflicts) at t_j."""
    censored: IntArray
    """c_j: censored observations at t_j."""
    survival: FloatArray
    """S(t_j), the curve just after t_j."""
    lower: FloatArray
    """Lower band at t_j (log-log, exponential Greenwood)."""
    upper: FloatArray
    """Upper band at t_j."""
    confidence: float = 0.95

    @property
    def n(self) -> int:
        return int(self.at_risk[0]) if len(self.at_risk) else 0

    @property
    def n_events(self) -> int:
        return int(self.events.sum())

    def _index(self, t: float) -> int:
        """Index of the last row with time <= t, or -1 before the first observed time."""
        return int(np.searchsorted(self.times, t, side="right")) - 1

    def at(self, t: float) -> float:
        """S(t): the share expected to be still alive after t turns (1.0 before the first event)."""
        i = self._index(t)
        return 1.0 if i < 0 else float(self.survival[i])

    def band_at(self, t: float) -> tuple[float, float]:
        i = self._index(t)
        return (1.0, 1.0) if i < 0 else (float(self.lower[i]), float(self.upper[i]))

    @property
    def median(self) -> float | None:
        """The smallest time at which S(t) <= 0.5; None when the curve never reaches 0.5."""
        hit = np.nonzero(self.survival <= 0.5 + 1e-12)[0]
        return float(self.times[hit[0]]) if len(hit) else None

    def rmst(self, horizon: float | None = None) -> float:
        """Area under S from 0 to the horizon (default: the largest observed time)."""
        if horizon is None:
            horizon = float(self.times[-1]) if len(self.times) else 0.0
        if horizon <= 0:
            return 0.0
        area, start, level = 0.0, 0.0, 1.0
        for t, s in zip(self.times.tolist(), self.survival.tolist(), strict=True):
            if t >= horizon:
                break
            area += level * (t - start)
            start, level = float(t), float(s)
        return area + level * (horizon - start)

    def steps(self, until: float | None = None) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(x, S, lower, upper) for a post-step plot starting at (0, 1) and ending at `until`."""
        end = float(until) if until is not None else (float(self.times[-1]) if len(self.times) else 0.0)
        keep = self.times <= end
        x = np.concatenate([[0.0], self.times[keep].astype(np.float64), [end]])
        s = np.concatenate([[1.0], self.survival[keep], [self.at(end)]])
        lo = np.concatenate([[1.0], self.lower[keep], [self.band_at(end)[0]]])
        hi = np.concatenate([[1.0], self.upper[keep], [self.band_at(end)[1]]])
        return x, s, lo, hi

    def censor_marks(self) -> tuple[FloatArray, FloatArray]:
        """(times, S at those times) of the censored observations, for tick marks."""
        mask = self.censored > 0
        return self.times[mask].astype(np.float64), self.survival[mask]


def _as_arrays(times: Sequence[int] | IntArray, events: Sequence[bool] | npt.NDArray[np.bool_]
               ) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    t = np.asarray(times, dtype=np.int64)
    e = np.asarray(events, dtype=bool)
    if t.shape != e.shape or t.ndim != 1:
        raise ValueError("times and events must be 1-d sequences of the same length")
    if len(t) and t.min() < 0:
        raise ValueError("times must be >= 0")
    return t, e


def kaplan_meier(times: Sequence[int] | IntArray, events: Sequence[bool] | npt.NDArray[np.bool_],
                 confidence: float = 0.95) -> KaplanMeier:
    """Fit the product-limit curve; `events[i]` is True when observation i ended in CONFLICT."""
    t, e = _as_arrays(times, events)
    z = Z95 if confidence == 0.95 else NormalDist().inv_cdf(0.5 + confidence / 2)
    distinct = np.unique(t)
    d = np.array([int(np.sum(e & (t == u))) for u in distinct], dtype=np.int64)
    c = np.array([int(np.sum(~e & (t == u))) for u in distinct], dtype=np.int64)
    n = np.array([int(np.sum(t >= u)) for u in distinct], dtype=np.int64)
    surv = np.empty(len(distinct), dtype=np.float64)
    lower = np.empty(len(distinct), dtype=np.float64)
    upper = np.empty(len(distinct), dtype=np.float64)
    s, greenwood = 1.0, 0.0
    for j in range(len(distinct)):
        nj, dj = int(n[j]), int(d[j])
        s *= 1.0 - dj / nj
        greenwood = math.inf if dj >= nj else greenwood + dj / (nj * (nj - dj))
        surv[j] = s
        if s <= 0.0:
            lower[j] = upper[j] = 0.0
        elif s >= 1.0:
            lower[j] = upper[j] = 1.0
        else:
            se = math.sqrt(greenwood) / abs(math.log(s))
            lower[j] = s ** math.exp(z * se)
            upper[j] = s ** math.exp(-z * se)
    return KaplanMeier(times=distinct.astype(np.int64), at_risk=n, events=d, censored=c,
                       survival=surv, lower=lower, upper=upper, confidence=confidence)


def alive_share(times: Sequence[int] | IntArray, t: int) -> float:
    """The published survival at turn t: the share of episodes whose turn count is at least t."""
    tt = np.asarray(times, dtype=np.int64)
    if not len(tt):
        return math.nan
    return float(np.mean(tt >= t))
