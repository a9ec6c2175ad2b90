"""ncpbench as an inspect_ai task (extra `ncpbench[inspect]`): one sample = one episode.

    inspect eval ncpbench/inspect_task.py --model openai/gpt-4o \
        --model-role auditor=openai/gpt-4o -T envs=iron-man,alien -T max_turns=20

- narrator: the eval's model (`--model`); it is prompted exactly like ncpbench's LLM narrator.
- auditor: the `auditor` model role, **required**: without `--model-role auditor=...` (or
  `-T auditor=...`) the task refuses to start. There is no default judge.
- player: the `player` model role, as the adversarial LLM player; without one, ncpbench's
  seeded scripted player.

Every role reaches its model through inspect (`InspectModelClient`, an adapter with the
interface of `ncpbench.models.client.ModelClient`), so any inspect provider works for any role
(`mockllm/model`, `openai-api/<service>/<model>` for an OpenAI-compatible endpoint, ...) and
every call of every role is an event in the inspect log. The episode itself runs through
ncpbench's own machinery: a `NarrativeEnv` driven by `ncpbench.episode.play_episode` (the same
turn deadline and failure policy as `ncpbench run`; a failing endpoint ends the episode as ERROR).

The sample's messages are the story (player actions as user turns, narrations as assistant
turns); the score's value has `outcome`, `turns`, `progress`, `satisfied`, `conflict` and
`conflict_kind`, and `ncp_metrics` aggregates them to the published columns (ERROR episodes
excluded, as in `ncpbench.metrics`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.log import transcript
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
    Model,
    ModelOutput,
    ResponseSchema,
    get_model,
    model_roles,
)
from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, metric, scorer
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import JSONSchema

from ncpbench.agents.llm import LLMNarrator, LLMPlayer
from ncpbench.agents.scripted import ScriptedPlayer
from ncpbench.auditors.pipeline import LLMAuditor
from ncpbench.env import NarrativeEnv
from ncpbench.episode import DEFAULT_TURN_TIMEOUT_S, play_episode
from ncpbench.errors import ModelCallError
from ncpbench.integrations.gym_plugin import sampling_profile
from ncpbench.metrics import CONFLICT_KINDS
from ncpbench.models.client import Completion, Message, ModelClient
from ncpbench.models.config import PROFILES, RoleConfig, StructuredMode
from ncpbench.protocols import Player
from ncpbench.record import EpisodeRecord
from ncpbench.registry import parse_envs
from ncpbench.verdict import Usage

RECORD_KEY = "ncpbench_record"
SURVIVAL_AT = (5, 10, 20)
MISSING_AUDITOR = ("ncpbench needs an auditor model and has no default judge: pass --model-role auditor=MODEL "
                   "(e.g. --model-role auditor=openai/gpt-4o) or -T auditor=MODEL")


class InspectModelClient(ModelClient):
    """A ModelClient whose calls go to an inspect `Model` (so they are logged as inspect events)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model

    async def chat(self, role: RoleConfig, messages: Sequence[Message], *,
                   response_format: dict[str, Any] | None = None, salt: str = "") -> Completion:
        convo: list[ChatMessage] = []
        for m in messages:
            if m["role"] == "system":
                convo.append(ChatMessageSystem(content=m["content"]))
            elif m["role"] == "assistant":
                convo.append(ChatMessageAssistant(content=m["content"]))
            else:
                convo.append(ChatMessageUser(content=m["content"]))
        config = GenerateConfig(**self._params(role))
        schema = (response_format or {}).get("json_schema")
        if schema:
            try:
                config = config.merge(GenerateConfig(response_schema=ResponseSchema(
                    name=schema["name"], json_schema=JSONSchema.model_validate(schema["schema"]))))
            except Exception:  # a schema inspect cannot express: the pipeline still validates and re-asks
                pass
        self.stats.calls += 1
        try:
            out = await self.model.generate(convo, config=config)
        except Exception as e:
            self.stats.failed += 1
            raise ModelCallError(f"{self.model}: {type(e).__name__}: {e}"[:500]) from None
        usage = Usage(prompt_tokens=out.usage.input_tokens if out.usage else 0,
                      completion_tokens=out.usage.output_tokens if out.usage else 0, calls=1)
        return Completion(out.completion or "", usage)


def profile_role(role: str, model: Model, structured: StructuredMode = "auto", protocol: str | None = None) -> RoleConfig:
    """The role's sampling under the profile `ncpbench run` resolves for `protocol` (paper under the
    default published protocol); the narrator keeps the eval's own settings."""
    fields: dict[str, Any] = {} if role == "narrator" else dict(PROFILES[sampling_profile(protocol)][role])
    return RoleConfig(model=f"inspect/{model}", structured=structured, **fields)


def ncpbench_task(envs: str | Sequence[str] = "iron-man", max_turns: int = 20, replicates: int = 1, seed: int = 0,
                  reward: str = "progress", protocol: str | None = None, auditor: str | None = None,
                  player: str | None = None, auditor_structured: StructuredMode = "auto",
                  turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S) -> Task:
    """The task behind `ncpbench/inspect_task.py` (its parameters are the `-T` options)."""
    if auditor is None and "auditor" not in model_roles():
        raise ValueError(MISSING_AUDITOR)
    from ncpbench.dataset import get_spec

    samples = []
    for slug in parse_envs(envs):
        title = get_spec(slug).meta.title
        for r in range(replicates):
            samples.append(Sample(id=f"{slug}#{r}", input=f"Narrate an interactive story: {title} ({slug}).",
                                  metadata={"env": slug, "seed": seed + r, "replicate": r}))
    roles = {k: v for k, v in (("auditor", auditor), ("player", player)) if v}
    return Task(dataset=MemoryDataset(samples, name="ncpbench"),
                solver=play_ncpbench_episode(max_turns=max_turns, reward=reward, protocol=protocol,
                                             auditor_structured=auditor_structured, turn_timeout_s=turn_timeout_s),
                scorer=episode_outcome(), model_roles=roles or None, name="ncpbench",
                metadata={"max_turns": max_turns, "reward": reward, "protocol": protocol})


@solver
def play_ncpbench_episode(max_turns: int = 20, reward: str = "progress", protocol: str | None = None,
                          auditor_structured: StructuredMode = "auto",
                          turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S) -> Solver:
    """Play the sample's episode: the eval's model narrates, the roles answer, ncpbench judges."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        narrator_model = get_model()
        auditor_model = get_model(role="auditor", required=True)
        narrator = LLMNarrator(InspectModelClient(narrator_model), profile_role("narrator", narrator_model))
        auditor = LLMAuditor(InspectModelClient(auditor_model), profile_role("auditor", auditor_model,
                                                                             auditor_structured, protocol))
        the_player: Player
        if "player" in model_roles():
            player_model = get_model(role="player")
            the_player = LLMPlayer(InspectModelClient(player_model), profile_role("player", player_model, protocol=protocol))
        else:
            the_player = ScriptedPlayer()
        meta = state.metadata
        env = NarrativeEnv(meta["env"], player=the_player, auditor=auditor, max_turns=max_turns, reward=reward,
                           protocol=protocol)
        record = await play_episode(env, narrator, seed=int(meta["seed"]), replicate=int(meta["replicate"]),
                                    config={"inspect": True}, turn_timeout_s=turn_timeout_s)
        state.messages = story_messages(record)
        last = record.history[-1].narrator_reply if record.history else ""
        state.output = ModelOutput.from_content(model=str(narrator_model), content=last)
        state.store.set(RECORD_KEY, record.model_dump_json())
        transcript().info({"outcome": record.outcome.value, "turns": record.turns, "progress": record.progress,
                           "conflict_kinds": ",".join(record.conflict_kinds), "error": record.error}, source="ncpbench")
        return state

    return solve


def story_messages(record: EpisodeRecord) -> list[ChatMessage]:
    """The episode as chat messages: player actions as user turns, narrations as assistant turns."""
    out: list[ChatMessage] = [ChatMessageSystem(content=f"ncpbench episode {record.episode_id}: {record.title}")]
    for t in record.history:
        out.append(ChatMessageUser(content=t.player_action if t.player_action is not None
                                   else "(the opening)"))
        note = "" if t.committed else "  [not committed: " + "; ".join(c.kind.value for c in t.verdict.conflicts) + "]"
        out.append(ChatMessageAssistant(content=t.narrator_reply + note))
    if record.error:
        out.append(ChatMessageUser(content=f"(episode ended with an infrastructure error: {record.error})"))
    return out


OUTCOME_CODES = {"CONFLICT": 0, "SUCCESS": 1, "SURVIVAL": 2, "ERROR": 3}
"""`value["outcome"]` is numeric (inspect reduces score values as floats); `answer` holds the name."""


@metric
def ncp_metrics() -> Metric:
    """The published columns over scored (non-ERROR) episodes: average turns, progress, satisfied
    commitments, conflict rates (any and per kind), survival at 5/10/20 turns (turns >= t), errors."""

    def compute(scores: list[SampleScore]) -> dict[str, float]:
        values = [s.score.value for s in scores if isinstance(s.score.value, dict)]
        scored = [v for v in values if not v.get("error")]
        n = len(scored)
        out: dict[str, float] = {"episodes": float(len(values)), "errors": float(len(values) - n)}
        if not n:
            return out

        def mean(key: str) -> float:
            return sum(float(v[key]) for v in scored) / n

        out["avg_turns"] = mean("turns")
        out["progress"] = mean("progress")
        out["satisfied"] = mean("satisfied")
        out["conflict_rate"] = mean("conflict")
        for kind in CONFLICT_KINDS:
            out[f"{kind}_conflict_rate"] = mean(f"conflict_{kind}")
        out["success_rate"] = mean("success")
        limit = min(int(v["max_turns"]) for v in scored)
        for t in SURVIVAL_AT:
            if t <= limit:  # no episode can reach a turn past its limit (as in ncpbench.metrics)
                out[f"survival@{t}"] = sum(1 for v in scored if int(v["turns"]) >= t) / n
        return out

    return compute


def score_value(record: EpisodeRecord | None) -> dict[str, str | int | float | bool]:
    """One episode as numbers: outcome code, turns, progress, satisfied share, conflict flags."""
    if record is None:
        return {"outcome": OUTCOME_CODES["ERROR"], "error": 1, "turns": 0, "progress": 0.0, "satisfied": 0.0,
                "conflict": 0, "success": 0, "max_turns": 0, **{f"conflict_{k}": 0 for k in CONFLICT_KINDS}}
    conflict = record.outcome.value == "CONFLICT"
    return {"outcome": OUTCOME_CODES[record.outcome.value], "error": int(record.outcome.value == "ERROR"),
            "turns": record.turns, "progress": record.progress, "satisfied": record.satisfied_share,
            "conflict": int(conflict), "success": int(record.outcome.value == "SUCCESS"),
            "max_turns": record.max_turns,
            **{f"conflict_{k}": int(conflict and k in record.conflict_kinds) for k in CONFLICT_KINDS}}


@scorer(metrics=[ncp_metrics()])
def episode_outcome() -> Scorer:
    """Outcome (`answer`, and coded in the value), turns, progress and conflict kind of the sample's episode."""

    async def score(state: TaskState, target: Target) -> Score:
        raw = state.store.get(RECORD_KEY)
        if raw is None:
            return Score(value=score_value(None), answer="ERROR", explanation="the episode did not run")
        record = EpisodeRecord.model_validate_json(raw)
        kinds = ",".join(record.conflict_kinds)
        explanation = f"{record.outcome.value} after {record.turns} turns, progress {record.progress:.2f}"
        if kinds:
            explanation += f", conflict: {kinds}"
        if record.error:
            explanation += f" (error: {record.error})"
        return Score(value=score_value(record), answer=record.outcome.value, explanation=explanation,
                     metadata={"env_id": record.env_id, "seed": record.seed, "outcome": record.outcome.value,
                               "conflict_kind": kinds, "error": record.error,
                               "usage": json.loads(json.dumps({k: u.model_dump() for k, u in record.usage.items()}))})

    return score
