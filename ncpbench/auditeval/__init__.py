"""Auditor validity: a planted-conflict suite that measures any auditor.

    from ncpbench.auditeval import generate_suite, evaluate, score, write_reports
    cases = generate_suite(bundled(), n=540, seed=0)          # labelled by construction
    results = await evaluate(my_auditor, cases, concurrency=4) # any Auditor: audit(request) -> Verdict
    scores = score(cases, results)                              # P/R/F1 per kind, FPR, agreement, CIs
    write_reports("out/", cases, results, scores, meta={...})  # report.md + report.html

`run_audit_eval` does all of it and writes cases.jsonl, results.jsonl (as cases finish),
scores.json, run.json and the reports into one folder; `rescore` rebuilds the scores and reports
from such a folder without calling a model. The CLI (`ncpbench audit-eval`) is a thin face over
these. The construction of every case category is documented in docs/AUDITOR_VALIDITY.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from ncpbench.auditeval.cases import (
    ALL_CATEGORIES,
    CATEGORIES,
    CLEAN_CATEGORIES,
    DEFAULT_CASES,
    HARD_NEGATIVES,
    LONG_RANGE_CATEGORIES,
    AuditCase,
    GenerationError,
    Gold,
    dump_cases,
    generate_suite,
    load_cases,
    make_long_case,
    narrate_violation,
    negate_fact,
)
from ncpbench.auditeval.evaluate import CaseResult, dump_results, evaluate, load_results
from ncpbench.auditeval.report import render_html, render_markdown, write_reports
from ncpbench.auditeval.scoring import Scores, bootstrap_f1, score, wilson
from ncpbench.protocol import DEFAULT_PROTOCOL, AuditProtocol
from ncpbench.protocols import Auditor
from ncpbench.spec import Spec

__all__ = [
    "ALL_CATEGORIES", "CATEGORIES", "CLEAN_CATEGORIES", "DEFAULT_CASES", "HARD_NEGATIVES", "LONG_RANGE_CATEGORIES",
    "AuditCase", "CaseResult", "GenerationError", "Gold", "Scores", "audit_context_text", "bootstrap_f1",
    "dump_cases", "dump_results", "evaluate", "generate_suite", "load_cases", "load_results", "make_long_case",
    "narrate_violation", "negate_fact", "render_html",
    "render_markdown", "rescore", "run_audit_eval", "score", "wilson", "write_reports",
]


async def run_audit_eval(auditor: Auditor, out_dir: str | Path, *, specs: Sequence[Spec], n: int = DEFAULT_CASES,
                         seed: int = 0, concurrency: int = 4, meta: Mapping[str, str] | None = None,
                         bootstrap_rounds: int = 2000,
                         on_result: Callable[[AuditCase, CaseResult], None] | None = None,
                         long_range: int = 0, protocol: AuditProtocol | None = None) -> Scores:
    """Generate the suite (`n` cases plus `long_range` long-range cases), audit every case under
    `protocol` (default: published, full context), score, and write everything into `out_dir`.
    run.json and the reports record the audit context."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    proto = protocol or DEFAULT_PROTOCOL
    cases = generate_suite(specs, n, seed, long_range=long_range)
    dump_cases(cases, out / "cases.jsonl")
    info = {"cases": str(len(cases)), "long-range cases": str(long_range), "seed": str(seed),
            "concurrency": str(concurrency), "protocol": proto.label, "audit context": audit_context_text(proto),
            "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), **(meta or {})}
    run_json = out / "run.json"
    run_json.write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")  # before any call
    started = time.perf_counter()
    by_spec = {s.key: s for s in specs}
    with (out / "results.jsonl").open("w", encoding="utf-8") as fh:
        def record(case: AuditCase, result: CaseResult) -> None:
            fh.write(json.dumps(result.model_dump(mode="json"), sort_keys=True, ensure_ascii=False) + "\n")
            fh.flush()
            if on_result is not None:
                on_result(case, result)

        results = await evaluate(auditor, cases, concurrency, specs=by_spec, on_result=record, protocol=proto)
    info["wall time"] = f"{time.perf_counter() - started:.1f} s"
    run_json.write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    dump_results(results, out / "results.jsonl")  # rewritten in case order
    return _finish(out, cases, results, info, seed, bootstrap_rounds)


def audit_context_text(protocol: AuditProtocol) -> str:
    """How run.json and the reports name the audit context: 'full' or 'compact, last 6 exchanges'."""
    if protocol.audit_context == "full":
        return "full"
    return f"compact, last {protocol.recent_turns} exchanges"


def rescore(out_dir: str | Path, *, seed: int | None = None, bootstrap_rounds: int = 2000) -> Scores:
    """Score an existing run folder again (cases.jsonl + results.jsonl) and rewrite its reports."""
    out = Path(out_dir)
    cases = load_cases(out / "cases.jsonl")
    results = load_results(out / "results.jsonl")
    info_path = out / "run.json"
    info: dict[str, str] = json.loads(info_path.read_text(encoding="utf-8")) if info_path.exists() else {}
    s = seed if seed is not None else int(info.get("seed", "0"))
    return _finish(out, cases, results, info, s, bootstrap_rounds)


def _finish(out: Path, cases: Sequence[AuditCase], results: Sequence[CaseResult], info: Mapping[str, str],
            seed: int, bootstrap_rounds: int) -> Scores:
    scores = score(cases, results, seed=seed, bootstrap_rounds=bootstrap_rounds)
    (out / "scores.json").write_text(scores.model_dump_json(indent=2) + "\n", encoding="utf-8")
    write_reports(out, cases, results, scores, info)
    return scores
