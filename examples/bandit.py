"""A small learning loop: a bandit over three narrator prompt variants.

Each episode the bandit (epsilon-greedy by default, or UCB1) picks a prompt variant for the
narrator; the episode's return under the chosen reward scheme is the arm's payoff. Episodes run
`--batch` at a time through `ncpbench.rl.AsyncBatchEnv`, so their model calls overlap. It writes
the reward curve to OUT/curve.csv (and OUT/curve.png when matplotlib is installed) and every
episode record to OUT/episodes.jsonl (so `ncpbench export OUT --format sft` works on it too).

Dry run (the default) against loopback mock servers. The mock narrator writes the same reply
whatever the prompt says, so a prompt variant cannot change anything there; to give the bandit
something to learn, each variant's narrator gets its own mock endpoint that drops a different
share of answers (`--mock-drop`, empty content, which the env judges a player-input conflict).
With a real narrator endpoint (`--narrator openai/... --narrator-base-url ...`) every variant
uses that endpoint and only the prompt differs.

    python examples/bandit.py --episodes 40 --turns 4 --out runs/bandit
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ncpbench.agents import prompts
from ncpbench.agents.callable import narrator_prompt

from ncpbench.cli.run import add_model_options, config_from_args
from ncpbench.env import NarrativeEnv
from ncpbench.logs import configure
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocols import Narrator, NarratorRequest
from ncpbench.record import AgentReply
from ncpbench.rl import AsyncBatchEnv
from ncpbench.roles import build_roles

VARIANTS = {
    "plain": "",
    "plot_first": ("\nAbove all, keep the plot moving: narrate the next plot point's trigger event as soon as the "
                   "player's action allows it."),
    "cautious": ("\nAbove all, keep the story consistent: when the player's action would break an established fact "
                 "or a commitment, let the world stop it and say why inside the story."),
}


class VariantNarrator:
    """The LLM narrator's prompt with one extra instruction appended to its system message."""

    def __init__(self, client: ModelClient, role: RoleConfig, extra: str) -> None:
        self.client, self.role, self.extra = client, role, extra

    async def narrate(self, request: NarratorRequest) -> AgentReply:
        system = prompts.NARRATOR_SYSTEM.format(title=request.title, role=request.player_role) + self.extra
        user = narrator_prompt(request)
        if request.player_action is None:
            user += "\n" + prompts.NARRATOR_OPENING.format(role=request.player_role)
        out = await self.client.chat(self.role, [{"role": "system", "content": system},
                                                 {"role": "user", "content": user}])
        return AgentReply(text=out.text.strip(), usage=out.usage)


@dataclass
class Bandit:
    arms: list[str]
    algo: str = "egreedy"
    epsilon: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    pulls: dict[str, int] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)

    def mean(self, arm: str) -> float:
        return self.totals.get(arm, 0.0) / self.pulls[arm] if self.pulls.get(arm) else 0.0

    def choose(self, pending: list[str] | None = None) -> str:
        """The arm for the next episode; `pending` = arms already picked for episodes still running."""
        untried = [a for a in self.arms if not self.pulls.get(a) and a not in (pending or [])]
        if untried:
            return untried[0]
        if any(not self.pulls.get(a) for a in self.arms):
            return self.rng.choice(self.arms)  # every arm is being tried already; no estimates yet
        if self.algo == "ucb":
            n = sum(self.pulls.values())
            means = [self.mean(a) for a in self.arms]
            scale = max(1.0, max(means) - min(means))  # returns are not in [0, 1]: scale the bonus
            return max(self.arms, key=lambda a: self.mean(a) + scale * math.sqrt(2 * math.log(n) / self.pulls[a]))
        if self.rng.random() < self.epsilon:
            return self.rng.choice(self.arms)
        return max(self.arms, key=self.mean)

    def update(self, arm: str, reward: float) -> None:
        self.pulls[arm] = self.pulls.get(arm, 0) + 1
        self.totals[arm] = self.totals.get(arm, 0.0) + reward


def write_curve(out: Path, rows: list[dict[str, object]], arms: list[str]) -> Path:
    with (out / "curve.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return out / "curve.csv"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    xs = [int(str(r["episode"])) for r in rows]
    ax1.plot(xs, [float(str(r["return"])) for r in rows], ".", alpha=0.4, label="episode return")
    ax1.plot(xs, [float(str(r["mean_return"])) for r in rows], "-", label="running mean")
    ax1.set_xlabel("episode")
    ax1.set_ylabel("return")
    ax1.legend()
    for arm in arms:
        ax2.plot(xs, [int(str(r[f"pulls_{arm}"])) for r in rows], label=arm)
    ax2.set_xlabel("episode")
    ax2.set_ylabel("times chosen")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=100)
    plt.close(fig)
    return out / "curve.png"


async def main_async(args: argparse.Namespace) -> int:
    arms = list(VARIANTS)
    drops = [float(x) for x in args.mock_drop.split(",")]
    if len(drops) != len(arms):
        raise SystemExit(f"--mock-drop needs {len(arms)} comma-separated rates, one per variant: {', '.join(arms)}")
    config = config_from_args(args)
    servers: list[MockServer] = []
    narrator_roles: dict[str, RoleConfig] = {}
    updates = {}
    for name in ("player", "auditor"):
        role = config.role(name)
        if role.provider == "mock" and not role.base_url:
            if not servers:
                servers.append(MockServer().start())
            updates[name] = role.model_copy(update={"base_url": servers[0].base_url})
    config = config.model_copy(update=updates)
    for arm, drop in zip(arms, drops, strict=True):
        role = config.narrator
        if role.provider == "mock" and not role.base_url:
            server = MockServer(MockConfig(fault_rate=drop, fault_kinds=("empty",), seed=args.seed)).start()
            servers.append(server)
            role = role.model_copy(update={"base_url": server.base_url})
        narrator_roles[arm] = role
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    client = ModelClient()
    bandit = Bandit(arms, algo=args.algo, epsilon=args.epsilon, rng=random.Random(args.seed))
    narrators = {arm: VariantNarrator(client, narrator_roles[arm], VARIANTS[arm]) for arm in arms}
    rows: list[dict[str, object]] = []
    total = 0.0
    try:
        _, player, auditor = build_roles(config, client, salt="bandit")
        with (out / "episodes.jsonl").open("w", encoding="utf-8") as episodes:
            episode = 0
            while episode < args.episodes:
                n = min(args.batch, args.episodes - episode)
                chosen: list[str] = []
                for _ in range(n):
                    chosen.append(bandit.choose(pending=chosen))
                envs = [NarrativeEnv(args.env, player=player, auditor=auditor, max_turns=args.turns, reward=args.reward)
                        for _ in range(n)]
                batch = AsyncBatchEnv(envs)
                # AgentReply (text + usage) is a valid narrator answer; the Protocol spells only str.
                records = await batch.run([cast(Narrator, narrators[a]) for a in chosen], seeds=args.seed + episode)
                for arm, record in zip(chosen, records, strict=True):
                    ret = sum(t.reward for t in record.history)
                    bandit.update(arm, ret)
                    total += ret
                    episode += 1
                    record = record.model_copy(update={"episode_id": f"{record.env_id}#{episode - 1}",
                                                       "replicate": episode - 1,
                                                       "config": {**config.public(), "bandit_arm": arm}})
                    episodes.write(record.model_dump_json() + "\n")
                    rows.append({"episode": episode, "arm": arm, "return": round(ret, 3),
                                 "outcome": record.outcome.value, "mean_return": round(total / episode, 3),
                                 **{f"pulls_{a}": bandit.pulls.get(a, 0) for a in arms}})
                    print(f"episode {episode:3d}  arm {arm:<10}  return {ret:+6.1f}  {record.outcome.value:<9}  "
                          f"running mean {total / episode:+.2f}")
        curve = write_curve(out, rows, arms)
        summary = {a: {"pulls": bandit.pulls.get(a, 0), "mean_return": round(bandit.mean(a), 3)} for a in arms}
        (out / "bandit.json").write_text(json.dumps({"algo": args.algo, "arms": summary}, indent=2))
        best = max(arms, key=bandit.mean)
        print("arms: " + "; ".join(f"{a} chosen {s['pulls']}x, mean return {s['mean_return']:+.2f}"
                                   for a, s in summary.items()))
        print(f"best arm so far: {best}. Curve written to {curve}")
        return 0
    finally:
        await client.aclose()
        for s in servers:
            s.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="An epsilon-greedy / UCB bandit over narrator prompt variants.")
    p.add_argument("--env", default="iron-man")
    p.add_argument("--episodes", type=int, default=40)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--batch", type=int, default=8, help="episodes played concurrently")
    p.add_argument("--algo", choices=["egreedy", "ucb"], default="egreedy")
    p.add_argument("--epsilon", type=float, default=0.2)
    p.add_argument("--reward", default="progress", help="reward scheme: progress, sparse, conflict_penalised")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mock-drop", default="0.35,0.15,0.03",
                   help="dry run: per variant (plain, plot_first, cautious), the share of empty narrator answers")
    p.add_argument("--out", default="runs/bandit")
    add_model_options(p)
    args = p.parse_args(argv)
    configure("WARNING")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
