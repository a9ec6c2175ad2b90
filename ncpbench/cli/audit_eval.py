"""`ncpbench audit-eval`: measure an auditor on the planted-conflict suite (docs/AUDITOR_VALIDITY.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from ncpbench import __version__
from ncpbench.auditeval import DEFAULT_CASES, generate_suite, rescore, run_audit_eval
from ncpbench.auditeval.cases import LONG_RANGE_CATEGORIES, AuditCase, dump_cases
from ncpbench.auditeval.evaluate import CaseResult
from ncpbench.auditeval.scoring import Scores
from ncpbench.dataset import Dataset, load
from ncpbench.models.config import PROFILES, RoleConfig, RunConfig, resolve_run_config, role_options
from ncpbench.preflight import (
    EXIT_USAGE,
    PreflightError,
    check_number,
    check_out,
    check_roles,
    probe_endpoints,
)
from ncpbench.protocol import PUBLISHED, AuditProtocol

AUDITOR_FLAGS: dict[str, Any] = {flag: kind for flag, (_, kind) in role_options().items()}
"""`--auditor-FLAG` for every RoleConfig field (generated, like `ncpbench run`'s)."""
LOCAL_TIMEOUT_S = 1800.0
"""Per-request timeout for the embedded local model unless --auditor-timeout says otherwise."""
_FIELD = {flag: field for flag, (field, _) in role_options().items()}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("audit-eval", help="measure an auditor on a suite of planted conflicts and clean controls",
                       description="Generate a labelled suite of audit cases from the environment specs (seeded), "
                                   "run the audit pipeline on every case, and report precision / recall / F1 per "
                                   "conflict kind, the false-positive rate on clean controls, and trajectory / "
                                   "commitment-status agreement, with confidence intervals.")
    p.add_argument("--auditor", metavar="MODEL", help="auditor model, provider/model (openai/…, mock/…, local/…)")
    for flag, typ in AUDITOR_FLAGS.items():
        p.add_argument(f"--auditor-{flag}", type=typ,
                       help="auditor endpoint, e.g. http://localhost:8000/v1 (vLLM)" if flag == "base-url" else
                       argparse.SUPPRESS)
    p.add_argument("--profile", choices=sorted(PROFILES),
                   help="sampling defaults (default: the one `ncpbench run` uses under the published protocol, "
                        "paper; run.json and the report record it)")
    p.add_argument("--config", help="run config file (YAML or JSON); only its auditor section is used")
    p.add_argument("--cache", help="SQLite response cache path (opt-in; replays a run exactly)")
    p.add_argument("--mock", action="store_true", help="a dry run: without --auditor, use mock/default")
    p.add_argument("--skip-preflight", action="store_true", help="do not probe the auditor's endpoint first")
    p.add_argument("--envs", default="all", help="all (default) or a comma-separated list of slugs")
    p.add_argument("--dataset", help="spec folder (default: bundled)")
    p.add_argument("--cases", type=int, default=DEFAULT_CASES,
                   help=f"suite size (default {DEFAULT_CASES}; any N is balanced across the 9 categories)")
    p.add_argument("--long-range", type=int, default=0, metavar="M",
                   help="append M long-range cases (an early detail, >= 10 turns of history, then a reply that "
                        "contradicts or agrees with it); default 0")
    p.add_argument("--audit-context", choices=["full", "compact"], default="full",
                   help="what the auditor sees of the story: every exchange (full, default) or the committed ledger "
                        "plus the last --recent-turns exchanges (compact)")
    p.add_argument("--recent-turns", type=int, default=6, metavar="N",
                   help="exchanges kept verbatim in compact context (default 6)")
    p.add_argument("--seed", type=int, default=0, help="suite seed (same seed -> identical cases.jsonl)")
    p.add_argument("--concurrency", type=int, default=4, help="cases audited at once (default 4)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the F1 intervals")
    p.add_argument("--out", required=True, help="output folder: cases.jsonl, results.jsonl, scores.json, report.*")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--generate-only", action="store_true", help="write cases.jsonl and stop (no model calls)")
    mode.add_argument("--report-only", action="store_true",
                      help="re-score an existing --out folder (cases.jsonl + results.jsonl); no model calls")
    p.set_defaults(func=cmd_audit_eval)


def select_dataset(envs: str, dataset: str | None) -> Dataset:
    """The chosen specs as a Dataset, keyed and ordered as `ncpbench run --envs` keys them, so the
    digest matches a run's `dataset_hash` over the same environments."""
    from ncpbench.runner import select_envs

    ds = load(dataset)
    keys = list(ds.specs) if envs.strip().lower() in ("", "all") else select_envs(ds, envs)
    return Dataset(root=ds.root, specs={k: ds[k] for k in keys})


def resolve_auditor(args: argparse.Namespace, protocol: str = PUBLISHED.name) -> tuple[RoleConfig, str]:
    """The auditor under test and the sampling profile it was given. Without --profile the profile is
    resolved exactly as `ncpbench run` resolves it for `protocol` (audit-eval plays published ->
    paper; a rescore passes the original run's), so the auditor samples as the runs it is set beside."""
    values: dict[str, Any] = {"model": args.auditor}
    for flag in AUDITOR_FLAGS:
        values[_FIELD.get(flag, flag)] = getattr(args, f"auditor_{flag.replace('-', '_')}")
    config = resolve_run_config({"auditor": values}, config_file=args.config, profile=args.profile,
                                extra={"protocol": protocol}, require=("auditor",),
                                mock_default=bool(getattr(args, "mock", False)))
    role = config.auditor
    if role.provider == "local" and args.auditor_timeout is None:
        # One CPU-bound llama.cpp slot: stage calls queue behind each other, and a retried timeout only
        # queues more work behind the abandoned one, so wait long instead of retrying.
        role = role.model_copy(update={"timeout_s": LOCAL_TIMEOUT_S, "max_retries": 1})
    return role, config.profile


def auditor_role(args: argparse.Namespace, protocol: str = PUBLISHED.name) -> RoleConfig:
    return resolve_auditor(args, protocol)[0]


RECORDED_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "timeout_s", "max_retries")
"""Auditor settings that can change a score (sampling, and how many audits fail), recorded and shown.
The model, endpoint and structured mode have rows of their own; the key's variable, concurrency and
transport never change an answer."""


def _setting(value: object) -> str:
    return "not set (the endpoint's default)" if value is None else str(value)


def run_meta(role: RoleConfig, profile: str, data: Dataset, protocol: AuditProtocol, envs: str) -> dict[str, str]:
    """What run.json and the reports say about the auditor and the suite: everything that can change a
    score, with the sampling profile compared against the one `ncpbench run` would use."""
    from ncpbench.runner import prompt_hashes

    public = role.public()  # the base URL without its credentials or secret query values
    run_profile = resolve_run_config(environ={}, extra={"protocol": protocol.name}).profile
    same = (f"as `ncpbench run` under {protocol.name}" if profile == run_profile else
            f"differs from `ncpbench run`, which samples the auditor with {run_profile} under {protocol.name}")
    meta = {"auditor": role.model, "endpoint": public["base_url"] or role.provider,
            "sampling profile": f"{profile} ({same})",
            **{f"auditor {name}": _setting(public[name]) for name in RECORDED_FIELDS},
            "structured output": role.structured_mode(), "envs": envs, "dataset": data.digest(),
            "ncpbench": __version__}
    if role.provider == "python":  # your own auditor: its prompts are its own, its source is pinned
        from ncpbench.roles import plugin_refs

        ref = plugin_refs(RunConfig(auditor=role, player_mode="scripted"))["auditor"]
        meta["auditor source sha256"] = str(ref.get("source_sha256"))
        return meta
    hashes = prompt_hashes(RunConfig(auditor=role, player_mode="scripted", protocol=protocol.name,
                                     audit_context=protocol.audit_context, recent_turns=protocol.recent_turns))
    meta.update({f"prompt hash {kind}": h for kind, h in hashes.items() if kind.startswith("auditor")})
    return meta


def long_range_lines(scores: Scores) -> list[str]:
    lines = []
    for cat in LONG_RANGE_CATEGORIES:
        row = scores.by_category.get(cat)
        if row:
            what = (f"false alarms {row['n'] - row['none']}/{row['n']}" if cat.startswith("hn_")
                    else f"fact recall {row['fact']}/{row['n']}")
            lines.append(f"  {cat:<20} {what}")
    return lines


def headline(scores: Scores) -> list[str]:
    lines = [f"scored {scores.scored}/{scores.cases} cases ({scores.errors} failed"
             + (f", {scores.missing} not reached" if scores.missing else "") + ")"]
    for k in scores.kinds.values():
        f1 = "n/a" if k.f1 is None else f"{k.f1:.3f}"
        p = "n/a" if k.precision.value is None else f"{k.precision.value:.3f}"
        r = "n/a" if k.recall.value is None else f"{k.recall.value:.3f}"
        lines.append(f"  {k.kind:<13} precision {p}  recall {r}  F1 {f1}")
    fpr = "n/a" if scores.fpr.value is None else f"{scores.fpr.value:.1%}"
    agree = scores.trajectory.agreement.value
    lines.append(f"  false alarms on clean controls {fpr} ({scores.fpr.k}/{scores.fpr.n}); trajectory agreement "
                 f"{'n/a' if agree is None else f'{agree:.1%}'} (n={scores.trajectory.agreement.n})")
    return lines + long_range_lines(scores)


def cmd_audit_eval(args: argparse.Namespace) -> int:
    out = check_out(args.out, "folder")
    check_number("--cases", args.cases, ge=0 if args.long_range else 1)
    check_number("--concurrency", args.concurrency, ge=1, fix="give --concurrency at least 1 (0 would wait forever)")
    check_number("--bootstrap", args.bootstrap, ge=1)
    check_number("--long-range", args.long_range, ge=0)
    check_number("--recent-turns", args.recent_turns, ge=1)
    protocol = PUBLISHED.with_context(args.audit_context, args.recent_turns)
    for flag, bounds in (("temperature", {"ge": 0.0, "le": 2.0}), ("top-p", {"gt": 0.0, "le": 1.0}),
                         ("max-tokens", {"ge": 1}), ("timeout", {"gt": 0.0})):
        check_number(f"--auditor-{flag}", getattr(args, f"auditor_{flag.replace('-', '_')}"),
                     ge=bounds.get("ge"), gt=bounds.get("gt"), le=bounds.get("le"))
    if args.report_only:
        scores = rescore(out, bootstrap_rounds=args.bootstrap)
        print("\n".join(headline(scores)))
        print(f"reports rewritten in {out}")
        return 0
    data = select_dataset(args.envs, args.dataset)
    specs = list(data)
    if args.generate_only:
        out.mkdir(parents=True, exist_ok=True)
        cases = generate_suite(specs, args.cases, args.seed, long_range=args.long_range)
        dump_cases(cases, out / "cases.jsonl")
        print(f"{len(cases)} cases from {len({c.env_id for c in cases})} environments written to "
              f"{out / 'cases.jsonl'}")
        return 0
    if not args.auditor and not args.config and not args.mock:
        raise PreflightError("no auditor given", "name the auditor under test with --auditor provider/model "
                             "(or --config, or --mock for a dry run)", EXIT_USAGE)
    role, profile = resolve_auditor(args)
    only_auditor = RunConfig(auditor=role, player_mode="scripted", narrator=role)
    check_roles(only_auditor)
    if not args.skip_preflight:
        probe_endpoints(only_auditor)
    from ncpbench.auditors import LLMAuditor
    from ncpbench.cli.run import LOCAL_NOTE
    from ncpbench.models.cache import ResponseCache
    from ncpbench.models.client import ModelClient
    from ncpbench.roles import load_role

    if role.provider == "local":
        print(LOCAL_NOTE.format(model=role.model), file=sys.stderr)
    meta = run_meta(role, profile, data, protocol, args.envs)
    total = args.cases + args.long_range
    done = [0]

    def progress(case: AuditCase, result: CaseResult) -> None:
        done[0] += 1
        if result.verdict is None:
            what = f"error: {result.error}"
        else:
            what = ", ".join(f"{c.kind.value} {c.target or ''}".strip() for c in result.verdict.conflicts) or "clean"
        print(f"[{done[0]}/{total}] {case.id}: {what} ({result.seconds:.1f} s)", file=sys.stderr, flush=True)

    async def go() -> Scores:
        cache = ResponseCache(args.cache) if args.cache else None
        client = ModelClient(cache=cache)
        try:
            auditor: Any = (load_role("auditor", role.model)[0] if role.provider == "python"  # your own auditor
                            else LLMAuditor(client, role, salt="audit-eval"))
            return await run_audit_eval(auditor, out, specs=specs, n=args.cases, seed=args.seed,
                                        concurrency=args.concurrency, meta=meta, bootstrap_rounds=args.bootstrap,
                                        on_result=progress, long_range=args.long_range, protocol=protocol)
        finally:
            await client.aclose()
            if cache:
                cache.close()

    scores = asyncio.run(go())
    print("\n".join(headline(scores)))
    print(f"report: {out / 'report.md'} and {out / 'report.html'}")
    return 0
