"""ncpbench as a verifiers multi-turn environment (extra `ncpbench[verifiers]`, classic `vf.MultiTurnEnv`).

    from ncpbench.integrations.verifiers_env import load_environment
    env = load_environment(envs="iron-man,alien", max_turns=20, auditor="openai/gpt-4o")

A rollout is one ncpbench episode: the model being trained narrates (its first completion is the
opening); `env_response` hands each narration to a `NarrativeEnv`, whose auditor judges it and
whose player acts, and answers with the player's action and the story state the narrator may
see. When the episode ends (CONFLICT, SUCCESS, SURVIVAL, or ERROR for an infrastructure
failure) the env sends a final message and the rollout stops. Each step runs under ncpbench's
turn deadline and failure policy (`ncpbench.episode.guarded`).

The reward is the episode's return under ncpbench's reward scheme (`reward=`, default
`progress`: +1 per plot node, +1 per satisfied commitment, -5 for a conflict; docs/RL.md); the
rubric also records turns, progress, conflict, success and error as zero-weight metrics. The
dataset has one row per (environment, seed); its prompt is the narrator's opening request.

An auditor is required (a model string, a RoleConfig or an Auditor): a reward for training must
come from a judge. The player defaults to ncpbench's seeded scripted player.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import verifiers as vf
from datasets import Dataset

from ncpbench.agents.prompts import NARRATOR_TURN, narrator_messages
from ncpbench.auditors.scripted import ReplayAuditor
from ncpbench.env import NarrativeEnv
from ncpbench.episode import DEFAULT_TURN_TIMEOUT_S, guarded
from ncpbench.integrations.gym_plugin import RoleArg, build_auditor, build_player
from ncpbench.record import EpisodeRecord
from ncpbench.registry import parse_envs

MISSING_AUDITOR = ("ncpbench's verifiers environment needs an auditor: load_environment(auditor='openai/MODEL') "
                   "(or a RoleConfig / an Auditor); a training reward must come from a judge")


def episode_summary(record: EpisodeRecord, episode_return: float) -> dict[str, Any]:
    return {"outcome": record.outcome.value, "turns": record.turns, "progress": record.progress,
            "satisfied": record.satisfied_share, "conflict_kinds": list(record.conflict_kinds),
            "error": record.error, "return": episode_return, "env_id": record.env_id, "seed": record.seed}


def dataset_rows(slugs: Sequence[str], seeds: Sequence[int]) -> Dataset:
    """One row per (environment, seed): the narrator's opening request as the prompt."""
    rows = []
    for slug in slugs:
        view = NarrativeEnv(slug, auditor=ReplayAuditor()).narrator_view()  # only to render the prompt
        for seed in seeds:
            rows.append({"prompt": narrator_messages(view), "answer": "",
                         "info": {"env": slug, "seed": seed}})
    return Dataset.from_list(rows)


class NCPBenchEnv(vf.MultiTurnEnv):  # type: ignore[misc]
    """See the module docstring."""

    def __init__(self, *, dataset: Dataset, auditor: RoleArg, player: RoleArg = None, max_turns: int = 20,
                 reward: str = "progress", protocol: str | None = None,
                 turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S, **kwargs: Any) -> None:
        if auditor is None:
            raise ValueError(MISSING_AUDITOR)
        rubric = vf.Rubric()
        rubric.add_reward_func(self.episode_return, weight=1.0)
        for name in ("turns", "progress", "conflict", "success", "error"):
            rubric.add_metric(self._metric(name), weight=0.0)
        # The env ends every episode itself; verifiers' own turn cap (opening + turns + 1) never binds.
        super().__init__(dataset=dataset, eval_dataset=dataset, rubric=rubric, max_turns=max_turns + 2, **kwargs)
        self.player_arg, self.auditor_arg = player, auditor
        self.ncp_max_turns = max_turns
        self.reward = reward
        self.protocol = protocol
        self.turn_timeout_s = turn_timeout_s
        self._episodes: dict[str, tuple[NarrativeEnv, list[float]]] = {}

    # -- the episode -------------------------------------------------------------------------------

    async def setup_state(self, state: Any) -> Any:
        info = state["info"]
        # Sampling as `ncpbench run` resolves it for this env's protocol (paper under published).
        player, client = build_player(self.player_arg, protocol=self.protocol)
        auditor, _ = build_auditor(self.auditor_arg, client, protocol=self.protocol)
        env = NarrativeEnv(info["env"], player=player, auditor=auditor, max_turns=self.ncp_max_turns,
                           reward=self.reward, protocol=self.protocol)
        env.reset(seed=int(info["seed"]))
        self._episodes[state["trajectory_id"]] = (env, [])
        return state

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> list[Any]:
        env, rewards = self._episodes[state["trajectory_id"]]
        last = messages[-1] if messages else {}
        reply = str((last.get("content") if isinstance(last, dict) else getattr(last, "content", "")) or "")
        result = None
        if reply.strip():
            result = await guarded(env, lambda: env.astep(reply), self.turn_timeout_s)
        else:  # an empty narration is invalid output: the episode cannot go on
            env.fail("InvalidOutputError: the narration is empty")
        if result is not None:
            rewards.append(float(result[1]))
        if env.state.done:
            record = env.record(replicate=0, config={"verifiers": True})
            state["ncp"] = episode_summary(record, sum(rewards))
            self._episodes.pop(state["trajectory_id"], None)
            end = [vf.UserMessage(content=f"The episode is over: {record.outcome.value} after {record.turns} turns.")]
            state["final_env_response"] = end
            return end
        obs = env.observation()
        role = env.story.meta.player_role
        return [vf.UserMessage(content=f"{obs['story_state']}\n\n{role} now does: {obs['player_action']}\n"
                                       + NARRATOR_TURN.format(role=role))]

    @vf.cleanup  # type: ignore[untyped-decorator]
    async def drop_episode(self, state: Any) -> None:
        """A rollout that stopped early (an error, a timeout) must not leave its episode behind."""
        pair = self._episodes.pop(state.get("trajectory_id", ""), None)
        if pair is not None and "ncp" not in state:
            env, rewards = pair
            if not env.state.done:
                env.fail("rollout stopped before the episode ended")
            state["ncp"] = episode_summary(env.record(), sum(rewards))

    # -- the rubric ----------------------------------------------------------------------------------

    async def episode_return(self, state: Any, **kwargs: Any) -> float:
        ncp = state.get("ncp") or {}
        return 0.0 if ncp.get("outcome") == "ERROR" else float(ncp.get("return", 0.0))

    @staticmethod
    def _metric(name: str) -> Any:
        async def metric(state: Any, **kwargs: Any) -> float:
            ncp = state.get("ncp") or {}
            if name == "conflict":
                return float(ncp.get("outcome") == "CONFLICT")
            if name == "success":
                return float(ncp.get("outcome") == "SUCCESS")
            if name == "error":
                return float(ncp.get("outcome", "ERROR") == "ERROR")
            return float(ncp.get(name, 0.0))

        metric.__name__ = f"ncp_{name}"
        return metric


def load_environment(envs: str | Sequence[str] = "iron-man", max_turns: int = 20, seeds: int | Sequence[int] = 1,
                     auditor: RoleArg = None, player: RoleArg = None, reward: str = "progress",
                     protocol: str | None = None, turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S,
                     **kwargs: Any) -> NCPBenchEnv:
    """The verifiers entry point: `seeds` is a count (seeds 0..n-1) or a list of seeds."""
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    return NCPBenchEnv(dataset=dataset_rows(parse_envs(envs), seed_list), auditor=auditor, player=player,
                       max_turns=max_turns, reward=reward, protocol=protocol, turn_timeout_s=turn_timeout_s,
                       **kwargs)
