"""Comparing runs: the log-rank test, paired differences over environments, Cohen's κ — against
textbook examples and hand-computed cases."""

from __future__ import annotations

import math

import pytest

from ncpbench.compare import cohen_kappa, logrank, paired_differences, per_environment
from ncpbench.record import EpisodeRecord
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState, Outcome


def rec(tiny: Spec, outcome: str, turns: int, env: str = "tiny", *, progress: float = 0.0, limit: int = 40,
        kinds: tuple[str, ...] = ()) -> EpisodeRecord:
    return EpisodeRecord(env_id=env, title=env, genres=[], outcome=Outcome(outcome), turns=turns, max_turns=limit,
                         progress=progress, satisfied_share=0.0, conflict_kinds=list(kinds),
                         final_state=EpisodeState.initial(tiny))


def test_logrank_reproduces_the_textbook_leukaemia_remission_example(tiny: Spec) -> None:
    # Freireich's 6-MP trial as worked in survival-analysis textbooks (weeks of remission; + = censored):
    # the log-rank chi-square is 16.79 on 1 df.
    treated = [6, 6, 6, 7, 10, 13, 16, 22, 23]
    treated_censored = [6, 9, 10, 11, 17, 19, 20, 25, 32, 32, 34, 35]
    placebo = [1, 1, 2, 2, 3, 4, 4, 5, 5, 8, 8, 8, 8, 11, 11, 12, 12, 15, 17, 22, 23]
    a = [rec(tiny, "CONFLICT", t) for t in treated] + [rec(tiny, "SURVIVAL", t) for t in treated_censored]
    b = [rec(tiny, "CONFLICT", t) for t in placebo]
    result = logrank(a, b)
    assert result is not None and result.statistic == pytest.approx(16.79, abs=0.01)
    assert result.p_value == pytest.approx(4.17e-5, rel=0.02)


def test_logrank_censors_success_and_error_and_needs_an_event(tiny: Spec) -> None:
    same = [rec(tiny, "CONFLICT", 3), rec(tiny, "SUCCESS", 5), rec(tiny, "ERROR", 2)]
    result = logrank(same, same)
    assert result is not None and result.statistic == pytest.approx(0.0, abs=1e-12) and result.p_value == 1.0
    assert logrank([rec(tiny, "SURVIVAL", 5)], [rec(tiny, "SUCCESS", 2)]) is None


def test_paired_differences_average_per_environment_means_and_skip_errors(tiny: Spec) -> None:
    a = [rec(tiny, "CONFLICT", 4, "x", progress=0.2), rec(tiny, "SURVIVAL", 40, "x", progress=0.4),
         rec(tiny, "CONFLICT", 12, "y", progress=0.5), rec(tiny, "ERROR", 1, "y")]
    b = [rec(tiny, "SURVIVAL", 40, "x", progress=0.6), rec(tiny, "SURVIVAL", 40, "x", progress=0.6),
         rec(tiny, "CONFLICT", 25, "y", progress=0.5), rec(tiny, "SUCCESS", 8, "z")]
    assert per_environment(a)["x"]["survival_at_10"] == 0.5 and per_environment(a)["y"]["survival_at_10"] == 1.0
    diffs = {d.metric: d for d in paired_differences(a, b, resamples=500)}
    # only x and y are in both runs; survival@10: x 1.0-0.5, y 1.0-1.0 -> mean 0.25
    assert diffs["survival_at_10"].value == pytest.approx(0.25) and diffs["survival_at_10"].environments == 2
    # survival@20: x 1.0-0.5, y 1.0-0.0 -> 0.75; progress: x 0.6-0.3, y 0 -> 0.15
    assert diffs["survival_at_20"].value == pytest.approx(0.75)
    assert diffs["progress"].value == pytest.approx(0.15)
    assert diffs["conflict_rate"].value == pytest.approx((0 - 0.5 + 1 - 1) / 2)
    for d in diffs.values():
        assert d.low <= d.value <= d.high


def test_paired_bootstrap_is_deterministic_under_a_seed(tiny: Spec) -> None:
    a = [rec(tiny, "CONFLICT", t, f"e{t}", progress=(t * 37 % 100) / 100) for t in range(1, 30)]
    b = [rec(tiny, "CONFLICT", t + (t % 3) * 5, f"e{t}", progress=(t * 53 % 100) / 100) for t in range(1, 30)]
    one = paired_differences(a, b, seed=7)
    assert one == paired_differences(a, b, seed=7)
    progress = [next(d for d in paired_differences(a, b, seed=s) if d.metric == "progress") for s in (7, 8)]
    assert progress[0].value == progress[1].value and progress[0].low != progress[1].low


def test_survival_beyond_either_run_limit_is_not_compared(tiny: Spec) -> None:
    a = [rec(tiny, "SURVIVAL", 15, limit=15)]
    b = [rec(tiny, "SURVIVAL", 15, limit=15)]
    metrics = {d.metric for d in paired_differences(a, b)}
    assert "survival_at_10" in metrics and "survival_at_20" not in metrics


def test_cohen_kappa_of_the_textbook_two_rater_table() -> None:
    # 50 items: both yes 20, yes/no 5, no/yes 10, both no 15 -> p_o 0.7, p_e 0.5, kappa 0.4
    x = ["yes"] * 25 + ["no"] * 25
    y = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(x, y) == pytest.approx(0.4)
    assert cohen_kappa(["a", "b"], ["a", "b"]) == 1.0 and cohen_kappa(["a"], ["a"]) == 1.0
    assert math.isnan(cohen_kappa([], []))
    with pytest.raises(ValueError, match="different lengths"):
        cohen_kappa(["a"], [])
