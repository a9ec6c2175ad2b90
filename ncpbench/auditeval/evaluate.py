"""Running an auditor over the suite: one `AuditRequest` per case, verdicts collected as results.

Any object with `audit(request) -> Verdict` (sync or async) is an auditor: the LLM pipeline, a
scripted double, a human at a terminal. A case whose audit raises is recorded with its error and
left out of the scores (and counted), so one bad answer does not sink a long run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ncpbench.auditeval.cases import AuditCase
from ncpbench.env import resolve
from ncpbench.jsonl import write_jsonl
from ncpbench.protocol import AuditProtocol
from ncpbench.protocols import Auditor
from ncpbench.spec import Spec
from ncpbench.verdict import Verdict


class CaseResult(BaseModel):
    """What the auditor said about one case."""

    model_config = ConfigDict(frozen=True)

    case_id: str
    verdict: Verdict | None = None
    error: str | None = None
    """Set when the audit raised (the case is then not scored)."""
    seconds: float = 0.0


def _specs_for(cases: Sequence[AuditCase], specs: Mapping[str, Spec] | None) -> Mapping[str, Spec]:
    if specs is not None:
        return specs
    from ncpbench.dataset import bundled

    return bundled().specs


async def audit_case(auditor: Auditor, case: AuditCase, spec: Spec,
                     protocol: AuditProtocol | None = None) -> CaseResult:
    started = time.perf_counter()
    try:
        verdict = await resolve(auditor.audit(case.request(spec, protocol)))
        if not isinstance(verdict, Verdict):
            raise TypeError(f"audit() returned {type(verdict).__name__}, not a Verdict")
        return CaseResult(case_id=case.id, verdict=verdict, seconds=round(time.perf_counter() - started, 3))
    except Exception as e:  # a failed audit is data: recorded, excluded from the scores, counted
        return CaseResult(case_id=case.id, error=f"{type(e).__name__}: {e}"[:500],
                          seconds=round(time.perf_counter() - started, 3))


async def evaluate(auditor: Auditor, cases: Sequence[AuditCase], concurrency: int = 4, *,
                   specs: Mapping[str, Spec] | None = None,
                   on_result: Callable[[AuditCase, CaseResult], None] | None = None,
                   protocol: AuditProtocol | None = None) -> list[CaseResult]:
    """Audit every case (at most `concurrency` at once); results come back in case order.

    `specs` maps env ids to specs (default: the bundled environments); `on_result` is called as
    each case finishes (progress lines, incremental writes); `protocol` goes into every request
    (default: the published preset, full context; `PUBLISHED.with_context("compact", N)` shows the
    auditor only the ledger and the last N exchanges)."""
    known = _specs_for(cases, specs)
    missing = sorted({c.env_id for c in cases} - set(known))
    if missing:
        raise KeyError(f"no spec for environments {missing}")
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(case: AuditCase) -> CaseResult:
        async with limit:
            result = await audit_case(auditor, case, known[case.env_id], protocol)
        if on_result is not None:
            on_result(case, result)
        return result

    return list(await asyncio.gather(*(one(c) for c in cases)))


def dump_results(results: Iterable[CaseResult], path: str | Path) -> None:
    write_jsonl(results, Path(path))


def load_results(path: str | Path) -> list[CaseResult]:
    with Path(path).open(encoding="utf-8") as fh:
        return [CaseResult.model_validate_json(line) for line in fh if line.strip()]
