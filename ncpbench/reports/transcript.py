"""Transcript views: what each turn of a recorded episode showed, rebuilt from the record alone.

- `find_evidence(reply, quote)`: where a conflict's quoted evidence sits in the narrator's reply,
  tolerant of whitespace runs, curly vs straight quote marks, "…" vs "...", case, and outer quote
  marks or ellipses around the quote (the same normalisation the audit's grounding uses).
- `highlight(reply, spans)`: the reply as escaped HTML with `<mark>` around the spans. Every
  character of the reply goes through `html.escape`: narrator replies are hostile input.
- `turn_states(record)`: per audited reply, the ledger after that turn (facts carry their
  added/negated turns, so `FactLedger.at_turn` rebuilds it), the nodes completed so far
  (cumulated from `history[].completed_nodes` of committed turns) and the commitments settled at
  that turn. A conflicting turn commits nothing, so its state is the one it was judged against.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from ncpbench.commitments import CommitmentState
from ncpbench.ledger import LedgerFact
from ncpbench.record import EpisodeRecord, TurnRecord

_QUOTES = {"“": '"', "”": '"', "„": '"', "‟": '"', "«": '"', "»": '"', "″": '"', "‘": "'", "’": "'", "‚": "'",
           "‛": "'", "`": "'", "′": "'"}
_TRIM = " \"'.…"


def _normalise(text: str) -> tuple[str, list[int]]:
    """The normalised text and, for each of its characters, the index of the original character."""
    out: list[str] = []
    where: list[int] = []
    space = False
    for i, ch in enumerate(text):
        if ch.isspace():
            if not space and out:
                out.append(" ")
                where.append(i)
            space = True
            continue
        space = False
        mapped = "..." if ch == "…" else _QUOTES.get(ch, ch).lower()
        for m in mapped:
            out.append(m)
            where.append(i)
    if out and out[-1] == " ":
        out.pop()
        where.pop()
    return "".join(out), where


def find_evidence(reply: str, quote: str) -> tuple[int, int] | None:
    """(start, end) of the quote in the reply (original indices), or None when it is not there."""
    needle, _ = _normalise(quote)
    needle = needle.strip(_TRIM)
    if not needle:
        return None
    hay, where = _normalise(reply)
    at = hay.find(needle)
    if at < 0:
        return None
    return where[at], where[at + len(needle) - 1] + 1


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    css: str
    title: str = ""


def highlight(reply: str, spans: Sequence[Span]) -> str:
    """Escaped HTML of the reply with `<mark class=css>` around each span (overlaps merged)."""
    ordered = sorted((s for s in spans if 0 <= s.start < s.end <= len(reply)), key=lambda s: (s.start, -s.end))
    merged: list[Span] = []
    for s in ordered:
        if merged and s.start < merged[-1].end:
            last = merged[-1]
            title = last.title if s.title in last.title else f"{last.title}; {s.title}"
            merged[-1] = Span(last.start, max(last.end, s.end), last.css, title)
        else:
            merged.append(s)
    out: list[str] = []
    pos = 0
    for s in merged:
        out.append(html.escape(reply[pos:s.start]))
        title = f' title="{html.escape(s.title)}"' if s.title else ""
        out.append(f'<mark class="{html.escape(s.css)}"{title}>{html.escape(reply[s.start:s.end])}</mark>')
        pos = s.end
    out.append(html.escape(reply[pos:]))
    return "".join(out)


@dataclass(frozen=True)
class TurnState:
    turn: TurnRecord
    facts: list[LedgerFact]
    """Active facts after the turn (the ones it added included)."""
    added: list[LedgerFact]
    negated: list[LedgerFact]
    """Facts this turn negated (no longer active)."""
    nodes: list[str]
    """Nodes completed so far, in order."""
    new_nodes: list[str]
    settled: list[CommitmentState]
    """Commitments this turn satisfied or violated."""


def turn_states(record: EpisodeRecord) -> list[TurnState]:
    ledger = record.final_state.ledger
    commitments = record.final_state.commitments.items
    nodes: list[str] = []
    out: list[TurnState] = []
    for turn in record.history:
        t = turn.turn
        new: list[str] = []
        if turn.committed:
            new = [n for n in turn.completed_nodes if n not in nodes]
            nodes = nodes + new
        at = ledger.at_turn(t)
        out.append(TurnState(
            turn=turn,
            facts=at.active(),
            added=[f for f in at.facts if f.added_turn == t and t > 0],
            negated=[f for f in at.facts if f.negated_turn == t],
            nodes=list(nodes),
            new_nodes=new,
            settled=[c for c in commitments if c.turn == t],
        ))
    return out
