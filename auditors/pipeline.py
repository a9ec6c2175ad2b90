"""The LLM audit pipeline: the audit protocol as separate model calls.

    opening:  fact_update
    turn:     fact_update                          the smallest ledger diff the reply makes
              -> conflict_check                    sees the candidate diff (published order)
              -> double_check (only if something was claimed; confirms or narrows, never adds)
              -> confirmed conflict: stop (nothing of this turn is committed)
              -> trajectory_check                  published: the current node, evidence accumulated
                                                   over the whole story; grounded: frontier nodes
                                                   completed by this reply alone
              -> commitment_status                 published: every commitment re-judged against the
                                                   post-turn plot (may revert); grounded: pending ones,
                                                   run alongside the trajectory check

What each stage sees and how its answer is applied is the request's `AuditProtocol`. Every stage
answers a pydantic model and is checked against the state (ids must exist and match the claimed
kind, nodes must be on the frontier, claims cannot be added); invalid answers are re-asked by the
client, never reinterpreted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ncpbench.auditors import prompts
from ncpbench.auditors.schemas import (
    ConflictCheckOutput,
    Decision,
    DoubleCheckOutput,
    FactUpdateOutput,
    NodeJudgement,
    StatusJudgements,
    StatusOutput,
    TrajectoryOutput,
    claim_schema,
    judgement_schema,
    narrowed,
)

from ncpbench.commitments import CommitmentUpdate, Status
from ncpbench.ledger import FactDiff
from ncpbench.models.calllog import call_context
from ncpbench.models.client import ModelClient, schema_of
from ncpbench.models.config import RoleConfig
from ncpbench.protocol import credit_nodes, is_grounded, preview_ledger
from ncpbench.protocols import AuditRequest
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Conflict, ConflictKind, NodeEvidence, Usage, Verdict

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
        self._graphs: dict[str, TrajectoryGraph] = {}

    def _graph(self, req: AuditRequest) -> TrajectoryGraph:
        key = req.spec.key
        if key not in self._graphs:
            self._graphs[key] = TrajectoryGraph(req.spec)
        return self._graphs[key]

    async def audit(self, request: AuditRequest) -> Verdict:
        turn = request.state.turn + 1 if request.player_action is not None else 0
        with call_context(role="auditor", turn=turn):  # labels the stage calls in calls.jsonl
            return await self._audit(request)

    async def _audit(self, request: AuditRequest) -> Verdict:
        usage: dict[str, Usage] = {}
        diff = await self._fact_update(request, usage)
        if request.player_action is None:
            return Verdict(fact_diff=diff, usage=usage)
        claims = await self._conflict_check(request, diff, usage)
        confirmed: list[Conflict] = []
        overturned: list[Conflict] = []
        if claims:
            confirmed, overturned = await self._double_check(request, claims, usage)
        if confirmed:
            return Verdict(conflicts=confirmed, overturned=overturned, fact_diff=diff, usage=usage)
        if request.protocol.one_node_per_turn:
            nodes, evidence = await self._current_node(request, diff, usage)
            updates = await self._rejudge(request, diff, nodes, evidence, usage)
        else:
            (nodes, evidence), updates = await _both(self._frontier(request, usage), self._pending(request, usage))
        return Verdict(overturned=overturned, fact_diff=diff, completed_nodes=nodes, node_evidence=evidence,
                       commitment_updates=updates, usage=usage)

    def _salt(self, req: AuditRequest, stage: str) -> str:
        return f"{self.salt}|{req.protocol.label}|{req.state.env_id}|{req.state.turn}|{stage}"

    # -- stages ---------------------------------------------------------------------------------

    async def _fact_update(self, req: AuditRequest, usage: dict[str, Usage]) -> FactDiff:
        pending_negated = set(req.state.pending_diff.negate)
        active = {f.id for f in req.state.ledger.active()} - pending_negated

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

    async def _conflict_check(self, req: AuditRequest, diff: FactDiff, usage: dict[str, Usage]) -> list[Conflict]:
        facts = {fid for fid, _ in preview_ledger(req.state)} | {f.id for f in req.state.ledger.facts}
        commitments = {c.id for c in req.spec.commitments}

        def check(out: ConflictCheckOutput) -> list[str]:
            # The kind is the auditor's; the id must fit it. A mismatch is re-asked, never relabelled.
            problems = []
            for i, c in enumerate(out.conflicts):
                if c.kind == "fact" and c.target not in facts:
                    problems.append(f"conflicts[{i}].target: a fact conflict must name the fact id it breaks "
                                    f"(got {c.target!r})")
                elif c.kind == "commitment" and c.target not in commitments:
                    problems.append(f"conflicts[{i}].target: a commitment conflict must name the commitment id it "
                                    f"breaks (got {c.target!r})")
                elif c.kind == "player_input" and c.target is not None:
                    problems.append(f"conflicts[{i}].target: a player_input conflict names no id (use null, got "
                                    f"{c.target!r})")
            return problems

        schema = claim_schema(sorted(facts, key=_num), [c.id for c in req.spec.commitments])
        extra = prompts.candidate_changes(diff.add, diff.negate)
        out, u = await self.client.structured(self.role, prompts.messages("conflict_check", req, extra),
                                              ConflictCheckOutput, name="conflict_check", check=check,
                                              salt=self._salt(req, "conflict_check"), json_schema=schema)
        usage["conflict_check"] = u
        return [Conflict(kind=ConflictKind(c.kind), target=c.target, evidence=c.evidence[:MAX_TEXT],
                         reason=c.reason[:MAX_TEXT], grounded=is_grounded(c.evidence, req.reply))
                for c in out.conflicts]

    async def _double_check(self, req: AuditRequest, claims: list[Conflict],
                            usage: dict[str, Usage]) -> tuple[list[Conflict], list[Conflict]]:
        grounded_mode = req.protocol.grounded_evidence
        listing = []
        for i, c in enumerate(claims, 1):
            found = f" quote found in reply: {'yes' if c.grounded else 'NO'}" if grounded_mode else ""
            listing.append(f"Claim {i}: kind={c.kind.value} target={c.target}{found}\n"
                           + prompts.fence(f"quote: {c.evidence}\nreason: {c.reason}", "claim"))
        schema = schema_of(DoubleCheckOutput)
        schema["$defs"]["Decision"]["properties"]["claim"] = {"type": "integer", "enum": list(range(1, len(claims) + 1))}
        schema["properties"]["decisions"].update(minItems=len(claims), maxItems=len(claims))
        out, u = await self.client.structured(self.role,
                                              prompts.messages("double_check", req, "Claims:\n" + "\n".join(listing)),
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
            # Grounded protocol: apply_turn refuses a confirmation whose quote is not in the reply
            # whatever we return; refusing it here too lets the audit go on to the plot and statuses.
            stands = d.confirmed and (grounded or not grounded_mode)
            (confirmed if stands else overturned).append(final)
        return confirmed, overturned

    async def _current_node(self, req: AuditRequest, diff: FactDiff,
                            usage: dict[str, Usage]) -> tuple[list[str], list[NodeEvidence]]:
        """Published: the current node, judged on the whole story with the candidate ledger changes."""
        if not req.frontier:
            return [], []
        node = req.frontier[0]

        def check(out: NodeJudgement) -> list[str]:
            return [] if out.node == node else [f"node: judge the current node {node!r}, not {out.node!r}"]

        schema = narrowed(NodeJudgement, {("NodeJudgement", "node"): [node]})
        out, u = await self.client.structured(self.role, prompts.messages(
            "trajectory_check", req, prompts.candidate_changes(diff.add, diff.negate)), NodeJudgement,
            name="trajectory_check", check=check, salt=self._salt(req, "trajectory_check"), json_schema=schema)
        usage["trajectory_check"] = u
        evidence = NodeEvidence(node=node, trigger=out.trigger_happened, key_delta=out.key_delta_happened,
                                evidence=out.evidence[:MAX_TEXT])
        return ([node] if out.trigger_happened and out.key_delta_happened else []), [evidence]

    async def _rejudge(self, req: AuditRequest, diff: FactDiff, nodes: list[str], evidence: list[NodeEvidence],
                       usage: dict[str, Usage]) -> list[CommitmentUpdate]:
        """Published: every commitment not violated is judged SATISFIED or PENDING, against the plot
        as it will stand after this turn."""
        ids = [c.id for c in req.state.commitments.items if c.status is not Status.VIOLATED]
        if not ids:
            return []
        probe = Verdict(fact_diff=diff, completed_nodes=nodes, node_evidence=evidence)
        credited, _, _ = credit_nodes(self._graph(req), req.state, probe, req.protocol, req.state.turn + 1)
        after = [*req.state.completed_nodes, *credited]

        def check(out: StatusJudgements) -> list[str]:
            problems = [f"judgements: {i!r} is not a listed commitment id" for i in out.judgements if i not in ids]
            missing = [i for i in ids if i not in out.judgements]
            if missing:
                problems.append(f"judgements: every listed commitment needs a judgement; missing {', '.join(missing)}")
            return problems

        schema = judgement_schema(ids)
        extra = (prompts.candidate_changes(diff.add, diff.negate)
                 + f"\nPlot nodes completed after this turn: {', '.join(after) or '(none)'}"
                 + f"\nCommitments to judge: {', '.join(ids)}")
        out, u = await self.client.structured(self.role, prompts.messages("commitment_status", req, extra),
                                              StatusJudgements, name="commitment_status", check=check,
                                              salt=self._salt(req, "commitment_status"), json_schema=schema)
        usage["commitment_status"] = u
        return [CommitmentUpdate(id=i, status=Status(j.status), evidence=[e[:80] for e in j.evidence[:6]])
                for i, j in out.judgements.items()]

    async def _frontier(self, req: AuditRequest, usage: dict[str, Usage]) -> tuple[list[str], list[NodeEvidence]]:
        """Grounded: frontier nodes whose trigger and key delta this reply alone narrates."""
        frontier = set(req.frontier)

        def check(out: TrajectoryOutput) -> list[str]:
            return [f"completed: {n!r} is not on the frontier {sorted(frontier)}" for n in out.completed
                    if n not in frontier]

        if not frontier:
            return [], []
        out, u = await self.client.structured(self.role, prompts.messages("trajectory_frontier", req), TrajectoryOutput,
                                              name="trajectory_frontier", check=check,
                                              salt=self._salt(req, "trajectory_check"),
                                              json_schema=narrowed(TrajectoryOutput, {
                                                  ("TrajectoryOutput", "completed"): list(req.frontier)}))
        usage["trajectory_check"] = u
        return list(dict.fromkeys(out.completed)), []

    async def _pending(self, req: AuditRequest, usage: dict[str, Usage]) -> list[CommitmentUpdate]:
        """Grounded: pending commitments that this turn satisfies (statuses only move forward)."""
        pending = {c.id for c in req.state.commitments.items if c.status is Status.PENDING}

        def check(out: StatusOutput) -> list[str]:
            return [f"updates: {u.id!r} is not a pending commitment id" for u in out.updates if u.id not in pending]

        if not pending:
            return []
        out, u = await self.client.structured(self.role, prompts.messages("commitment_pending", req), StatusOutput,
                                              name="commitment_pending", check=check,
                                              salt=self._salt(req, "commitment_status"),
                                              json_schema=narrowed(StatusOutput, {
                                                  ("StatusUpdate", "id"): sorted(pending, key=_num)}))
        usage["commitment_status"] = u
        return [CommitmentUpdate(id=x.id, status=Status(x.status), evidence=[e[:80] for e in x.evidence[:6]])
                for x in out.updates if x.status == "SATISFIED"]
