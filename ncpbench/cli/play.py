"""`ncpbench play SLUG --as narrator|player`: a person at the terminal in one of the two roles.

- `--as narrator`: you are the narrator under test, against the player model; each turn you see
  what an LLM narrator sees (the story state and the player's action), and after each reply the
  auditors' verdict.
- `--as player`: you play the role against the narrator model: an interactive-fiction game with
  live audits of every narrator reply.

Lines are read from stdin, so piped input works; `/quit` or the end of input ends the session
cleanly (so does Ctrl-C at the prompt). The session is saved as an ordinary episode record (`--out`, and appended to
`--run-dir`'s episodes.jsonl), which `report` and `export` read. `--run-dir` must be a folder of play
sessions: a batch run folder is refused (exit 3) before the session starts. A session you end before the turn
limit is recorded as SURVIVAL with the turns actually played as its limit (`max_turns`), and
`config.play.ended_by = "quit"`: an observation censored where you stopped, like any SURVIVAL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from ncpbench.agents.human import EndOfSession, HumanNarrator, HumanPlayer
from ncpbench.cli.run import add_model_options, config_from_args, print_step
from ncpbench.dataset import get_spec
from ncpbench.env import NarrativeEnv
from ncpbench.episode import play_episode
from ncpbench.jsonl import iter_jsonl
from ncpbench.models.cache import ResponseCache
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RunConfig
from ncpbench.protocols import Narrator, PlayerRequest
from ncpbench.record import EpisodeRecord
from ncpbench.roles import build_roles
from ncpbench.runner import RunError, append_line, atomic_write, folder_identity, repair_jsonl, run_lock

HumanRole = Literal["narrator", "player"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("play", help="play an episode at the terminal, as the narrator or as the player")
    p.add_argument("slug", help="environment slug (see `ncpbench list`)")
    p.add_argument("--as", dest="human", required=True, choices=["narrator", "player"],
                   help="narrator: you answer the player model; player: you act against the narrator model")
    p.add_argument("--turns", type=int, default=10, help="turn limit (SURVIVAL when reached; default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="the episode record (JSON); default runs/play-SLUG-as-ROLE-TIME.json")
    p.add_argument("--run-dir", help="also append the record to RUN_DIR/episodes.jsonl (a folder of play "
                   "sessions; a batch run folder is refused)")
    p.add_argument("--dataset", help="spec folder (default: bundled)")
    p.add_argument("--hide-state", action="store_true", help="as narrator: do not print the story state each turn")
    add_model_options(p)
    p.set_defaults(func=cmd_play)


async def play_session(env: NarrativeEnv, narrator: Narrator, *, seed: int = 0, replicate: int = 0,
                       config: dict[str, Any] | None = None,
                       on_step: Callable[[NarrativeEnv, dict[str, Any]], None] | None = None) -> EpisodeRecord:
    """Play until the episode ends or the person ends the session (EndOfSession / Ctrl-C).

    A session ended early is finished as SURVIVAL with `max_turns` set to the turns played and
    `config["play"]["ended_by"] = "quit"`; model failures end it as ERROR, as in any run.
    """
    config = dict(config or {})
    play = dict(config.get("play") or {})
    quit_early = False
    try:  # the shared episode loop; model failures become ERROR there, as in any run
        await play_episode(env, narrator, seed=seed, replicate=replicate, on_step=on_step)
    except (EndOfSession, KeyboardInterrupt):
        quit_early = not env.state.done
    play["ended_by"] = "quit" if quit_early else "episode_end"
    play["turn_limit"] = env.max_turns
    config["play"] = play
    if quit_early:
        env.quit()
    record = env.record(replicate=replicate, config=config)
    if quit_early:
        record = record.model_copy(update={"max_turns": record.turns})
    return record


def _next_replicate(path: Path, env_id: str) -> int:
    used = set()
    for data in iter_jsonl(path):
        eid = str(data.get("episode_id", ""))
        if eid.startswith(f"{env_id}#") and eid.split("#", 1)[1].isdigit():
            used.add(int(eid.split("#", 1)[1]))
    return max(used, default=-1) + 1


def check_play_folder(run_dir: str | Path) -> None:
    """Refuse (RunError, exit 3) a folder that is not a play folder: a batch run's episodes are one
    setup, and a person's episodes there would count as that batch's and be scored as its narrator's."""
    folder = Path(run_dir)
    meta: dict[str, Any] = {}
    run_json = folder / "run.json"
    fix = "choose another --run-dir (a folder of play sessions, e.g. runs/play-NAME)"
    if run_json.exists():
        try:
            data = json.loads(run_json.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise RunError(f"--run-dir {folder}: run.json is not JSON, so it is not a play folder; {fix}") from None
        meta = data if isinstance(data, dict) else {}
        if meta.get("kind") != "play":
            raise RunError(f"--run-dir {folder} is a batch run folder (run.json), not a play folder: your episode "
                           f"would be counted and scored as that batch's; {fix}")
    identity, source = folder_identity(folder, meta)
    if identity is not None:
        raise RunError(f"--run-dir {folder} holds batch run records ({source}), not a play folder: your episode "
                       f"would be counted and scored as that batch's; {fix}")


def append_to_run(run_dir: str | Path, record: EpisodeRecord) -> EpisodeRecord:
    """Append the record to RUN_DIR/episodes.jsonl under a fresh `<env>#<n>` id; run.json is written if missing.

    RUN_DIR must be a play folder (`check_play_folder`): a batch run folder is refused with RunError.
    """
    from ncpbench import __version__

    folder = Path(run_dir)
    episodes = folder / "episodes.jsonl"
    # The runner's own file discipline: the folder lock, a torn last line cut, one fsynced line.
    with run_lock(folder):
        check_play_folder(folder)  # again under the lock: a batch may have started there meanwhile
        repair_jsonl(episodes)
        replicate = _next_replicate(episodes, record.env_id)
        record = record.model_copy(update={"episode_id": f"{record.env_id}#{replicate}", "replicate": replicate})
        run_json = folder / "run.json"
        if not run_json.exists():
            atomic_write(run_json, json.dumps({
                "name": folder.name, "kind": "play", "ncpbench_version": __version__, "config": record.config,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "status": "open"}, indent=2))
        with episodes.open("a", encoding="utf-8") as f:
            append_line(f, record.model_dump(mode="json"))
    return record


def _record_config(config: RunConfig, human: HumanRole) -> dict[str, Any]:
    data = config.public()
    data[human] = {"model": "human"}
    if human == "player":
        data["player_mode"] = "human"
    data["play"] = {"human": human}
    return data


async def run_play(slug: str, config: RunConfig, human: HumanRole, *, turns: int, seed: int = 0,
                   dataset: str | None = None, console: Console | None = None, show_state: bool = True,
                   stdin: Any = None) -> EpisodeRecord:
    """One play session with model-backed other roles; prints turns and verdicts to `console`."""
    console = console or Console(highlight=False, soft_wrap=True)
    spec = get_spec(slug, dataset)
    cache = ResponseCache(config.cache_path) if config.cache_path else None
    client = ModelClient(cache=cache)
    printed = 0
    env: NarrativeEnv | None = None

    def show(e: NarrativeEnv, info: dict[str, Any] | None = None) -> None:
        nonlocal printed
        if len(e.history) > printed:
            print_step(console, e, info or {"progress": e.state.progress(e.graph)})
            printed = len(e.history)

    def before_prompt(request: PlayerRequest) -> None:
        if env is not None:
            show(env)

    try:
        model_narrator, model_player, auditor = build_roles(config, client, salt=f"{slug}|play")
        narrator: Narrator
        if human == "narrator":
            narrator, player = HumanNarrator(stdin=stdin, show_state=show_state), model_player
        else:
            narrator, player = model_narrator, HumanPlayer(stdin=stdin, before_prompt=before_prompt)
        env = NarrativeEnv(spec, player=player, auditor=auditor, max_turns=turns, protocol=config.audit_protocol())
        record = await play_session(env, narrator, seed=seed, config=_record_config(config, human),
                                    on_step=lambda e, i: show(e, i))
        show(env)
        return record
    finally:
        await client.aclose()
        if cache:
            cache.close()


def cmd_play(args: argparse.Namespace) -> int:
    # The judge must be named (or --mock said): a session silently audited by the mock is not a result.
    config = config_from_args(args, require=("auditor",))
    if args.run_dir:  # before the session: a refusal must not cost the person their episode
        check_play_folder(args.run_dir)
    console = Console(highlight=False, soft_wrap=True)
    human: HumanRole = args.human
    others = ("player model " + (config.player.model if config.player_mode != "scripted" else "scripted")
              if human == "narrator" else f"narrator model {config.narrator.model}")
    console.print(f"[bold]{escape(args.slug)}[/] — you are the {human}; {escape(others)}; auditor "
                  f"{escape(config.auditor.model)}; {args.turns} turns. Type /quit (or end the input) to stop; "
                  "end a line with \\ to continue it.")
    # A plain loop, not asyncio.run: its SIGINT handler would leave Ctrl-C waiting for Enter at the prompt.
    loop = asyncio.new_event_loop()
    try:
        record = loop.run_until_complete(run_play(args.slug, config, human, turns=args.turns, seed=args.seed,
                                                  dataset=args.dataset, console=console,
                                                  show_state=not args.hide_state))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    ended = record.config.get("play", {}).get("ended_by")
    console.print(f"[bold]outcome {record.outcome.value}[/] after {record.turns} turns"
                  + (" (session ended by you)" if ended == "quit" else "")
                  + f"; progress {record.progress:.0%}; satisfied {record.satisfied_share:.0%}"
                  + (f"; error: {escape(record.error)}" if record.error else ""))
    out = Path(args.out or f"runs/play-{args.slug}-as-{human}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    if args.run_dir:
        if record.turns == 0 and ended == "quit":
            console.print(f"nothing played: not added to {escape(args.run_dir)}")
        else:
            try:
                record = append_to_run(args.run_dir, record)
            except RunError:  # refused after the session after all: keep the record in --out first
                _write_record(out, record, console)
                raise
            console.print(f"appended to {escape(str(Path(args.run_dir) / 'episodes.jsonl'))} as {record.episode_id}")
    _write_record(out, record, console)
    return 0


def _write_record(out: Path, record: EpisodeRecord, console: Console) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record.model_dump(mode="json"), indent=2, ensure_ascii=False))
    console.print(f"record written to {escape(str(out))}")

