"""`ncpbench build SYNOPSIS_FILE --out environments/SLUG.yaml ...`: draft a new environment with a model.

Three dependent model calls (plot, commitments, initial facts), each validated and repaired for at
most --repair-rounds rounds (`ncpbench.builder.SpecBuilder`). Exit 0: the spec passed the same checks
as `ncpbench validate` and was written to --out. Exit 1: it did not; the findings are printed and
nothing is written, except with --keep-draft (then SLUG.draft.yaml beside --out). Exit 2: bad input
(no synopsis, --out exists without --force, a file stem that is not a slug).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from ncpbench.builder import REPAIR_ROUNDS, SLUG, BuildResult, SpecBuilder, draft_yaml
from ncpbench.dataset import index_entries
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig, RunConfig, check_model_string
from ncpbench.preflight import check_number, check_roles, probe_endpoints, single_role_flag
from ncpbench.spec import dump_yaml

MAX_SYNOPSIS_BYTES = 100_000
"""A synopsis is a few hundred words; anything this big is the wrong file."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("build", help="draft a new environment spec from a synopsis with a model",
                       description="Draft a spec in three validated model calls: plot, commitments, facts.")
    p.add_argument("synopsis_file", metavar="SYNOPSIS_FILE", help="plain-text synopsis (UTF-8)")
    p.add_argument("--title", required=True, help="film title")
    p.add_argument("--role", required=True, help="the character the player plays")
    p.add_argument("--genres", required=True, help="comma-separated, e.g. Action,Sci-Fi")
    p.add_argument("--out", required=True, help="environments/SLUG.yaml (the file stem is the slug)")
    p.add_argument("--model", required=True, metavar="MODEL", help="provider/model (openai/…, local/…, mock/…)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    p.add_argument("--api-key-env", help="name of the variable holding the API key (default OPENAI_API_KEY)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the endpoint's)")
    p.add_argument("--max-tokens", type=int, help="cap on completion tokens per call")
    p.add_argument("--structured", choices=["auto", "json_schema", "json_object", "prompt"], default="auto",
                   help="how JSON is requested (auto: json_object for local/, else json_schema)")
    p.add_argument("--repair-rounds", type=int, default=REPAIR_ROUNDS,
                   help=f"rounds per stage that send validator findings back to the model (default {REPAIR_ROUNDS})")
    p.add_argument("--keep-draft", action="store_true", help="on failure, write SLUG.draft.yaml beside --out")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--skip-preflight", action="store_true", help="do not probe the model's endpoint first")
    p.set_defaults(func=cmd_build)


def _fail(message: str) -> int:
    print(f"ncpbench build: {message}", file=sys.stderr)
    return 2


def _write(path: Path, text: str) -> None:
    """Atomic: a reader never sees half a spec."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _read_synopsis(path: Path) -> str:
    if path.stat().st_size > MAX_SYNOPSIS_BYTES:
        raise ValueError(f"{path} is over {MAX_SYNOPSIS_BYTES} bytes; a synopsis is a few hundred words")
    text = path.read_bytes().decode("utf-8").strip()
    if not text:
        raise ValueError(f"{path} is empty")
    return text


async def _build(args: argparse.Namespace, role: RoleConfig, synopsis: str, slug: str) -> BuildResult:
    client = ModelClient()
    try:
        builder = SpecBuilder(client, role, repair_rounds=args.repair_rounds)
        return await builder.build(synopsis, title=args.title, role=args.role, genres=args.genres.split(","),
                                   slug=slug, file=args.out)
    finally:
        await client.aclose()


def _usage_line(result: BuildResult) -> str:
    rounds = ", ".join(f"{stage} {n}" for stage, n in result.rounds.items()) or "none"
    calls = sum(u.calls for u in result.usage.values())
    tokens = sum(u.total_tokens for u in result.usage.values())
    return f"repair rounds: {rounds}; {calls} model calls, {tokens} tokens"


def cmd_build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    slug = out.stem
    if out.suffix != ".yaml" or not SLUG.match(slug):
        return _fail(f"--out must be SLUG.yaml with a slug of lowercase words joined by -, got {args.out!r}")
    if out.exists() and not args.force:
        return _fail(f"{out} exists; pass --force to overwrite it")
    check_number("--repair-rounds", args.repair_rounds, ge=0)
    check_number("--temperature", args.temperature, ge=0, le=2)
    check_number("--max-tokens", args.max_tokens, ge=1)
    try:
        synopsis = _read_synopsis(Path(args.synopsis_file))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return _fail(f"cannot use the synopsis: {e}")
    check_model_string(args.model, "--model")
    role = RoleConfig(model=args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                      temperature=args.temperature, max_tokens=args.max_tokens, structured=args.structured)
    # The builder's one role, checked like a run's auditor (flags named --model / --base-url here).
    as_run = RunConfig(narrator=role, auditor=role, player_mode="scripted")
    check_roles(as_run, flags=single_role_flag)
    if not args.skip_preflight:
        probe_endpoints(as_run, flags=single_role_flag)
    if role.provider == "local":
        print(f"note: {role.model} is a tiny smoke-test model; it rarely writes a valid spec. Use a real "
              "endpoint (--model openai/MODEL [--base-url URL]) for environments worth keeping.", file=sys.stderr)

    result = asyncio.run(_build(args, role, synopsis, slug))

    if result.spec is None:
        for f in result.findings:
            print(f, file=sys.stderr)
        print(f"build failed at stage {result.failed_stage}; nothing written to {out}. {_usage_line(result)}",
              file=sys.stderr)
        if args.keep_draft:
            draft = out.with_name(f"{slug}.draft.yaml")
            _write(draft, draft_yaml(result))
            print(f"draft written to {draft}", file=sys.stderr)
        return 1

    _write(out, dump_yaml(result.spec))
    for f in result.findings:
        print(f)
    spec = result.spec
    print(f"wrote {out}: {len(spec.trajectory)} plot nodes, {len(spec.commitments)} commitments, "
          f"{len(spec.initial_facts)} initial facts. {_usage_line(result)}")
    listed, _ = index_entries(out.parent)
    if (out.parent / "index.yaml").exists() and out.resolve() not in {p.resolve() for p in listed}:
        print(f"note: add {slug} to {out.parent / 'index.yaml'} to include it in that dataset")
    return 0
