"""`ncpbench run SLUG`: one episode with model-backed roles, printed turn by turn.

Also the options shared with the batch (`ncpbench run --envs`): model flags, the checks that run
before anything is created (numbers, config, roles, --out, endpoint probes), and signal handling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape

from ncpbench.dataset import get_spec
from ncpbench.env import NarrativeEnv
from ncpbench.episode import play_episode
from ncpbench.models.cache import ResponseCache
from ncpbench.models.client import ModelClient
from ncpbench.models.config import PROFILES, PROTOCOLS, ROLES, RunConfig, resolve_run_config, role_options
from ncpbench.preflight import (
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    ROLE_RANGES,
    check_number,
    check_out,
    check_roles,
    probe_endpoints,
)
from ncpbench.record import EpisodeRecord
from ncpbench.roles import build_roles
from ncpbench.state import Outcome

T = TypeVar("T")
MOCK_NOTE = "mock models: not a benchmark result ({roles} answered by the mock server)"

ROLE_FLAGS = {flag: kind for flag, (_, kind) in role_options().items()}
"""`--ROLE-FLAG` for every RoleConfig field (generated: adding a field adds its flag)."""
_FIELD = {flag: field for flag, (field, _) in role_options().items()}


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models (flags > NCPBENCH_<ROLE>_* variables > --config file > --profile)")
    for role in ROLES:
        g.add_argument(f"--{role}", metavar="MODEL", help=f"{role} model, provider/model (openai/…, mock/…, local/…)")
        for flag, typ in ROLE_FLAGS.items():
            g.add_argument(f"--{role}-{flag}", type=typ, help=argparse.SUPPRESS if flag != "base-url" else
                           f"{role} endpoint (also " + ", ".join(f"-{f}" for f in ROLE_FLAGS if f != "base-url") + ")")
    g.add_argument("--profile", default=None, choices=sorted(PROFILES),
                   help="sampling defaults: paper = the published setup (the default under --protocol published), "
                        "default = ours (the default under other protocols)")
    g.add_argument("--config", help="run config file (YAML or JSON): {narrator: {model: …}, player: …, auditor: …}")
    g.add_argument("--player-mode", choices=["adversarial", "cooperative", "scripted"],
                   help="LLM player condition, or the model-free scripted adversary")
    g.add_argument("--mock", action="store_true",
                   help="a dry run: roles not given use mock/default (tagged; reports say it is not a benchmark result)")
    g.add_argument("--protocol", choices=list(PROTOCOLS), help="audit protocol (default published)")
    g.add_argument("--audit-context", choices=["full", "compact"], default=None,
                   help="what each auditor stage sees: full (default, published) or compact (the ledger plus the "
                        "last --recent-turns exchanges; a labelled deviation for endpoints without prompt caching)")
    g.add_argument("--recent-turns", type=int, default=None, help="exchanges kept verbatim in compact context (6)")
    g.add_argument("--cache", help="SQLite response cache path (opt-in; replays a run exactly)")
    g.add_argument("--skip-preflight", action="store_true",
                   help="do not probe the endpoints before the run (for endpoints that cannot be probed)")


def check_role_flags(args: argparse.Namespace, roles: tuple[str, ...] = ROLES) -> None:
    """Range-check every numeric per-role flag before anything else happens."""
    for role in roles:
        for flag, bounds in ROLE_RANGES.items():
            check_number(f"--{role}-{flag}", getattr(args, f"{role}_{flag.replace('-', '_')}", None),
                         ge=bounds.get("ge"), gt=bounds.get("gt"), le=bounds.get("le"))


def config_from_args(args: argparse.Namespace, require: tuple[str, ...] | None = None) -> RunConfig:
    """The run config from flags, variables, file and profile; a role in `require` that nobody named is
    an error unless --mock (`ncpbench run` requires every role it uses; by default other commands none)."""
    check_role_flags(args)
    if require is None:
        require = ROLES if getattr(args, "command", None) == "run" else ()
    flags: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        values: dict[str, Any] = {"model": getattr(args, role)}
        for flag in ROLE_FLAGS:
            values[_FIELD.get(flag, flag)] = getattr(args, f"{role}_{flag.replace('-', '_')}")
        flags[role] = values
    return resolve_run_config(flags, config_file=args.config, profile=args.profile,
                              extra={"player_mode": args.player_mode, "cache_path": args.cache,
                                     "protocol": getattr(args, "protocol", None),
                                     "audit_context": getattr(args, "audit_context", None),
                                     "recent_turns": getattr(args, "recent_turns", None)},
                              require=require, mock_default=bool(getattr(args, "mock", False)))


def check_common(args: argparse.Namespace) -> None:
    """The numeric options of `ncpbench run`, single and batch."""
    check_number("--turns", args.turns, ge=1, fix="give --turns (--max-turns) a turn limit of at least 1")
    check_number("--seed", args.seed, ge=0)
    check_number("--turn-timeout", args.turn_timeout, gt=0, fix="give --turn-timeout a number of seconds above 0")


def preflight_roles(args: argparse.Namespace, config: RunConfig) -> None:
    """Roles and keys always; one probe per endpoint unless --skip-preflight."""
    check_roles(config)
    if not args.skip_preflight:
        probe_endpoints(config)


def mock_note(config: RunConfig) -> str | None:
    roles = config.mock_roles()
    return MOCK_NOTE.format(roles=", ".join(roles)) if roles else None


class Stopped(Exception):
    """The run was stopped by a signal; `code` is the exit code (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, with SIGINT and SIGTERM both cancelling the run cleanly (finally blocks run, so a
    batch writes run.json as interrupted and keeps its checkpoints) and raising Stopped."""

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        received: list[int] = []

        def on_signal(signum: int) -> None:
            if not received and task is not None:
                task.cancel()
            received.append(signum)

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            return await main
        except asyncio.CancelledError:
            if received:
                raise Stopped(received[0]) from None
            raise
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    return asyncio.run(guarded())


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
    b.add_argument("--replicates", type=int, default=1, help="episodes per environment (at least 1)")
    b.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once (at least 1)")
    b.add_argument("--shard", help="i/n: run only this shard of the episodes (join with `ncpbench merge`)")
    b.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="where episodes are played: this process (default) or Ray worker actors (ncpbench[ray])")
    b.add_argument("--ray-address", help="with --executor ray: the Ray cluster to join (default: a local Ray instance)")
    b.add_argument("--ray-workers", type=int, help="with --executor ray: worker actors (default: one per cluster CPU)")
    b.add_argument("--retry-errors", action="store_true", help="re-run only the episodes recorded as errors")
    b.add_argument("--max-total-tokens", type=int, help="stop starting new work once this many tokens are used")
    b.add_argument("--max-cost", type=float, help="stop new work at this estimated cost (USD; needs --prices)")
    b.add_argument("--prices", help="YAML/JSON: {MODEL: [usd_per_1M_prompt, usd_per_1M_completion]}")
    b.add_argument("--no-progress", action="store_true", help="no live display and no final table")
    b.add_argument("--circuit-breaker", type=int, default=5, metavar="N",
                   help="stop after N identical infrastructure errors in a row (default 5; 0 = never)")
    p.add_argument("--turn-timeout", type=float, default=600.0,
                   help="wall-clock limit of one turn in seconds (default 600; single runs too)")
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
        changes = env.state.transcript[-1].status_changes if env.state.transcript else ()
        if changes:  # what this turn changed (under the published protocol a status may also revert)
            bits.append("; ".join(changes))
        console.print(f"  [green]ok[/] {'; '.join(bits)}; progress {info['progress']:.0%}")
    for note in turn.notes:
        console.print(f"  [dim]note: {escape(note)}[/]")


async def run_one(slug: str, config: RunConfig, *, turns: int, seed: int, dataset: str | None = None,
                  console: Console | None = None, turn_timeout_s: float | None = 600.0,
                  ) -> tuple[EpisodeRecord, dict[str, int]]:
    spec = get_spec(slug, dataset)
    cache = ResponseCache(config.cache_path) if config.cache_path else None
    client = ModelClient(cache=cache)
    try:
        narrator, player, auditor = build_roles(config, client, salt=f"{slug}|r0")
        env = NarrativeEnv(spec, player=player, auditor=auditor, max_turns=turns, protocol=config.audit_protocol())
        on_step = (lambda e, i: print_step(console, e, i)) if console else None
        # Pinned like a batch record, so a single record also says exactly what produced it.
        from ncpbench.dataset import Dataset
        from ncpbench.runner import BatchSettings, batch_identity

        settings = BatchSettings(envs=[slug], max_turns=turns, seed=seed, dataset=dataset, turn_timeout_s=turn_timeout_s)
        identity = batch_identity(config, settings, Dataset(root=Path("."), specs={slug: spec}).digest())
        record = await play_episode(env, narrator, seed=seed, config={**config.public(), "run_identity": identity},
                                    on_step=on_step, turn_timeout_s=turn_timeout_s)
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


def check_slug(slug: str, dataset: str | None) -> None:
    """An unknown slug is a usage error with a did-you-mean, before any model is touched."""
    from ncpbench.dataset import load
    from ncpbench.runner import unknown_env

    ds = load(dataset)
    if slug not in ds.specs:
        raise unknown_env(slug, list(ds.specs))


def cmd_run(args: argparse.Namespace) -> int:
    if args.envs or args.slug is None:
        if not args.envs or not args.out:
            from ncpbench.preflight import PreflightError

            raise PreflightError("ncpbench run needs a SLUG or a batch",
                                 "give a SLUG for one episode, or --envs and --out runs/NAME for a batch")
        from ncpbench.cli.batch import cmd_batch

        return cmd_batch(args)
    # Preflight: everything is checked before a model is called or a file is written.
    check_common(args)
    if args.turns is None:
        args.turns = 10
    config = config_from_args(args)
    check_slug(args.slug, args.dataset)
    if args.out:
        check_out(args.out, "file")
    preflight_roles(args, config)

    console = Console(highlight=False)
    for note in (local_note(config), mock_note(config)):
        if note:
            console.print(f"[yellow]{escape(note)}[/]", soft_wrap=True)
    note = local_note(config)
    if not args.quiet:
        console.print(f"[bold]{args.slug}[/] — narrator {config.narrator.model}, player "
                      f"{config.player.model if config.player_mode != 'scripted' else 'scripted'} ({config.player_mode}), "
                      f"auditor {config.auditor.model}; {args.turns} turns")
    record, stats = run_stoppable(run_one(args.slug, config, turns=args.turns, seed=args.seed, dataset=args.dataset,
                                          console=None if args.quiet else console, turn_timeout_s=args.turn_timeout))
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
    return EXIT_ERRORS if record.outcome is Outcome.ERROR else EXIT_OK
