"""`NarrativeEnv`: the one episode engine, as a Gymnasium environment.

`step(narrator_reply)` takes the narrator's text; the env owns the player and the auditor and
applies the audit protocol of DESIGN.md:

    reset -> (obs, info)                    obs asks for the opening
    step(opening)                           fact update of the opening (committed with turn 1),
                                            then the player acts for turn 1
    step(reply to turn t)                   audit; a confirmed conflict ends the episode and
                                            commits nothing of turn t; otherwise commit, check
                                            SUCCESS / SURVIVAL, and the player acts for t + 1

`astep` is the same step for callers already inside an event loop (the batch runner, async RL
loops); `step` drives it on one event loop per thread, shared by every env of the thread, so model
clients (often shared by several envs) keep their connections.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import inspect
import os
import re
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

import gymnasium as gym
from gymnasium import spaces

from ncpbench.commitments import CommitmentUpdate, Status
from ncpbench.dataset import get_spec
from ncpbench.errors import AuditError
from ncpbench.ledger import LedgerError
from ncpbench.protocols import Auditor, AuditRequest, Narrator, NarratorRequest, Player
from ncpbench.record import AgentReply, EpisodeRecord, TurnRecord
from ncpbench.rewards import RewardConfig, breakdown, reward_config
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState, Outcome
from ncpbench.textspace import UnicodeText
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Conflict, ConflictKind, Usage, Verdict
from ncpbench.views import narrator_request, player_request, render_story_state, render_transcript

T = TypeVar("T")
StepResult = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]

MAX_REPLY_CHARS = 16_000
"""Longer replies are cut (and the record says so): no reply can grow memory or prompts unbounded."""

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


_THREAD = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    """The event loop every env of this thread runs its sync `step` on.

    One per thread, not one per env: roles of several envs often share one model client (the
    envs of `gymnasium.make_vec(..., "sync")`, branches, a batch), and a client's pooled
    connections belong to the loop that opened them. Closed when the interpreter exits.
    """
    loop: asyncio.AbstractEventLoop | None = getattr(_THREAD, "loop", None)
    if loop is None or loop.is_closed() or getattr(_THREAD, "pid", None) != os.getpid():
        # A forked child (AsyncVectorEnv's workers) must not drive the parent's loop: its selector is shared.
        loop = asyncio.new_event_loop()
        _THREAD.loop, _THREAD.pid = loop, os.getpid()
        atexit.register(_close_loop, loop)
    return loop


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_closed() and not loop.is_running():
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def resolve(value: T | Awaitable[T]) -> T:
    """Await a protocol method's result when it is awaitable (sync and async agents both plug in)."""
    if inspect.isawaitable(value):
        return await value
    return value


async def narrate(narrator: Narrator, request: NarratorRequest) -> str | AgentReply:
    """Ask a narrator for its reply, sync or async, as text or an AgentReply."""
    return cast("str | AgentReply", await resolve(narrator.narrate(request)))


def clean_text(text: str, limit: int = MAX_REPLY_CHARS) -> tuple[str, list[str]]:
    """The defined handling of hostile text: control characters, lone surrogates, runaway length."""
    notes = []
    if _CONTROL.search(text):
        text = _CONTROL.sub("", text)
        notes.append("control characters removed")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
        notes.append("invalid code points replaced")
    if len(text) > limit:
        notes.append(f"reply truncated from {len(text)} to {limit} characters")
        text = text[:limit]
    return text, notes


def _text_and_usage(value: str | AgentReply) -> tuple[str, Usage]:
    if isinstance(value, AgentReply):
        return value.text, value.usage
    if not isinstance(value, str):
        raise TypeError(f"expected the narrator's reply as str, got {type(value).__name__}")
    return value, Usage()


class NarrativeEnv(gym.Env[dict[str, Any], str]):
    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}

    def __init__(
        self,
        spec: Spec | str,
        *,
        player: Player | None = None,
        auditor: Auditor | None = None,
        max_turns: int = 100,
        reward: RewardConfig | str | None = None,
        render_mode: str | None = None,
        dataset: str | None = None,
        max_reply_chars: int = MAX_REPLY_CHARS,
    ) -> None:
        self.story = get_spec(spec, dataset) if isinstance(spec, str) else spec
        if auditor is None:
            raise ValueError(
                f"NarrativeEnv({self.story.key!r}) needs an auditor: pass auditor=... (an LLM auditor from "
                "ncpbench.auditors, or a scripted one for tests)")
        if player is None:
            from ncpbench.agents.scripted import (
                ScriptedPlayer,  # the default adversary; lazy: env must not need agents
            )

            player = ScriptedPlayer()
        self.player = player
        self.auditor = auditor
        self.max_turns = max_turns
        self.reward_config = reward_config(reward)
        self.render_mode = render_mode
        self.max_reply_chars = max_reply_chars
        self.graph = TrajectoryGraph(self.story)
        self.action_space = UnicodeText(max_length=1_000_000)
        self.observation_space = spaces.Dict({
            "turn": spaces.Discrete(max_turns + 2),
            "player_action": UnicodeText(),
            "story_state": UnicodeText(),
            "transcript": UnicodeText(),
        })
        self.state = EpisodeState.initial(self.story)
        self.pending_action: str | None = None
        self.history: list[TurnRecord] = []
        self.episode_seed = 0
        self.error: str | None = None
        self._player_usage: Usage | None = None
        """Tokens the player spent on the pending action; billed to the turn that answers it."""

    # -- Gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.episode_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self.state = EpisodeState.initial(self.story)
        self.pending_action = None
        self.history = []
        self.error = None
        self._player_usage = None
        if options and "snapshot" in options:
            self.restore(options["snapshot"])
        return self._observation(), self._info(None, {}, [])

    def step(self, action: str) -> StepResult:
        return self._run(lambda: self.astep(action))

    async def astep(self, action: str | AgentReply) -> StepResult:
        if self.state.done:
            raise RuntimeError(f"the episode is over ({self.state.outcome.value}); call reset()")
        raw, narrator_usage = _text_and_usage(action)
        reply, notes = clean_text(raw, self.max_reply_chars)
        if self.pending_action is None:
            return await self._opening(reply, notes, narrator_usage)
        return await self._turn(self.pending_action, reply, notes, narrator_usage)

    def render(self) -> str | None:
        text = render_transcript(self.state.transcript, self.story.meta.player_role)
        if self.pending_action:
            text += f"\n[turn {self.state.turn + 1}] {self.story.meta.player_role}: {self.pending_action}"
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        """Nothing to release: the event loop of `step` belongs to the thread, not to the env."""

    # -- snapshots (checkpoints and branching) ------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to continue this episode later or elsewhere; JSON-serialisable."""
        return {
            "state": self.state.model_dump(mode="json"),
            "pending_action": self.pending_action,
            "history": [t.model_dump(mode="json") for t in self.history],
            "episode_seed": self.episode_seed,
            "error": self.error,
        }

    def restore(self, snap: dict[str, Any]) -> None:
        state = EpisodeState.model_validate(snap["state"])
        if state.env_id != self.story.key:
            raise ValueError(f"snapshot is of {state.env_id!r}, this env is {self.story.key!r}")
        self.state = state
        self.pending_action = snap["pending_action"]
        self.history = [TurnRecord.model_validate(t) for t in snap["history"]]
        self.episode_seed = snap["episode_seed"]
        self.error = snap.get("error")

    def branch(self, *, player: Player | None = None, auditor: Auditor | None = None) -> NarrativeEnv:
        """A new env at this exact point of this episode: same story, roles, limits and reward.

        Stepping either one never changes the other (the state is immutable; the history list is
        copied). Roles are shared unless replaced.
        """
        other = NarrativeEnv(self.story, player=player or self.player, auditor=auditor or self.auditor,
                             max_turns=self.max_turns, reward=self.reward_config, render_mode=self.render_mode,
                             max_reply_chars=self.max_reply_chars)
        other.restore(self.snapshot())
        other._np_random = copy.deepcopy(self._np_random)
        other._player_usage = self._player_usage
        return other

    def fail(self, error: str) -> None:
        """End the episode as an infrastructure ERROR (a model that kept failing), not a verdict."""
        self.error = error
        self.state = self.state.finish(Outcome.ERROR)

    def record(self, replicate: int = 0, config: dict[str, Any] | None = None) -> EpisodeRecord:
        usage: dict[str, Usage] = {}
        for t in self.history:
            for role, u in t.usage.items():
                usage[role] = usage.get(role, Usage()).add(u)
        last = self.history[-1] if self.history else None
        conflicting = last is not None and not last.committed and last.verdict.is_conflict
        return EpisodeRecord(
            episode_id=f"{self.story.key}#{replicate}",
            seed=self.episode_seed,
            env_id=self.story.key,
            title=self.story.meta.title,
            genres=list(self.story.meta.genres),
            replicate=replicate,
            outcome=self.state.outcome,
            turns=self.state.turn + (1 if conflicting else 0),
            max_turns=self.max_turns,
            progress=self.state.progress(self.graph),
            satisfied_share=self.state.commitments.satisfied_share(),
            conflict_kinds=sorted({c.kind.value for c in last.verdict.conflicts}) if conflicting and last else [],
            error=self.error,
            history=list(self.history),
            final_state=self.state,
            usage=usage,
            config=config or {},
        )

    # -- the protocol ---------------------------------------------------------------------------

    async def _opening(self, reply: str, notes: list[str], narrator_usage: Usage) -> StepResult:
        if not reply.strip():
            notes = [*notes, "empty opening"]
        verdict = await self._audit(None, reply)
        self.state = self.state.with_opening(reply, verdict.fact_diff)
        self.history.append(TurnRecord(turn=0, player_action=None, narrator_reply=reply, verdict=verdict,
                                       committed=True, usage=self._usage(narrator_usage, verdict), notes=notes))
        await self._next_action()
        return self._observation(), 0.0, False, False, self._info(verdict, {}, notes)

    async def _turn(self, action: str, reply: str, notes: list[str], narrator_usage: Usage) -> StepResult:
        turn = self.state.turn + 1
        if not reply.strip():
            # Defined handling: silence ignores the player's action, without asking a model.
            verdict = Verdict(conflicts=[Conflict(kind=ConflictKind.PLAYER_INPUT, evidence="",
                                                  reason="the narrator's reply is empty")])
            notes = [*notes, "empty reply: player-input conflict without an audit"]
        else:
            verdict = await self._audit(action, reply)
        usage = self._usage(narrator_usage, verdict)
        if verdict.conflicts:
            self.state = self._mark_violations(verdict).finish(Outcome.CONFLICT)
            parts = breakdown(self.reward_config, new_nodes=0, new_satisfied=0, conflict=True, success=False,
                              committed=False)
            self.history.append(TurnRecord(turn=turn, player_action=action, narrator_reply=reply, verdict=verdict,
                                           committed=False, reward=sum(parts.values()), usage=usage, notes=notes))
            self.pending_action = None
            return self._observation(), sum(parts.values()), True, False, self._info(verdict, parts, notes)

        done = set(self.state.completed_nodes)
        position = {n: i for i, n in enumerate(self.graph.order)}
        completed, rejected = [], []
        for node in sorted(dict.fromkeys(verdict.completed_nodes), key=lambda n: position.get(n, -1)):
            if node in done:
                continue
            if node in position and self.graph.check_skip(node, done).ok:
                completed.append(node)
                done.add(node)
            else:
                rejected.append(node)
        satisfied_before = sum(c.status is Status.SATISFIED for c in self.state.commitments.items)
        try:
            new_state = self.state.commit_turn(self.story, self.graph, action, reply, verdict.fact_diff, completed,
                                               list(verdict.commitment_updates))
        except (LedgerError, KeyError) as e:
            raise AuditError(f"verdict for turn {turn} cannot apply: {e}") from e
        satisfied_now = sum(c.status is Status.SATISFIED for c in new_state.commitments.items)
        success = new_state.commitments.all_achieved()
        truncated = not success and new_state.turn >= self.max_turns
        if success:
            new_state = new_state.finish(Outcome.SUCCESS)
        elif truncated:
            new_state = new_state.finish(Outcome.SURVIVAL)
        self.state = new_state
        parts = breakdown(self.reward_config, new_nodes=len(completed), new_satisfied=satisfied_now - satisfied_before,
                          conflict=False, success=success, committed=True, survival=truncated)
        self.history.append(TurnRecord(turn=turn, player_action=action, narrator_reply=reply, verdict=verdict,
                                       committed=True, completed_nodes=completed, rejected_nodes=rejected,
                                       reward=sum(parts.values()), usage=usage, notes=notes))
        self.pending_action = None
        if not self.state.done:
            await self._next_action()
        return self._observation(), sum(parts.values()), success, truncated, self._info(verdict, parts, notes)

    def _mark_violations(self, verdict: Verdict) -> EpisodeState:
        known = {c.id for c in self.state.commitments.items}
        updates = [CommitmentUpdate(id=c.target, status=Status.VIOLATED, evidence=[c.evidence])
                   for c in verdict.conflicts if c.kind is ConflictKind.COMMITMENT and c.target in known]
        book = self.state.commitments.apply(updates, self.state.turn + 1)
        return self.state.model_copy(update={"commitments": book})

    async def _audit(self, action: str | None, reply: str) -> Verdict:
        request = AuditRequest(spec=self.story, state=self.state, player_action=action, reply=reply,
                               frontier=tuple(self.graph.frontier(self.state.completed_nodes)))
        verdict = await resolve(self.auditor.audit(request))
        if not isinstance(verdict, Verdict):
            raise AuditError(f"auditor returned {type(verdict).__name__}, not a Verdict")
        return verdict

    async def _next_action(self) -> None:
        request = player_request(self.story, self.state).model_copy(update={"seed": self.episode_seed})
        value = await resolve(self.player.act(request))
        text, usage = _text_and_usage(value)
        text, _ = clean_text(text, self.max_reply_chars)
        self.pending_action = text
        self._player_usage = usage

    def _usage(self, narrator: Usage, verdict: Verdict) -> dict[str, Usage]:
        auditor = Usage()
        for u in verdict.usage.values():
            auditor = auditor.add(u)
        out = {"narrator": narrator, "auditor": auditor}
        player = self._player_usage
        if player is not None:
            out["player"] = player
        return out

    # -- observations ---------------------------------------------------------------------------

    def narrator_view(self) -> NarratorRequest:
        return narrator_request(self.story, self.graph, self.state, self.pending_action)

    def _observation(self) -> dict[str, Any]:
        view = self.narrator_view()
        return {
            "turn": min(view.turn, self.max_turns + 1),
            "player_action": self.pending_action or "",
            "story_state": render_story_state(view),
            "transcript": render_transcript(self.state.transcript, self.story.meta.player_role),
        }

    def _info(self, verdict: Verdict | None, parts: dict[str, float], notes: list[str]) -> dict[str, Any]:
        return {
            "env_id": self.story.key,
            "outcome": self.state.outcome.value,
            "turn": self.state.turn,
            "phase": "opening" if not self.state.transcript else ("over" if self.state.done else "turn"),
            "player_action": self.pending_action,
            "verdict": verdict,
            "progress": self.state.progress(self.graph),
            "completed_nodes": list(self.state.completed_nodes),
            "commitments": self.state.commitments.statuses(),
            "reward_breakdown": parts or dict.fromkeys(breakdown(self.reward_config, new_nodes=0, new_satisfied=0,
                                                                 conflict=False, success=False, committed=False), 0.0),
            "notes": notes,
            "narrator_request": self.narrator_view(),
        }

    def _run(self, make_coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("step() was called inside a running event loop; use `await env.astep(reply)`")
        return _thread_loop().run_until_complete(make_coro())
