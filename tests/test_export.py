"""`ncpbench export`: SFT examples from records, preference pairs from branch searches."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ncpbench.agents import LLMNarrator, ReplayNarrator, ScriptedPlayer
from ncpbench.auditors import ReplayAuditor

from ncpbench import NarrativeEnv, rl
from ncpbench.export import (
    ExportError,
    export,
    narrator_messages,
    preference_pairs,
    read_records,
    replay_requests,
    sft_examples,
)
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig
from ncpbench.protocols import AuditRequest
from ncpbench.record import EpisodeRecord
from ncpbench.spec import Spec
from ncpbench.verdict import Conflict, ConflictKind, Verdict

FIXTURES = Path(__file__).parent / "fixtures"
TINY = str(FIXTURES / "tiny.yaml")
REPLIES = ["Fog lies on the water as the ferry slows.", "The gangway drops onto the pier.",
           "You find the cellar door and the key turns.", "The key melts in your pocket."]


class KeywordAuditor:
    def audit(self, request: AuditRequest) -> Verdict:
        if request.player_action is None:
            return Verdict()
        if "melts" in request.reply:
            return Verdict(conflicts=[Conflict(kind=ConflictKind.FACT, target="f_1", evidence="The key melts",
                                               reason="f_1: Mara carries the key")])
        return Verdict(completed_nodes=list(request.frontier[:1]))


class FlakyAuditor(KeywordAuditor):
    def audit(self, request: AuditRequest) -> Verdict:
        if "flaky" in request.reply:
            raise TimeoutError("auditor endpoint timed out")
        return super().audit(request)


def live_episode(tiny: Spec, seed: int = 3) -> tuple[EpisodeRecord, list[list[dict[str, str]]]]:
    """Play REPLIES and keep the exact messages the LLM narrator would have been sent each turn."""
    env = NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=KeywordAuditor(), max_turns=10)
    narrator = LLMNarrator(ModelClient(), RoleConfig())
    _, info = env.reset(seed=seed)
    sent = []
    for reply in REPLIES:
        sent.append(narrator.messages(info["narrator_request"]))
        _, _, term, _, info = env.step(reply)
        if term:
            break
    return env.record(replicate=0), sent


def write_run(folder: Path, records: list[EpisodeRecord]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "episodes.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r.model_dump(mode="json")) + "\n")
    return folder


def test_sft_prompts_are_exactly_what_the_narrator_saw_at_each_turn(tiny: Spec) -> None:
    record, sent = live_episode(tiny)
    examples = list(sft_examples([record], dataset=TINY))
    assert [e["metadata"]["turn"] for e in examples] == [0, 1, 2], "the conflicting turn is left out"
    for example, messages in zip(examples, sent, strict=False):
        assert example["messages"][:2] == messages
        assert example["messages"][2]["role"] == "assistant"
    assert [e["messages"][2]["content"] for e in examples] == REPLIES[:3]
    assert examples[1]["metadata"]["completed_nodes"] == ["s_0"]
    assert examples[0]["metadata"]["episode_outcome"] == "CONFLICT"


def test_replay_rebuilds_every_request_including_the_conflicting_one(tiny: Spec) -> None:
    record, sent = live_episode(tiny)
    pairs = list(replay_requests(record, spec=tiny))
    assert [narrator_messages(req) for req, _ in pairs] == sent
    assert pairs[-1][1].committed is False


def test_sft_can_leave_out_openings_and_metadata(tiny: Spec) -> None:
    record, _ = live_episode(tiny)
    examples = list(sft_examples([record], dataset=TINY, include_opening=False, metadata=False))
    assert len(examples) == 2 and all(set(e) == {"messages"} for e in examples)


def test_a_record_that_does_not_replay_on_this_spec_is_an_error(tiny: Spec) -> None:
    record, _ = live_episode(tiny)
    broken = record.model_copy(update={"history": [record.history[0], record.history[2]]})
    with pytest.raises(ExportError, match="does not replay"):
        list(sft_examples([broken], dataset=TINY))


def test_run_folder_reading_keeps_the_last_line_per_episode_and_skips_a_torn_line(tmp_path: Path, tiny: Spec) -> None:
    first, _ = live_episode(tiny, seed=1)
    second, _ = live_episode(tiny, seed=2)
    run = write_run(tmp_path / "run", [first, second.model_copy(update={"episode_id": "tiny#1"})])
    with (run / "episodes.jsonl").open("a") as f:
        f.write(json.dumps(first.model_copy(update={"seed": 9}).model_dump(mode="json")) + "\n")
        f.write('{"episode_id": "tiny#2", "env_id": "ti')
    records = read_records(run)
    assert sorted((r.episode_id, r.seed) for r in records) == [("tiny#0", 9), ("tiny#1", 2)]
    single = tmp_path / "one.json"
    single.write_text(first.model_dump_json())
    assert read_records(single)[0].seed == 1


def branch_searches(tiny: Spec) -> list[rl.BranchSearch]:
    env = NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=FlakyAuditor())
    env.reset(seed=0)
    env.step("Opening.")
    candidates = ["The gangway drops.", "The key melts.", "The key melts.", "A flaky reply.", "The gangway drops."]
    results = asyncio.run(rl.try_replies(env, candidates))
    return [rl.search_record(env, results, rl.best_index(results), episode_id="tiny#0")]


def test_preference_pairs_a_passing_reply_with_each_failing_one(tiny: Spec) -> None:
    searches = branch_searches(tiny)
    assert [c.committed for c in searches[0].candidates] == [True, False, False, False, True]
    assert searches[0].candidates[3].error is not None
    pairs = list(preference_pairs(searches))
    assert len(pairs) == 1, "identical texts pair once; a candidate that could not be audited is no evidence"
    pair = pairs[0]
    assert pair["chosen"] == [{"role": "assistant", "content": "The gangway drops."}]
    assert pair["rejected"] == [{"role": "assistant", "content": "The key melts."}]
    assert pair["prompt"] == narrator_messages(searches[0].request)
    assert f"Mara now does: {searches[0].request.player_action}\n" in pair["prompt"][1]["content"]
    assert pair["metadata"]["rejected_conflicts"][0]["kind"] == "fact"


def test_a_search_where_everything_passed_gives_no_pairs(tiny: Spec) -> None:
    env = NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=KeywordAuditor())
    env.reset(seed=0)
    env.step("Opening.")
    results = asyncio.run(rl.try_replies(env, ["One.", "Two."]))
    assert list(preference_pairs([rl.search_record(env, results)])) == []


def test_export_writes_jsonl_for_a_run_folder(tmp_path: Path, tiny: Spec) -> None:
    record, _ = live_episode(tiny)
    run = write_run(tmp_path / "run", [record])
    (run / "branches.jsonl").write_text("".join(s.model_dump_json() + "\n" for s in branch_searches(tiny)))
    assert export(run, "sft", tmp_path / "sft.jsonl", dataset=TINY) == 3
    assert export(run, "preference", tmp_path / "pref.jsonl") == 1
    lines = (tmp_path / "sft.jsonl").read_text().splitlines()
    assert [json.loads(line)["messages"][0]["role"] for line in lines] == ["system"] * 3


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ncpbench", "export", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_export_command_on_a_bundled_run_and_its_errors(tmp_path: Path) -> None:
    env = NarrativeEnv("iron-man", player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True), max_turns=2)
    narrator = ReplayNarrator(["The convoy rolls.", "The Jericho flies.", "The ambush comes."])
    _, info = env.reset(seed=4)
    while not env.state.done:
        _, _, _, _, info = env.step(narrator.narrate(info["narrator_request"]))
    run = write_run(tmp_path / "run", [env.record()])
    out = run_cli(str(run), "--format", "sft", "--out", str(tmp_path / "sft.jsonl"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "wrote 3 sft examples" in out.stdout
    first = json.loads((tmp_path / "sft.jsonl").read_text().splitlines()[0])
    assert "Iron Man" in first["messages"][0]["content"] and first["messages"][2]["content"] == "The convoy rolls."
    missing = run_cli(str(run), "--format", "preference", "--out", str(tmp_path / "p.jsonl"), cwd=tmp_path)
    assert missing.returncode == 1 and "no branches.jsonl" in missing.stderr and "Traceback" not in missing.stderr
