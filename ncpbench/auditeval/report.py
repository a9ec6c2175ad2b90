"""The audit-eval report: the same content as markdown (report.md) and a self-contained HTML page
(report.html: inline CSS, no scripts, every piece of text HTML-escaped).

Reads cases, results and scores only; never calls a model. Both renderings come from one list of
blocks, so they cannot disagree.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ncpbench.auditeval.cases import ALL_CATEGORIES, LONG_RANGE_CATEGORIES, AuditCase
from ncpbench.auditeval.evaluate import CaseResult
from ncpbench.auditeval.scoring import Agreement, Proportion, Scores, wilson


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Para:
    text: str


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass
class CaseCard:
    title: str
    fields: list[tuple[str, str]] = field(default_factory=list)
    """(label, text); long texts are shown as quoted blocks."""


Block = Heading | Para | Table | CaseCard
QUOTED_LABELS = ("reply", "player action", "planted")
"""Case-card fields shown as quoted blocks."""
QUOTED = ' class="q"'


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def prop(p: Proportion) -> str:
    """'62.5% [40.9–80.0] (10/16)'."""
    if p.value is None:
        return f"n/a (0/{p.n})"
    assert p.low is not None and p.high is not None
    return f"{pct(p.value)} [{100 * p.low:.1f}–{100 * p.high:.1f}] ({p.k}/{p.n})"


def num(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def f1_text(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f} [{num(low)}–{num(high)}]"


def _agreement_table(a: Agreement, yes: str, no: str) -> Table:
    return Table(["", f"auditor: {yes}", f"auditor: {no}"],
                 [[f"gold: {yes}", str(a.tp), str(a.fn)], [f"gold: {no}", str(a.fp), str(a.tn)]])


def blocks(cases: Sequence[AuditCase], results: Sequence[CaseResult], scores: Scores,
           meta: Mapping[str, str]) -> list[Block]:
    out: list[Block] = [Heading("Auditor validity report", 1)]
    out.append(Table(["", ""], [[k, v] for k, v in meta.items()]))
    s = scores
    out.append(Para(
        f"{s.scored} of {s.cases} cases scored ({s.errors} failed to audit"
        + (f", {s.missing} never reached by an interrupted run" if s.missing else "")
        + "; those are left out). The auditor confirmed "
        f"a conflict on {prop(s.recall_any)} of the planted-conflict cases and raised a false alarm on "
        f"{prop(s.fpr)} of the clean controls (clean replies and hard negatives). Intervals are 95%: Wilson for "
        "proportions, a seeded percentile bootstrap over cases for F1."
        + (f" Mean audit time {s.seconds_mean:.1f} s per case." if s.seconds_mean is not None else "")))

    out.append(Heading("Conflict detection per kind"))
    rows = []
    for k in s.kinds.values():
        rows.append([k.kind, str(k.tp), str(k.fp), str(k.fn), str(k.tn), prop(k.precision), prop(k.recall),
                     f1_text(k.f1, k.f1_low, k.f1_high), prop(k.target) if k.kind != "player_input" else "–",
                     str(k.skipped)])
    out.append(Table(["kind", "TP", "FP", "FN", "TN", "precision", "recall", "F1", "right id (of hits)",
                      "tolerated, not counted"], rows))
    out.append(Para("A case counts for a kind when the kind is planted (positive) or not planted and not "
                    "tolerated (negative). Tolerated: a planted plot violation may also read as a fact "
                    "contradiction and vice versa, so such extra claims are neither hits nor false alarms."))
    out.append(Heading("Any conflict vs. none", 3))
    out.append(_agreement_table(s.detection, "conflict", "no conflict"))

    out.append(Heading("False alarms on clean controls"))
    out.append(Table(["controls", "false-positive rate"], [
        ["all clean controls", prop(s.fpr)], ["clean replies", prop(s.fpr_clean)],
        ["hard negatives", prop(s.fpr_hard_negatives)]]))

    out.append(Heading("Confusion table (category × confirmed conflict kinds)"))
    out.append(Para("A case can count in several kind columns. 'correct' = every planted kind confirmed and no "
                    "false alarm."))
    table_rows = []
    for cat in ALL_CATEGORIES:
        row = s.by_category.get(cat)
        if not row:
            continue
        table_rows.append([cat, str(row["n"]), f"{row['correct']} ({pct(row['correct'] / row['n'])})",
                           str(row["none"]), str(row["fact"]), str(row["commitment"]), str(row["player_input"])])
    out.append(Table(["category", "n", "correct", "no conflict", "fact", "commitment", "player_input"], table_rows))

    out += long_range_blocks(cases, s, meta)

    out.append(Heading("Trajectory (frontier node completion)"))
    out.append(Para(f"On the clean controls the auditor passed ({s.trajectory_skipped} flagged controls never reach "
                    f"this stage): agreement {prop(s.trajectory.agreement)}, Cohen's kappa "
                    f"{num(s.trajectory.kappa)}."))
    out.append(_agreement_table(s.trajectory, "completes", "does not"))
    out.append(Heading("Commitment status"))
    out.append(Para(f"Exact set of newly SATISFIED commitments right: {prop(s.status.cases)}. Per pending "
                    f"commitment: agreement {prop(s.status.decisions.agreement)}, kappa {num(s.status.decisions.kappa)} "
                    "(decisions within a case are not independent, so that interval is optimistic)."))
    out.append(_agreement_table(s.status.decisions, "satisfied", "pending"))

    out.append(Heading(f"Misjudged cases ({len(s.misjudged)})"))
    out.append(Para("Conflict misjudgements first, then trajectory / status disagreements. Each shows the reply, "
                    "the planted sentence, the label's reason, and what the auditor confirmed with the evidence "
                    "it quoted."))
    case_by_id = {c.id: c for c in cases}
    result_by_id = {r.case_id: r for r in results}
    ordered = sorted(s.misjudged, key=lambda m: (not m.conflict_axis, case_by_id[m.case_id].index))
    for m in ordered:
        case = case_by_id[m.case_id]
        verdict = result_by_id[m.case_id].verdict
        card = CaseCard(f"{case.id} — {case.category} / {case.variant}")
        card.fields.append(("problems", "; ".join(m.problems)))
        gold = ", ".join(k.value for k in case.gold.kinds) or "no conflict"
        targets = "; ".join(f"{k}: {', '.join(v)}" for k, v in case.gold.targets.items())
        card.fields.append(("gold", gold + (f" ({targets})" if targets else "") + f" — {case.gold.why}"))
        card.fields.append(("plot", f"done {', '.join(case.state.completed_nodes) or 'none'}; frontier "
                                    f"{case.frontier_node or 'none'}"))
        card.fields.append(("player action", case.player_action))
        card.fields.append(("reply", case.reply))
        if case.planted:
            card.fields.append(("planted", case.planted))
        if verdict is not None:
            if not verdict.conflicts:
                card.fields.append(("auditor", "no conflict confirmed"))
            for c in verdict.conflicts:
                card.fields.append((f"auditor: {c.kind.value} {c.target or ''}".strip(),
                                    f"“{c.evidence}” — {c.reason}"))
            for c in verdict.overturned:
                card.fields.append((f"overturned claim: {c.kind.value} {c.target or ''}".strip(),
                                    f"“{c.evidence}” — {c.reason}"))
            if verdict.completed_nodes:
                card.fields.append(("auditor: completed", ", ".join(verdict.completed_nodes)))
        out.append(card)
    errors = [r for r in results if r.error]
    if errors:
        out.append(Heading(f"Failed audits ({len(errors)})"))
        out.append(Table(["case", "error"], [[r.case_id, r.error or ""] for r in errors]))
    return out


def long_range_blocks(cases: Sequence[AuditCase], s: Scores, meta: Mapping[str, str]) -> list[Block]:
    """Recall on the long-range categories (and false alarms on their hard negative), when present."""
    rows = []
    for cat in LONG_RANGE_CATEGORIES:
        row = s.by_category.get(cat)
        if not row:
            continue
        gaps = [c.detail_distance for c in cases if c.category == cat and c.detail_distance is not None]
        span = f"{min(gaps)}–{max(gaps)}" if gaps else "–"
        if cat.startswith("hn_"):
            rows.append([cat, str(row["n"]), span, "no conflict", "false alarms " + prop(wilson(row["n"] - row["none"],
                                                                                            row["n"]))])
        else:
            rows.append([cat, str(row["n"]), span, "fact", "fact recall " + prop(wilson(row["fact"], row["n"]))])
    if not rows:
        return []
    context = meta.get("audit context", "full")
    return [Heading("Long-range cases"),
            Para(f"Audit context of this run: {context}. The detail the reply speaks of was narrated in turn 1 or 2; "
                 "'turns back' is the distance from that turn to the reply under audit. long_fact_ledger's detail "
                 "is in the ledger (shown in every context); long_fact_narration's is only in the early narration, "
                 "which a compact context with fewer recent exchanges than that distance does not show. Run the "
                 "suite once with --audit-context full and once with compact to read the cost of compact context "
                 "in recall off this table."),
            Table(["category", "n", "turns back", "gold", "figure"], rows)]


# -- markdown --------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines() or [""])


def render_markdown(items: Sequence[Block]) -> str:
    lines: list[str] = []
    for b in items:
        if isinstance(b, Heading):
            lines += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            lines += [b.text, ""]
        elif isinstance(b, Table):
            lines.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            lines.append("|" + "|".join("---" for _ in b.headers) + "|")
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            lines.append("")
        else:
            lines += [f"#### {b.title}", ""]
            for label, text in b.fields:
                if label in QUOTED_LABELS or len(text) > 160:
                    lines += [f"**{label}**:", "", _md_quote(text), ""]
                else:
                    lines += [f"**{label}**: {text}", ""]
    return "\n".join(lines).rstrip() + "\n"


# -- HTML ------------------------------------------------------------------------------------------

CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1d1d1f; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .92em; }
th, td { border: 1px solid #d0d0d0; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f5; }
.case { border: 1px solid #d8d8de; border-radius: 6px; padding: .6em 1em; margin: 1em 0; background: #fcfcfd; }
.case h4 { margin: .2em 0 .5em; font-size: 1em; }
.case dt { font-weight: 600; margin-top: .4em; } .case dd { margin: .1em 0 .1em 1.2em; white-space: pre-wrap; }
.case dd.q { border-left: 3px solid #c9c9d6; padding-left: .6em; color: #333; }
"""


def render_html(items: Sequence[Block], title: str = "Auditor validity report") -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{e(title)}</title><style>{CSS}</style></head><body>"]
    for b in items:
        if isinstance(b, Heading):
            parts.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            parts.append(f"<p>{e(b.text)}</p>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{e(h)}</th>" for h in b.headers)
            body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        else:
            fields = "".join(
                f"<dt>{e(label)}</dt><dd{QUOTED if label in QUOTED_LABELS else ''}>{e(text)}</dd>"
                for label, text in b.fields)
            parts.append(f'<div class="case"><h4>{e(b.title)}</h4><dl>{fields}</dl></div>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_reports(out_dir: str | Path, cases: Sequence[AuditCase], results: Sequence[CaseResult], scores: Scores,
                  meta: Mapping[str, str]) -> tuple[Path, Path]:
    """Write report.md and report.html into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = blocks(cases, results, scores, meta)
    md, page = out / "report.md", out / "report.html"
    md.write_text(render_markdown(items), encoding="utf-8")
    page.write_text(render_html(items), encoding="utf-8")
    return md, page
