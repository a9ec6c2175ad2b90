"""`NarrativeEnv`: the Gymnasium adapter over the turn rules and the roles.

`step(narrator_reply)` takes the narrator's text; the env owns the player and the auditor. The
rules of a turn are not here: `ncpbench.protocol.apply_opening` / `apply_turn` decide what a
verdict does to the state, `ncpbench.rewards` prices the result. This module only asks the roles,
hands their answers to those functions, and translates to Gymnasium's API and back:

    reset -> (obs, info)              obs asks for the opening (turn 0)
    step(opening)                     audit the opening, then the player acts for turn 1
    step(reply to turn t)             audit, apply the verdict; unless the episode ended, the player
                                      acts for turn t + 1

"turn" means one thing everywhere (obs, info, record, displays): the turn in play — 0 for the
opening, t while the reply to the player's action of turn t is awaited, and after the last step
the final turn (the conflicting one included), equal to the record's `turns`.

`astep` is the same step for callers inside an event loop. `step` works anywhere: outside an
event loop it runs on one loop per thread (shared by every env of the thread, so model clients
keep their pooled connections); inside one (a notebook cell) it runs on a private loop thread.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import inspect
import os
import re
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar, cast

import gymnasium as gym
from gymnasium import spaces

from ncpbench.dataset import get_spec
from ncpbench.errors import AuditError
from ncpbench.protocol import (
    AuditProtocol,
    TurnOutcome,
    apply_opening,
    apply_quit,
    apply_turn,
    audit_frontier,
    get_protocol,
)
from ncpbench.protocols import Auditor, AuditRequest, Narrator, NarratorRequest, Player
from ncpbench.record import AgentReply, EpisodeRecord, TurnRecord
from ncpbench.rewards import RewardConfig, breakdown, reward_config, turn_reward
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState, Outcome
from ncpbench.textspace import UnicodeText
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Usage, Verdict
from ncpbench.views import narrator_request, player_request, render_story_state, render_transcript

T = TypeVar("T")
StepResult = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]

MAX_REPLY_CHARS = 16_000
"""Longer replies are cut (and the record says so): no reply can grow memory or prompts unbounded."""

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_THREAD = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    """The event loop every env of this thread runs its sync `step` on (one per thread and process)."""
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


class _LoopThread:
    """A daemon thread running its own event loop: where sync `step` runs when the caller's thread
    already has a running loop (which it must not block on itself)."""

    _lock = threading.Lock()
    _instance: tuple[int, asyncio.AbstractEventLoop] | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._instance is None or cls._instance[0] != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="ncpbench-step-loop", daemon=True).start()
                cls._instance = (os.getpid(), loop)
            return cls._instance[1]


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, whether or not an event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _thread_loop().run_until_complete(coro)
    return asyncio.run_coroutine_threadsafe(coro, _LoopThread.loop()).result()


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


def _text_bound(max_turns: int, max_reply_chars: int) -> int:
    """Characters the transcript and story-state texts can reach in the longest allowed episode:
    every turn's action and reply at full length plus their labels and the state lines."""
    return (max_turns + 1) * (2 * max_reply_chars + 10_000) + 100_000


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
        protocol: AuditProtocol | str | None = None,
    ) -> None:
        self.story = get_spec(spec, dataset) if isinstance(spec, str) else spec
        if auditor is None:
            raise ValueError(
                f"NarrativeEnv({self.story.key!r}) needs an auditor: pass auditor=... (an LLM auditor from "
                "ncpbench.auditors, or a scripted one for tests)")
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        if player is None:
            from ncpbench.agents.scripted import (
                ScriptedPlayer,  # the default adversary; lazy: env needs no agents
            )

            player = ScriptedPlayer()
        self.player = player
        self.auditor = auditor
        self.max_turns = max_turns
        self.protocol = get_protocol(protocol)
        self.reward_config = reward_config(reward)
        self.render_mode = render_mode
        self.max_reply_chars = max_reply_chars
        self.graph = TrajectoryGraph(self.story)
        bound = _text_bound(max_turns, max_reply_chars)
        self.action_space = UnicodeText(max_length=max(1_000_000, max_reply_chars * 4), non_blank=True)
        self.observation_space = spaces.Dict({
            "turn": spaces.Discrete(max_turns + 1),
            "player_action": UnicodeText(max_length=max_reply_chars),
            "narrator_reply": UnicodeText(max_length=max_reply_chars),
            "story_state": UnicodeText(max_length=bound),
            "transcript": UnicodeText(max_length=bound),
        })
        self._state = EpisodeState.initial(self.story)
        self._pending_action: str | None = None
        self._last: tuple[str | None, str] = (None, "")
        """(action, reply) of the last audited step: what a terminal observation shows."""
        self._history: list[TurnRecord] = []
        self.episode_seed = 0
        self.error: str | None = None
        self._player_usage: Usage | None = None
        """Tokens the player spent on the pending action; billed to the turn that answers it."""

    # -- read-only views of the episode ------------------------------------------------------------

    @property
    def state(self) -> EpisodeState:
        return self._state

    @property
    def pending_action(self) -> str | None:
        """The player's action awaiting the narrator's reply (None before the opening and once over)."""
        return self._pending_action

    @property
    def history(self) -> list[TurnRecord]:
        """Every audited step so far (a copy: appending to it changes nothing)."""
        return list(self._history)

    @property
    def turn(self) -> int:
        """The turn in play (see the module docstring): one definition for obs, info and records."""
        if self._state.done:
            return self._record_turns()
        return 0 if self._pending_action is None else self._state.turn + 1

    # -- Gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.episode_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self._state = EpisodeState.initial(self.story)
        self._pending_action = None
        self._last = (None, "")
        self._history = []
        self.error = None
        self._player_usage = None
        if options and "snapshot" in options:
            self.restore(options["snapshot"])
        return self._observation_and_info(None, {}, [])

    def step(self, action: str) -> StepResult:
        return run_sync(self.astep(action))

    async def astep(self, action: str | AgentReply) -> StepResult:
        """One step. An empty reply is refused with ValueError and changes nothing (it is invalid
        output, never a verdict); infrastructure failures raise and leave the state as it was."""
        if self._state.done:
            raise RuntimeError(f"the episode is over ({self._state.outcome.value}); call reset()")
        raw, narrator_usage = _text_and_usage(action)
        reply, notes = clean_text(raw, self.max_reply_chars)
        if not reply.strip():
            raise ValueError("the narration is empty: env.step() needs the narrator's text (nothing was changed)")
        if self._pending_action is None:
            return await self._opening(reply, notes, narrator_usage)
        return await self._turn(self._pending_action, reply, notes, narrator_usage)

    def render(self) -> str | None:
        text = render_transcript(self._state.transcript, self.story.meta.player_role)
        if self._pending_action:
            text += f"\n[turn {self._state.turn + 1}] {self.story.meta.player_role}: {self._pending_action}"
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
            "state": self._state.model_dump(mode="json"),
            "pending_action": self._pending_action,
            "last": list(self._last),
            "history": [t.model_dump(mode="json") for t in self._history],
            "episode_seed": self.episode_seed,
            "error": self.error,
            "player_usage": self._player_usage.model_dump() if self._player_usage else None,
            "protocol": self.protocol.label,
        }

    def restore(self, snap: dict[str, Any]) -> None:
        state = EpisodeState.model_validate(snap["state"])
        if state.env_id != self.story.key:
            raise ValueError(f"snapshot is of {state.env_id!r}, this env is {self.story.key!r}")
        if snap.get("protocol", self.protocol.label) != self.protocol.label:
            raise ValueError(f"snapshot was played under protocol {snap['protocol']}, this env uses {self.protocol.label}")
        self._state = state
        self._pending_action = snap["pending_action"]
        last = snap.get("last") or [None, ""]
        self._last = (last[0], last[1])
        self._history = [TurnRecord.model_validate(t) for t in snap["history"]]
        self.episode_seed = snap["episode_seed"]
        self.error = snap.get("error")
        usage = snap.get("player_usage")
        self._player_usage = Usage.model_validate(usage) if usage else None

    def branch(self, *, player: Player | None = None, auditor: Auditor | None = None) -> NarrativeEnv:
        """A new env at this exact point of this episode: same story, roles, limits, protocol and reward.

        Stepping either one never changes the other (the state is immutable; the history is copied).
        Roles are shared unless replaced.
        """
        other = NarrativeEnv(self.story, player=player or self.player, auditor=auditor or self.auditor,
                             max_turns=self.max_turns, reward=self.reward_config, render_mode=self.render_mode,
                             max_reply_chars=self.max_reply_chars, protocol=self.protocol)
        other.restore(self.snapshot())
        other._np_random = copy.deepcopy(self._np_random)
        return other

    def fail(self, error: str) -> None:
        """End the episode as an infrastructure ERROR (a model that kept failing), not a verdict."""
        self.error = error
        self._pending_action = None
        self._state = self._state.finish(Outcome.ERROR)

    def quit(self) -> None:
        """End the episode early at the user's request (a person leaving `ncpbench play`): SURVIVAL
        of the turns committed so far. The pending action is dropped."""
        if not self._state.done:
            self._pending_action = None
            self._state = apply_quit(self._state)

    def _conflicting(self) -> TurnRecord | None:
        last = self._history[-1] if self._history else None
        return last if last is not None and not last.committed and last.verdict.is_conflict else None

    def _record_turns(self) -> int:
        return self._state.turn + (1 if self._conflicting() else 0)

    def record(self, replicate: int = 0, config: dict[str, Any] | None = None) -> EpisodeRecord:
        usage: dict[str, Usage] = {}
        for t in self._history:
            for role, u in t.usage.items():
                usage[role] = usage.get(role, Usage()).add(u)
        conflicting = self._conflicting()
        return EpisodeRecord(
            episode_id=f"{self.story.key}#{replicate}",
            seed=self.episode_seed,
            env_id=self.story.key,
            env_version=self.story.meta.version,
            title=self.story.meta.title,
            genres=list(self.story.meta.genres),
            replicate=replicate,
            protocol=self.protocol.label,
            outcome=self._state.outcome,
            turns=self._record_turns(),
            max_turns=self.max_turns,
            progress=self._state.progress(self.graph),
            satisfied_share=self._state.commitments.satisfied_share(),
            conflict_kinds=sorted({c.kind.value for c in conflicting.verdict.conflicts}) if conflicting else [],
            error=self.error,
            history=list(self._history),
            final_state=self._state,
            usage=usage,
            config=config or {},
        )

    # -- one step: ask the roles, apply the rules --------------------------------------------------

    async def _opening(self, reply: str, notes: list[str], narrator_usage: Usage) -> StepResult:
        verdict = await self._audit(None, reply)
        self._state = apply_opening(self._state, reply, verdict)
        self._last = (None, reply)
        self._history.append(TurnRecord(turn=0, player_action=None, narrator_reply=reply, verdict=verdict,
                                        committed=True, usage=self._usage(narrator_usage, verdict), notes=notes))
        await self._next_action()
        obs, info = self._observation_and_info(verdict, {}, notes)
        return obs, 0.0, False, False, info

    async def _turn(self, action: str, reply: str, notes: list[str], narrator_usage: Usage) -> StepResult:
        verdict = await self._audit(action, reply)
        outcome: TurnOutcome = apply_turn(self.story, self.graph, self._state, action, reply, verdict,
                                          self.protocol, self.max_turns)
        parts = turn_reward(self.reward_config, outcome)
        self._state = outcome.state
        self._pending_action = None
        self._last = (action, reply)
        self._history.append(outcome.record.model_copy(update={
            "reward": sum(parts.values()), "usage": self._usage(narrator_usage, verdict), "notes": notes}))
        if not self._state.done:
            await self._next_action()
        # The verdict as the core applied it (grounded/1 may have set unquoted conflicts aside).
        obs, info = self._observation_and_info(outcome.record.verdict, parts, notes)
        return obs, sum(parts.values()), outcome.terminated, outcome.truncated, info

    async def _audit(self, action: str | None, reply: str) -> Verdict:
        request = AuditRequest(spec=self.story, state=self._state, player_action=action, reply=reply,
                               frontier=audit_frontier(self.graph, self._state, self.protocol),
                               protocol=self.protocol)
        verdict = await resolve(self.auditor.audit(request))
        if not isinstance(verdict, Verdict):
            raise AuditError(f"auditor returned {type(verdict).__name__}, not a Verdict")
        return verdict

    async def _next_action(self) -> None:
        request = player_request(self.story, self._state).model_copy(update={"seed": self.episode_seed})
        text, usage = _text_and_usage(await resolve(self.player.act(request)))
        text, _ = clean_text(text, self.max_reply_chars)
        self._pending_action = text
        self._player_usage = usage

    def _usage(self, narrator: Usage, verdict: Verdict) -> dict[str, Usage]:
        auditor = Usage()
        for u in verdict.usage.values():
            auditor = auditor.add(u)
        out = {"narrator": narrator, "auditor": auditor}
        if self._player_usage is not None:
            out["player"] = self._player_usage
        return out

    # -- observations ---------------------------------------------------------------------------

    def narrator_view(self) -> NarratorRequest:
        """What the narrator sees now; marked terminal once the episode is over."""
        view = narrator_request(self.story, self.graph, self._state, self._pending_action)
        if self._state.done:
            view = view.model_copy(update={"turn": self.turn, "player_action": self._last[0], "terminal": True})
        return view

    def observation(self) -> dict[str, Any]:
        """The Gymnasium observation for the current point of the episode."""
        return self._observation(self.narrator_view())

    def _observation_and_info(self, verdict: Verdict | None, parts: dict[str, float],
                              notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        view = self.narrator_view()  # built once: the observation renders it, the info carries it
        return self._observation(view), self._info(verdict, parts, notes, view)

    def _observation(self, view: NarratorRequest) -> dict[str, Any]:
        action = self._last[0] if self._state.done else self._pending_action
        return {
            "turn": min(self.turn, self.max_turns),
            "player_action": (action or "")[: self.max_reply_chars],
            "narrator_reply": self._last[1] if self._state.done else "",
            "story_state": render_story_state(view),
            "transcript": render_transcript(self._state.transcript, self.story.meta.player_role),
        }

    def _info(self, verdict: Verdict | None, parts: dict[str, float], notes: list[str],
              view: NarratorRequest) -> dict[str, Any]:
        return {
            "env_id": self.story.key,
            "protocol": self.protocol.label,
            "outcome": self._state.outcome.value,
            "turn": self.turn,
            "phase": "opening" if not self._state.transcript else ("over" if self._state.done else "turn"),
            "player_action": self._pending_action,
            "verdict": verdict,
            "progress": self._state.progress(self.graph),
            "completed_nodes": list(self._state.completed_nodes),
            "commitments": self._state.commitments.statuses(),
            "reward_breakdown": parts or dict.fromkeys(breakdown(self.reward_config, new_nodes=0, new_satisfied=0,
                                                                 conflict=False, success=False, committed=False), 0.0),
            "notes": notes,
            "narrator_request": view,
        }
