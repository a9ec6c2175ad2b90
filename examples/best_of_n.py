"""Best-of-n narration: sample k replies a turn, audit each on its own branch, keep the best.

The auditors serve as the reward model: every candidate is played on a branch of the episode
(`ncpbench.rl.try_replies`), the best one (passed the audit, then highest reward) is kept and the
episode continues from its branch. Every search is written down, so the run folder can feed
`ncpbench export --format preference` (a reply that passed vs. one the audit failed):

    RUN/episodes.jsonl   one EpisodeRecord per episode (the kept replies)
    RUN/branches.jsonl   one ncpbench.rl.BranchSearch per turn: the request and every candidate's verdict
    RUN/run.json         what ran

Dry run (the default): every role talks to loopback mock servers. The mock narrator answers the
same prompt with the same text, so to give the search something to choose, a seeded share of the
mock narrator's candidates is dropped (`--mock-drop`): an empty reply ignores the player, a
player-input conflict. The drop happens here, not at the endpoint: an endpoint that answers with
empty content is a fault the client retries, never a reply. Point the roles at real endpoints to sample real alternatives:

    python examples/best_of_n.py --env iron-man --k 4 --turns 5 --episodes 2 --out runs/best-of-n
    python examples/best_of_n.py --narrator openai/gpt-4o-mini --auditor openai/gpt-4o --player-mode scripted ...
    ncpbench export runs/best-of-n --format preference --out prefs.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

from ncpbench.cli.run import add_model_options, config_from_args
from ncpbench.env import NarrativeEnv, resolve
from ncpbench.logs import configure
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocols import Auditor, Narrator, NarratorRequest, Player
from ncpbench.record import EpisodeRecord
from ncpbench.rl import best_index, search_record, try_replies
from ncpbench.roles import build_roles


async def best_of_n_episode(env: NarrativeEnv, narrator: Narrator, *, k: int, seed: int, replicate: int,
                            branches: Any, config: dict[str, Any]) -> EpisodeRecord:
    env.reset(seed=seed)
    episode_id = f"{env.story.key}#{replicate}"
    while not env.state.done:
        request = env.narrator_view()
        replies = await asyncio.gather(*(resolve(narrator.narrate(request)) for _ in range(k)))
        results = await try_replies(env, replies)
        best = best_index(results)
        branches.write(search_record(env, results, best, episode_id=episode_id).model_dump_json() + "\n")
        branches.flush()
        passed = sum(r.committed for r in results)
        chosen = results[best]
        print(f"  {episode_id} turn {request.turn}: {passed}/{k} candidates passed; kept #{best} "
              f"(reward {chosen.reward:+.1f}, {chosen.env.state.outcome.value})")
        if chosen.error is not None:
            env.fail(chosen.error)
            break
        env = chosen.env
    return env.record(replicate=replicate, config=config)


class DroppingNarrator:
    """Dry runs only: drops a seeded share of the candidates (an empty reply) so the search can choose."""

    def __init__(self, inner: Narrator, drop: float, seed: int) -> None:
        self.inner = inner
        self.drop = drop
        self.rng = random.Random(seed)

    async def narrate(self, request: NarratorRequest) -> Any:
        reply = await resolve(self.inner.narrate(request))
        return "" if self.rng.random() < self.drop else reply


def with_mock_endpoints(config: RunConfig, servers: list[MockServer]) -> RunConfig:
    """Give every mock role without a base URL the loopback mock server."""
    roles: dict[str, Any] = {}
    world: MockServer | None = None
    for name in ("narrator", "player", "auditor"):
        role = config.role(name)
        if role.provider != "mock" or role.base_url:
            continue
        if world is None:
            world = MockServer(MockConfig()).start()
            servers.append(world)
        roles[name] = role.model_copy(update={"base_url": world.base_url})
    return config.model_copy(update=roles)


async def main_async(args: argparse.Namespace) -> int:
    servers: list[MockServer] = []
    asked = config_from_args(args)
    dry_narrator = asked.narrator.provider == "mock" and not asked.narrator.base_url
    config = with_mock_endpoints(asked, servers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    client = ModelClient()
    try:
        narrator, player, auditor = build_roles(config, client, salt="best-of-n")
        if dry_narrator and args.mock_drop > 0:
            narrator = DroppingNarrator(narrator, args.mock_drop, args.seed)
        roles: tuple[Narrator, Player, Auditor] = (narrator, player, auditor)
        record_config = {**config.public(), "best_of_n": {"k": args.k}}
        (out / "run.json").write_text(json.dumps({"name": out.name, "kind": "best_of_n", "k": args.k,
                                                  "config": record_config}, indent=2))
        with (out / "episodes.jsonl").open("w", encoding="utf-8") as episodes, \
                (out / "branches.jsonl").open("w", encoding="utf-8") as branches:
            for i in range(args.episodes):
                env = NarrativeEnv(args.env, player=roles[1], auditor=roles[2], max_turns=args.turns,
                                   reward=args.reward)
                record = await best_of_n_episode(env, roles[0], k=args.k, seed=args.seed + i, replicate=i,
                                                 branches=branches, config=record_config)
                episodes.write(record.model_dump_json() + "\n")
                print(f"{record.episode_id}: {record.outcome.value} after {record.turns} turns, "
                      f"progress {record.progress:.0%}")
        print(f"wrote {out / 'episodes.jsonl'} and {out / 'branches.jsonl'}")
        return 0
    finally:
        await client.aclose()
        for s in servers:
            s.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--env", default="iron-man", help="environment slug")
    p.add_argument("--k", type=int, default=4, help="candidate replies per turn")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reward", default="progress", help="reward scheme: progress, sparse, conflict_penalised")
    p.add_argument("--mock-drop", type=float, default=0.3,
                   help="dry run: share of the mock narrator's answers that come back empty (default 0.3)")
    p.add_argument("--out", default="runs/best-of-n", help="run folder to write")
    add_model_options(p)
    args = p.parse_args(argv)
    configure("WARNING")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
