"""The LLM audit pipeline: the protocol of DESIGN.md as separate model calls.

    opening:  fact_update
    turn:     fact_update ∥ conflict_check          (independent reads of the same reply)
              -> ground every claimed quote in the reply
              -> double_check (only if something was claimed; confirms or overturns, never adds)
              -> confirmed conflict: stop (the env commits nothing of this turn)
              -> trajectory_check ∥ commitment_status (independent judgements of the same reply)

Every stage answers a pydantic model and is checked against the state (ids must exist, nodes
must be on the frontier, claims cannot be added); invalid answers are re-asked by the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ncpbench.auditors import prompts
from ncpbench.auditors.grounding import is_grounded
from ncpbench.auditors.schemas import (
    ConflictCheckOutput,
    Decision,
    DoubleCheckOutput,
    FactUpdateOutput,
    StatusOutput,
    TrajectoryOutput,
    narrowed,
)

from ncpbench.commitments import CommitmentUpdate, Status
from ncpbench.ledger import FactDiff
from ncpbench.models.calllog import call_context
from ncpbench.models.client import ModelClient, schema_of
from ncpbench.models.config import RoleConfig
from ncpbench.protocols import AuditRequest
from ncpbench.verdict import Conflict, ConflictKind, Usage, Verdict

MAX_NEW_FACTS = 12
"""A runaway fact update cannot flood the ledger."""
MAX_TEXT = 600


A = TypeVar("A")
B = TypeVar("B")


async def _both(a: Coroutine[Any, Any, A], b: Coroutine[Any, Any, B]) -> tuple[A, B]:
    """Run two stages concurrently. Unlike gather, a failure cancels the other stage (no orphaned
    call keeps spending tokens), and the first error is raised as itself, not as a group."""
    try:
        async with asyncio.TaskGroup() as tg:
            task_a = tg.create_task(a)
            task_b = tg.create_task(b)
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return task_a.result(), task_b.result()


def _num(ident: str) -> int:
    return int(ident.split("_")[1])


class LLMAuditor:
    def __init__(self, client: ModelClient, role: RoleConfig, salt: str = "") -> None:
        self.client = client
        self.role = role
        self.salt = salt

    async def audit(self, request: AuditRequest) -> Verdict:
        turn = request.state.turn + 1 if request.player_action is not None else 0
        with call_context(role="auditor", turn=turn):  # labels the stage calls in calls.jsonl
            return await self._audit(request)

    async def _audit(self, request: AuditRequest) -> Verdict:
        usage: dict[str, Usage] = {}
        if request.player_action is None:
            diff = await self._fact_update(request, usage)
            return Verdict(fact_diff=diff, usage=usage)
        diff, claims = await _both(self._fact_update(request, usage), self._conflict_check(request, usage))
        confirmed: list[Conflict] = []
        overturned: list[Conflict] = []
        if claims:
            confirmed, overturned = await self._double_check(request, claims, usage)
        if confirmed:
            return Verdict(conflicts=confirmed, overturned=overturned, fact_diff=diff, usage=usage)
        nodes, updates = await _both(self._trajectory(request, usage), self._statuses(request, usage))
        return Verdict(overturned=overturned, fact_diff=diff, completed_nodes=nodes, commitment_updates=updates,
                       usage=usage)

    def _salt(self, req: AuditRequest, stage: str) -> str:
        return f"{self.salt}|{req.state.env_id}|{req.state.turn}|{stage}"

    # -- stages ---------------------------------------------------------------------------------

    async def _fact_update(self, req: AuditRequest, usage: dict[str, Usage]) -> FactDiff:
        active = {f.id for f in req.state.ledger.active()}

        def check(out: FactUpdateOutput) -> list[str]:
            problems = [f"negate: {fid!r} is not an active fact id" for fid in out.negate if fid not in active]
            if len(out.add) > MAX_NEW_FACTS:
                problems.append(f"add: at most {MAX_NEW_FACTS} facts per reply")
            return problems

        schema = narrowed(FactUpdateOutput, {("FactUpdateOutput", "negate"): sorted(active, key=_num)})
        out, u = await self.client.structured(self.role, prompts.messages("fact_update", req), FactUpdateOutput,
                                              name="fact_update", check=check, salt=self._salt(req, "fact_update"),
                                              json_schema=schema)
        usage["fact_update"] = u
        adds = [a.strip()[:MAX_TEXT] for a in out.add if a.strip()]
        return FactDiff(add=adds, negate=list(dict.fromkeys(out.negate)))

    async def _conflict_check(self, req: AuditRequest, usage: dict[str, Usage]) -> list[Conflict]:
        facts = {f.id for f in req.state.ledger.facts}
        commitments = {c.id for c in req.spec.commitments}

        def check(out: ConflictCheckOutput) -> list[str]:
            return [f"conflicts[{i}].target: {c.target!r} is neither a fact id nor a commitment id"
                    for i, c in enumerate(out.conflicts)
                    if c.target is not None and c.target not in facts and c.target not in commitments]

        def kind_of(kind: str, target: str | None) -> ConflictKind:
            # The id settles the kind when they disagree: a claim naming c_N is about a commitment.
            if target in commitments:
                return ConflictKind.COMMITMENT
            if target in facts:
                return ConflictKind.FACT
            return ConflictKind(kind) if kind != "commitment" else ConflictKind.PLAYER_INPUT

        ids = sorted(facts, key=_num) + [c.id for c in req.spec.commitments]
        schema = narrowed(ConflictCheckOutput, {("ClaimedConflict", "target"): ids}, {("ClaimedConflict", "target")})
        out, u = await self.client.structured(self.role, prompts.messages("conflict_check", req), ConflictCheckOutput,
                                              name="conflict_check", check=check, salt=self._salt(req, "conflict_check"),
                                              json_schema=schema)
        usage["conflict_check"] = u
        return [Conflict(kind=kind_of(c.kind, c.target),
                         target=c.target if kind_of(c.kind, c.target) is not ConflictKind.PLAYER_INPUT else None,
                         evidence=c.evidence[:MAX_TEXT], reason=c.reason[:MAX_TEXT],
                         grounded=is_grounded(c.evidence, req.reply))
                for c in out.conflicts]

    async def _double_check(self, req: AuditRequest, claims: list[Conflict],
                            usage: dict[str, Usage]) -> tuple[list[Conflict], list[Conflict]]:
        listing = "\n".join(
            f"Claim {i}: kind={c.kind.value} target={c.target} quote found in reply: {'yes' if c.grounded else 'NO'}\n"
            f"  quote: {c.evidence}\n  reason: {c.reason}" for i, c in enumerate(claims, 1))

        schema = schema_of(DoubleCheckOutput)
        schema["$defs"]["Decision"]["properties"]["claim"] = {"type": "integer", "enum": list(range(1, len(claims) + 1))}
        schema["properties"]["decisions"].update(minItems=len(claims), maxItems=len(claims))
        out, u = await self.client.structured(self.role, prompts.messages("double_check", req, "Claims:\n" + listing),
                                              DoubleCheckOutput, name="double_check", json_schema=schema,
                                              salt=self._salt(req, "double_check"))
        usage["double_check"] = u
        decided: dict[int, Decision] = {}
        for d in out.decisions:
            decided.setdefault(d.claim, d)  # decisions on claims that do not exist are ignored
        confirmed: list[Conflict] = []
        overturned: list[Conflict] = []
        for i, claim in enumerate(claims, 1):
            # The double check may narrow, never add: a claim it did not decide is not confirmed.
            d = decided.get(i) or Decision(claim=i, confirmed=False, reason="no decision from the double check")
            evidence = d.evidence if d.evidence and is_grounded(d.evidence, req.reply) else claim.evidence
            grounded = is_grounded(evidence, req.reply)
            final = claim.model_copy(update={"evidence": evidence[:MAX_TEXT], "grounded": grounded,
                                             "reason": f"{claim.reason} | double check: {d.reason}"[:MAX_TEXT]})
            # A conflict needs evidence: a confirmation without a quote from the reply does not stand.
            (confirmed if d.confirmed and grounded else overturned).append(final)
        return confirmed, overturned

    async def _trajectory(self, req: AuditRequest, usage: dict[str, Usage]) -> list[str]:
        frontier = set(req.frontier)

        def check(out: TrajectoryOutput) -> list[str]:
            return [f"completed: {n!r} is not on the frontier {sorted(frontier)}" for n in out.completed
                    if n not in frontier]

        if not frontier:
            return []
        out, u = await self.client.structured(self.role, prompts.messages("trajectory_check", req), TrajectoryOutput,
                                              name="trajectory_check", check=check,
                                              salt=self._salt(req, "trajectory_check"),
                                              json_schema=narrowed(TrajectoryOutput, {
                                                  ("TrajectoryOutput", "completed"): list(req.frontier)}))
        usage["trajectory_check"] = u
        return list(dict.fromkeys(out.completed))

    async def _statuses(self, req: AuditRequest, usage: dict[str, Usage]) -> list[CommitmentUpdate]:
        pending = {c.id for c in req.state.commitments.items if c.status is Status.PENDING}

        def check(out: StatusOutput) -> list[str]:
            return [f"updates: {u.id!r} is not a pending commitment id" for u in out.updates if u.id not in pending]

        if not pending:
            return []
        out, u = await self.client.structured(self.role, prompts.messages("commitment_status", req), StatusOutput,
                                              name="commitment_status", check=check,
                                              salt=self._salt(req, "commitment_status"),
                                              json_schema=narrowed(StatusOutput, {
                                                  ("StatusUpdate", "id"): sorted(pending, key=_num)}))
        usage["commitment_status"] = u
        return [CommitmentUpdate(id=x.id, status=Status(x.status), evidence=[e[:80] for e in x.evidence[:6]])
                for x in out.updates if x.status == "SATISFIED"]
