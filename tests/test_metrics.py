"""Metrics of DESIGN.md computed from episode records: definitions, ERROR handling, intervals, groups."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ncpbench.metrics import (
    NO_GENRE,
    bootstrap_means,
    summarize,
    summarize_by_env,
    summarize_by_genre,
    survival_turns,
)
from ncpbench.record import EpisodeRecord
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState, Outcome


def rec(tiny: Spec, outcome: str, turns: int, *, kinds: tuple[str, ...] = (), progress: float = 0.0,
        satisfied: float = 0.0, env: str = "tiny", genres: tuple[str, ...] = ("Mystery",), limit: int = 10,
        replicate: int = 0) -> EpisodeRecord:
    return EpisodeRecord(episode_id=f"{env}#{replicate}", env_id=env, title=env, genres=list(genres),
                         replicate=replicate, outcome=Outcome(outcome), turns=turns, max_turns=limit,
                         progress=progress, satisfied_share=satisfied, conflict_kinds=list(kinds),
                         error="boom" if outcome == "ERROR" else None, final_state=EpisodeState.initial(tiny))


@pytest.fixture
def five(tiny: Spec) -> list[EpisodeRecord]:
    return [
        rec(tiny, "CONFLICT", 2, kinds=("fact",), progress=0.25, satisfied=0.25),
        rec(tiny, "CONFLICT", 4, kinds=("commitment", "player_input"), progress=0.5, satisfied=0.0),
        rec(tiny, "SUCCESS", 5, progress=1.0, satisfied=1.0),
        rec(tiny, "SURVIVAL", 10, progress=0.75, satisfied=0.5),
        rec(tiny, "ERROR", 1, progress=0.0, satisfied=0.0),
    ]


def test_averages_and_rates_exclude_error_episodes_which_are_counted_separately(five: list[EpisodeRecord]) -> None:
    s = summarize(five)
    assert (s.episodes, s.errors, s.scored) == (5, 1, 4)
    assert s.outcomes == {"CONFLICT": 2, "SUCCESS": 1, "SURVIVAL": 1, "ERROR": 1}
    assert s.avg_turns is not None and s.avg_turns.value == (2 + 4 + 5 + 10) / 4 == 5.25
    assert s.progress is not None and s.progress.value == pytest.approx((0.25 + 0.5 + 1.0 + 0.75) / 4)
    assert s.satisfied is not None and s.satisfied.value == pytest.approx((0.25 + 0 + 1 + 0.5) / 4)
    assert s.conflict_free == 2, "SUCCESS and SURVIVAL; the ERROR episode is not counted"


def test_conflict_kinds_co_occur_so_rates_can_sum_past_the_conflict_share(five: list[EpisodeRecord]) -> None:
    rates = summarize(five).conflict_rates
    assert {k: v.value for k, v in rates.items() if v} == {"fact": 0.25, "commitment": 0.25, "player_input": 0.25}
    assert sum(v.value for v in rates.values() if v) == 0.75 > 2 / 4


def test_survival_at_t_is_the_published_share_whose_turn_count_reaches_t(five: list[EpisodeRecord]) -> None:
    s = summarize(five, at=[1, 2, 3, 4, 5, 6, 10, 11])
    got = {t: (e.value if e else None) for t, e in s.survival_at.items()}
    # scored (turns, outcome): (2, CONFLICT) (4, CONFLICT) (5, SUCCESS) (10, SURVIVAL); ERROR excluded.
    # A conflict exactly at t still counts at t; the SUCCESS at 5 counts at 5 but not at 6.
    assert got == {1: 1.0, 2: 1.0, 3: 0.75, 4: 0.75, 5: 0.5, 6: 0.25, 10: 0.25, 11: None}, \
        "beyond the turn limit: not observable"


def test_a_success_at_turn_three_is_not_alive_at_five_and_a_conflict_at_five_is(tiny: Spec) -> None:
    records = [rec(tiny, "SUCCESS", 3), rec(tiny, "CONFLICT", 5, kinds=("fact",)), rec(tiny, "ERROR", 2)]
    s = summarize(records, at=[3, 5, 6])
    assert {t: e.value for t, e in s.survival_at.items() if e} == {3: 1.0, 5: 0.5, 6: 0.0}
    assert s.scored == 2, "the ERROR episode is in no share"


def test_kaplan_meier_censors_error_success_and_survival(five: list[EpisodeRecord]) -> None:
    s = summarize(five)
    # observations: 1 ERROR(c), 2 C, 4 C, 5 SUCCESS(c), 10 SURVIVAL(c)
    assert s.km.n == 5 and s.km.n_events == 2
    assert s.km.at(2) == pytest.approx(1 - 1 / 4)                  # the ERROR left the risk set at 1
    assert s.km.at(4) == pytest.approx(0.75 * (1 - 1 / 3))          # 0.5
    assert s.km_median == 4.0
    # RMST up to the limit 10: 1*2 + 0.75*(4-2) + 0.5*(10-4) = 6.5
    assert s.horizon == 10 and s.rmst == pytest.approx(6.5)
    assert summarize(five, horizon=4).rmst == pytest.approx(2 + 0.75 * 2)


def test_default_survival_turns_go_up_to_the_limit() -> None:
    assert survival_turns(100) == (5, 10, 20, 50, 100)
    assert survival_turns(30) == (5, 10, 20, 30)
    assert survival_turns(3) == (3,)
    assert survival_turns(0) == ()


def test_intervals_contain_the_estimate_and_are_seeded(five: list[EpisodeRecord]) -> None:
    a, b = summarize(five, seed=7), summarize(five, seed=7)
    assert a.avg_turns == b.avg_turns and a.conflict_rates == b.conflict_rates
    for e in (a.avg_turns, a.progress, a.satisfied, *a.conflict_rates.values(), *a.survival_at.values()):
        assert e is not None and e.low <= e.value <= e.high and e.n == 4
    assert a.avg_turns is not None and 2 <= a.avg_turns.low < a.avg_turns.high <= 10
    c = summarize(five, seed=8)
    assert c.avg_turns is not None and c.avg_turns.value == a.avg_turns.value


def test_bootstrap_percentile_interval_has_the_expected_width() -> None:
    # 200 episodes, 60 of them with a conflict: SE = sqrt(.3*.7/200) = 0.0324, 95% ~ +-0.0635
    values = np.array([[1.0] * 60 + [0.0] * 140]).T
    (e,) = bootstrap_means(values, resamples=2000, seed=0)
    assert e.value == pytest.approx(0.3)
    assert e.low == pytest.approx(0.3 - 0.0635, abs=0.012) and e.high == pytest.approx(0.3 + 0.0635, abs=0.012)
    (const,) = bootstrap_means(np.full((50, 1), 0.4), seed=0)
    assert (const.low, const.value, const.high) == (0.4, 0.4, 0.4)


def test_bootstrap_works_in_chunks_for_large_runs() -> None:
    rng = np.random.default_rng(1)
    values = rng.random((5000, 2))
    est = bootstrap_means(values, resamples=1000, seed=3)
    assert all(e.low < e.value < e.high for e in est)
    assert est == bootstrap_means(values, resamples=1000, seed=3)


def test_only_error_episodes_give_no_averages(tiny: Spec) -> None:
    s = summarize([rec(tiny, "ERROR", 3), rec(tiny, "ERROR", 1)])
    assert s.scored == 0 and s.errors == 2 and s.avg_turns is None and s.conflict_rates["fact"] is None
    assert s.conflict_free == 0 and all(v is None for v in s.survival_at.values())
    assert s.km.n == 2 and s.km_median is None and s.rmst == 10.0


def test_no_records_at_all(tiny: Spec) -> None:
    s = summarize([])
    assert s.episodes == 0 and s.avg_turns is None and s.rmst is None and s.km.n == 0


def test_an_env_with_two_genres_counts_in_both(tiny: Spec) -> None:
    records = [rec(tiny, "CONFLICT", 1, kinds=("fact",), env="a", genres=("Drama", "Mystery")),
               rec(tiny, "SURVIVAL", 10, env="b", genres=("Mystery",)),
               rec(tiny, "SURVIVAL", 10, env="c", genres=())]
    by = summarize_by_genre(records)
    assert list(by) == ["(none)", "Drama", "Mystery"] and NO_GENRE == "(none)"
    assert by["Drama"].episodes == 1 and by["Mystery"].episodes == 2
    assert by["Mystery"].conflict_rates["fact"] is not None and by["Mystery"].conflict_rates["fact"].value == 0.5
    assert by["Drama"].env_ids == ["a"] and by["Mystery"].env_ids == ["a", "b"]


def test_per_environment_groups_replicates(tiny: Spec) -> None:
    records = [rec(tiny, "CONFLICT", 3, kinds=("fact",), env="a", replicate=0),
               rec(tiny, "SURVIVAL", 10, env="a", replicate=1), rec(tiny, "SUCCESS", 4, env="b")]
    by = summarize_by_env(records)
    assert list(by) == ["a", "b"] and by["a"].episodes == 2
    assert by["a"].avg_turns is not None and by["a"].avg_turns.value == 6.5


def test_summary_dict_is_plain_json(five: list[EpisodeRecord]) -> None:
    d = summarize(five).as_dict()
    again = json.loads(json.dumps(d))
    assert again["errors"] == 1 and again["km"]["times"] == [1, 2, 4, 5, 10]
    assert again["survival_at"]["10"]["value"] == 0.25
