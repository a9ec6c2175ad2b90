"""The inspect_ai task: inspect's model narrates, the auditor role judges, one sample per episode.

Offline: the narrator is inspect's `mockllm/model` (given token usage, so it never needs tiktoken's
downloaded encodings), the auditor an inspect `openai-api` model pointed at our mock server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

inspect_ai = pytest.importorskip("inspect_ai", reason="needs the ncpbench[inspect] extra (pip install -e '.[inspect]')")

from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.log import EvalLog  # noqa: E402
from inspect_ai.model import Model, ModelOutput, ModelUsage, get_model  # noqa: E402

from ncpbench.models.mock_server import MockServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASK_FILE = "ncpbench/inspect_task.py"
"""Relative, as on the command line (inspect's loader globs it from the working directory)."""


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
NARRATION = "The convoy rolls on through the heat, and the story moves forward as it must."


def mock_narrator() -> Model:
    def answer(input: Any, tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        out = ModelOutput.from_content(model="mockllm", content=NARRATION)
        out.usage = ModelUsage(input_tokens=10, output_tokens=12, total_tokens=22)
        return out

    return get_model("mockllm/model", custom_outputs=answer, memoize=False)


def run(tmp_path: Path, server: MockServer | None, **task_args: Any) -> EvalLog:
    roles = {} if server is None else {
        "auditor": get_model("openai-api/mock/default", base_url=server.base_url, api_key="not-needed", memoize=False)}
    logs = inspect_eval(TASK_FILE, model=mock_narrator(), model_roles=roles or None, task_args=task_args,
                        log_dir=str(tmp_path / "logs"), display="none")
    assert len(logs) == 1
    return logs[0]


def test_two_episodes_run_end_to_end_with_the_narrator_in_inspect_and_the_auditor_as_a_model_role(tmp_path: Path) -> None:
    with MockServer() as server:
        log = run(tmp_path, server, envs="iron-man,alien", max_turns=3)
        audits = server.stats.requests
    assert log.status == "success", log.error
    assert log.samples is not None and sorted(str(s.id) for s in log.samples) == ["alien#0", "iron-man#0"]
    assert audits > 0  # the auditor's calls reached the mock server through inspect
    for sample in log.samples:
        score = next(iter((sample.scores or {}).values()))
        assert score.answer in ("CONFLICT", "SUCCESS", "SURVIVAL")  # never ERROR: every role answered
        assert isinstance(score.value, dict)
        assert score.value["turns"] >= 1 and 0.0 <= score.value["progress"] <= 1.0
        assert score.metadata is not None and "conflict_kind" in score.metadata
        # the transcript: the story as messages, and every role's model call as an event
        assistant = [m.text for m in sample.messages if m.role == "assistant"]
        assert assistant and all(text.startswith(NARRATION) for text in assistant)
        models = {e.model for e in sample.events if e.event == "model"}
        assert any("mockllm" in m for m in models) and any("mock/default" in m for m in models), models
    assert log.results is not None
    metrics = log.results.scores[0].metrics
    for name in ("avg_turns", "progress", "conflict_rate", "fact_conflict_rate", "errors"):
        assert name in metrics, sorted(metrics)
    turns = [next(iter((s.scores or {}).values())).value["turns"] for s in log.samples]  # type: ignore[index]
    assert metrics["avg_turns"].value == pytest.approx(sum(turns) / 2)
    assert metrics["errors"].value == 0


def test_survival_at_t_is_the_share_of_scored_episodes_whose_turn_count_reaches_t(tmp_path: Path) -> None:
    from inspect_ai.scorer import SampleScore, Score

    from ncpbench.integrations.inspect_eval import ncp_metrics, score_value

    def sample(turns: int, outcome: str, max_turns: int = 20) -> SampleScore:
        value = score_value(None) if outcome == "ERROR" else {
            **score_value(None), "error": 0, "turns": turns, "max_turns": max_turns,
            "conflict": int(outcome == "CONFLICT"), "conflict_fact": int(outcome == "CONFLICT")}
        return SampleScore(score=Score(value=value))

    out = ncp_metrics()([sample(4, "CONFLICT"), sample(10, "CONFLICT"), sample(20, "SURVIVAL"), sample(0, "ERROR")])
    assert isinstance(out, dict)
    assert out["errors"] == 1 and out["episodes"] == 4
    assert out["survival@5"] == pytest.approx(2 / 3) and out["survival@10"] == pytest.approx(2 / 3)
    assert out["survival@20"] == pytest.approx(1 / 3)
    assert out["conflict_rate"] == pytest.approx(2 / 3) and out["fact_conflict_rate"] == pytest.approx(2 / 3)
    assert out["avg_turns"] == pytest.approx(34 / 3)
    short = ncp_metrics()([sample(3, "SURVIVAL", max_turns=3)])
    assert isinstance(short, dict) and "survival@5" not in short  # no episode could reach turn 5


def test_a_missing_auditor_role_is_an_error_before_any_model_is_called(tmp_path: Path) -> None:
    calls: list[int] = []

    def answer(input: Any, tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        calls.append(1)
        return ModelOutput.from_content(model="mockllm", content=NARRATION)

    narrator = get_model("mockllm/model", custom_outputs=answer, memoize=False)
    with pytest.raises(ValueError, match="needs an auditor"):
        inspect_eval(TASK_FILE, model=narrator, task_args={"envs": "iron-man"}, log_dir=str(tmp_path), display="none")
    assert calls == []


def test_unknown_environments_are_refused() -> None:
    from ncpbench.registry import parse_envs

    assert parse_envs("iron-man, alien") == ["iron-man", "alien"]
    with pytest.raises(ValueError, match="unknown environments"):
        parse_envs("iron-man,no-such-film")


@pytest.mark.slow
def test_the_inspect_eval_command_runs_the_task_file_from_a_checkout(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from inspect_ai.log import read_eval_log

    inspect_cli = Path(sys.executable).with_name("inspect")
    with MockServer() as server:
        env = {**os.environ, "MOCK_BASE_URL": server.base_url, "MOCK_API_KEY": "not-needed"}
        out = subprocess.run([str(inspect_cli), "eval", TASK_FILE, "--model", "openai-api/mock/default",
                              "--model-role", "auditor=openai-api/mock/default", "-T", "envs=iron-man,alien",
                              "-T", "max_turns=3", "--log-dir", str(tmp_path), "--display", "none"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    log = read_eval_log(str(next(tmp_path.glob("*.eval"))))
    assert log.status == "success" and log.samples is not None and len(log.samples) == 2
    assert log.results is not None and log.results.scores[0].metrics["avg_turns"].value == 3


@pytest.mark.parametrize("protocol, profile", [(None, "paper"), ("published", "paper"), ("grounded", "default")])
def test_the_auditor_and_player_sample_as_ncpbench_run_does_for_the_protocol(protocol: str | None,
                                                                           profile: str) -> None:
    from ncpbench.integrations.inspect_eval import profile_role
    from ncpbench.models.config import PROFILES

    model = get_model("mockllm/model")
    for role in ("auditor", "player"):
        got = profile_role(role, model, protocol=protocol)
        assert {k: getattr(got, k) for k in PROFILES[profile][role]} == PROFILES[profile][role]
    assert profile_role("narrator", model, protocol=protocol).temperature is None, "the eval's own settings"
