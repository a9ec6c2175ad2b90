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
    CATEGORIES,
    CLEAN_CATEGORIES,
    DEFAULT_CASES,
    HARD_NEGATIVES,
    AuditCase,
    GenerationError,
    Gold,
    dump_cases,
    generate_suite,
    load_cases,
    narrate_violation,
    negate_fact,
)
from ncpbench.auditeval.evaluate import CaseResult, dump_results, evaluate, load_results
from ncpbench.auditeval.report import render_html, render_markdown, write_reports
from ncpbench.auditeval.scoring import Scores, bootstrap_f1, score, wilson
from ncpbench.protocols import Auditor
from ncpbench.spec import Spec

__all__ = [
    "CATEGORIES", "CLEAN_CATEGORIES", "DEFAULT_CASES", "HARD_NEGATIVES", "AuditCase", "CaseResult",
    "GenerationError", "Gold", "Scores", "bootstrap_f1", "dump_cases", "dump_results", "evaluate",
    "generate_suite", "load_cases", "load_results", "narrate_violation", "negate_fact", "render_html",
    "render_markdown", "rescore", "run_audit_eval", "score", "wilson", "write_reports",
]


async def run_audit_eval(auditor: Auditor, out_dir: str | Path, *, specs: Sequence[Spec], n: int = DEFAULT_CASES,
                         seed: int = 0, concurrency: int = 4, meta: Mapping[str, str] | None = None,
                         bootstrap_rounds: int = 2000,
                         on_result: Callable[[AuditCase, CaseResult], None] | None = None) -> Scores:
    """Generate the suite, audit every case, score, and write everything into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cases = generate_suite(specs, n, seed)
    dump_cases(cases, out / "cases.jsonl")
    info = {"cases": str(len(cases)), "seed": str(seed), "concurrency": str(concurrency),
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

        results = await evaluate(auditor, cases, concurrency, specs=by_spec, on_result=record)
    info["wall time"] = f"{time.perf_counter() - started:.1f} s"
    run_json.write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    dump_results(results, out / "results.jsonl")  # rewritten in case order
    return _finish(out, cases, results, info, seed, bootstrap_rounds)


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
