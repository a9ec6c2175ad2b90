"""`ncpbench play`: a person at the terminal as the narrator or the player, driven with piped input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ncpbench.agents.human import EndOfSession, HumanNarrator, HumanPlayer

from ncpbench.export import export, read_records
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocols import NarratorRequest, PlayerRequest
from ncpbench.state import Exchange


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer(MockConfig(conflict_turns=frozenset({3}))) as server:
        yield server


def play(*args: str, stdin: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ncpbench", "play", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def record_at(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_human_narrator_sees_the_state_and_gets_a_verdict_after_each_reply(tmp_path: Path, mock: MockServer) -> None:
    lines = ["The convoy rolls through the Kunar hills.", "", "The Jericho rises over the ridge.",
             "Rhodes shouts as the ground shakes.", "The humvee burns."]
    out = play("iron-man", "--as", "narrator", "--turns", "5", "--player-mode", "scripted",
               "--auditor", "mock/default", "--auditor-base-url", mock.base_url, "--out", str(tmp_path / "rec.json"),
               stdin="\n".join(lines) + "\n", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Established facts:" in text and "Next plot point (s_0)" in text
    assert "Tony Stark does: " in text
    assert text.count("  ok ") == 2 and "completed s_0" in text
    assert "CONFLICT fact" in text, "the mock plants a conflict at turn 3"
    assert "outcome CONFLICT after 3 turns" in text
    rec = record_at(tmp_path / "rec.json")
    assert rec["outcome"] == "CONFLICT" and rec["turns"] == 3
    history = rec["history"]
    assert isinstance(history, list)
    assert [h["narrator_reply"] for h in history] == [line for line in lines if line][:4]
    assert history[-1]["committed"] is False
    config = rec["config"]
    assert isinstance(config, dict)
    assert config["narrator"] == {"model": "human"} and config["play"]["ended_by"] == "episode_end"


def test_quitting_records_the_episode_as_it_stands(tmp_path: Path, mock: MockServer) -> None:
    out = play("iron-man", "--as", "narrator", "--turns", "10", "--player-mode", "scripted",
               "--auditor", "mock/default", "--auditor-base-url", mock.base_url, "--out", str(tmp_path / "rec.json"),
               stdin="An opening.\nA first reply.\n/state\n/quit\nnever read\n", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "session ended by you" in out.stdout
    assert out.stdout.count("Established facts:") >= 3, "/state prints the story state again"
    rec = record_at(tmp_path / "rec.json")
    assert rec["outcome"] == "SURVIVAL" and rec["turns"] == 1 and rec["max_turns"] == 1
    config = rec["config"]
    assert isinstance(config, dict) and config["play"] == {"human": "narrator", "ended_by": "quit", "turn_limit": 10}


def test_human_player_plays_against_the_narrator_model_with_live_audits(tmp_path: Path, mock: MockServer) -> None:
    url = mock.base_url
    models = ["--narrator", "mock/default", "--narrator-base-url", url, "--auditor", "mock/default",
              "--auditor-base-url", url]
    actions = "I check the convoy radio.\nI ask Rhodes where we are headed.\n"
    first = play("iron-man", "--as", "player", "--turns", "5", *models, "--out", str(tmp_path / "a.json"),
                 "--run-dir", str(tmp_path / "run"), stdin=actions, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    text = first.stdout
    assert text.index("Narrator (turn 0)") < text.index("Tony Stark (turn 1)> I check the convoy radio.")
    assert "Narrator (turn 1): You check the convoy radio" in text and "  ok " in text
    assert "outcome SURVIVAL after 2 turns (session ended by you)" in text
    rec = record_at(tmp_path / "a.json")
    history = rec["history"]
    assert isinstance(history, list) and [h["player_action"] for h in history] == [
        None, "I check the convoy radio.", "I ask Rhodes where we are headed."]
    second = play("iron-man", "--as", "player", "--turns", "1", *models, "--out", str(tmp_path / "b.json"),
                  "--run-dir", str(tmp_path / "run"), stdin="I wait.\n", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "outcome SURVIVAL after 1 turns;" in second.stdout
    records = read_records(tmp_path / "run")
    assert sorted(r.episode_id for r in records) == ["iron-man#0", "iron-man#1"]
    assert (tmp_path / "run" / "run.json").exists()
    assert export(tmp_path / "run", "sft", tmp_path / "sft.jsonl") == 5  # two openings + three turns


def request(action: str | None) -> NarratorRequest:
    return NarratorRequest(title="T", player_role="Mara", turn=0 if action is None else 1, player_action=action,
                           transcript=(), facts=("f_0: Fog.",), commitments=(), current_node=None, completed_nodes=())


def test_line_reading_continues_on_backslash_and_ends_on_eof() -> None:
    stdout = io.StringIO()
    narrator = HumanNarrator(io.StringIO("First line \\\nsecond line.\n\n  \nNext.\n"), stdout)
    assert narrator.narrate(request(None)) == "First line\nsecond line."
    assert narrator.narrate(request("I knock.")) == "Next."
    assert "(story state unchanged; /state shows it)" in stdout.getvalue()
    with pytest.raises(EndOfSession):
        narrator.narrate(request("I knock again."))


def test_human_player_sees_only_the_story_so_far() -> None:
    stdout = io.StringIO()
    player = HumanPlayer(io.StringIO("I climb the stairs.\n/quit\n"), stdout)
    req = PlayerRequest(title="T", player_role="Mara", turn=1,
                        transcript=(Exchange(turn=0, player_action=None, narrator_reply="The lighthouse is dark."),))
    assert player.act(req) == "I climb the stairs."
    assert "Narrator: The lighthouse is dark." in stdout.getvalue() and "f_" not in stdout.getvalue()
    with pytest.raises(EndOfSession):
        player.act(req)


# -- play folders never mix with batch runs ---------------------------------------------------------


def batch_folder(path: Path, mock: MockServer) -> None:
    import asyncio

    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.runner import run_batch

    r = RoleConfig(model="mock/default", base_url=mock.base_url)
    asyncio.run(run_batch(path, RunConfig(narrator=r, player=r, auditor=r, player_mode="scripted"),
                          envs="iron-man", replicates=2, max_turns=1))


def test_play_refuses_a_batch_run_folder_before_the_session(tmp_path: Path, mock: MockServer) -> None:
    batch_folder(tmp_path / "batch", mock)
    before = (tmp_path / "batch" / "episodes.jsonl").read_bytes()
    out = play("iron-man", "--as", "narrator", "--turns", "2", "--player-mode", "scripted", "--auditor",
               "mock/default", "--auditor-base-url", mock.base_url, "--out", str(tmp_path / "rec.json"),
               "--run-dir", str(tmp_path / "batch"), stdin="An opening.\nA reply.\n", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    err = [x for x in out.stderr.splitlines() if x.startswith("ncpbench: ")]
    assert len(err) == 1 and "is a batch run folder" in err[0] and "Traceback" not in out.stderr
    assert "Narrator (turn 0)" not in out.stdout and "Established facts" not in out.stdout, "refused before playing"
    assert (tmp_path / "batch" / "episodes.jsonl").read_bytes() == before


def test_append_to_run_refuses_batch_records_even_without_run_json(tmp_path: Path, mock: MockServer) -> None:
    from ncpbench.cli.play import append_to_run
    from ncpbench.record import EpisodeRecord
    from ncpbench.runner import RunError

    batch_folder(tmp_path / "batch", mock)
    first = (tmp_path / "batch" / "episodes.jsonl").read_text().splitlines()[0]
    human = EpisodeRecord.model_validate_json(first).model_copy(update={"config": {"narrator": {"model": "human"}}})
    with pytest.raises(RunError, match="is a batch run folder"):
        append_to_run(tmp_path / "batch", human)
    (tmp_path / "batch" / "run.json").unlink()
    with pytest.raises(RunError, match=r"holds batch run records \(episodes\.jsonl\)"):
        append_to_run(tmp_path / "batch", human)
    assert append_to_run(tmp_path / "plays", human).episode_id == "iron-man#0", "a play folder still takes it"


def test_a_batch_rerun_never_counts_a_play_record_as_its_own(tmp_path: Path, mock: MockServer) -> None:
    import asyncio

    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.runner import read_records, run_batch

    batch_folder(tmp_path / "batch", mock)
    episodes = tmp_path / "batch" / "episodes.jsonl"
    lines = {json.loads(x)["episode_id"]: x for x in episodes.read_text().splitlines()}
    human = json.loads(lines["iron-man#1"])
    human["config"] = {"narrator": {"model": "human"}, "play": {"human": "narrator"}}  # as `play --run-dir` wrote it
    # iron-man#1 not yet run by the batch, a person's episode under its id (the reviewer's case)
    episodes.write_text(lines["iron-man#0"] + "\n" + json.dumps(human) + "\n")
    r = RoleConfig(model="mock/default", base_url=mock.base_url)
    again = asyncio.run(run_batch(tmp_path / "batch", RunConfig(narrator=r, player=r, auditor=r, player_mode="scripted"),
                                  envs="iron-man", replicates=2, max_turns=1))
    assert again.progress.skipped == 1 and [x.episode_id for x in again.records] == ["iron-man#1"]
    final = read_records(episodes)["iron-man#1"]
    assert final["config"]["narrator"]["model"] == "mock/default", "the batch's own episode, not the person's"


def test_play_without_an_auditor_is_refused_before_the_session_unless_mock_is_said(tmp_path: Path,
                                                                                   mock: MockServer) -> None:
    out = play("iron-man", "--as", "narrator", "--turns", "1", "--player-mode", "scripted",
               "--out", str(tmp_path / "rec.json"), stdin="An opening.\n", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    err = [x for x in out.stderr.splitlines() if x.startswith("ncpbench: ")]
    assert len(err) == 1 and "auditor" in err[0] and "Traceback" not in out.stderr
    assert "Narrator (turn 0)" not in out.stdout and not (tmp_path / "rec.json").exists()
    dry = play("iron-man", "--as", "narrator", "--turns", "1", "--player-mode", "scripted", "--mock",
               "--out", str(tmp_path / "rec.json"), stdin="An opening.\nA reply.\n", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
