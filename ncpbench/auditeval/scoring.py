"""Scoring verdicts against the gold labels: pure arithmetic, no model calls.

Per conflict kind K (fact, commitment, player_input), over the scored cases:
    positive   = K is in the gold kinds;  flagged = the verdict confirmed a conflict of kind K;
    a case where K is only *tolerated* (and not required) is left out of K's count;
    precision  = TP / (TP + FP), recall = TP / (TP + FN), F1 = 2TP / (2TP + FP + FN).
Precision and recall carry Wilson 95% intervals; F1 a seeded percentile bootstrap over cases.
The false-positive rate is the share of clean controls (clean replies and hard negatives) on which
the auditor confirmed any conflict (Wilson interval). Trajectory and commitment-status agreement
are measured on the clean controls the auditor also passed (it only runs those stages then).
Cases whose audit failed, and cases an interrupted run never reached, are counted and left out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.auditeval.cases import CATEGORIES, AuditCase
from ncpbench.auditeval.evaluate import CaseResult
from ncpbench.commitments import Status
from ncpbench.verdict import ConflictKind, Verdict

Z95 = 1.959963984540054
KINDS: tuple[ConflictKind, ...] = (ConflictKind.FACT, ConflictKind.COMMITMENT, ConflictKind.PLAYER_INPUT)


class Proportion(BaseModel):
    """k successes out of n, with a Wilson score interval (None when n = 0)."""

    model_config = ConfigDict(frozen=True)

    k: int
    n: int
    value: float | None
    low: float | None
    high: float | None


def wilson(k: int, n: int, z: float = Z95) -> Proportion:
    """Wilson score interval: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    if n == 0:
        return Proportion(k=k, n=n, value=None, low=None, high=None)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Proportion(k=k, n=n, value=p, low=max(0.0, centre - half), high=min(1.0, centre + half))


def f1_of(tp: int, fp: int, fn: int) -> float | None:
    denom = 2 * tp + fp + fn
    return 2 * tp / denom if denom else None


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default method)."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_f1(pairs: Sequence[tuple[bool, bool]], *, seed: int = 0, rounds: int = 2000,
                 level: float = 0.95) -> tuple[float | None, float | None]:
    """Percentile interval of F1 over `rounds` resamples (with replacement) of (gold, flagged) pairs;
    resamples where F1 is undefined (no positives, no flags) are skipped."""
    if not pairs:
        return None, None
    rng = random.Random(seed)
    n = len(pairs)
    values: list[float] = []
    for _ in range(rounds):
        tp = fp = fn = 0
        for _ in range(n):
            gold, flagged = pairs[rng.randrange(n)]
            tp += gold and flagged
            fp += flagged and not gold
            fn += gold and not flagged
        f1 = f1_of(tp, fp, fn)
        if f1 is not None:
            values.append(f1)
    if not values:
        return None, None
    values.sort()
    tail = (1 - level) / 2
    return quantile(values, tail), quantile(values, 1 - tail)


def kappa(tp: int, fp: int, fn: int, tn: int) -> float | None:
    """Cohen's kappa of two binary raters (gold and auditor)."""
    n = tp + fp + fn + tn
    if n == 0:
        return None
    po = (tp + tn) / n
    pe = ((tp + fp) * (tp + fn) + (fn + tn) * (fp + tn)) / (n * n)
    return None if pe >= 1 else (po - pe) / (1 - pe)


class KindScore(BaseModel):
    kind: str
    tp: int
    fp: int
    fn: int
    tn: int
    skipped: int
    """Cases where this kind was only tolerated and not required."""
    precision: Proportion
    recall: Proportion
    f1: float | None
    f1_low: float | None
    f1_high: float | None
    target: Proportion
    """Among hits on a kind with ids (fact, commitment): the claim names an acceptable id."""


class Agreement(BaseModel):
    """A binary judgement compared with the gold one."""

    tp: int
    fp: int
    fn: int
    tn: int
    agreement: Proportion
    kappa: float | None


class StatusAgreement(BaseModel):
    cases: Proportion
    """Cases where the set of commitments judged SATISFIED equals the gold set."""
    decisions: Agreement
    """Every PENDING commitment of every such case as one yes/no decision (decisions within one case
    are not independent, so this interval is optimistic)."""


class Misjudgement(BaseModel):
    case_id: str
    category: str
    problems: list[str]
    conflict_axis: bool
    """True when the conflict judgement itself was wrong (a miss or a false alarm)."""


class Scores(BaseModel):
    cases: int
    scored: int
    errors: int
    """Cases whose audit raised."""
    missing: int = 0
    """Cases with no result at all (an interrupted run): left out, like errors."""
    kinds: dict[str, KindScore]
    detection: Agreement
    """Any conflict at all vs. a planted one, over all scored cases."""
    recall_any: Proportion
    """Planted-conflict cases where the auditor confirmed at least one conflict."""
    fpr: Proportion
    """Clean controls (clean + hard negatives) on which the auditor confirmed a conflict."""
    fpr_clean: Proportion
    fpr_hard_negatives: Proportion
    by_category: dict[str, dict[str, int]]
    """category -> {n, correct, none, fact, commitment, player_input}: the confusion table."""
    trajectory: Agreement
    trajectory_skipped: int
    """Clean controls not scored for trajectory: the auditor flagged them (so never ran the stage)."""
    status: StatusAgreement
    misjudged: list[Misjudgement] = Field(default_factory=list)
    seconds_total: float
    seconds_mean: float | None


def flagged_kinds(verdict: Verdict) -> set[ConflictKind]:
    return verdict.conflict_kinds()


def conflict_problems(case: AuditCase, verdict: Verdict) -> list[str]:
    """What the verdict got wrong on the conflict axis (empty = right)."""
    gold = set(case.gold.kinds)
    tolerated = set(case.gold.tolerated)
    flagged = flagged_kinds(verdict)
    out = [f"missed {k.value} conflict" for k in KINDS if k in gold and k not in flagged]
    out += [f"false alarm: {k.value}" for k in KINDS if k in flagged and k not in gold and k not in tolerated]
    return out


def target_problems(case: AuditCase, verdict: Verdict) -> list[str]:
    out = []
    for kind in (ConflictKind.FACT, ConflictKind.COMMITMENT):
        ok = case.gold.targets.get(kind.value, [])
        claims = [c for c in verdict.conflicts if c.kind is kind]
        if kind in case.gold.kinds and claims and ok and not any(c.target in ok for c in claims):
            named = ", ".join(str(c.target) for c in claims)
            out.append(f"right kind ({kind.value}) but wrong id: named {named}, expected one of {', '.join(ok)}")
    return out


def satisfied_ids(verdict: Verdict) -> set[str]:
    return {u.id for u in verdict.commitment_updates if u.status is Status.SATISFIED}


def _agreement(tp: int, fp: int, fn: int, tn: int) -> Agreement:
    return Agreement(tp=tp, fp=fp, fn=fn, tn=tn, agreement=wilson(tp + tn, tp + fp + fn + tn),
                     kappa=kappa(tp, fp, fn, tn))


def score(cases: Sequence[AuditCase], results: Sequence[CaseResult], *, seed: int = 0,
          bootstrap_rounds: int = 2000) -> Scores:
    """Score results (matched to cases by id) against the gold labels."""
    by_id = {r.case_id: r for r in results}
    scored: list[tuple[AuditCase, Verdict]] = []
    errors = missing = 0
    for case in cases:
        r = by_id.get(case.id)
        if r is None:
            missing += 1
            continue
        if r.verdict is None:
            errors += 1
            continue
        scored.append((case, r.verdict))

    kinds: dict[str, KindScore] = {}
    for kind in KINDS:
        pairs: list[tuple[bool, bool]] = []
        skipped = 0
        hits = named = 0
        for case, verdict in scored:
            gold = kind in case.gold.kinds
            hit = kind in flagged_kinds(verdict)
            if not gold and kind in case.gold.tolerated:
                skipped += 1
                continue
            pairs.append((gold, hit))
            ok = case.gold.targets.get(kind.value, [])
            if gold and hit and ok:
                hits += 1
                named += any(c.target in ok for c in verdict.conflicts if c.kind is kind)
        tp = sum(g and f for g, f in pairs)
        fp = sum(f and not g for g, f in pairs)
        fn = sum(g and not f for g, f in pairs)
        tn = sum(not g and not f for g, f in pairs)
        low, high = bootstrap_f1(pairs, seed=seed, rounds=bootstrap_rounds)
        kinds[kind.value] = KindScore(kind=kind.value, tp=tp, fp=fp, fn=fn, tn=tn, skipped=skipped,
                                      precision=wilson(tp, tp + fp), recall=wilson(tp, tp + fn),
                                      f1=f1_of(tp, fp, fn), f1_low=low, f1_high=high, target=wilson(named, hits))

    det = [0, 0, 0, 0]  # tp fp fn tn
    fpr_k = {"clean": [0, 0], "hard": [0, 0]}
    table: dict[str, dict[str, int]] = {
        c: {"n": 0, "correct": 0, "none": 0, **{k.value: 0 for k in KINDS}} for c in CATEGORIES}
    traj = [0, 0, 0, 0]
    traj_skipped = 0
    status_cases = [0, 0]
    dec = [0, 0, 0, 0]
    misjudged: list[Misjudgement] = []
    for case, verdict in scored:
        gold_conflict = not case.gold.is_clean
        flagged = flagged_kinds(verdict)
        det[0 if gold_conflict and flagged else 1 if flagged else 2 if gold_conflict else 3] += 1
        row = table.setdefault(case.category, {"n": 0, "correct": 0, "none": 0, **{k.value: 0 for k in KINDS}})
        row["n"] += 1
        if not flagged:
            row["none"] += 1
        for k in flagged:
            row[k.value] += 1
        problems = conflict_problems(case, verdict)
        row["correct"] += not problems
        conflict_axis = bool(problems)
        problems += target_problems(case, verdict)
        if case.gold.is_clean:
            bucket = fpr_k["clean" if case.category == "clean" else "hard"]
            bucket[0] += bool(flagged)
            bucket[1] += 1
            if flagged:
                traj_skipped += 1
            elif case.frontier_node is not None:
                pred = case.frontier_node in verdict.completed_nodes
                gold_c = case.gold.completes
                traj[0 if gold_c and pred else 1 if pred else 2 if gold_c else 3] += 1
                if pred != gold_c:
                    problems.append(f"trajectory: said {case.frontier_node} {'completes' if pred else 'does not complete'}"
                                    f", gold says it {'does' if gold_c else 'does not'}")
                got, want = satisfied_ids(verdict), set(case.gold.satisfied)
                status_cases[0] += got == want
                status_cases[1] += 1
                if got != want:
                    problems.append(f"commitment status: judged satisfied {sorted(got) or 'none'}, gold "
                                    f"{sorted(want) or 'none'}")
                pending = [c.id for c in case.state.commitments.items if c.status is Status.PENDING]
                for cid in pending:
                    g, p = cid in want, cid in got
                    dec[0 if g and p else 1 if p else 2 if g else 3] += 1
        if problems:
            misjudged.append(Misjudgement(case_id=case.id, category=case.category, problems=problems,
                                          conflict_axis=conflict_axis))

    seconds = [r.seconds for r in results]
    clean_k, clean_n = fpr_k["clean"]
    hard_k, hard_n = fpr_k["hard"]
    return Scores(
        cases=len(cases), scored=len(scored), errors=errors, missing=missing, kinds=kinds, detection=_agreement(*det),
        recall_any=wilson(det[0], det[0] + det[2]), fpr=wilson(clean_k + hard_k, clean_n + hard_n),
        fpr_clean=wilson(clean_k, clean_n), fpr_hard_negatives=wilson(hard_k, hard_n),
        by_category={c: v for c, v in table.items() if v["n"]}, trajectory=_agreement(*traj),
        trajectory_skipped=traj_skipped,
        status=StatusAgreement(cases=wilson(*status_cases), decisions=_agreement(*dec)),
        misjudged=misjudged, seconds_total=round(sum(seconds), 3),
        seconds_mean=round(sum(seconds) / len(seconds), 3) if seconds else None)
