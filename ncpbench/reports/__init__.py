"""Reports over run folders: the headline, comparison and per-genre tables, the survival plot, the HTML report.

`build_report(run_dirs, out_dir)` reads each run (run.json + episodes.jsonl, and calls.jsonl for the
auditor's raw answers, records only: no model layer, agents or auditors), computes
`ncpbench.metrics.summarize` per run, per genre and per environment, and writes into `out_dir`:

    headline.md / headline.csv       one short row per run: narrator, auditor, protocol, scored /
                                     errors, conflict-free share, published survival at 10 and 20,
                                     Kaplan–Meier median, RMST to the run's own limit, progress,
                                     each role's sampling
    comparison.md / comparison.csv   one row per run: models, counts, metrics with 95% intervals,
                                     survival at a few turns, Kaplan–Meier median and RMST
    genres.md / genres.csv           one row per (genre, run)
    envs.md / envs.csv               one row per (environment, run)
    usage.md / usage.csv             tokens per run and role: prompt, cached prompt (share),
                                     completion, estimated cost (with a price table)
    survival.png / survival.svg      every run's Kaplan–Meier curve with bands and censor ticks, the
                                     published survival-at-t markers, a number-at-risk table
    metrics.json                     every summary, the warnings, the run comparisons (log-rank,
                                     paired differences), auditor agreement, the at-risk counts
    index.html                       the self-contained HTML report with the episode browser

Every markdown file starts with the warnings (`run_warnings`): mock models, mostly (> 50%) ERROR,
no scored episodes, or not comparable with the first run (environment sets, turn limits,
protocols, auditors, env versions), each naming the difference. Each run's RMST is to its own
turn limit; a run without scored episodes has no median, no restricted mean and no curve.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ncpbench.compare import logrank, paired_differences
from ncpbench.metrics import (
    DEFAULT_RESAMPLES,
    Summary,
    summarize,
    summarize_by_env,
    summarize_by_genre,
    survival_turns,
)
from ncpbench.pricing import Price
from ncpbench.reports.agreement import agreement, is_rescore_of
from ncpbench.reports.html import RunSection, episode_anchors, render_page
from ncpbench.reports.plots import Curve, at_risk, write_survival_plot
from ncpbench.reports.runs import Run, RunFormatError, load_run, load_runs, read_auditor_calls, read_episodes
from ncpbench.reports.tables import (
    HEADLINE_TURNS,
    Table,
    comparison_table,
    group_table,
    headline_table,
    usage_table,
)
from ncpbench.state import Outcome

__all__ = ["Run", "RunFormatError", "Table", "build_report", "load_run", "load_runs", "read_episodes"]

MOCK_NOTICE = "mock models: not a benchmark result"
"""Said by every report file of a run answered (in any role) by the mock server."""

FILES = ("headline.md", "headline.csv", "comparison.md", "comparison.csv", "genres.md", "genres.csv", "envs.md", "envs.csv", "usage.md", "usage.csv",
         "survival.png", "survival.svg", "metrics.json", "index.html")


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def build_report(run_dirs: Iterable[str | Path], out_dir: str | Path, *, at: Sequence[int] | None = None,
                 resamples: int = DEFAULT_RESAMPLES, seed: int = 0, title: str = "ncpbench report",
                 prices: Mapping[str, Price] | None = None) -> Path:
    """Write every report file for the runs into out_dir; return the path of index.html.

    `at`: turns to report survival at (default: 5, 10, 20, 50, 100 up to the largest limit, and
    the limit). `prices` (model -> Price) adds the estimated cost to the usage table. Raises RunFormatError when a folder is not a readable run.
    """
    runs = load_runs([Path(p) for p in run_dirs])
    if not runs:
        raise ValueError("build_report needs at least one run folder")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    max_turns = max((r.max_turns for run in runs for r in run.records), default=0)
    turns_at = tuple(at) if at else survival_turns(max_turns)
    summaries = [_summary(run, turns_at, resamples, seed) for run in runs]
    kw: dict[str, Any] = {"at": turns_at, "horizon": max_turns, "resamples": resamples, "seed": seed}

    mocked = [run for run in runs if run.mock_roles]
    for run in mocked:
        run.notes.append(f"{MOCK_NOTICE} ({', '.join(run.mock_roles)} answered by the mock server)")
    banner = (f"**{MOCK_NOTICE}**: {', '.join(run.name for run in mocked)} used the mock server.\n\n"
              if mocked else "")
    if mocked:
        title = f"{title} — {MOCK_NOTICE}"
    warnings = run_warnings(runs, summaries)
    banner += "".join(f"**{w}**\n\n" for w in warnings if not w.startswith(MOCK_NOTICE))

    by_genre = [summarize_by_genre(run.records, **{**kw, "horizon": run.limit}) for run in runs]
    by_env = [summarize_by_env(run.records, **{**kw, "horizon": run.limit}) for run in runs]

    pairs = list(zip(runs, summaries, strict=True))
    headline = headline_table(pairs)
    comparison = comparison_table(pairs, turns_at)
    genre_rows = [(g, run, s) for g in sorted({g for groups in by_genre for g in groups})
                  for run, groups in zip(runs, by_genre, strict=True) if (s := groups.get(g)) is not None]
    genres = group_table("Per genre", "genre", genre_rows, turns_at)
    titles = {r.env_id: r.title for run in runs for r in run.records}
    env_rows = [(k, run, s) for k in sorted({k for groups in by_env for k in groups})
                for run, groups in zip(runs, by_env, strict=True) if (s := groups.get(k)) is not None]
    envs = group_table("Per environment", "environment", env_rows, turns_at, label=titles)

    usage = usage_table(runs, prices)
    for table, stem in ((headline, "headline"), (comparison, "comparison"), (genres, "genres"), (envs, "envs"),
                        (usage, "usage")):
        (out / f"{stem}.md").write_text(banner + table.to_markdown(), encoding="utf-8")
        (out / f"{stem}.csv").write_text(table.to_csv(), encoding="utf-8")

    tests = comparisons(runs, resamples=resamples, seed=seed)
    agreements = [agreement(a, b) for a in runs for b in runs if a is not b and is_rescore_of(b, a)]

    marks = tuple(sorted(set(turns_at) | set(HEADLINE_TURNS)))
    curves = [Curve(run.name, s.km, float(run.limit),
                    published=tuple((t, e.value) for t in marks if (e := s.survival_at.get(t)) is not None))
              for run, s in pairs if s.scored]
    risk_at = at_risk_turns(max_turns)
    risk = [(run.name, [at_risk(s.km, t) if s.scored and t <= run.limit else None for t in risk_at]) for run, s in pairs]
    _, _, png = write_survival_plot(curves, out, risk_at=risk_at)

    metrics = {"survival_turns": list(turns_at), "horizon": max_turns, "resamples": resamples, "seed": seed,
               "warnings": warnings,
               "runs": [_run_metrics(run, s, g, v) for run, s, g, v in zip(runs, summaries, by_genre, by_env, strict=True)],
               "comparisons": tests, "agreement": agreements,
               "at_risk": {"turns": list(risk_at), "runs": {name: counts for name, counts in risk}},
               "usage": [dict(zip(usage.csv_columns, row, strict=True)) for row in usage.csv_rows]}
    (out / "metrics.json").write_text(json.dumps(_clean(metrics), indent=1) + "\n", encoding="utf-8")

    anchors = episode_anchors(runs)
    sections = [RunSection(run, s, a, read_auditor_calls(run.path)) for run, s, a in zip(runs, summaries, anchors, strict=True)]
    files = {name: name for name in FILES if name != "index.html"}
    page = render_page(sections, comparison, genres, envs, png, title=title, files=files, usage=usage,
                       headline=headline, warnings=warnings, tests=tests, agreements=agreements,
                       risk=(list(risk_at), risk))
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _summary(run: Run, at: Sequence[int], resamples: int, seed: int) -> Summary:
    """The run's summary, RMST to its own turn limit; a run without scored episodes has no curve figures."""
    marks = tuple(sorted(set(at) | set(HEADLINE_TURNS)))
    s = summarize(run.records, at=marks, horizon=run.limit, resamples=resamples, seed=seed)
    if not s.scored:
        s = dataclasses.replace(s, rmst=None, km_median=None)
    return s


def at_risk_turns(limit: int) -> tuple[int, ...]:
    """The turns of the number-at-risk table: 0, then about five even steps up to the limit."""
    if limit <= 0:
        return (0,)
    step = max(1, math.ceil(limit / 5))
    if step > 2:
        step = next(s for s in (2, 5, 10, 20, 25, 50, 100, 200, 500, step) if s >= step)
    return tuple(sorted(set(range(0, limit + 1, step)) | {limit}))


def run_warnings(runs: Sequence[Run], summaries: Sequence[Summary]) -> list[str]:
    """Why a run's numbers should not be read as they stand: mock, mostly ERROR, not comparable."""
    out: list[str] = []
    for run, s in zip(runs, summaries, strict=True):
        if run.mock_roles:
            out.append(f"{MOCK_NOTICE}: {run.name} ({', '.join(run.mock_roles)} answered by the mock server)")
        if s.episodes and not s.scored:
            out.append(f"{run.name}: all {s.episodes} episodes are ERROR (infrastructure failures): no scored episodes")
        elif s.episodes and s.errors / s.episodes > 0.5:
            out.append(f"{run.name}: {s.errors} of {s.episodes} episodes are ERROR (infrastructure failures); its "
                       f"scores rest on {s.scored}")
    base = runs[0]
    for run in runs[1:]:
        diffs = differences(base, run)
        if diffs:
            out.append(f"not comparable: {run.name} vs {base.name}: " + "; ".join(diffs))
    return out


def differences(a: Run, b: Run) -> list[str]:
    """What makes two runs' scores not comparable, named."""
    out: list[str] = []
    ea, eb = set(a.env_versions), set(b.env_versions)
    if ea != eb:
        gone, new = sorted(ea - eb), sorted(eb - ea)
        what = [f"{len(ea & eb)} shared"]
        if gone:
            what.append(f"only in {a.name}: {', '.join(gone[:5])}{' …' if len(gone) > 5 else ''}")
        if new:
            what.append(f"only in {b.name}: {', '.join(new[:5])}{' …' if len(new) > 5 else ''}")
        out.append(f"different environment sets ({len(ea)} vs {len(eb)}; {', '.join(what)})")
    if a.limits != b.limits:
        out.append(f"turn limits {'/'.join(map(str, a.limits))} vs {'/'.join(map(str, b.limits))}")
    if a.protocols != b.protocols:
        out.append(f"protocols {', '.join(a.protocols) or '?'} vs {', '.join(b.protocols) or '?'}")
    if a.model("auditor") != b.model("auditor"):
        out.append(f"auditors {a.model('auditor') or '?'} vs {b.model('auditor') or '?'}")
    va, vb = a.env_versions, b.env_versions
    changed = sorted(k for k in ea & eb if va[k] != vb[k])
    if changed:
        out.append("env versions " + ", ".join(f"{k} v{va[k]} vs v{vb[k]}" for k in changed[:5])
                   + (" …" if len(changed) > 5 else ""))
    return out


def comparisons(runs: Sequence[Run], *, resamples: int, seed: int) -> list[dict[str, Any]]:
    """The first run against each other run over the environments both scored: log-rank test and
    paired per-environment differences (ncpbench.compare)."""
    out: list[dict[str, Any]] = []
    base = runs[0]
    for run in runs[1:]:
        shared = set(base.env_versions) & set(run.env_versions)
        if not shared:
            continue
        a = [r for r in base.records if r.env_id in shared]
        b = [r for r in run.records if r.env_id in shared]
        scored_a = [r for r in a if r.outcome is not Outcome.ERROR]
        scored_b = [r for r in b if r.outcome is not Outcome.ERROR]
        lr = logrank(scored_a, scored_b) if scored_a and scored_b else None
        diffs = paired_differences(a, b, resamples=resamples, seed=seed)
        out.append({"a": base.name, "b": run.name, "environments": len(shared),
                    "logrank": None if lr is None else {"chi2": lr.statistic, "p_value": lr.p_value,
                                                        "n_a": lr.n_a, "n_b": lr.n_b},
                    "differences": [{"metric": d.metric, "b_minus_a": d.value, "low": d.low, "high": d.high,
                                     "environments": d.environments, "excludes_zero": d.excludes_zero}
                                    for d in diffs]})
    return out


def _run_metrics(run: Run, summary: Summary, genres: dict[str, Summary], envs: dict[str, Summary]) -> dict[str, Any]:
    return {"name": run.name, "path": str(run.path),
            "models": {role: run.model(role) for role in ("narrator", "player", "auditor")},
            "player_mode": run.player_mode, "mock_roles": run.mock_roles, "protocols": run.protocols,
            "turn_limit": run.limit, "sampling": {role: run.sampling(role) for role in ("narrator", "player", "auditor")},
            "rescore_of": run.meta.get("rescore_of"),
            "benchmark_result": not run.mock_roles, "notes": run.notes, "summary": summary.as_dict(),
            "genres": {k: v.as_dict() for k, v in genres.items()},
            "envs": {k: v.as_dict() for k, v in envs.items()}}
