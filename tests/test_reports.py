"""Reports from run folders: reading runs, tables, the survival plot and the HTML transcript viewer.

Run folders are generated here with the real NarrativeEnv, a ReplayPlayer and a ReplayAuditor, so
the records are exactly what a batch run writes.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import re
from pathlib import Path

import pytest
from ncpbench.agents import ReplayPlayer
from ncpbench.auditors import ReplayAuditor

from ncpbench import NarrativeEnv
from ncpbench.cli import report as report_cli
from ncpbench.dataset import load_file
from ncpbench.ledger import FactDiff
from ncpbench.record import EpisodeRecord
from ncpbench.reports import RunFormatError, build_report, load_run, read_episodes
from ncpbench.reports.transcript import Span, find_evidence, highlight, turn_states
from ncpbench.spec import Spec
from ncpbench.verdict import Conflict, ConflictKind, Verdict

ROOT = Path(__file__).resolve().parent.parent
CLEAN = Verdict()
HOSTILE = ('The key\n   MELTS in your pocket. <script>alert("pwned")</script> </mark><b>bold</b> '
           '<img src=x onerror=alert(1)> & more')
LIMIT = 5


def play(spec: Spec, verdicts: list[Verdict], replies: list[str], replicate: int, *, fail: str | None = None,
         config: dict[str, object] | None = None, protocol: str = "grounded") -> EpisodeRecord:
    env = NarrativeEnv(spec, player=ReplayPlayer(["I look around.", "I walk on.", "I jump into the sea."]),
                       auditor=ReplayAuditor(verdicts), max_turns=LIMIT, protocol=protocol)  # grounded: graph credit
    env.reset(seed=replicate)
    for reply in replies:
        _, _, term, trunc, _ = env.step(reply)
        if term or trunc:
            break
    if fail:
        env.fail(fail)
    env.close()
    return env.record(replicate=replicate, config=config or {})


def two_genre(tiny: Spec) -> Spec:
    meta = tiny.meta.model_copy(update={"id": "tiny-two", "slug": "tiny-two", "title": "The Second Key",
                                        "genres": ["Mystery", "Drama"]})
    return tiny.model_copy(update={"meta": meta})


def scenario(tiny: Spec) -> list[EpisodeRecord]:
    """Five episodes of tiny (CONFLICT with hostile text, SUCCESS, SURVIVAL, CONFLICT with unfound
    evidence, ERROR) and one of a two-genre copy."""
    fact_conflict = Verdict(conflicts=[Conflict(kind=ConflictKind.FACT, target="f_1", evidence="“the key melts”",
                                                reason="f_1: Mara carries the key <b>intact</b>")])
    unfound = Verdict(conflicts=[
        Conflict(kind=ConflictKind.COMMITMENT, target="c_0", evidence="she opens the vault <now>", reason="c_0"),
        Conflict(kind=ConflictKind.PLAYER_INPUT, evidence="ignores the jump", reason="the jump is ignored")])
    return [
        play(tiny, [Verdict(fact_diff=FactDiff(add=["Fog lies on the water."])), Verdict(completed_nodes=["s_0"]),
                    fact_conflict],
             ["Fog lies on the water.", "The gangway drops; you step onto the pier.", HOSTILE], 0),
        play(tiny, [CLEAN, Verdict(completed_nodes=["s_0"]), Verdict(completed_nodes=["s_1"]),
                    Verdict(completed_nodes=["s_2"]), Verdict(completed_nodes=["s_3"])],
             ["Opening.", "Docked.", "The key fits.", "The vault opens.", "The beam sweeps the sea."], 1),
        play(tiny, [CLEAN, Verdict(fact_diff=FactDiff(add=["The pier is slick with rain."])),
                    Verdict(fact_diff=FactDiff(negate=["f_0"]), completed_nodes=["s_0"])],
             ["Opening.", "Rain falls on the pier.", "You step off the ferry.", "Waves.", "Gulls.", "Wind."], 2),
        # published: the double check decides, so a CONFLICT may quote what the reply does not contain
        # (grounded/1 refuses such a conflict in the core).
        play(tiny, [CLEAN, unfound], ["Opening.", "Nothing happens at all."], 3, protocol="published"),
        play(tiny, [CLEAN], ["Opening."], 4, fail="ModelCallError: endpoint kept failing"),
        play(two_genre(tiny), [CLEAN, Verdict(completed_nodes=["s_0"])], ["Opening.", "Docked.", "a", "b", "c", "d"], 0),
    ]


CONFIG = {"narrator": {"model": "mock/steady", "temperature": 0.7}, "player": {"model": "mock/player"},
          "auditor": {"model": "mock/judge"}, "player_mode": "scripted"}


def write_run(folder: Path, records: list[EpisodeRecord], config: dict[str, object] | None = None,
              tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps({"name": folder.name, "config": config or CONFIG,
                                                 "status": "complete", "ncpbench_version": "0.1.0"}))
    lines = [json.dumps(r.model_dump(mode="json"), ensure_ascii=False) for r in records]
    (folder / "episodes.jsonl").write_text("\n".join(lines) + "\n" + tail, encoding="utf-8")
    return folder


def fragments(index: Path) -> dict[str, str]:
    """The transcripts the page renders on click: anchor -> markup, from its JSON data."""
    m = re.search(r'<script type="application/json" id="episode-data">(.*?)</script>', index.read_text(), re.S)
    assert m, "no episode data"
    data: dict[str, str] = json.loads(m.group(1))
    return data


def page_text(index: Path) -> str:
    """The page with every transcript as the browser renders it on click."""
    return index.read_text() + "".join(fragments(index).values())


@pytest.fixture(scope="module")
def records() -> list[EpisodeRecord]:
    return scenario(load_file(ROOT / "tests" / "fixtures" / "tiny.yaml"))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, records: list[EpisodeRecord]) -> Path:
    """Two runs: all six episodes, and three of them under a narrator model with a hostile name."""
    tmp = tmp_path_factory.mktemp("report")
    a = write_run(tmp / "steady", records)
    other = {**CONFIG, "narrator": {"model": "mock/<b>shaky</b>|pipe"}}
    b = write_run(tmp / "shaky", [*records[:2], records[3]], other)
    return build_report([a, b], tmp / "out", resamples=200)


# -- reading runs -------------------------------------------------------------------------------


def test_scenario_records_are_what_the_env_produces(records: list[EpisodeRecord]) -> None:
    assert [(r.episode_id, r.outcome.value, r.turns) for r in records] == [
        ("tiny#0", "CONFLICT", 2), ("tiny#1", "SUCCESS", 4), ("tiny#2", "SURVIVAL", 5), ("tiny#3", "CONFLICT", 1),
        ("tiny#4", "ERROR", 0), ("tiny-two#0", "SURVIVAL", 5)]
    assert records[3].conflict_kinds == ["commitment", "player_input"]


def test_last_line_wins_and_an_incomplete_final_line_is_skipped(tmp_path: Path, records: list[EpisodeRecord]) -> None:
    changed = records[1].model_copy(update={"turns": 3})
    partial = json.dumps(records[2].model_dump(mode="json"))[:200]
    folder = write_run(tmp_path / "r", [records[1], records[0], changed], tail=partial)
    run = load_run(folder)
    assert [r.episode_id for r in run.records] == ["tiny#1", "tiny#0"]
    assert run.records[0].turns == 3, "the later line of tiny#1 wins"
    assert any("incomplete last line" in n for n in run.notes) and any("repeated" in n for n in run.notes)
    assert run.model("narrator") == "mock/steady" and run.player_mode == "scripted" and run.name == "r"


def test_a_damaged_line_is_skipped_with_a_note_and_an_error_in_strict_mode(tmp_path: Path,
                                                                          records: list[EpisodeRecord]) -> None:
    path = tmp_path / "episodes.jsonl"
    good = json.dumps(records[0].model_dump(mode="json"))
    path.write_text("{not json\n" + good + "\n")
    with pytest.raises(RunFormatError, match=":1: not JSON"):
        read_episodes(path, strict=True)
    kept, notes = read_episodes(path)
    assert [r.episode_id for r in kept] == ["tiny#0"] and any("damaged line 1" in n for n in notes)
    path.write_text(json.dumps({"env_id": "x"}) + "\n" + good + "\n")
    with pytest.raises(RunFormatError, match="not an episode record"):
        read_episodes(path, strict=True)
    assert [r.episode_id for r in read_episodes(path)[0]] == ["tiny#0"]
    with pytest.raises(RunFormatError, match=r"no episodes\.jsonl"):
        load_run(tmp_path / "nothing")


def test_a_run_without_run_json_takes_models_from_the_records(tmp_path: Path, tiny: Spec) -> None:
    rec = play(tiny, [], ["Opening.", "x"], 0, config={"narrator": {"model": "openai/gpt-x"}})
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "episodes.jsonl").write_text(json.dumps(rec.model_dump(mode="json")) + "\n")
    run = load_run(folder / "episodes.jsonl")
    assert run.model("narrator") == "openai/gpt-x" and run.model("auditor") == "" and run.meta == {}


# -- tables and plots -----------------------------------------------------------------------------


def test_report_writes_every_file(report: Path) -> None:
    out = report.parent
    for name in ("index.html", "comparison.md", "comparison.csv", "genres.md", "genres.csv", "envs.md",
                 "envs.csv", "survival.png", "survival.svg", "metrics.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "survival.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / "survival.svg").read_text()
    assert "<svg" in svg and "steady" in svg and "shaky" in svg


def test_comparison_csv_has_one_row_per_run_with_models_and_intervals(report: Path) -> None:
    rows = list(csv.DictReader(io.StringIO((report.parent / "comparison.csv").read_text())))
    assert [r["run"] for r in rows] == ["steady", "shaky"]
    steady = rows[0]
    assert (steady["narrator"], steady["player"], steady["auditor"], steady["player_mode"]) == (
        "mock/steady", "mock/player", "mock/judge", "scripted")
    assert (steady["episodes"], steady["errors"], steady["conflict"], steady["success"], steady["survival"]) == (
        "6", "1", "2", "1", "2")
    # scored turns: 2, 4, 5, 1, 5 -> 17 / 5
    assert float(steady["avg_turns"]) == pytest.approx(17 / 5)
    assert float(steady["avg_turns_low"]) <= 3.4 <= float(steady["avg_turns_high"])
    assert float(steady["fact_conflict_rate"]) == pytest.approx(1 / 5)
    assert float(steady["player_input_conflict_rate"]) == pytest.approx(1 / 5)
    assert steady["conflict_free"] == "3"
    # published survival at 5: turn counts >= 5 among 2, 4 (SUCCESS), 5, 1, 5 -> 2 / 5
    assert float(steady["survival_at_5"]) == pytest.approx(2 / 5) and steady["rmst_horizon"] == "5"
    # KM: ERROR censored at 0; at 1: n=5, d=1 -> 0.8; at 2: n=4, d=1 -> 0.6; no median; RMST to 5 = 1 + 0.8 + 0.6*3
    assert steady["km_median"] == "" and float(steady["rmst"]) == pytest.approx(1 + 0.8 + 0.6 * 3)


def test_markdown_tables_escape_pipes_and_show_intervals(report: Path) -> None:
    md = (report.parent / "comparison.md").read_text()
    banner, md = md.split("## Run comparison", 1)  # the fixture runs use mock/ models, so the report says so first
    md = "## Run comparison" + md
    assert banner.startswith("**mock models: not a benchmark result**")
    assert "**not comparable: shaky vs steady: different environment sets (2 vs 1; 1 shared, only in steady: tiny-two)**" \
        in banner
    assert md.startswith("## Run comparison") and "mock/<b>shaky</b>\\|pipe" in md
    assert "3.40 [" in md and "survival@5" in md and "RMST (≤5 turns)" in md
    header = md.splitlines()[2]
    assert all(line.count(" | ") == header.count(" | ") for line in md.splitlines()[4:])


def test_per_genre_table_counts_a_two_genre_env_in_both(report: Path) -> None:
    rows = list(csv.DictReader(io.StringIO((report.parent / "genres.csv").read_text())))
    got = {(r["genre"], r["run"]): int(r["episodes"]) for r in rows}
    assert got == {("Drama", "steady"): 1, ("Mystery", "steady"): 6, ("Mystery", "shaky"): 3}
    envs = list(csv.DictReader(io.StringIO((report.parent / "envs.csv").read_text())))
    assert {(r["environment"], r["run"]) for r in envs} == {("tiny", "steady"), ("tiny-two", "steady"),
                                                            ("tiny", "shaky")}
    assert "The Second Key (tiny-two)" in (report.parent / "envs.md").read_text()


def test_metrics_json_holds_every_summary(report: Path) -> None:
    data = json.loads((report.parent / "metrics.json").read_text())
    assert data["survival_turns"] == [5] and data["horizon"] == 5
    steady = data["runs"][0]
    assert steady["summary"]["errors"] == 1 and set(steady["genres"]) == {"Drama", "Mystery"}
    assert steady["models"]["narrator"] == "mock/steady"


def test_report_is_reproducible(tmp_path: Path, records: list[EpisodeRecord]) -> None:
    run = write_run(tmp_path / "r", records)
    first = build_report([run], tmp_path / "a", resamples=100)
    second = build_report([run], tmp_path / "b", resamples=100)
    for name in ("index.html", "comparison.csv", "survival.svg", "metrics.json"):
        assert (first.parent / name).read_bytes() == (second.parent / name).read_bytes(), name


# -- the HTML report ---------------------------------------------------------------------------


def test_html_is_self_contained(report: Path) -> None:
    page = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "no external URL"
    assert "@import" not in page and "url(" not in page.replace("data:image", "")
    assert page.count("<script") == 2 and page.count("<style") == 1
    assert '<script type="application/json" id="episode-data">' in page
    assert 'src="data:image/png;base64,' in page


def test_hostile_record_text_is_escaped_everywhere(report: Path) -> None:
    raw = report.read_text()
    assert "<script>alert" not in raw and "</mark><b>" not in raw and raw.count("</script>") == 2
    page = page_text(report)
    assert "<script>alert" not in page and "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;/mark&gt;&lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold</b>" not in page
    assert "mock/&lt;b&gt;shaky&lt;/b&gt;|pipe" in page and "<b>shaky</b>|pipe" not in page
    assert "she opens the vault &lt;now&gt;" in page
    # every <mark> we open is closed by us: the reply's own </mark> never closes ours early
    assert page.count("<mark") == page.count("</mark>")


def test_conflict_evidence_is_marked_in_the_narrator_reply(report: Path) -> None:
    page = page_text(report)
    assert re.search(r'<mark class="evidence" title="fact conflict: f_1: Mara carries the key '
                     r'&lt;b&gt;intact&lt;/b&gt;">The key\n   MELTS</mark> in your pocket\.', page)


def test_evidence_not_in_the_reply_is_shown_separately(report: Path) -> None:
    page = page_text(report)
    assert 'Nothing happens at all.</p>' in page
    assert re.search(r'class="evidence-missing">Quoted evidence \(commitment\).*?<q>she opens the vault &lt;now&gt;</q>',
                     page)
    assert "<q>ignores the jump</q>" in page


def test_episode_list_links_to_transcripts_by_hash(report: Path) -> None:
    page = page_text(report)
    # two runs: ids carry the run number
    assert '<a href="#ep-r1-tiny-0">tiny#0</a>' in page and '<details class="episode" id="ep-r1-tiny-0">' in page
    assert '<details class="episode" id="ep-r2-tiny-0">' in page
    assert 'id="ep-r1-tiny-0-t2"' in page and "window.location.hash" in page
    assert "ERROR" in page and "ModelCallError: endpoint kept failing" in page


def test_single_run_ids_are_ep_and_the_episode_id(tmp_path: Path, records: list[EpisodeRecord]) -> None:
    page = page_text(build_report([write_run(tmp_path / "r", records)], tmp_path / "o", resamples=50))
    assert 'id="ep-tiny-0"' in page and 'id="ep-tiny-two-0"' in page and 'href="#ep-tiny-4"' in page


def test_each_turn_shows_plot_state_and_a_ledger_slot(report: Path) -> None:
    page = page_text(report)
    assert "Plot, nodes completed so far: <b>s_0</b>" in page
    assert '<ul class="ledger-at" data-turn="2"></ul>' in page
    assert '<tr data-added="1" data-negated=""><td>f_4</td><td>Fog lies on the water.</td>' in page
    assert '<tr data-added="0" data-negated="2"><td>f_0</td>' in page


# -- transcript helpers ------------------------------------------------------------------------


def test_evidence_matching_tolerates_whitespace_quote_marks_case_and_outer_quotes() -> None:
    reply = "He said:  “Don’t\n move,”  and the lamp went   OUT…"
    # the outer quote marks of the quote are trimmed, so the span ends at the comma
    assert find_evidence(reply, "said: \"Don't move,\"") == (3, reply.index("”"))
    span = find_evidence(reply, "'the lamp went out...'")
    assert span is not None and reply[span[0]:span[1]] == "the lamp went   OUT", "outer ellipsis trimmed"
    assert find_evidence(reply, "and the lamp went out…") == (reply.index("and"), len(reply) - 1)
    assert find_evidence(reply, "the lamp went on") is None
    assert find_evidence(reply, "  “ ” ") is None and find_evidence(reply, "") is None


def test_highlight_escapes_and_merges_overlaps() -> None:
    out = highlight("a <b> c </mark> d", [Span(2, 5, "evidence", 'x"y'), Span(4, 8, "evidence", "z")])
    assert out == 'a <mark class="evidence" title="x&quot;y; z">&lt;b&gt; c </mark>&lt;/mark&gt; d'
    assert highlight("<i>", []) == "&lt;i&gt;"


def test_turn_states_rebuild_ledger_and_plot_per_turn(records: list[EpisodeRecord]) -> None:
    states = turn_states(records[2])  # SURVIVAL: +fact at 1, negate f_0 and s_0 at 2
    assert [s.turn.turn for s in states] == [0, 1, 2, 3, 4, 5]
    assert [f.id for f in states[0].facts] == ["f_0", "f_1", "f_2", "f_3"]
    assert [f.content for f in states[1].added] == ["The pier is slick with rain."]
    assert [f.id for f in states[2].negated] == ["f_0"] and "f_0" not in [f.id for f in states[2].facts]
    assert states[1].nodes == [] and states[2].nodes == ["s_0"] and states[2].new_nodes == ["s_0"]
    assert states[5].nodes == ["s_0"] and states[5].new_nodes == []
    conflict = turn_states(records[0])[-1]
    assert not conflict.turn.committed and [f.content for f in conflict.facts][-1] == "Fog lies on the water."
    success = turn_states(records[1])
    assert [c.id for c in success[3].settled] == ["c_0", "c_1"]


# -- CLI and dependency rule -------------------------------------------------------------------


def test_cli_report_writes_the_report(tmp_path: Path, records: list[EpisodeRecord],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    report_cli.register(parser.add_subparsers(dest="command"))
    run = write_run(tmp_path / "r", records)
    args = parser.parse_args(["report", str(run), "--out", str(tmp_path / "o"), "--at", "2,5", "--resamples", "50"])
    assert args.func(args) == 0
    assert "index.html" in capsys.readouterr().out
    assert "survival@2" in (tmp_path / "o" / "comparison.md").read_text()
    bad = parser.parse_args(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")])
    assert report_cli.cmd_report(bad) == 2 and "no episodes.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["report", str(run), "--out", "x", "--at", "0"])


def test_metrics_survival_and_reports_import_no_model_layer_agents_or_auditors() -> None:
    banned = ("openai", "httpx", "ncpbench.models", "ncpbench.agents", "ncpbench.auditors", "ncpbench.env",
              "ncpbench.episode", "ncpbench.runner")
    files = [ROOT / "ncpbench" / "metrics.py", ROOT / "ncpbench" / "survival.py",
             *sorted((ROOT / "ncpbench" / "reports").rglob("*.py"))]
    found = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{f.name}: {n}" for n in names if n.startswith(banned)]
    assert len(files) >= 8 and found == []


def test_rmst_is_per_run_to_its_own_turn_limit(tmp_path: Path, tiny: Spec) -> None:
    global LIMIT
    saved, LIMIT = LIMIT, 3
    try:  # a 3-turn run: one SURVIVAL (3 turns), one CONFLICT at turn 2
        short = [play(tiny, [CLEAN, CLEAN, CLEAN, CLEAN], ["Opening.", "a", "b", "c"], 0),
                 play(tiny, [CLEAN, CLEAN, Verdict(conflicts=[Conflict(kind=ConflictKind.FACT, evidence="b",
                                                                        reason="x")])], ["Opening.", "a", "b"], 1,
                      protocol="published")]  # a one-letter quote: grounded/1 would refuse it
    finally:
        LIMIT = saved
    long = [play(tiny, [CLEAN] * 6, ["Opening.", "a", "b", "c", "d", "e"], 0)]
    assert [(r.turns, r.max_turns) for r in short] == [(3, 3), (2, 3)] and long[0].max_turns == 5
    index = build_report([write_run(tmp_path / "short", short), write_run(tmp_path / "long", long)],
                         tmp_path / "o", resamples=50)
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO((index.parent / "headline.csv").read_text()))}
    # KM of the short run: S = 1 up to 2, 0.5 after; RMST to its own limit 3 = 2 + 0.5
    assert rows["short"]["rmst_horizon"] == "3" and float(rows["short"]["rmst"]) == pytest.approx(2.5)
    assert rows["long"]["rmst_horizon"] == "5" and float(rows["long"]["rmst"]) == pytest.approx(5)
    page = index.read_text()
    assert "2.50 (≤3)" in page and "5.00 (≤5)" in page and "RMST (≤ 6 turns)" not in page
    full = (index.parent / "comparison.md").read_text()
    assert "2.50 (≤3)" in full and "5.00 (≤5)" in full, "the full table names each run's own horizon"
    data = json.loads((index.parent / "metrics.json").read_text())
    assert [r["summary"]["horizon"] for r in data["runs"]] == [3, 5]
    assert "not comparable: long vs short: turn limits 3 vs 5" in " ".join(data["warnings"])


def test_an_all_error_run_has_no_restricted_mean_and_no_curve(tmp_path: Path, tiny: Spec) -> None:
    broken = [play(tiny, [], ["Opening."], k, fail="ModelCallError: down") for k in range(2)]
    index = build_report([write_run(tmp_path / "down", broken)], tmp_path / "o", resamples=50)
    data = json.loads((index.parent / "metrics.json").read_text())
    summary = data["runs"][0]["summary"]
    assert summary["scored"] == 0 and summary["rmst"] is None and summary["km_median"] is None
    assert data["at_risk"]["runs"]["down"] == [None] * len(data["at_risk"]["turns"])
    assert any("no scored episodes" in w for w in data["warnings"])
    head = (index.parent / "headline.md").read_text()
    assert "no scored episodes" in head and "100" not in head.split("## Headline")[1]
    summary_text = page_text(index).split('id="summary"')[1].split("</details>")[0]
    assert "no scored episodes, so no score, no survival curve and no restricted mean" in summary_text
    assert "restricted mean —" not in summary_text and "Kaplan–Meier median" not in summary_text
