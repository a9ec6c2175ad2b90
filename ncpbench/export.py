"""Training data from episode records and branch searches (JSONL).

Two formats:

- **sft** — one chat example per narrator reply that passed the audit (`committed=True`, the
  opening included unless `include_opening=False`): `{"messages": [system, user, assistant]}`.
  System and user are exactly what `LLMNarrator.messages` builds for that turn: the
  `NarratorRequest` is rebuilt by replaying the record through a `NarrativeEnv` (recorded player
  actions and verdicts stand in for the roles), so the prompt is what the narrator saw then.
- **preference** — pairs from branch searches (`branches.jsonl`, one `ncpbench.rl.BranchSearch`
  a line: several candidate replies to one request, each audited on its own branch). Every reply
  that passed is paired with every reply that the audit failed (a confirmed conflict), each distinct
pair of texts once; candidates
  that could not be audited (a failed model call) are no evidence and are left out:
  `{"prompt": [system, user], "chosen": [assistant], "rejected": [assistant]}`.

Each line also carries `"metadata"` (episode id, env, turn, outcome, ...) unless
`metadata=False`. Inputs (`read_records`): a run folder (its `episodes.jsonl`; for preference its
`branches.jsonl`), an `episodes.jsonl`, a single record JSON (`ncpbench run/play --out`), or a
`branches.jsonl`. In JSONL the last line per `episode_id` wins and a torn final line is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from ncpbench.agents.llm import LLMNarrator
from ncpbench.dataset import get_spec
from ncpbench.env import NarrativeEnv
from ncpbench.jsonl import iter_jsonl
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig
from ncpbench.protocols import AuditRequest, NarratorRequest, PlayerRequest
from ncpbench.record import EpisodeRecord, TurnRecord
from ncpbench.reports.runs import RunFormatError, read_episodes
from ncpbench.rl import BranchSearch
from ncpbench.spec import Spec
from ncpbench.verdict import Verdict

Format = Literal["sft", "preference"]
FORMATS: tuple[Format, ...] = ("sft", "preference")

_MESSAGES = LLMNarrator(ModelClient(), RoleConfig())
"""Only its `messages` is used (no model is called): the one place narrator prompts are built."""


class ExportError(ValueError):
    """The input cannot give the asked-for data (missing files, a record that does not replay)."""


def narrator_messages(request: NarratorRequest) -> list[dict[str, str]]:
    """System + user messages exactly as the LLM narrator sends them for `request`."""
    messages: list[dict[str, str]] = _MESSAGES.messages(request)
    return messages


# -- reading ---------------------------------------------------------------------------------------


def read_records(path: str | Path) -> list[EpisodeRecord]:
    """Episode records from a run folder, an episodes.jsonl or one record JSON file."""
    p = Path(path)
    if p.is_dir():
        p = p / "episodes.jsonl"
        if not p.exists():
            raise ExportError(f"{p.parent}: no episodes.jsonl (is it a run folder?)")
    if not p.exists():
        raise ExportError(f"{p}: no such file or folder")
    if p.suffix == ".jsonl":
        try:  # the report's reader: last line per episode wins, a torn last line is skipped
            records, _ = read_episodes(p)
        except RunFormatError as e:
            raise ExportError(str(e)) from None
        return records
    data = json.loads(p.read_text(encoding="utf-8"))
    items = data if isinstance(data, list) else [data]
    return [EpisodeRecord.model_validate(d) for d in items]


def read_branches(path: str | Path) -> list[BranchSearch]:
    """Branch searches from a run folder's branches.jsonl or the file itself."""
    p = Path(path)
    if p.is_dir():
        p = p / "branches.jsonl"
        if not p.exists():
            raise ExportError(f"{p.parent}: no branches.jsonl; preference pairs come from branch searches "
                              "(examples/best_of_n.py writes them)")
    if not p.exists():
        raise ExportError(f"{p}: no such file or folder")
    return [BranchSearch.model_validate(d) for d in iter_jsonl(p)]


# -- replaying a record ----------------------------------------------------------------------------


class _RecordedPlayer:
    def __init__(self, history: list[TurnRecord]) -> None:
        self.actions = {t.turn: t.player_action for t in history if t.player_action is not None}

    def act(self, request: PlayerRequest) -> str:
        return self.actions.get(request.turn, "")


class _RecordedAuditor:
    def __init__(self, history: list[TurnRecord]) -> None:
        self.verdicts = {t.turn: t.verdict for t in history}

    def audit(self, request: AuditRequest) -> Verdict:
        turn = 0 if request.player_action is None else request.state.turn + 1
        return self.verdicts.get(turn, Verdict())


def replay_requests(record: EpisodeRecord, spec: Spec | None = None,
                    dataset: str | None = None) -> Iterator[tuple[NarratorRequest, TurnRecord]]:
    """(what the narrator saw, what happened) for every audited reply of the record, in order."""
    story = spec or get_spec(record.env_id, dataset)
    history = list(record.history)
    env = NarrativeEnv(story, player=_RecordedPlayer(history), auditor=_RecordedAuditor(history),
                       max_turns=max(record.max_turns, len(history)), protocol=record.protocol.split("/")[0])
    try:
        env.reset(seed=record.seed)
        for entry in history:
            request = env.narrator_view()
            if request.turn != entry.turn or request.player_action != entry.player_action:
                raise ExportError(f"{record.episode_id or record.env_id}: turn {entry.turn} does not replay "
                                  f"(the env is at turn {request.turn}); was the spec changed?")
            yield request, entry
            if not entry.committed or env.state.done:
                break
            env.step(entry.narrator_reply)
    finally:
        env.close()


# -- examples --------------------------------------------------------------------------------------


def sft_examples(records: Iterable[EpisodeRecord], *, dataset: str | None = None, include_opening: bool = True,
                 metadata: bool = True) -> Iterator[dict[str, Any]]:
    for record in records:
        for request, entry in replay_requests(record, dataset=dataset):
            if not entry.committed or (entry.turn == 0 and not include_opening):
                continue
            example: dict[str, Any] = {"messages": [*narrator_messages(request),
                                                    {"role": "assistant", "content": entry.narrator_reply}]}
            if metadata:
                example["metadata"] = {"episode_id": record.episode_id, "env_id": record.env_id, "seed": record.seed,
                                       "turn": entry.turn, "reward": entry.reward, "episode_outcome": record.outcome.value,
                                       "completed_nodes": entry.completed_nodes}
            yield example


def preference_pairs(searches: Iterable[BranchSearch], *, metadata: bool = True) -> Iterator[dict[str, Any]]:
    for search in searches:
        passed = [c for c in search.candidates if c.committed and c.error is None]
        failed = [c for c in search.candidates
                  if not c.committed and c.error is None and c.verdict is not None and c.verdict.is_conflict]
        if not passed or not failed:
            continue
        prompt = narrator_messages(search.request)
        seen: set[tuple[str, str]] = set()
        for good in passed:
            for bad in failed:
                if good.reply == bad.reply or (good.reply, bad.reply) in seen:
                    continue
                seen.add((good.reply, bad.reply))
                pair: dict[str, Any] = {"prompt": prompt,
                                        "chosen": [{"role": "assistant", "content": good.reply}],
                                        "rejected": [{"role": "assistant", "content": bad.reply}]}
                if metadata:
                    pair["metadata"] = {
                        "episode_id": search.episode_id, "env_id": search.env_id, "turn": search.turn,
                        "chosen_reward": good.reward, "rejected_reward": bad.reward,
                        "rejected_conflicts": [{"kind": c.kind.value, "target": c.target, "evidence": c.evidence}
                                               for c in (bad.verdict.conflicts if bad.verdict else [])]}
                yield pair


def export(run: str | Path, fmt: Format, out: str | Path, *, dataset: str | None = None,
           include_opening: bool = True, metadata: bool = True) -> int:
    """Write `fmt` examples from `run` to `out` (JSONL); returns how many were written."""
    if fmt == "sft":
        rows: Iterator[dict[str, Any]] = sft_examples(read_records(run), dataset=dataset,
                                                      include_opening=include_opening, metadata=metadata)
    elif fmt == "preference":
        rows = preference_pairs(read_branches(run), metadata=metadata)
    else:
        raise ExportError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(target)
    return count
