"""`ncpbench rescore`: a finished run replayed through another auditor, and the agreement report.

The original run's auditor (a mock server) plants a conflict at turn 3; the new one at turn 2 and,
by a hash of the reply text (`conflict_rate`), on some other replies. The agreement figures are
computed here by hand from the two schedules and the recorded replies.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.record import EpisodeRecord
from ncpbench.reports import build_report
from ncpbench.rescore import rescore
from ncpbench.runner import Progress, run_batch

RATE = 0.25


def records(path: Path) -> dict[str, EpisodeRecord]:
    out = [EpisodeRecord.model_validate_json(x) for x in (path / "episodes.jsonl").read_text().splitlines() if x]
    return {r.episode_id: r for r in out}


def flagged(reply: str) -> bool:
    """The mock's conflict_rate rule: a hash of the reply's text."""
    return int(hashlib.sha256(reply.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < RATE


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("rescore")
    with MockServer(MockConfig(conflict_turns=frozenset({3}))) as first, \
            MockServer(MockConfig(conflict_turns=frozenset({2}), conflict_rate=RATE, conflict_kind="fact")) as second:
        talk = RoleConfig(model="mock/talk", base_url=first.base_url)
        config = RunConfig(narrator=talk, player=talk, auditor=RoleConfig(model="mock/judge-a", base_url=first.base_url),
                           player_mode="scripted")
        asyncio.run(run_batch(tmp / "a", config, envs="iron-man,alien,zombieland", replicates=3, max_turns=4))
        rescore(tmp / "a", RoleConfig(model="mock/judge-b", base_url=second.base_url), tmp / "b")
    return tmp / "a", tmp / "b"


def test_rescore_replays_the_recorded_replies_through_the_new_auditor(runs: tuple[Path, Path]) -> None:
    a, b = records(runs[0]), records(runs[1])
    assert set(a) == set(b) and len(a) == 9
    meta = json.loads((runs[1] / "run.json").read_text())
    assert meta["rescore_of"] == str(runs[0].resolve()) and meta["config"]["auditor"]["model"] == "mock/judge-b"
    for key, ra in a.items():
        assert ra.outcome.value == "CONFLICT" and ra.turns == 3
        rb = b[key]
        # the new auditor's first conflict: a hashed reply (the opening is not conflict-checked), else turn 2
        first = next(t.turn for t in ra.history if t.turn >= 1 and (flagged(t.narrator_reply) or t.turn == 2))
        assert rb.outcome.value == "CONFLICT" and rb.turns == first, key
        assert [t.narrator_reply for t in rb.history] == [t.narrator_reply for t in ra.history[:first + 1]]
        assert [t.player_action for t in rb.history] == [t.player_action for t in ra.history[:first + 1]]


def test_report_of_a_run_and_its_rescore_shows_agreement_as_the_schedules_imply(runs: tuple[Path, Path],
                                                                                tmp_path: Path) -> None:
    a, b = records(runs[0]), records(runs[1])
    x: list[bool] = []
    y: list[bool] = []
    for key, ra in a.items():
        for t in ra.history[:b[key].turns + 1]:
            x.append(t.turn == 3)
            y.append(t.turn == b[key].turns)
    n = len(x)
    p_o = sum(p == q for p, q in zip(x, y, strict=True)) / n
    p_yes = (sum(x) / n) * (sum(y) / n)
    p_no = (1 - sum(x) / n) * (1 - sum(y) / n)
    kappa = (p_o - (p_yes + p_no)) / (1 - (p_yes + p_no))
    index = build_report(list(runs), tmp_path / "r", resamples=100)
    (got,) = json.loads((index.parent / "metrics.json").read_text())["agreement"]
    assert got["turns"] == n and got["agreement"] == pytest.approx(p_o) and got["kappa"] == pytest.approx(kappa)
    assert got["conflict_original"] == sum(x) and got["conflict_rescore"] == 9
    both = sum(p and q for p, q in zip(x, y, strict=True))
    assert got["both_conflict"] == both and got["kind_turns"] == both
    assert got["kind_agreement"] == (1.0 if both else None)  # both auditors say "fact"
    assert got["pearson"] is None and got["spearman"] is None  # the original's turn counts are all 3
    page = index.read_text()
    assert "Auditor agreement" in page and "Cohen" in page and "re-audits" in page
    assert "auditors mock/judge-a vs mock/judge-b" in page  # the not-comparable banner names the difference
    assert np.isfinite(kappa)


def test_the_report_shows_a_turns_raw_auditor_answers_from_calls_jsonl(runs: tuple[Path, Path], tmp_path: Path) -> None:
    from test_reports import fragments

    index = build_report([runs[1]], tmp_path / "r", resamples=50)
    episode = fragments(index)["ep-iron-man-0"]
    assert "Raw auditor answers" in episode and "from calls.jsonl" in episode
    calls = [json.loads(x) for x in (runs[1] / "calls.jsonl").read_text().splitlines()]
    mine = [c for c in calls if c["episode"] == "iron-man#0" and c["turn"] == 1 and c["role"] == "auditor"]
    assert mine and all(c["role"] != "narrator" for c in calls), "a rescore never calls the narrator"
    assert all(f"<b>{c['stage']}</b>" in episode for c in mine)
    assert "planted by the mock server" in episode  # the conflict check's raw answer, escaped JSON text
    assert "<details class=\"raw-audit\">" not in index.read_text(), "rendered on demand, not in the page's DOM"


def test_cli_rescore(runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ncpbench.cli import main

    with MockServer(MockConfig()) as lenient:
        code = main(["rescore", str(runs[0]), "--auditor", "mock/lenient", "--auditor-base-url", lenient.base_url,
                     "--out", str(tmp_path / "c"), "--concurrency", "2"])
    out = capsys.readouterr().out
    # the lenient auditor passes the original's turn-3 conflict: no recorded reply beyond it -> ERROR
    assert code == 4 and "re-audited 9 episode(s)" in out and "9 ERROR" in out
    recs = records(tmp_path / "c")
    assert all(r.outcome.value == "ERROR" and r.error and "RescoreExhausted" in r.error for r in recs.values())
    assert all(len(r.history) == 4 for r in recs.values()), "turns 0-3 judged by the new auditor"


# -- a rescore is a run like any other: preflight, exit codes, run.json from the start ----------------


def test_cli_rescore_without_the_auditors_key_is_exit_2_and_writes_nothing(
        runs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ncpbench.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code = main(["rescore", str(runs[0]), "--auditor", "openai/gpt-4o-mini", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and "OPENAI_API_KEY is not set" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_cli_rescore_stopped_by_the_breaker_exits_6_like_run(
        runs: tuple[Path, Path], tmp_path: Path, hostile: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import error_body

    from ncpbench.cli import main

    server = hostile(lambda method, path, body: (401, error_body("Incorrect API key provided")))
    args = ["rescore", str(runs[0]), "--auditor", "openai/m", "--auditor-base-url", server.base_url,
            "--out", str(tmp_path / "c"), "--concurrency", "1"]
    assert main(args) == 2 and not (tmp_path / "c").exists(), "the probe meets the 401 first"
    capsys.readouterr()
    assert main([*args, "--skip-preflight"]) == 6
    err = capsys.readouterr().err
    assert err.count("ncpbench: stopped: 5 episodes in a row failed") == 1
    meta = json.loads((tmp_path / "c" / "run.json").read_text())
    assert meta["status"] == "stopped_by_breaker" and meta["rescore_of"] == str(runs[0].resolve())


def test_run_json_says_rescore_of_before_the_first_episode_starts(runs: tuple[Path, Path], tmp_path: Path) -> None:
    seen: list[object] = []

    def on_change(progress: Progress) -> None:
        if progress.alive and not seen:  # the first episode has just started
            seen.append(json.loads((tmp_path / "c" / "run.json").read_text()).get("rescore_of"))

    with MockServer(MockConfig()) as server:
        rescore(runs[0], RoleConfig(model="mock/judge-c", base_url=server.base_url), tmp_path / "c",
                on_change=on_change)
    assert seen == [str(runs[0].resolve())], "an interrupted rescore still says what it re-audits"


def test_cli_rescore_samples_the_new_auditor_as_run_does_for_the_original_protocol(
        runs: tuple[Path, Path], tmp_path: Path) -> None:
    from ncpbench.cli import main
    from ncpbench.models.config import PROFILES

    with MockServer(MockConfig()) as server:
        talk = RoleConfig(model="mock/talk", base_url=server.base_url)
        grounded = RunConfig(narrator=talk, player=talk, auditor=talk, player_mode="scripted", protocol="grounded")
        asyncio.run(run_batch(tmp_path / "g", grounded, envs="iron-man", max_turns=2))
        for original, out, profile in ((tmp_path / "g", "rg", "default"), (runs[0], "rp", "paper")):
            assert main(["rescore", str(original), "--auditor", "mock/new", "--auditor-base-url", server.base_url,
                         "--out", str(tmp_path / out)]) in (0, 4)
            auditor = json.loads((tmp_path / out / "run.json").read_text())["config"]["auditor"]
            assert auditor["temperature"] == PROFILES[profile]["auditor"]["temperature"], original
