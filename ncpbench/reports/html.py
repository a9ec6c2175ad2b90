"""The static HTML report: one self-contained index.html (inline CSS and JS, the plot as base64 PNG).

Top of the page, on the first screen: a red banner naming every run that is mock, mostly ERROR,
or not comparable with the first run (and why); the headline table (one short row per run);
"is the difference real" (log-rank and paired per-environment differences against the first
run); auditor agreement when one run is a rescore of another. Below, behind toggles: the summary
in words and the full comparison; then the survival plot with its number-at-risk table, the
per-genre and per-environment tables, the episode browser, tokens and the runs' metadata.

The episode browser is one table of every episode of every run, filtered and sorted in the page
(plain JS; `?outcome=CONFLICT&env=iron&genre=Drama&kind=fact&min=3&max=20` in the URL sets the
filters). Transcripts are not in the DOM: each episode's markup is a string in one JSON data block
(`<script type="application/json">`, with `<`, `>` and `&` written as \\u escapes so nothing in it
can close the block), parsed on the first open and rendered into the viewer one episode at a time.
A transcript is a `<details class="episode">` with id `ep-<episode id>` (one run) or
`ep-r<run>-<episode id>` (several), characters other than letters, digits, `-` and `_` replaced
by `-`; the script opens the one named in the URL hash (on load and on hashchange) and also
accepts the raw episode id (`#ep-iron-man#0`), a turn anchor (`...-t3`) and, with several runs,
`#ep-<id>` for the first run's. Each turn shows the player action, the narrator reply with the
confirmed conflict evidence marked (`<mark class="evidence">`; a quote not found in the reply is
shown separately), the verdict, the nodes completed so far, the commitments settled, the ledger
after the turn (filled in from the episode's ledger table by cloning its text, never parsing
markup) and, when the run folder has calls.jsonl, the auditor's raw answers behind a toggle.

Every piece of record and run text goes through `html.escape`: narrator replies, player actions,
raw model answers, model names and titles are hostile input.
"""

from __future__ import annotations

import base64
import html
import json
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
    calls: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    """(episode, turn) -> the auditor's raw answers from the run's calls.jsonl."""


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
main { padding: 4px 28px 40px; max-width: 1500px; }
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
.banner { background: #b71c1c; color: #fff; border-radius: 6px; padding: 6px 14px; margin: 8px 0; font-weight: 600; }
.banner ul { margin: 4px 0; padding-left: 18px; }
table.headline { font-size: 13px; } table.headline td:last-child { white-space: pre-line; font-size: 12px; color: var(--muted); }
table.headline td:first-child { font-weight: 600; }
section#headline h2 { margin-top: 12px; }
section > details > summary { cursor: pointer; font-size: 17px; margin: 18px 0 6px; }
.filters { display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; margin: 6px 0; font-size: 14px; }
.episode-list { max-height: 520px; overflow-y: auto; }
table.episodes th[data-sort] { cursor: pointer; }
table.episodes th[data-dir="asc"]::after { content: " ▲"; } table.episodes th[data-dir="desc"]::after { content: " ▼"; }
pre.raw { white-space: pre-wrap; background: #f3f3f6; padding: 4px 8px; font-size: 12px; max-height: 320px; overflow: auto; }
details.raw-audit > summary { cursor: pointer; font-size: 13px; color: var(--accent); }
"""

SCRIPT = """
(function () {
  "use strict";
  var parsed = null;
  function data() {  // parsed on the first open, not on load: a big run's page shows its tables at once
    if (parsed === null) parsed = JSON.parse(document.getElementById("episode-data").textContent);
    return parsed;
  }
  var viewer = document.getElementById("viewer");
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
  function candidates(id) {
    var out = [id];
    var clean = id.replace(/[^A-Za-z0-9_-]+/g, "-").replace(/^-+|-+$/g, "");
    out.push(clean);
    [id, clean].forEach(function (x) {
      var m = /^(.*)-t\\d+$/.exec(x);
      if (m) out.push(m[1]);
    });
    out.slice().forEach(function (x) {
      if (x.indexOf("ep-") === 0 && !/^ep-r\\d+-/.test(x)) out.push("ep-r1-" + x.slice(3));
    });
    return out;
  }
  function render(anchor) {
    var current = viewer.firstElementChild;
    if (!current || current.id !== anchor) {
      viewer.innerHTML = data()[anchor];  // our own escaped markup, generated with the report
      current = viewer.firstElementChild;
      current.addEventListener("toggle", function () { if (current.open) fillLedgers(current); });
    }
    current.open = true;
    fillLedgers(current);
    return current;
  }
  function openFromHash() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    if (!id) return;
    var list = candidates(id);
    for (var i = 0; i < list.length; i++) {
      if (Object.prototype.hasOwnProperty.call(data(), list[i])) {
        var ep = render(list[i]);
        var target = document.getElementById(id) || ep;
        for (var d = target; d; d = d.parentElement) {
          if (d.tagName === "DETAILS") d.open = true;
        }
        target.scrollIntoView();
        return;
      }
    }
  }
  // the episode list: filters and sorting, all in the page
  var table = document.querySelector("table.episodes");
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  function val(id) { var el = document.getElementById(id); return el ? el.value : ""; }
  function applyFilters() {
    var outcome = val("f-outcome"), env = val("f-env").toLowerCase(), genre = val("f-genre"), kind = val("f-kind");
    var lo = val("f-min") === "" ? null : Number(val("f-min")), hi = val("f-max") === "" ? null : Number(val("f-max"));
    var shown = 0;
    rows.forEach(function (tr) {
      var turns = Number(tr.getAttribute("data-turns"));
      var ok = (!outcome || tr.getAttribute("data-outcome") === outcome)
        && (!env || tr.getAttribute("data-env").toLowerCase().indexOf(env) >= 0)
        && (!genre || tr.getAttribute("data-genres").split("|").indexOf(genre) >= 0)
        && (!kind || tr.getAttribute("data-kinds").split("|").indexOf(kind) >= 0)
        && (lo === null || turns >= lo) && (hi === null || turns <= hi);
      tr.hidden = !ok;
      if (ok) shown++;
    });
    var count = document.getElementById("f-count");
    if (count) count.textContent = shown + " of " + rows.length + " episodes";
  }
  ["f-outcome", "f-env", "f-genre", "f-kind", "f-min", "f-max"].forEach(function (id) {
    var el = document.getElementById(id);
    if (el) { el.addEventListener("input", applyFilters); el.addEventListener("change", applyFilters); }
  });
  var numeric = {turns: "data-turns", progress: "data-progress"};
  table.querySelectorAll("th[data-sort]").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var key = th.getAttribute("data-sort");
      var dir = th.getAttribute("data-dir") === "asc" ? -1 : 1;
      table.querySelectorAll("th[data-sort]").forEach(function (o) { o.removeAttribute("data-dir"); });
      th.setAttribute("data-dir", dir === 1 ? "asc" : "desc");
      rows.sort(function (a, b) {
        var x, y;
        if (numeric[key]) { x = Number(a.getAttribute(numeric[key])); y = Number(b.getAttribute(numeric[key])); }
        else { x = a.cells[col].textContent; y = b.cells[col].textContent; }
        return (x < y ? -1 : x > y ? 1 : 0) * dir;
      });
      rows.forEach(function (tr) { body.appendChild(tr); });
    });
  });
  // filters from the query string too: index.html?outcome=CONFLICT&kind=fact&min=3 is a shareable view
  var query = new URLSearchParams(window.location.search);
  [["outcome", "f-outcome"], ["env", "f-env"], ["genre", "f-genre"], ["kind", "f-kind"], ["min", "f-min"],
   ["max", "f-max"]].forEach(function (pair) {
    var el = document.getElementById(pair[1]);
    if (el && query.has(pair[0])) el.value = query.get(pair[0]);
  });
  applyFilters();
  var headline = document.querySelector("table.headline");
  if (headline) {  // where the headline table ends, for checks that it fits the first screen
    var box = headline.getBoundingClientRect();
    document.documentElement.setAttribute("data-headline-box",
      Math.round(box.right + window.scrollX) + "x" + Math.round(box.bottom + window.scrollY));
  }
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
    if not s.scored:
        return (f"<li><b>{e(section.run.name)}</b>: " + e(f"{s.episodes} episodes, all ERROR (infrastructure "
                "failures): no scored episodes, so no score, no survival curve and no restricted mean") + ".</li>")
    parts = [f"{s.episodes} episodes ({s.errors} ERROR, excluded from the averages; "
             f"{o['CONFLICT']} CONFLICT, {o['SUCCESS']} SUCCESS, {o['SURVIVAL']} SURVIVAL)",
             f"average turns {fmt_estimate(s.avg_turns)}",
             f"progress {fmt_estimate(s.progress, True)}",
             f"satisfied commitments {fmt_estimate(s.satisfied, True)}"]
    for t, est in s.survival_at.items():
        if est is not None:
            parts.append(f"survival after {t} turns {fmt_estimate(est, True)}")
    median = "not reached" if s.km_median is None else f"{s.km_median:g} turns"
    parts.append(f"Kaplan–Meier median {median}, restricted mean {fmt_number(s.rmst)} of its {s.horizon}-turn limit")
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


def raw_audit_html(calls: Sequence[dict[str, Any]]) -> str:
    """The auditor's raw answers of one turn (from calls.jsonl), behind a toggle."""
    if not calls:
        return ""
    items = "".join(
        f'<li><b>{e(c["stage"] or "?")}</b> <span class="muted">attempt {e(c["attempt"])}'
        f'{" · re-ask " + e(c["reask"]) if c.get("reask") else ""} · {e(c["outcome"])}</span>'
        f'<pre class="raw">{e(c["response"])}</pre></li>' for c in calls)
    return (f'<details class="raw-audit"><summary>Raw auditor answers ({len(calls)} call(s), from calls.jsonl)'
            f'</summary><ul>{items}</ul></details>')


def turn_html(ts: TurnState, anchor: str, calls: Sequence[dict[str, Any]] = ()) -> str:
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
                 f'</summary><ul class="ledger-at" data-turn="{t.turn}"></ul></details>')
    out.append('<div class="state">' + "".join(state) + "</div>" + raw_audit_html(calls) + "</article>")
    return "".join(out)


def _negated_attr(fact: LedgerFact) -> str:
    """The turn that negated the fact, "" when active, -1 when it was negated from the start."""
    if fact.negated_turn is not None:
        return str(fact.negated_turn)
    return "-1" if fact.negated else ""


def episode_html(record: EpisodeRecord, anchor: str, run_name: str,
                 calls: dict[tuple[str, int], list[dict[str, Any]]] | None = None) -> str:
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
    calls = calls or {}
    turns = "".join(turn_html(ts, anchor, calls.get((record.episode_id, ts.turn.turn), ())) for ts in states) or '<p class="muted">No audited reply.</p>'
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


def _json_for_script(data: object) -> str:
    """JSON safe inside <script>: no `<`, `>` or `&` survives as such (no `</script>` can close it)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def episode_fragments(sections: Sequence[RunSection]) -> dict[str, str]:
    """anchor -> the episode's transcript markup (rendered on click from the page's JSON data)."""
    out: dict[str, str] = {}
    for section in sections:
        for r in sorted(section.run.records, key=_sort_key):
            anchor = section.anchors[episode_key(r)]
            out[anchor] = episode_html(r, anchor, section.run.name, section.calls)
    return out


def episodes_html(sections: Sequence[RunSection]) -> str:
    """The filterable, sortable list of every episode of every run; transcripts open on click."""
    rows = []
    outcomes: set[str] = set()
    genres: set[str] = set()
    kinds: set[str] = set()
    several = len(sections) > 1
    for section in sections:
        for r in sorted(section.run.records, key=_sort_key):
            anchor = section.anchors[episode_key(r)]
            outcomes.add(r.outcome.value)
            genres.update(r.genres)
            kinds.update(r.conflict_kinds)
            attrs = (f'data-run="{e(section.run.name)}" data-outcome="{e(r.outcome.value)}" data-env="{e(r.env_id)}" '
                     f'data-genres="{e("|".join(r.genres))}" data-kinds="{e("|".join(r.conflict_kinds))}" '
                     f'data-turns="{r.turns}" data-progress="{r.progress:.4f}"')
            rows.append(
                f"<tr {attrs}>" + (f"<td>{e(section.run.name)}</td>" if several else "")
                + f'<td><a href="#{anchor}">{e(episode_key(r))}</a></td><td>{e(r.title)}</td>'
                f"<td>{e(', '.join(r.genres))}</td><td><span class=\"outcome {e(r.outcome.value)}\">"
                f"{e(r.outcome.value)}</span></td><td>{r.turns} / {r.max_turns}</td><td>{100 * r.progress:.0f}%</td>"
                f"<td>{100 * r.satisfied_share:.0f}%</td><td>{e(', '.join(r.conflict_kinds))}</td>"
                f"<td>{e((r.error or '')[:120])}</td></tr>")

    def options(values: set[str]) -> str:
        return '<option value="">all</option>' + "".join(f'<option value="{e(v)}">{e(v)}</option>' for v in sorted(values))

    keys = (["run"] if several else []) + ["episode", "title", "genres", "outcome", "turns", "progress", "satisfied",
                                           "kinds", "error"]
    labels = {"kinds": "conflict kinds"}
    head = "".join(f'<th data-sort="{k}" title="click to sort">{e(labels.get(k, k))}</th>' for k in keys)
    filters = (
        '<div class="filters" id="episode-filters">'
        f'<label>outcome <select id="f-outcome">{options(outcomes)}</select></label>'
        '<label>environment <input id="f-env" type="search" placeholder="slug contains" size="14"></label>'
        f'<label>genre <select id="f-genre">{options(genres)}</select></label>'
        f'<label>conflict kind <select id="f-kind">{options(kinds)}</select></label>'
        '<label>turns ≥ <input id="f-min" type="number" min="0" size="4"></label>'
        '<label>turns ≤ <input id="f-max" type="number" min="0" size="4"></label>'
        '<span class="muted" id="f-count"></span></div>')
    table = (f'{filters}<div class="table-wrap episode-list"><table class="episodes"><thead><tr>{head}</tr></thead>'
             "<tbody>" + "".join(rows) + "</tbody></table></div>")
    return table + '<div id="viewer"></div>'


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def tests_html(tests: Sequence[dict[str, Any]]) -> str:
    """Is the difference real: log-rank and paired per-environment differences, per run pair."""
    if not tests:
        return ""
    names = {"survival_at_10": "survival@10", "survival_at_20": "survival@20", "progress": "progress",
             "conflict_rate": "conflict rate"}
    rows = []
    for t in tests:
        lr = t.get("logrank")
        lr_text = "—" if lr is None else f"χ² {lr['chi2']:.2f}, p = {lr['p_value']:.3g}"
        diffs = {d["metric"]: d for d in t["differences"]}
        cells = []
        for key in names:
            d = diffs.get(key)
            if d is None:
                cells.append("—")
                continue
            if d["environments"] < 2:
                cells.append(f"{100 * d['b_minus_a']:+.1f} pts (one environment: no interval)")
                continue
            star = " *" if d["excludes_zero"] else ""
            cells.append(f"{100 * d['b_minus_a']:+.1f} pts [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]{star}")
        rows.append(f"<tr><td>{e(t['b'])} − {e(t['a'])}</td><td>{t['environments']}</td><td>{e(lr_text)}</td>"
                    + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>Δ {e(n)}</th>" for n in names.values())
    return ('<h3>Is the difference real?</h3><div class="table-wrap"><table class="tests"><thead><tr><th>runs</th>'
            f"<th>shared envs</th><th>log-rank (KM curves)</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody>"
            '</table></div><p class="muted">Δ: the second run minus the first, averaged over the environments both '
            "scored, with a 95% paired bootstrap interval over environments; * the interval excludes 0. "
            "Survival@t here is the published definition.</p>")


def agreement_html(agreements: Sequence[dict[str, Any]]) -> str:
    if not agreements:
        return ""
    rows = []
    for a in agreements:
        kappa = "—" if a["kappa"] is None else f"{a['kappa']:.3f}"
        pearson = "—" if a["pearson"] is None else f"{a['pearson']:.3f}"
        spearman = "—" if a["spearman"] is None else f"{a['spearman']:.3f}"
        rows.append(f"<tr><td>{e(a['rescore'])} re-audits {e(a['original'])}</td>"
                    f"<td>{e(a['original_auditor'])} vs {e(a['rescore_auditor'])}</td><td>{a['turns']}</td>"
                    f"<td>{_pct(a['agreement'])}</td><td>{kappa}</td><td>{a['conflict_original']} / "
                    f"{a['conflict_rescore']} / {a['both_conflict']}</td><td>{_pct(a['kind_agreement'])} "
                    f"(of {a['kind_turns']})</td><td>{pearson} / {spearman} (n={a['turn_count_episodes']})</td></tr>")
    return ('<h3>Auditor agreement</h3><div class="table-wrap"><table class="agreement"><thead><tr><th>runs</th>'
            "<th>auditors</th><th>turns judged by both</th><th>agreement (conflict / none)</th><th>Cohen's κ</th>"
            "<th>conflicts: original / rescore / both</th><th>same conflict kind</th>"
            "<th>turn counts: Pearson / Spearman</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")


def risk_html(risk: tuple[list[int], list[tuple[str, list[int | None]]]] | None) -> str:
    if not risk:
        return ""
    turns, rows = risk
    head = "".join(f"<th>{t}</th>" for t in turns)
    body = "".join(f"<tr><td>{e(name)}</td>" + "".join(f"<td>{'—' if c is None else c}</td>" for c in counts)
                   + "</tr>" for name, counts in rows)
    return (f'<div class="table-wrap"><table class="at-risk"><thead><tr><th>number at risk at turn</th>{head}</tr>'
            f"</thead><tbody>{body}</tbody></table></div>")


def render_page(sections: Sequence[RunSection], comparison: Table, genres: Table, envs: Table, png: bytes,
                title: str = "ncpbench report", files: dict[str, Any] | None = None, usage: Table | None = None,
                headline: Table | None = None, warnings: Sequence[str] = (), tests: Sequence[dict[str, Any]] = (),
                agreements: Sequence[dict[str, Any]] = (),
                risk: tuple[list[int], list[tuple[str, list[int | None]]]] | None = None) -> str:
    """The whole page as one string."""
    names = ", ".join(s.run.name for s in sections)
    img = base64.b64encode(png).decode("ascii")
    links = "".join(f'<a href="{e(path)}">{e(label)}</a> ' for label, path in (files or {}).items())
    runs_meta = "".join(f"<h3>{e(s.run.name)}</h3>{_meta_html(s.run)}" for s in sections)
    banner = ('<div class="banner" role="alert"><ul>' + "".join(f"<li>{e(w)}</li>" for w in warnings)
              + "</ul></div>") if warnings else ""
    top = (f'<section id="headline"><h2>Headline</h2>{banner}'
           + (table_html(headline, "headline") if headline else "")
           + '<p class="muted">Survival@t: the published metric (share of scored episodes whose turn count is at '
           "least t; — beyond the run's turn limit). KM median and RMST: Kaplan–Meier, each run to its own turn "
           "limit. ERROR episodes are excluded from every score. Everything else is below and in the CSV files.</p>"
           + tests_html(tests) + agreement_html(agreements) + "</section>")
    data = _json_for_script(episode_fragments(sections))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{e(title)}</h1><p>{len(sections)} run(s): {e(names)}</p></header>"
        '<nav><a href="#headline">Headline</a><a href="#summary">Summary</a><a href="#comparison">Comparison</a>'
        '<a href="#survival">Survival</a><a href="#genres">Genres</a><a href="#environments">Environments</a>'
        '<a href="#episodes">Episodes</a><a href="#usage">Tokens and cost</a><a href="#runs">Runs</a></nav><main>'
        + top +
        '<section id="summary"><details><summary><b>Summary</b> (every metric of every run, in words)</summary><ul>'
        + "".join(summary_sentence(s) for s in sections) + "</ul>"
        '<p class="muted">Averages and shares carry 95% bootstrap percentile intervals. ERROR episodes '
        "(infrastructure failures) are excluded from the averages and counted separately; in the "
        "Kaplan–Meier curves they, SUCCESS and SURVIVAL are censored at the turn they reached.</p></details></section>"
        f'<section id="comparison"><details><summary><b>Run comparison</b> (every metric with its interval)</summary>'
        f'{table_html(comparison, "comparison")}</details>'
        f'<p class="muted">Also as files: {links}</p></section>'
        '<section id="survival"><h2>Survival</h2><figure>'
        f'<img class="survival-plot" alt="Kaplan–Meier survival curves of every run" src="data:image/png;base64,{img}">'
        "<figcaption>Lines: share of episodes without a conflict after each turn (Kaplan–Meier), shaded 95% "
        "log-log bands; ticks mark censored episodes. Hollow markers: the published survival@t (share of scored "
        "episodes whose turn count is at least t). Runs without scored episodes are not drawn."
        f"</figcaption></figure>{risk_html(risk)}</section>"
        f'<section id="genres"><h2>Per genre</h2><details><summary>{len(genres.rows)} rows; an environment with '
        f"several genres counts in each</summary>{table_html(genres, 'genres')}</details></section>"
        f'<section id="environments"><h2>Per environment</h2><details><summary>{len(envs.rows)} rows'
        f"</summary>{table_html(envs, 'environments')}</details></section>"
        '<section id="episodes"><h2>Episodes</h2><p class="muted">Filter and sort the list (click a column); click '
        "an episode (or link to <code>index.html#ep-&lt;episode id&gt;</code>) to open its transcript.</p>"
        + episodes_html(sections) + "</section>"
        + (f'<section id="usage"><h2>Tokens and cost</h2><p class="muted">Cached prompt tokens are the part of '
           "the prompt the endpoint served from its prefix cache; the cost estimate prices them at the cached "
           f'rate when the price table gives one.</p>{table_html(usage, "usage")}</section>' if usage else "")
        + f'<section id="runs"><h2>Runs</h2>{runs_meta}</section>'
        f'</main><script type="application/json" id="episode-data">{data}</script>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )
