"""Auditor agreement between a run and its rescore (`ncpbench rescore`): the same replies, two judges.

Episodes are paired by episode id; within a pair, turns by turn number, over the turns both
auditors judged (the rescore may end an episode earlier, or, as ERROR, later than the original):

- per-turn agreement on conflict / no conflict (a confirmed conflict in the turn's verdict), with
  Cohen's kappa (`ncpbench.compare.cohen_kappa`);
- agreement on the conflict kind (the set of confirmed kinds) over the turns both call a conflict;
- the correlation of the episodes' turn counts (Pearson and Spearman, scipy.stats) over the
  episodes both runs scored (neither is ERROR).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from ncpbench.compare import cohen_kappa
from ncpbench.record import EpisodeRecord
from ncpbench.reports.runs import Run, episode_key
from ncpbench.state import Outcome


def is_rescore_of(rescore: Run, original: Run) -> bool:
    """True when run.json of `rescore` names `original` as the run it re-audited."""
    target = rescore.meta.get("rescore_of")
    if not isinstance(target, str) or not target:
        return False
    try:
        return bool(original.path.resolve() == type(original.path)(target).resolve())
    except OSError:
        return False


def _kinds(record_turn: Any) -> tuple[str, ...]:
    return tuple(sorted({c.kind.value for c in record_turn.verdict.conflicts}))


def agreement(original: Run, rescore: Run) -> dict[str, Any]:
    """The agreement figures (JSON-ready; None where nothing can be computed)."""
    from scipy import stats

    theirs = {episode_key(r): r for r in rescore.records}
    a_labels: list[bool] = []
    b_labels: list[bool] = []
    kind_same = kind_n = 0
    turns_a: list[int] = []
    turns_b: list[int] = []
    episodes = 0
    for ra in original.records:
        rb: EpisodeRecord | None = theirs.get(episode_key(ra))
        if rb is None:
            continue
        episodes += 1
        b_turns = {t.turn: t for t in rb.history}
        for ta in ra.history:
            tb = b_turns.get(ta.turn)
            if tb is None:
                continue
            ka, kb = _kinds(ta), _kinds(tb)
            a_labels.append(bool(ka))
            b_labels.append(bool(kb))
            if ka and kb:
                kind_n += 1
                kind_same += ka == kb
        if ra.outcome is not Outcome.ERROR and rb.outcome is not Outcome.ERROR:
            turns_a.append(ra.turns)
            turns_b.append(rb.turns)
    n = len(a_labels)
    agree = sum(x == y for x, y in zip(a_labels, b_labels, strict=True))
    kappa = cohen_kappa(a_labels, b_labels) if n else math.nan
    pearson = spearman = None
    if len(turns_a) >= 2 and len(set(turns_a)) > 1 and len(set(turns_b)) > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pearson = float(stats.pearsonr(turns_a, turns_b)[0])
            spearman = float(stats.spearmanr(turns_a, turns_b)[0])
    return {
        "original": original.name, "rescore": rescore.name,
        "original_auditor": original.model("auditor"), "rescore_auditor": rescore.model("auditor"),
        "episodes": episodes, "turns": n, "agreement": agree / n if n else None,
        "conflict_original": sum(a_labels), "conflict_rescore": sum(b_labels),
        "both_conflict": sum(x and y for x, y in zip(a_labels, b_labels, strict=True)),
        "kappa": None if math.isnan(kappa) else kappa,
        "kind_turns": kind_n, "kind_agreement": kind_same / kind_n if kind_n else None,
        "turn_count_episodes": len(turns_a), "pearson": pearson, "spearman": spearman,
    }
