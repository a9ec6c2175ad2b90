"""Report tables: the run comparison, per genre and per environment, as markdown and CSV.

One `Table` holds both views of the same rows: display cells ("42.0% [30.1–55.2]") for
markdown and HTML, raw numbers (value, low, high in separate columns) for CSV.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ncpbench.metrics import CONFLICT_KINDS, Estimate, Summary
from ncpbench.pricing import Price, cached_share
from ncpbench.reports.runs import Run
from ncpbench.verdict import Usage

Cell = str | int | float | None

KIND_LABELS = {"fact": "fact conflicts", "commitment": "commitment conflicts", "player_input": "player-input conflicts"}


@dataclass
class Table:
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    csv_columns: list[str] = field(default_factory=list)
    csv_rows: list[list[Cell]] = field(default_factory=list)

    def to_markdown(self) -> str:
        def cell(text: str) -> str:
            return " ".join(text.split()).replace("|", "\\|") or " "

        out = [f"## {self.title}", "", "| " + " | ".join(cell(c) for c in self.columns) + " |",
               "|" + "|".join("---" for _ in self.columns) + "|"]
        out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in self.rows]
        return "\n".join(out) + "\n"

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.csv_columns)
        for row in self.csv_rows:
            writer.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in row])
        return buf.getvalue()


def fmt_number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def fmt_estimate(e: Estimate | None, percent: bool = False) -> str:
    """"4.20 [3.10–5.30]" or "42.0% [30.1–55.2]"; "—" when there is nothing to average."""
    if e is None or math.isnan(e.value):
        return "—"
    if percent:
        return f"{100 * e.value:.1f}% [{100 * e.low:.1f}–{100 * e.high:.1f}]"
    return f"{e.value:.2f} [{e.low:.2f}–{e.high:.2f}]"


class _Builder:
    """Appends a summary's metric cells to a row, with matching headers."""

    def __init__(self, at: Sequence[int], horizon_label: str) -> None:
        self.at = list(at)
        self.horizon_label = horizon_label

    def headers(self) -> tuple[list[str], list[str]]:
        cols = ["episodes", "errors", "CONFLICT", "SUCCESS", "SURVIVAL", "avg turns", "progress",
                "satisfied commitments", *(KIND_LABELS[k] for k in CONFLICT_KINDS), "conflict-free",
                *(f"survival@{t}" for t in self.at), "KM median", f"RMST{self.horizon_label}"]
        csv_cols = ["episodes", "errors", "conflict", "success", "survival"]
        for name in ("avg_turns", "progress", "satisfied", *(f"{k}_conflict_rate" for k in CONFLICT_KINDS)):
            csv_cols += [name, f"{name}_low", f"{name}_high"]
        csv_cols.append("conflict_free")
        for t in self.at:
            csv_cols += [f"survival_at_{t}", f"survival_at_{t}_low", f"survival_at_{t}_high"]
        csv_cols += ["km_median", "rmst", "rmst_horizon"]
        return cols, csv_cols

    def cells(self, s: Summary) -> tuple[list[str], list[Cell]]:
        o = s.outcomes
        row = [str(s.episodes), str(s.errors), str(o["CONFLICT"]), str(o["SUCCESS"]), str(o["SURVIVAL"]),
               fmt_estimate(s.avg_turns), fmt_estimate(s.progress, True), fmt_estimate(s.satisfied, True),
               *(fmt_estimate(s.conflict_rates[k], True) for k in CONFLICT_KINDS), str(s.conflict_free),
               *(fmt_estimate(s.survival_at.get(t), True) for t in self.at),
               "—" if s.km_median is None else f"{s.km_median:g}",
               "—" if s.rmst is None else fmt_number(s.rmst) + ("" if self.horizon_label else f" (≤{s.horizon})")]
        raw: list[Cell] = [s.episodes, s.errors, o["CONFLICT"], o["SUCCESS"], o["SURVIVAL"]]
        for e in (s.avg_turns, s.progress, s.satisfied, *(s.conflict_rates[k] for k in CONFLICT_KINDS)):
            raw += _raw(e)
        raw.append(s.conflict_free)
        for t in self.at:
            raw += _raw(s.survival_at.get(t))
        raw += [s.km_median, s.rmst, s.horizon]
        return row, raw


def _raw(e: Estimate | None) -> list[Cell]:
    return [None, None, None] if e is None or math.isnan(e.value) else [e.value, e.low, e.high]


def _horizon_label(summaries: Sequence[Summary]) -> str:
    horizons = {s.horizon for s in summaries}
    return f" (≤{horizons.pop()} turns)" if len(horizons) == 1 else ""


def comparison_table(runs: Sequence[tuple[Run, Summary]], at: Sequence[int]) -> Table:
    """One row per run: its models, episode counts, every metric with its interval."""
    b = _Builder(at, _horizon_label([s for _, s in runs]))
    cols, csv_cols = b.headers()
    table = Table("Run comparison", ["run", "narrator", "player", "player mode", "auditor", *cols],
                  csv_columns=["run", "path", "narrator", "player", "player_mode", "auditor", *csv_cols])
    for run, s in runs:
        row, raw = b.cells(s)
        models = [run.model("narrator"), run.model("player"), run.player_mode, run.model("auditor")]
        table.rows.append([run.name, *(m or "—" for m in models), *row])
        table.csv_rows.append([run.name, str(run.path), *models, *raw])
    return table


def group_table(title: str, key: str, groups: Sequence[tuple[str, Run, Summary]], at: Sequence[int],
                label: dict[str, str] | None = None) -> Table:
    """One row per (group, run): per genre or per environment."""
    b = _Builder(at, _horizon_label([s for _, _, s in groups]))
    cols, csv_cols = b.headers()
    table = Table(title, [key, "run", *cols], csv_columns=[key, "run", *csv_cols])
    for name, run, s in groups:
        row, raw = b.cells(s)
        shown = f"{label[name]} ({name})" if label and name in label else name
        table.rows.append([shown, run.name, *row])
        table.csv_rows.append([name, run.name, *raw])
    return table


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "—"


def usage_table(runs: Sequence[Run], prices: Mapping[str, Price] | None = None) -> Table:
    """Tokens per run and role from the records: prompt, cached prompt (and its share), completion, cost.

    The cost is estimated with the price table (cached prompt tokens at the cached price when the
    table gives one); "—" without a table or for a model it does not price.
    """
    table = Table("Tokens and cost", ["run", "role", "model", "calls", "prompt tokens", "cached prompt tokens",
                                      "cached share", "completion tokens", "est. cost (USD)"],
                  csv_columns=["run", "role", "model", "calls", "prompt_tokens", "cached_tokens", "cached_share",
                               "completion_tokens", "cost_usd"])
    for run in runs:
        total, total_cost, priced = Usage(), 0.0, bool(prices)
        for role in ("narrator", "player", "auditor"):
            usage = Usage()
            for record in run.records:
                usage = usage.add(record.usage.get(role, Usage()))
            if not usage.calls and not usage.prompt_tokens:
                continue
            model = run.model(role)
            price = (prices or {}).get(model)
            cost = price.cost(usage) if price is not None else None
            priced = priced and cost is not None
            total, total_cost = total.add(usage), total_cost + (cost or 0.0)
            table.rows.append([run.name, role, model or "—", f"{usage.calls:,}", f"{usage.prompt_tokens:,}",
                               f"{usage.cached_tokens:,}", _share(usage.cached_tokens, usage.prompt_tokens),
                               f"{usage.completion_tokens:,}", "—" if cost is None else f"{cost:.4f}"])
            table.csv_rows.append([run.name, role, model, usage.calls, usage.prompt_tokens, usage.cached_tokens,
                                   cached_share(usage), usage.completion_tokens, cost])
        table.rows.append([run.name, "all", "", f"{total.calls:,}", f"{total.prompt_tokens:,}",
                           f"{total.cached_tokens:,}", _share(total.cached_tokens, total.prompt_tokens),
                           f"{total.completion_tokens:,}", f"{total_cost:.4f}" if priced else "—"])
        table.csv_rows.append([run.name, "all", "", total.calls, total.prompt_tokens, total.cached_tokens,
                               cached_share(total), total.completion_tokens, total_cost if priced else None])
    return table


def fmt_compact(e: Estimate | None) -> str:
    """"42% [30–55]": the headline's short form of a share with its interval."""
    if e is None or math.isnan(e.value):
        return "—"
    return f"{100 * e.value:.0f}% [{100 * e.low:.0f}–{100 * e.high:.0f}]"


HEADLINE_TURNS = (10, 20)


def _short_sampling(run: Run, role: str) -> str:
    """"0.6 / 0.95 / 8092" ("–" for a value the run leaves to the endpoint); "" when the run does not say."""
    value = run.config.get(role)
    if not isinstance(value, dict):
        return ""
    return " / ".join("–" if (v := value.get(k)) is None else f"{v:g}" for k in ("temperature", "top_p", "max_tokens"))


def headline_table(runs: Sequence[tuple[Run, Summary]]) -> Table:
    """The decision table: one short row per run; everything else is in the full comparison."""
    cols = ["run", "narrator", "auditor", "protocol", "scored / errors", "conflict-free",
            *(f"survival@{t}" for t in HEADLINE_TURNS), "KM median", "RMST (≤ own limit)", "progress", "sampling (T / top-p / max tokens)"]
    csv_cols = ["run", "narrator", "auditor", "protocol", "scored", "errors", "conflict_free_share",
                *(f"survival_at_{t}" for t in HEADLINE_TURNS), "km_median", "rmst", "rmst_horizon", "progress",
                "sampling"]
    table = Table("Headline", cols, csv_columns=csv_cols)
    for run, s in runs:
        share = s.conflict_free / s.scored if s.scored else None
        sampling = "\n".join(f"{role[0].upper()} {short}" for role in ("narrator", "player", "auditor")
                             if (short := _short_sampling(run, role))
                             and not (role == "player" and run.player_mode == "scripted"))
        protocol = ", ".join(run.protocols) or "—"
        if s.scored:
            median = "not reached" if s.km_median is None else f"{s.km_median:g}"
            rmst = f"{fmt_number(s.rmst)} (≤{s.horizon})"
        else:
            median = rmst = "no scored episodes"
        table.rows.append([run.name, run.model("narrator") or "—", run.model("auditor") or "—", protocol,
                           f"{s.scored} / {s.errors}", "—" if share is None else f"{100 * share:.0f}%",
                           *(fmt_compact(s.survival_at.get(t)) for t in HEADLINE_TURNS), median, rmst,
                           fmt_compact(s.progress), sampling or "—"])
        surv = [None if (v := s.survival_at.get(t)) is None or math.isnan(v.value) else v.value for t in HEADLINE_TURNS]
        table.csv_rows.append([run.name, run.model("narrator"), run.model("auditor"), protocol, s.scored, s.errors,
                               share, *surv, s.km_median if s.scored else None, s.rmst if s.scored else None,
                               s.horizon, None if s.progress is None else s.progress.value, sampling.replace("\n", "; ")])
    return table
