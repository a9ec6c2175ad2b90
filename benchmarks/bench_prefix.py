"""How much of every prompt a provider's prefix cache can serve (a benchmark, not a test).

Plays real episodes (LLM narrator, LLM adversarial player, the staged LLM auditor) against a
loopback OpenAI-compatible endpoint: the mock server (`ncpbench.models.mock_server`), which answers
every request itself; its `on_request` hook hands each chat request to the recorder. Per call it records

- the prompt characters (system + user),
- the prefix shared with the previous call of the same episode and the same role/stage
  (`same`: narrator after narrator, conflict_check after conflict_check, ...),
- the prefix shared with the previous call of any role/stage of the same episode (`any`: e.g.
  conflict_check right after fact_update of the same turn).

The reused prefix of a call is max(same, any): what a cache that keeps the last prompt of each
role and the last prompt of the episode would serve (providers keep more, so this is a lower
bound for one episode per cache). Uncached characters are prompt minus reused.

The episode is told from the request itself (the story's title: "Story: T." heads every auditor
prompt, "based on T." sits in the narrator's and the player's system prompt), the stage from the
json_schema name of the response format, narrator and player from their system prompts, the turn
from the prompt ("=== Now: turn N ===", "Now: turn N.", the player's log).

    .venv/bin/python benchmarks/bench_prefix.py --turns 50 --advance-every 3 --compact 6 --csv prefix.csv
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import re
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # finds _common under `python -m benchmarks.X` too
from _common import table_head, table_row, timed

from ncpbench.models.mock_server import MockConfig, MockServer, common_prefix

FILMS = ["the-prestige", "the-hangover", "taxi-driver", "predator", "iron-man"]
"""Films with 18-19 plot nodes: at one node every 3 turns none reaches SUCCESS before turn 50."""
TABLE_TURNS = (1, 5, 10, 20, 30, 40, 50)
ROLES = ("narrator", "player", "auditor")

_AUDIT_TURN = re.compile(r"^=== Now: turn (\d+) ===", re.M)
_NARRATOR_TURN = re.compile(r"^Now: turn (\d+)\.", re.M)
_PLAYER_LOG_TURN = re.compile(r"^\[turn (\d+)\] Narrator: ", re.M)
_AUDIT_TITLE = re.compile(r"\AStory: (.+?)\. The player's character is ")
_AGENT_TITLE = re.compile(r"interactive story based on (.+?)\. (?:The player controls|You test|Act as)")


@dataclass
class Call:
    episode: str
    role: str
    stage: str
    turn: int
    prompt_chars: int
    same: int
    any: int

    @property
    def reused(self) -> int:
        return max(self.same, self.any)


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)
    last_by_stage: dict[tuple[str, str], str] = field(default_factory=dict)
    last_any: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        system = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
        user = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") != "system")
        schema_name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if schema_name:
            role, stage = "auditor", str(schema_name)
            m = _AUDIT_TITLE.search(user)
            t = _AUDIT_TURN.search(user)
            turn = int(t.group(1)) if t else 0
        elif "You are the narrator" in system:
            role = stage = "narrator"
            m = _AGENT_TITLE.search(system)
            t = _NARRATOR_TURN.search(user)
            turn = int(t.group(1)) if t else 0
        else:
            role = stage = "player"
            m = _AGENT_TITLE.search(system)
            done = [int(x) for x in _PLAYER_LOG_TURN.findall(user)]
            turn = max(done, default=0) + 1
        episode = m.group(1) if m else "?"
        flat = system + "\x00" + user  # the separator keeps two different system prompts apart

        def shared(prev: str | None) -> int:
            if prev is None:
                return 0
            n = common_prefix(prev, flat)
            return n - 1 if n > len(system) else n  # do not count the separator

        with self.lock:
            call = Call(episode, role, stage, turn, len(flat) - 1,
                        shared(self.last_by_stage.get((episode, stage))), shared(self.last_any.get(episode)))
            self.calls.append(call)
            self.last_by_stage[(episode, stage)] = flat
            self.last_any[episode] = flat


RECORDER = Recorder()


async def play(url: str, films: list[str], turns: int, protocol: Any, player_mode: str) -> list[Any]:
    from ncpbench.dataset import load
    from ncpbench.env import NarrativeEnv
    from ncpbench.episode import play_episode
    from ncpbench.models.client import ModelClient
    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.roles import build_roles

    role = RoleConfig(model="mock/default", base_url=url)
    config = RunConfig(narrator=role, player=role, auditor=role, player_mode=player_mode)
    client = ModelClient()
    ds = load(None)

    async def one(slug: str) -> Any:
        narrator, player, auditor = build_roles(config, client, salt=slug)
        env = NarrativeEnv(ds[slug], player=player, auditor=auditor, max_turns=turns, protocol=protocol)
        return await play_episode(env, narrator, seed=0)

    try:
        return list(await asyncio.gather(*(one(s) for s in films)))
    finally:
        await client.aclose()


def curve(calls: list[Call], turns: int) -> list[dict[str, Any]]:
    """Per turn, averaged over the episodes that made calls at that turn."""
    rows = []
    for t in range(turns + 1):
        at = [c for c in calls if c.turn == t]
        n = len({c.episode for c in at}) or 1
        row: dict[str, Any] = {"turn": t, "episodes": len({c.episode for c in at}), "calls": round(len(at) / n, 2)}
        for role in ROLES:
            mine = [c for c in at if c.role == role]
            row[f"{role}_prompt"] = round(sum(c.prompt_chars for c in mine) / n)
            row[f"{role}_same"] = round(sum(c.same for c in mine) / n)
            row[f"{role}_any"] = round(sum(c.any for c in mine) / n)
            row[f"{role}_reused"] = round(sum(c.reused for c in mine) / n)
        row["prompt"] = sum(row[f"{r}_prompt"] for r in ROLES)
        row["reused"] = sum(row[f"{r}_reused"] for r in ROLES)
        row["uncached"] = row["prompt"] - row["reused"]
        row["reused_share"] = round(row["reused"] / row["prompt"], 3) if row["prompt"] else 0.0
        rows.append(row)
    return rows


def shares(calls: list[Call], since: int = 10) -> dict[str, float]:
    out = {}
    for role in ROLES:
        mine = [c for c in calls if c.role == role and c.turn >= since]
        total = sum(c.prompt_chars for c in mine)
        out[role] = sum(c.reused for c in mine) / total if total else 0.0
        out[f"{role}_same"] = sum(c.same for c in mine) / total if total else 0.0
    mine = [c for c in calls if c.turn >= since]
    out["all"] = sum(c.reused for c in mine) / max(1, sum(c.prompt_chars for c in mine))
    return out


def by_stage(calls: list[Call], since: int = 10) -> dict[str, tuple[int, float, float]]:
    """stage -> (calls, share served by the same stage's previous call, share served by max(same, any))."""
    groups: dict[str, list[Call]] = defaultdict(list)
    for c in calls:
        if c.turn >= since:
            groups[c.stage].append(c)
    return {s: (len(cs), sum(c.same for c in cs) / sum(c.prompt_chars for c in cs),
                sum(c.reused for c in cs) / sum(c.prompt_chars for c in cs)) for s, cs in sorted(groups.items())}


def measure(url: str, films: list[str], turns: int, protocol: Any, player_mode: str) -> tuple[list[Call], list[Any], float]:
    with RECORDER.lock:
        RECORDER.calls.clear()
        RECORDER.last_by_stage.clear()
        RECORDER.last_any.clear()
    with timed() as t:
        records = asyncio.run(play(url, films, turns, protocol, player_mode))
        with RECORDER.lock:
            calls = list(RECORDER.calls)
    if not calls:  # the mock's handler no longer reaches the hook above: fail rather than report zeros
        sys.exit("no chat request was recorded: the mock server's on_request hook was not called")
    return calls, records, t.wall_s


def report(label: str, calls: list[Call], records: list[Any], seconds: float, turns: int) -> list[dict[str, Any]]:
    rows = curve(calls, turns)
    outcomes = ", ".join(f"{r.env_id}: {r.outcome.value} at {r.turns}" for r in records)
    print(f"\n## {label}: {len(records)} episodes, {len(calls)} calls, {seconds:.1f} s ({outcomes})")
    print("Per turn, mean per episode (characters); reused = max(prefix shared with the previous call of the "
          "same role/stage, with the previous call of any stage)")
    print(table_head("turn", "calls", "prompt chars", *(f"{role} reused/prompt" for role in ROLES), "uncached chars",
                     "reused share", left=0))
    for row in rows:
        if row["turn"] in TABLE_TURNS:
            print(table_row(row["turn"], row["calls"], f"{row['prompt']:,}",
                            *(f"{row[f'{role}_reused']:,} / {row[f'{role}_prompt']:,}" for role in ROLES),
                            f"{row['uncached']:,}", f"{row['reused_share']:.1%}"))
    s = shares(calls)
    print(f"Turns >= 10: reused share auditor {s['auditor']:.1%} (target >= 85%), narrator {s['narrator']:.1%} "
          f"(target >= 80%), player {s['player']:.1%}, all {s['all']:.1%}")
    print("By stage, turns >= 10: | stage | calls | served by its own previous call | served by max(same, any) |")
    for stage, (n, same, reused) in by_stage(calls).items():
        print(table_row(stage, n, f"{same:.1%}", f"{reused:.1%}"))
    tail = [r for r in rows if r["turn"] >= 10 and r["episodes"]]
    if len(tail) >= 2:
        first, last = tail[0], tail[-1]
        print(f"Uncached chars per turn: turn {first['turn']} {first['uncached']:,} -> turn {last['turn']} "
              f"{last['uncached']:,} (x{last['uncached'] / max(1, first['uncached']):.2f}); prompt chars per turn "
              f"x{last['prompt'] / max(1, first['prompt']):.2f}")
    return rows


def block_story_log(state: Any, protocol: Any) -> str:
    """What-if for `--compact-blocks`: the compact log drops exchanges N at a time (it keeps between N
    and 2N-1), so between two drops it grows by appending only, like the full log."""
    exchanges = state.transcript
    text = "Story so far:\n"
    n = protocol.recent_turns
    if protocol.audit_context == "compact" and len(exchanges) > n:
        dropped = (len(exchanges) - n) // n * n
        if dropped:
            exchanges = exchanges[dropped:]
            text += f"({dropped} earlier exchanges are summarised by the ledger in the current state below.)\n\n"
    from ncpbench.auditors.prompts import log_entry

    return text + "".join(log_entry(ex) + "\n\n" for ex in exchanges)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--films", nargs="+", default=FILMS)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--advance-every", type=int, default=3)
    ap.add_argument("--player-mode", choices=("adversarial", "scripted"), default="adversarial")
    ap.add_argument("--compact", type=int, default=None, help="also run the compact audit context, N recent turns")
    ap.add_argument("--compact-blocks", action="store_true",
                    help="with --compact: also a what-if run whose compact log drops exchanges N at a time")
    ap.add_argument("--csv", default="prefix_curve.csv", help="the whole curve (one row per turn and protocol)")
    args = ap.parse_args()
    from ncpbench.protocol import PUBLISHED

    with MockServer(MockConfig(advance_every=args.advance_every), on_request=RECORDER.record) as server:
        print(f"{len(args.films)} films x {args.turns} turns, player {args.player_mode}, mock auditor completes the "
              f"current node every {args.advance_every} turns, no conflicts; characters, not tokens")
        runs = [("full", PUBLISHED)]
        if args.compact:
            runs.append((f"compact{args.compact}", PUBLISHED.with_context("compact", args.compact)))
        if args.compact and args.compact_blocks:
            runs.append((f"compact{args.compact}-blocks", PUBLISHED.with_context("compact", args.compact)))
        all_rows = []
        import ncpbench.auditors.prompts as auditor_prompts

        original = auditor_prompts.story_log
        for label, protocol in runs:
            auditor_prompts.story_log = block_story_log if label.endswith("-blocks") else original
            try:
                calls, records, seconds = measure(server.base_url, args.films, args.turns, protocol, args.player_mode)
            finally:
                auditor_prompts.story_log = original
            name = protocol.label + (" with block drops (what-if, not the shipped prompt)" if label.endswith("-blocks")
                                     else "")
            for row in report(name, calls, records, seconds, args.turns):
                all_rows.append({"protocol": label, **row})
        if len(runs) >= 2:
            full = [r for r in all_rows if r["protocol"] == "full" and r["turn"] >= 10]
            print("\nvs full, turns >= 10 (sum over turns of the per-episode means):")
            for label, _ in runs[1:]:
                other = [r for r in all_rows if r["protocol"] == label and r["turn"] >= 10]
                for key in ("prompt", "uncached", "auditor_prompt", "narrator_prompt"):
                    a, b = sum(r[key] for r in full), sum(r[key] for r in other)
                    print(f"  {label} {key}: full {a:,}  {label} {b:,}  ratio {b / max(1, a):.2f}")
    with open(args.csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(all_rows[0]))
        writer.writeheader()
        writer.writerows(all_rows)
    print(f"\ncurve written to {args.csv}", file=sys.stderr)


if __name__ == "__main__":
    main()
