"""Reports over run folders: comparison and per-genre tables, the survival plot, the HTML report.

`build_report(run_dirs, out_dir)` reads each run (run.json + episodes.jsonl, records only: no
model layer, agents or auditors), computes `ncpbench.metrics.summarize` per run, per genre and per
environment, and writes into `out_dir`:

    comparison.md / comparison.csv   one row per run: models, counts, metrics with 95% intervals,
                                     survival at a few turns, Kaplan–Meier median and RMST
    genres.md / genres.csv           one row per (genre, run)
    envs.md / envs.csv               one row per (environment, run)
    usage.md / usage.csv             tokens per run and role: prompt, cached prompt (share),
                                     completion, estimated cost (with a price table)
    survival.png / survival.svg      every run's Kaplan–Meier curve with bands and censor ticks
    metrics.json                     every summary, machine-readable
    index.html                       the self-contained HTML report with the transcript viewer

All runs share the survival turns and the RMST horizon (the largest turn limit among them), so
their numbers compare.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ncpbench.metrics import (
    DEFAULT_RESAMPLES,
    Summary,
    summarize,
    summarize_by_env,
    summarize_by_genre,
    survival_turns,
)
from ncpbench.pricing import Price
from ncpbench.reports.html import RunSection, episode_anchors, render_page
from ncpbench.reports.plots import Curve, write_survival_plot
from ncpbench.reports.runs import Run, RunFormatError, load_run, load_runs, read_episodes
from ncpbench.reports.tables import Table, comparison_table, group_table, usage_table

__all__ = ["Run", "RunFormatError", "Table", "build_report", "load_run", "load_runs", "read_episodes"]

MOCK_NOTICE = "mock models: not a benchmark result"
"""Said by every report file of a run answered (in any role) by the mock server."""

FILES = ("comparison.md", "comparison.csv", "genres.md", "genres.csv", "envs.md", "envs.csv", "usage.md", "usage.csv",
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
    kw: dict[str, Any] = {"at": turns_at, "horizon": max_turns, "resamples": resamples, "seed": seed}

    mocked = [run for run in runs if run.mock_roles]
    for run in mocked:
        run.notes.append(f"{MOCK_NOTICE} ({', '.join(run.mock_roles)} answered by the mock server)")
    banner = (f"**{MOCK_NOTICE}**: {', '.join(run.name for run in mocked)} used the mock server.\n\n"
              if mocked else "")
    if mocked:
        title = f"{title} — {MOCK_NOTICE}"

    summaries = [summarize(run.records, **kw) for run in runs]
    by_genre = [summarize_by_genre(run.records, **kw) for run in runs]
    by_env = [summarize_by_env(run.records, **kw) for run in runs]

    comparison = comparison_table(list(zip(runs, summaries, strict=True)), turns_at)
    genre_rows = [(g, run, s) for g in sorted({g for groups in by_genre for g in groups})
                  for run, groups in zip(runs, by_genre, strict=True) if (s := groups.get(g)) is not None]
    genres = group_table("Per genre", "genre", genre_rows, turns_at)
    titles = {r.env_id: r.title for run in runs for r in run.records}
    env_rows = [(k, run, s) for k in sorted({k for groups in by_env for k in groups})
                for run, groups in zip(runs, by_env, strict=True) if (s := groups.get(k)) is not None]
    envs = group_table("Per environment", "environment", env_rows, turns_at, label=titles)

    usage = usage_table(runs, prices)
    for table, stem in ((comparison, "comparison"), (genres, "genres"), (envs, "envs"), (usage, "usage")):
        (out / f"{stem}.md").write_text(banner + table.to_markdown(), encoding="utf-8")
        (out / f"{stem}.csv").write_text(table.to_csv(), encoding="utf-8")

    curves = [Curve(run.name, s.km, float(s.max_turns)) for run, s in zip(runs, summaries, strict=True)]
    _, _, png = write_survival_plot(curves, out)

    metrics = {"survival_turns": list(turns_at), "horizon": max_turns, "resamples": resamples, "seed": seed,
               "runs": [_run_metrics(run, s, g, v) for run, s, g, v in zip(runs, summaries, by_genre, by_env, strict=True)],
               "usage": [dict(zip(usage.csv_columns, row, strict=True)) for row in usage.csv_rows]}
    (out / "metrics.json").write_text(json.dumps(_clean(metrics), indent=1) + "\n", encoding="utf-8")

    anchors = episode_anchors(runs)
    sections = [RunSection(run, s, a) for run, s, a in zip(runs, summaries, anchors, strict=True)]
    files = {name: name for name in FILES if name != "index.html"}
    page = render_page(sections, comparison, genres, envs, png, title=title, files=files, usage=usage)
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _run_metrics(run: Run, summary: Summary, genres: dict[str, Summary], envs: dict[str, Summary]) -> dict[str, Any]:
    return {"name": run.name, "path": str(run.path),
            "models": {role: run.model(role) for role in ("narrator", "player", "auditor")},
            "player_mode": run.player_mode, "mock_roles": run.mock_roles,
            "benchmark_result": not run.mock_roles, "notes": run.notes, "summary": summary.as_dict(),
            "genres": {k: v.as_dict() for k, v in genres.items()},
            "envs": {k: v.as_dict() for k, v in envs.items()}}
