"""The static HTML report: one self-contained index.html (inline CSS and JS, the plot as base64 PNG).

Sections: summary, run comparison, survival plot, per-genre and per-environment tables, and the
episodes: a list per run whose links open a transcript viewer. A transcript is a `<details>`
element (id `ep-<episode id>`, with `ep-r<run>-<episode id>` when several runs are shown); the
inline script opens the one named in the URL hash (on load and on hashchange), so
`index.html#ep-iron-man-0` lands on that episode. Each turn shows the player action, the narrator
reply with the confirmed conflict evidence marked (`<mark class="evidence">`; a quote not found in
the reply is shown separately), the verdict, the nodes completed so far, the commitments settled
and the ledger after the turn.

Every piece of record and run text goes through `html.escape`: narrator replies, player actions,
model names and titles are hostile input. The per-turn ledgers are filled in by the script from
the episode's ledger table (cloning its text, never parsing markup) when the episode opens, so a
100-turn episode carries its ledger once instead of a hundred times; without script the full
ledger table, with each fact's added and negated turn, is still there.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ncpbench.ledger import LedgerFact
from ncpbench.metrics import Summary
from ncpbench.record import EpisodeRecord
from ncpbench.reports.runs import Run, episode_key
from ncpbench.reports.tables import Table, fmt_estimate, fmt_number
from ncpbench.reports.transcript import Span, TurnState, find_evidence, highlight, turn_states


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


@dataclass
class RunSection:
    run: Run
    summary: Summary
    anchors: dict[str, str] = field(default_factory=dict)
    """episode key -> element id."""


def episode_anchors(runs: Sequence[Run]) -> list[dict[str, str]]:
    """Element ids for every episode: `ep-<id>` (one run) or `ep-r<n>-<id>`, unique in the page."""
    used: set[str] = set()
    out: list[dict[str, str]] = []
    for i, run in enumerate(runs, start=1):
        prefix = "ep-" if len(runs) == 1 else f"ep-r{i}-"
        anchors: dict[str, str] = {}
        for r in run.records:
            key = episode_key(r)
            base = prefix + (re.sub(r"[^A-Za-z0-9_-]+", "-", key).strip("-") or "episode")
            anchor, n = base, 1
            while anchor in used:
                n += 1
                anchor = f"{base}-{n}"
            used.add(anchor)
            anchors[key] = anchor
        out.append(anchors)
    return out


CSS = """
:root { --fg:#1d1d1f; --muted:#5f6368; --line:#d9d9de; --bg:#ffffff; --soft:#f5f6f8; --accent:#1f5fbf; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
header { padding: 18px 28px; background: #20324a; color: #fff; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 0; color: #c9d4e3; }
nav { padding: 8px 28px; background: var(--soft); border-bottom: 1px solid var(--line); }
nav a { margin-right: 16px; color: var(--accent); text-decoration: none; }
main { padding: 8px 28px 40px; max-width: 1500px; }
h2 { margin-top: 28px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--soft); position: sticky; top: 0; }
tbody tr:nth-child(even) { background: #fafafb; }
figure { margin: 12px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
.muted { color: var(--muted); }
.outcome { display: inline-block; min-width: 78px; padding: 0 6px; border-radius: 4px; font-size: 12px; font-weight: 600; text-align: center; color: #fff; }
.outcome.CONFLICT { background: #c62828; } .outcome.SUCCESS { background: #2e7d32; }
.outcome.SURVIVAL { background: #1565c0; } .outcome.ERROR { background: #6d4c41; } .outcome.ONGOING { background: #757575; }
details.episode { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; background: #fff; }
details.episode > summary { cursor: pointer; padding: 6px 10px; background: var(--soft); }
details.episode[open] > summary { border-bottom: 1px solid var(--line); }
.episode-body { padding: 6px 14px 12px; }
article.turn { border-left: 4px solid #90a4ae; padding: 4px 12px; margin: 12px 0; }
article.turn.conflict { border-left-color: #c62828; background: #fff7f7; }
article.turn h4 { margin: 4px 0; }
.badge { font-size: 12px; font-weight: normal; color: var(--muted); margin-left: 8px; }
.who { font-weight: 600; margin-right: 6px; }
.player { margin: 4px 0; color: #0d47a1; }
.reply .text { white-space: pre-wrap; margin: 4px 0; }
mark.evidence { background: #ffd54f; outline: 2px solid #c62828; padding: 0 1px; }
mark.overturned { background: #e8eaed; text-decoration: underline dotted #5f6368; }
.evidence-missing { background: #fff3e0; border: 1px dashed #ef6c00; padding: 4px 8px; }
ul.verdict { margin: 4px 0; padding-left: 20px; font-size: 14px; }
ul.verdict li.conflict { color: #b71c1c; } ul.verdict li.overturned { color: var(--muted); }
.state { font-size: 14px; background: var(--soft); padding: 4px 10px; border-radius: 4px; }
.state p { margin: 2px 0; }
ul.ledger-at { margin: 4px 0; padding-left: 20px; }
ul.ledger-at li.new { color: #1b5e20; font-weight: 600; }
ul.ledger-at li.negated { color: var(--muted); text-decoration: line-through; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; font-size: 13px; }
dl.meta dt { color: var(--muted); } dl.meta dd { margin: 0; }
"""

SCRIPT = """
(function () {
  "use strict";
  function fillLedgers(ep) {
    if (ep.getAttribute("data-filled")) return;
    ep.setAttribute("data-filled", "1");
    var rows = ep.querySelectorAll("table.ledger tbody tr");
    ep.querySelectorAll("ul.ledger-at").forEach(function (ul) {
      var t = Number(ul.getAttribute("data-turn"));
      rows.forEach(function (tr) {
        var added = Number(tr.getAttribute("data-added"));
        var negAttr = tr.getAttribute("data-negated");
        var neg = negAttr === "" ? null : Number(negAttr);
        if (added > t || (neg !== null && neg < t)) return;
        var li = document.createElement("li");
        li.textContent = tr.cells[0].textContent + ": " + tr.cells[1].textContent;
        if (neg === t) li.className = "negated";
        else if (added === t && t > 0) li.className = "new";
        ul.appendChild(li);
      });
    });
  }
  function openFromHash() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    if (!id) return;
    var target = document.getElementById(id);
    if (!target) return;
    var ep = target.closest("details.episode");
    for (var d = target; d; d = d.parentElement) {
      if (d.tagName === "DETAILS") d.open = true;
    }
    if (ep) fillLedgers(ep);
    target.scrollIntoView();
  }
  document.querySelectorAll("details.episode").forEach(function (ep) {
    ep.addEventListener("toggle", function () { if (ep.open) fillLedgers(ep); });
  });
  window.addEventListener("hashchange", openFromHash);
  openFromHash();
})();
"""


def table_html(table: Table, css: str = "") -> str:
    head = "".join(f"<th>{e(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    return (f'<div class="table-wrap"><table class="{e(css)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _meta_html(run: Run) -> str:
    items = [("path", str(run.path))]
    for key, value in run.meta.items():
        if key != "config" and isinstance(value, str | int | float | bool) and value is not None:
            items.append((key, str(value)))
    for role in ("narrator", "player", "auditor"):
        if run.model(role):
            items.append((f"{role} model", run.model(role)))
    if run.player_mode:
        items.append(("player mode", run.player_mode))
    rows = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in items)
    notes = "".join(f"<li>{e(n)}</li>" for n in run.notes)
    return f'<dl class="meta">{rows}</dl>' + (f'<ul class="muted">{notes}</ul>' if notes else "")


def summary_sentence(section: RunSection) -> str:
    s = section.summary
    o = s.outcomes
    parts = [f"{s.episodes} episodes ({s.errors} ERROR, excluded from the averages; "
             f"{o['CONFLICT']} CONFLICT, {o['SUCCESS']} SUCCESS, {o['SURVIVAL']} SURVIVAL)",
             f"average turns {fmt_estimate(s.avg_turns)}",
             f"progress {fmt_estimate(s.progress, True)}",
             f"satisfied commitments {fmt_estimate(s.satisfied, True)}"]
    for t, est in s.survival_at.items():
        if est is not None:
            parts.append(f"survival after {t} turns {fmt_estimate(est, True)}")
    median = "not reached" if s.km_median is None else f"{s.km_median:g} turns"
    parts.append(f"Kaplan–Meier median {median}, restricted mean {fmt_number(s.rmst)} of {s.horizon} turns")
    return f"<li><b>{e(section.run.name)}</b>: " + e("; ".join(parts)) + ".</li>"


def unquote(quote: str) -> str:
    """The quote without the quote marks around it (we add our own)."""
    text = quote.strip()
    while len(text) >= 2 and text[0] in "\"'“‘«„" and text[-1] in "\"'”’»“":
        text = text[1:-1].strip()
    return text


def _verdict_items(ts: TurnState) -> list[str]:
    t = ts.turn
    v = t.verdict
    items: list[str] = []
    for c in v.conflicts:
        items.append(f'<li class="conflict"><b>{e(c.kind.value)} conflict</b>'
                     f"{' on ' + e(c.target) if c.target else ''}: “{e(unquote(c.evidence))}” — {e(c.reason)}</li>")
    for c in v.overturned:
        items.append(f'<li class="overturned">overturned {e(c.kind.value)} claim'
                     f"{' on ' + e(c.target) if c.target else ''}: “{e(unquote(c.evidence))}” — {e(c.reason)}</li>")
    if v.fact_diff.add:
        items.append("<li>facts added: " + "; ".join(e(f) for f in v.fact_diff.add) + "</li>")
    if v.fact_diff.negate:
        items.append("<li>facts negated: " + ", ".join(e(f) for f in v.fact_diff.negate) + "</li>")
    if t.completed_nodes:
        items.append("<li>nodes completed: " + ", ".join(e(n) for n in t.completed_nodes) + "</li>")
    if t.rejected_nodes:
        items.append("<li>nodes claimed but not credited (predecessors missing): "
                     + ", ".join(e(n) for n in t.rejected_nodes) + "</li>")
    for u in v.commitment_updates:
        items.append(f"<li>commitment {e(u.id)} → {e(u.status.value)}"
                     + (f" (evidence: {e(', '.join(u.evidence))})" if u.evidence else "") + "</li>")
    for note in t.notes:
        items.append(f'<li class="muted">note: {e(note)}</li>')
    if not items:
        items.append('<li class="muted">clean: no conflict, no state change</li>')
    return items


def turn_html(ts: TurnState, anchor: str) -> str:
    t = ts.turn
    v = t.verdict
    spans: list[Span] = []
    missing = []
    for c in v.conflicts:
        pos = find_evidence(t.narrator_reply, c.evidence) if c.evidence else None
        if pos is not None:
            spans.append(Span(pos[0], pos[1], "evidence", f"{c.kind.value} conflict: {c.reason}"))
        elif c.evidence:
            missing.append(c)
    for c in v.overturned:
        pos = find_evidence(t.narrator_reply, c.evidence) if c.evidence else None
        if pos is not None:
            spans.append(Span(pos[0], pos[1], "overturned", f"overturned {c.kind.value} claim: {c.reason}"))
    conflict = bool(v.conflicts) and not t.committed
    label = "Opening" if t.turn == 0 else f"Turn {t.turn}"
    badge = "conflict: not committed" if conflict else ("committed" if t.committed else "not committed")
    out = [f'<article class="turn{" conflict" if conflict else ""}" id="{anchor}-t{t.turn}">',
           f'<h4>{label}<span class="badge">{badge}</span></h4>']
    if t.player_action is not None:
        out.append(f'<p class="player"><span class="who">Player:</span>{e(t.player_action)}</p>')
    out.append(f'<div class="reply"><span class="who">Narrator:</span><p class="text">'
               f"{highlight(t.narrator_reply, spans)}</p></div>")
    for c in missing:
        out.append(f'<p class="evidence-missing">Quoted evidence ({e(c.kind.value)}), not found verbatim in the '
                   f"reply: <q>{e(c.evidence)}</q></p>")
    out.append('<ul class="verdict">' + "".join(_verdict_items(ts)) + "</ul>")
    nodes = ", ".join(f"<b>{e(n)}</b>" if n in ts.new_nodes else e(n) for n in ts.nodes) or "none yet"
    state = [f"<p>Plot, nodes completed so far: {nodes}</p>"]
    if ts.settled:
        state.append("<p>Commitments settled at this turn: " + ", ".join(
            f"{e(c.id)} ({e(c.type.value)}) {e(c.status.value)}" for c in ts.settled) + "</p>")
    when = "before the opening's updates (they commit with turn 1)" if t.turn == 0 else (
        "as judged (nothing of this turn was committed)" if conflict else "after this turn")
    change = f", +{len(ts.added)} new, −{len(ts.negated)} negated" if (ts.added or ts.negated) else ""
    opened = " open" if conflict else ""
    state.append(f'<details class="ledger-at"{opened}><summary>Ledger {when}: {len(ts.facts)} active facts{change}'
                 f'</summary><noscript><p>See the ledger table at the end of the episode: a fact is active at turn '
                 f'{t.turn} when added at or before it and not negated by then.</p></noscript>'
                 f'<ul class="ledger-at" data-turn="{t.turn}"></ul></details>')
    out.append('<div class="state">' + "".join(state) + "</div></article>")
    return "".join(out)


def _negated_attr(fact: LedgerFact) -> str:
    """The turn that negated the fact, "" when active, -1 when it was negated from the start."""
    if fact.negated_turn is not None:
        return str(fact.negated_turn)
    return "-1" if fact.negated else ""


def episode_html(record: EpisodeRecord, anchor: str, run_name: str) -> str:
    key = episode_key(record)
    states = turn_states(record)
    genres = ", ".join(record.genres)
    facts = [f'<li>env {e(record.env_id)} · genres {e(genres or "—")} · replicate {record.replicate} · '
             f"seed {record.seed} · run {e(run_name)}</li>",
             f"<li>turns {record.turns} of {record.max_turns} · progress {100 * record.progress:.0f}% · "
             f"satisfied commitments {100 * record.satisfied_share:.0f}%"
             + (f" · conflict kinds: {e(', '.join(record.conflict_kinds))}" if record.conflict_kinds else "")
             + "</li>"]
    if record.error:
        facts.append(f"<li>error (infrastructure, not a verdict): {e(record.error)}</li>")
    turns = "".join(turn_html(ts, anchor) for ts in states) or '<p class="muted">No audited reply.</p>'
    ledger_rows = "".join(
        f'<tr data-added="{f.added_turn}" data-negated="{_negated_attr(f)}">'
        f"<td>{e(f.id)}</td><td>{e(f.content)}</td><td>{f.added_turn}</td>"
        f"<td>{'' if f.negated_turn is None else f.negated_turn}{' (initially negated)' if f.negated and f.negated_turn is None else ''}</td></tr>"
        for f in record.final_state.ledger.facts)
    commitment_rows = "".join(
        f"<tr><td>{e(c.id)}</td><td>{e(c.type.value)}</td><td>{e(c.status.value)}</td>"
        f"<td>{'' if c.turn is None else c.turn}</td><td>{e(', '.join(c.evidence))}</td></tr>"
        for c in record.final_state.commitments.items)
    return (
        f'<details class="episode" id="{anchor}"><summary><span class="outcome {e(record.outcome.value)}">'
        f"{e(record.outcome.value)}</span> {e(record.title)} — <code>{e(key)}</code> · {record.turns} turns"
        f'</summary><div class="episode-body"><ul class="muted">{"".join(facts)}</ul>{turns}'
        f'<details class="ledger-full"><summary>Ledger: every fact with the turn that added or negated it '
        f'(0 = initial)</summary><div class="table-wrap"><table class="ledger"><thead><tr><th>id</th><th>fact</th>'
        f"<th>added</th><th>negated</th></tr></thead><tbody>{ledger_rows}</tbody></table></div></details>"
        f'<details class="commitments"><summary>Commitments at the end</summary><div class="table-wrap"><table>'
        f"<thead><tr><th>id</th><th>type</th><th>status</th><th>turn</th><th>evidence</th></tr></thead>"
        f"<tbody>{commitment_rows}</tbody></table></div></details></div></details>"
    )


def _sort_key(r: EpisodeRecord) -> tuple[str, int, str]:
    return (r.env_id, r.replicate, episode_key(r))


def episodes_html(section: RunSection) -> str:
    recs = sorted(section.run.records, key=_sort_key)
    rows = []
    for r in recs:
        anchor = section.anchors[episode_key(r)]
        rows.append(
            f'<tr><td><a href="#{anchor}">{e(episode_key(r))}</a></td><td>{e(r.title)}</td>'
            f"<td>{e(', '.join(r.genres))}</td><td><span class=\"outcome {e(r.outcome.value)}\">"
            f"{e(r.outcome.value)}</span></td><td>{r.turns} / {r.max_turns}</td><td>{100 * r.progress:.0f}%</td>"
            f"<td>{100 * r.satisfied_share:.0f}%</td><td>{e(', '.join(r.conflict_kinds))}</td>"
            f"<td>{e((r.error or '')[:120])}</td></tr>")
    table = ('<div class="table-wrap"><table class="episodes"><thead><tr><th>episode</th><th>title</th>'
             "<th>genres</th><th>outcome</th><th>turns</th><th>progress</th><th>satisfied</th>"
             "<th>conflict kinds</th><th>error</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")
    transcripts = "".join(episode_html(r, section.anchors[episode_key(r)], section.run.name) for r in recs)
    return f"<h3>{e(section.run.name)}</h3>{table}<h4>Transcripts</h4>{transcripts}"


def render_page(sections: Sequence[RunSection], comparison: Table, genres: Table, envs: Table, png: bytes,
                title: str = "ncpbench report", files: dict[str, Any] | None = None, usage: Table | None = None) -> str:
    """The whole page as one string."""
    names = ", ".join(s.run.name for s in sections)
    img = base64.b64encode(png).decode("ascii")
    links = "".join(f'<a href="{e(path)}">{e(label)}</a> ' for label, path in (files or {}).items())
    runs_meta = "".join(f"<h3>{e(s.run.name)}</h3>{_meta_html(s.run)}" for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{e(title)}</h1><p>{len(sections)} run(s): {e(names)}</p></header>"
        '<nav><a href="#summary">Summary</a><a href="#comparison">Comparison</a><a href="#survival">Survival</a>'
        '<a href="#genres">Genres</a><a href="#environments">Environments</a><a href="#episodes">Episodes</a>'
        '<a href="#usage">Tokens and cost</a><a href="#runs">Runs</a></nav><main>'
        '<section id="summary"><h2>Summary</h2><ul>' + "".join(summary_sentence(s) for s in sections) + "</ul>"
        '<p class="muted">Averages and shares carry 95% bootstrap percentile intervals. ERROR episodes '
        "(infrastructure failures) are excluded from the averages and counted separately; in the "
        "Kaplan–Meier curves they, SUCCESS and SURVIVAL are censored at the turn they reached.</p></section>"
        f'<section id="comparison"><h2>Run comparison</h2>{table_html(comparison, "comparison")}'
        f'<p class="muted">Also as files: {links}</p></section>'
        '<section id="survival"><h2>Survival</h2><figure>'
        f'<img class="survival-plot" alt="Kaplan–Meier survival curves of every run" src="data:image/png;base64,{img}">'
        "<figcaption>Share of episodes without a conflict after each turn (Kaplan–Meier), shaded 95% "
        "log-log bands; ticks mark censored episodes.</figcaption></figure></section>"
        f'<section id="genres"><h2>Per genre</h2><p class="muted">An environment with several genres counts '
        f"in each.</p>{table_html(genres, 'genres')}</section>"
        f'<section id="environments"><h2>Per environment</h2><details><summary>{len(envs.rows)} rows'
        f"</summary>{table_html(envs, 'environments')}</details></section>"
        '<section id="episodes"><h2>Episodes</h2><p class="muted">Click an episode (or link to '
        "<code>#ep-&lt;id&gt;</code>) to open its transcript.</p>"
        + "".join(episodes_html(s) for s in sections) + "</section>"
        + (f'<section id="usage"><h2>Tokens and cost</h2><p class="muted">Cached prompt tokens are the part of '
           "the prompt the endpoint served from its prefix cache; the cost estimate prices them at the cached "
           f'rate when the price table gives one.</p>{table_html(usage, "usage")}</section>' if usage else "")
        + f'<section id="runs"><h2>Runs</h2>{runs_meta}</section>'
        f"</main><script>{SCRIPT}</script></body></html>\n"
    )
