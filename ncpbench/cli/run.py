"""`ncpbench run SLUG`: one episode with model-backed roles, printed turn by turn."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ncpbench.dataset import get_spec
from ncpbench.env import NarrativeEnv
from ncpbench.episode import play_episode
from ncpbench.models.cache import ResponseCache
from ncpbench.models.client import ModelClient
from ncpbench.models.config import PROFILES, ROLES, RunConfig, resolve_run_config
from ncpbench.record import EpisodeRecord
from ncpbench.roles import build_roles

ROLE_FLAGS = {"base-url": str, "api-key-env": str, "temperature": float, "top-p": float, "max-tokens": int,
              "seed": int, "structured": str, "timeout": float, "concurrency": int}
_FIELD = {"base-url": "base_url", "api-key-env": "api_key_env", "top-p": "top_p", "max-tokens": "max_tokens",
          "timeout": "timeout_s"}


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models (flags > NCPBENCH_<ROLE>_* variables > --config file > --profile)")
    for role in ROLES:
        g.add_argument(f"--{role}", metavar="MODEL", help=f"{role} model, provider/model (openai/…, mock/…, local/…)")
        for flag, typ in ROLE_FLAGS.items():
            g.add_argument(f"--{role}-{flag}", type=typ, help=argparse.SUPPRESS if flag != "base-url" else
                           f"{role} endpoint (also -api-key-env, -temperature, -top-p, -max-tokens, -seed, "
                           "-structured, -timeout, -concurrency)")
    g.add_argument("--profile", default="default", choices=sorted(PROFILES), help="sampling defaults (paper = published setup)")
    g.add_argument("--config", help="run config file (YAML or JSON): {narrator: {model: …}, player: …, auditor: …}")
    g.add_argument("--player-mode", choices=["adversarial", "cooperative", "scripted"],
                   help="LLM player condition, or the model-free scripted adversary")
    g.add_argument("--cache", help="SQLite response cache path (opt-in; replays a run exactly)")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    flags: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        values: dict[str, Any] = {"model": getattr(args, role)}
        for flag in ROLE_FLAGS:
            values[_FIELD.get(flag, flag)] = getattr(args, f"{role}_{flag.replace('-', '_')}")
        flags[role] = values
    return resolve_run_config(flags, config_file=args.config, profile=args.profile,
                              extra={"player_mode": args.player_mode, "cache_path": args.cache})


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run one episode (SLUG) or a batch (--envs) with model-backed roles")
    p.add_argument("slug", nargs="?", help="one environment slug (see `ncpbench list`); omit with --envs")
    p.add_argument("--turns", "--max-turns", dest="turns", type=int, default=None,
                   help="turn limit (SURVIVAL when reached; default 10 for one episode, 100 for a batch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="one episode: the record file (JSON); batch: the run folder (runs/NAME)")
    p.add_argument("--dataset", help="spec folder (default: bundled)")
    p.add_argument("--quiet", action="store_true", help="print only the outcome")
    b = p.add_argument_group("batch")
    b.add_argument("--envs", help="all | SLUG,SLUG | genre:GENRE — runs a batch into --out")
    b.add_argument("--replicates", type=int, default=1)
    b.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once")
    b.add_argument("--shard", help="i/n: run only this shard of the episodes (join with `ncpbench merge`)")
    b.add_argument("--retry-errors", action="store_true", help="re-run only the episodes recorded as errors")
    b.add_argument("--max-total-tokens", type=int, help="stop starting new work once this many tokens are used")
    b.add_argument("--max-cost", type=float, help="stop new work at this estimated cost (USD; needs --prices)")
    b.add_argument("--prices", help="YAML/JSON: {MODEL: [usd_per_1M_prompt, usd_per_1M_completion]}")
    b.add_argument("--no-progress", action="store_true", help="no live display")
    b.add_argument("--turn-timeout", type=float, default=600.0, help="wall-clock limit of one turn, seconds")
    add_model_options(p)
    p.set_defaults(func=cmd_run)


def print_step(console: Console, env: NarrativeEnv, info: dict[str, Any]) -> None:
    turn = env.history[-1]
    role = env.story.meta.player_role
    if turn.player_action is not None:
        console.print(f"[bold cyan]{escape(role)}[/]: {escape(turn.player_action)}")
    console.print(f"[bold]Narrator[/] (turn {turn.turn}): {escape(turn.narrator_reply)}")
    v = turn.verdict
    for c in v.conflicts:
        console.print(f"  [bold red]CONFLICT[/] {c.kind.value} {c.target or ''}: “{escape(c.evidence)}” — {escape(c.reason)}")
    for c in v.overturned:
        console.print(f"  [yellow]overturned[/] {c.kind.value} {c.target or ''}: “{escape(c.evidence)}”")
    if turn.committed and turn.turn > 0:
        bits = [f"+{len(v.fact_diff.add)} facts", f"-{len(v.fact_diff.negate)} facts"]
        if turn.completed_nodes:
            bits.append("completed " + ", ".join(turn.completed_nodes))
        satisfied = [u.id for u in v.commitment_updates]
        if satisfied:
            bits.append("satisfied " + ", ".join(satisfied))
        console.print(f"  [green]ok[/] {'; '.join(bits)}; progress {info['progress']:.0%}")
    for note in turn.notes:
        console.print(f"  [dim]note: {escape(note)}[/]")


async def run_one(slug: str, config: RunConfig, *, turns: int, seed: int, dataset: str | None = None,
                  console: Console | None = None) -> tuple[EpisodeRecord, dict[str, int]]:
    spec = get_spec(slug, dataset)
    cache = ResponseCache(config.cache_path) if config.cache_path else None
    client = ModelClient(cache=cache)
    try:
        narrator, player, auditor = build_roles(config, client, salt=f"{slug}|r0")
        env = NarrativeEnv(spec, player=player, auditor=auditor, max_turns=turns)
        on_step = (lambda e, i: print_step(console, e, i)) if console else None
        record = await play_episode(env, narrator, seed=seed, config=config.public(), on_step=on_step)
        return record, client.stats.as_dict()
    finally:
        await client.aclose()
        if cache:
            cache.close()


LOCAL_NOTE = (
    "note: {model} is a 135M-parameter smoke-test model running on this CPU; its stories and verdicts show the "
    "machinery working and are not benchmark-grade. For real scores point each role at a real endpoint, e.g. "
    "--narrator openai/gpt-4o-mini (OPENAI_API_KEY), --auditor openai/MODEL --auditor-base-url http://localhost:8000/v1 "
    "(vLLM) or http://localhost:11434/v1 (Ollama).")


def local_note(config: RunConfig) -> str | None:
    local = [config.role(r).model for r in ROLES if config.role(r).provider == "local"
             and not (r == "player" and config.player_mode == "scripted")]
    return LOCAL_NOTE.format(model=local[0]) if local else None


def cmd_run(args: argparse.Namespace) -> int:
    if args.envs or args.slug is None:
        if not args.envs or not args.out:
            raise SystemExit("ncpbench run: give a SLUG for one episode, or --envs and --out runs/NAME for a batch")
        from ncpbench.cli.batch import cmd_batch

        return cmd_batch(args)
    if args.turns is None:
        args.turns = 10
    config = config_from_args(args)
    console = Console(highlight=False)
    note = local_note(config)
    if note:
        console.print(f"[yellow]{escape(note)}[/]")
    if not args.quiet:
        console.print(f"[bold]{args.slug}[/] — narrator {config.narrator.model}, player "
                      f"{config.player.model if config.player_mode != 'scripted' else 'scripted'} ({config.player_mode}), "
                      f"auditor {config.auditor.model}; {args.turns} turns")
    record, stats = asyncio.run(run_one(args.slug, config, turns=args.turns, seed=args.seed, dataset=args.dataset,
                                        console=None if args.quiet else console))
    tokens = sum(u.total_tokens for u in record.usage.values())
    console.print(f"[bold]outcome {record.outcome.value}[/] after {record.turns} turns; progress {record.progress:.0%}; "
                  f"satisfied {record.satisfied_share:.0%}; tokens {tokens}; calls {stats['calls']}"
                  + (f"; error: {escape(record.error)}" if record.error else ""))
    if note and not args.quiet:
        console.print("[yellow]reminder: tiny-model verdicts are not benchmark-grade.[/]")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        data = record.model_dump(mode="json")
        data["call_stats"] = stats
        out.write_text(json.dumps(data, indent=2, ensure_ascii=False))
        console.print(f"record written to {out}")
    return 0
