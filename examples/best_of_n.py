"""Best-of-n narration: sample k replies a turn, audit each on its own branch, keep the best.

The auditors serve as the reward model: every candidate is played on a branch of the episode
(`ncpbench.rl.try_replies`), the best one (passed the audit, then highest reward) is kept and the
episode continues from its branch. Every search is written down, so the run folder can feed
`ncpbench export --format preference` (a reply that passed vs. one the audit failed):

    RUN/episodes.jsonl   one EpisodeRecord per episode (the kept replies)
    RUN/branches.jsonl   one ncpbench.rl.BranchSearch per turn: the request and every candidate's verdict
    RUN/run.json         what ran

Dry run (the default): every role talks to loopback mock servers. To give the search something to
choose, the mock narrator numbers its answers (so each candidate differs) and the mock auditor
flags a share of replies, picked by a hash of their text (`--mock-conflict`). Point the roles at
real endpoints to sample real alternatives:

    python examples/best_of_n.py --env iron-man --k 4 --turns 5 --episodes 2 --out runs/best-of-n
    python examples/best_of_n.py --narrator openai/gpt-4o-mini --auditor openai/gpt-4o --player-mode scripted ...
    ncpbench export runs/best-of-n --format preference --out prefs.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from ncpbench.cli.run import add_model_options, config_from_args
from ncpbench.env import NarrativeEnv, resolve
from ncpbench.logs import configure
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocols import Auditor, Narrator, Player
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


def with_mock_endpoints(config: RunConfig, conflict: float, seed: int, servers: list[MockServer]) -> RunConfig:
    """Give every mock role without a base URL a loopback server (varied narration, some flagged replies)."""
    roles: dict[str, Any] = {}
    world: MockServer | None = None
    for name in ("narrator", "player", "auditor"):
        role = config.role(name)
        if role.provider != "mock" or role.base_url:
            continue
        if name == "narrator":
            server = MockServer(MockConfig(vary_narration=True, seed=seed)).start()
            servers.append(server)
        else:
            if world is None:
                world = MockServer(MockConfig(conflict_rate=conflict, conflict_kind="player_input", seed=seed)).start()
                servers.append(world)
            server = world
        roles[name] = role.model_copy(update={"base_url": server.base_url})
    return config.model_copy(update=roles)


async def main_async(args: argparse.Namespace) -> int:
    servers: list[MockServer] = []
    config = with_mock_endpoints(config_from_args(args), args.mock_conflict, args.seed, servers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    client = ModelClient()
    try:
        narrator, player, auditor = build_roles(config, client, salt="best-of-n")
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
    p.add_argument("--mock-conflict", type=float, default=0.3,
                   help="dry run: share of replies the mock auditor flags as conflicts (default 0.3)")
    p.add_argument("--out", default="runs/best-of-n", help="run folder to write")
    add_model_options(p)
    args = p.parse_args(argv)
    configure("WARNING")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
