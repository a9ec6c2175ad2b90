"""The HTML report as a person sees it: headless Chromium renders it, runs its script, and we read
the resulting DOM (`--dump-dom`) and pixels (`--screenshot`).

Needs Debian's `chromium` package (apt-get install -y chromium); skipped when the binary is missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_reports import CONFIG, play, scenario, write_run

from ncpbench.dataset import load_file
from ncpbench.reports import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")

FIXTURES = Path(__file__).parent / "fixtures"
EVIDENCE_YELLOW = (255, 213, 79)   # mark.evidence background (#ffd54f)
CONFLICT_RED = (198, 40, 40)       # CONFLICT badge (#c62828)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    records = scenario(load_file(FIXTURES / "tiny.yaml"))
    a = write_run(tmp / "runs" / "steady", records)
    b = write_run(tmp / "runs" / "shaky", [*records[:2], records[3]], {**CONFIG, "narrator": {"model": "mock/shaky"}})
    return build_report([a, b], tmp / "report", resamples=200)


def chromium(index: Path, fragment: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    profile = index.parent.parent / f"profile-{len(list(index.parent.parent.glob('profile-*')))}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--virtual-time-budget=5000", *args, index.as_uri() + fragment]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def episode_dom(dom: str, anchor: str) -> str:
    """The rendered markup of one episode's <details> element."""
    start = dom.index(f'id="{anchor}"')
    end = dom.find('<details class="episode"', start)
    return dom[start:end if end > 0 else len(dom)]


def ledger_items(episode: str, turn: int) -> list[tuple[str, str]]:
    """(class, text) of the rendered ledger entries of one turn."""
    m = re.search(rf'<ul class="ledger-at" data-turn="{turn}">(.*?)</ul>', episode, re.S)
    assert m, f"no ledger list for turn {turn}"
    return re.findall(r'<li(?: class="(\w+)")?>(.*?)</li>', m.group(1), re.S)


def test_hash_opens_the_transcript_with_marked_evidence_and_the_ledger(index: Path) -> None:
    dom = chromium(index, "#ep-r1-tiny-0", "--dump-dom").stdout
    assert re.search(r'<details class="episode" id="ep-r1-tiny-0"[^>]*\bopen=', dom), "the script opened it"
    assert not re.search(r'<details class="episode" id="ep-r1-tiny-1"[^>]*\bopen=', dom), "only that one"
    ep = episode_dom(dom, "ep-r1-tiny-0")
    assert re.search(r'<mark class="evidence"[^>]*>The key\s+MELTS</mark> in your pocket', ep)
    # the hostile reply stayed text: no element was made of it
    assert dom.count("<script") == 2 and "&lt;script&gt;alert" in ep and "<img src=\"x\"" not in dom
    # ledgers filled in by the script: turn 0 holds the initial facts, turn 1 adds the opening's fact
    assert [t for _, t in ledger_items(ep, 0)] == [
        "f_0: Mara is standing on the deck of the ferry Albatross.", "f_1: Mara carries a brass key in her coat pocket.",
        "f_2: Mara does not know which door the brass key opens.",
        "f_3: The lighthouse on Skerry Island has not been lit for ten years."]
    assert ("new", "f_4: Fog lies on the water.") in ledger_items(ep, 1)
    assert len(ledger_items(ep, 2)) == 5 and ("new", "f_4: Fog lies on the water.") not in ledger_items(ep, 2)


def test_tables_and_plot_are_rendered(index: Path) -> None:
    dom = chromium(index, "", "--dump-dom").stdout
    comparison = re.search(r'<table class="comparison">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert comparison and [r[:40] for r in re.findall(r"<tr><td>(\w+)</td>", comparison.group(1))] == ["steady", "shaky"]
    assert "<td>mock/steady</td>" in comparison.group(1)
    assert re.search(r'<img class="survival-plot" alt="[^"]+" src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}">', dom)
    assert '<a href="#ep-r1-tiny-0">tiny#0</a>' in dom
    assert not re.search(r'<details class="episode"[^>]*\bopen=', dom), "nothing opens without a hash"


def test_ledger_shows_negated_facts_struck_at_their_turn(index: Path) -> None:
    ep = episode_dom(chromium(index, "#ep-r1-tiny-2", "--dump-dom").stdout, "ep-r1-tiny-2")
    assert ("new", "f_4: The pier is slick with rain.") in ledger_items(ep, 1)
    assert ("negated", "f_0: Mara is standing on the deck of the ferry Albatross.") in ledger_items(ep, 2)
    assert not any(t.startswith("f_0:") for _, t in ledger_items(ep, 3))


def test_screenshot_of_an_opened_episode_is_not_blank(index: Path) -> None:
    from PIL import Image

    shot = index.parent / "shot.png"
    # A window taller than the page: headless Chromium paints blank screenshots of a scrolled viewport.
    chromium(index, "#ep-r1-tiny-0", f"--screenshot={shot}", "--window-size=1280,9000", "--hide-scrollbars")
    assert shot.stat().st_size > 50_000
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 9000)
    pixels = np.asarray(image, dtype=np.int16)
    non_white = float(np.mean(pixels.sum(axis=2) < 740))
    assert non_white > 0.05, f"only {non_white:.1%} of the page is not white"
    assert len(np.unique(pixels[::4, ::4].reshape(-1, 3), axis=0)) > 200, "text, tables and the plot: many colours"

    def shown(colour: tuple[int, int, int]) -> int:
        return int(np.sum(np.all(np.abs(pixels - np.array(colour)) <= 6, axis=2)))

    assert shown(EVIDENCE_YELLOW) > 200, "the marked evidence is visible"
    assert shown(CONFLICT_RED) > 200, "the CONFLICT badges are visible"


def test_headline_table_is_visible_without_scrolling_at_1400_px(index: Path) -> None:
    dom = chromium(index, "", "--dump-dom", "--window-size=1400,900").stdout
    m = re.search(r'data-headline-box="(\d+)x(\d+)"', dom)
    assert m, "the script measured the headline table"
    right, bottom = int(m.group(1)), int(m.group(2))
    assert right <= 1400 and bottom <= 900, f"headline table ends at {right}x{bottom}"
    head = re.search(r'<table class="headline">.*?</table>', dom, re.S)
    assert head and "<th>survival@10</th>" in head.group(0) and "<th>RMST (≤ own limit)</th>" in head.group(0)
    assert "grounded/1" in head.group(0) and "(≤5)" in head.group(0) and "N 0.7 / – / –" in head.group(0)
    # the banner is on the first screen too: both runs are mock, and they cover different environments
    assert dom.index('class="banner"') < dom.index('<table class="headline">')
    assert "mock models: not a benchmark result" in dom and "not comparable: shaky vs steady" in dom


def test_an_all_error_run_gets_a_banner_and_no_scores(tmp_path: Path) -> None:
    tiny = load_file(FIXTURES / "tiny.yaml")
    broken = [play(tiny, [], ["Opening."], k, fail="ModelCallError: endpoint kept failing") for k in range(3)]
    run = write_run(tmp_path / "runs" / "down", broken)
    dom = chromium(build_report([run], tmp_path / "report", resamples=50), "", "--dump-dom").stdout
    banner = re.search(r'<div class="banner"[^>]*>(.*?)</div>', dom, re.S)
    assert banner and "down: all 3 episodes are ERROR (infrastructure failures): no scored episodes" in banner.group(1)
    head = re.search(r'<table class="headline">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert head and head.group(1).count("no scored episodes") == 2, "no KM median, no restricted mean"
    assert "<td>0 / 3</td>" in head.group(1)
    assert "restricted mean" not in dom.split('id="summary"')[1].split("</ul>")[0] or "—" in dom


def test_episode_filter_hides_the_other_outcomes(index: Path) -> None:
    def shown(dom: str) -> list[tuple[str, str]]:
        body = re.search(r'<table class="episodes">.*?<tbody>(.*?)</tbody>', dom, re.S)
        assert body
        rows = re.findall(r'<tr ([^>]*)>', body.group(1))
        return [(re.search(r'data-run="(\w+)"', r).group(1), re.search(r'data-outcome="(\w+)"', r).group(1))  # type: ignore[union-attr]
                for r in rows if "hidden" not in r]

    assert len(shown(chromium(index, "", "--dump-dom").stdout)) == 9
    conflicts = shown(chromium(index, "?outcome=CONFLICT", "--dump-dom").stdout)
    assert conflicts == [("steady", "CONFLICT"), ("steady", "CONFLICT"), ("shaky", "CONFLICT"), ("shaky", "CONFLICT")]
    long = shown(chromium(index, "?min=4&kind=", "--dump-dom").stdout)
    assert sorted(long) == sorted([("steady", "SUCCESS"), ("steady", "SURVIVAL"), ("steady", "SURVIVAL"),
                                   ("shaky", "SUCCESS")])
    dom = chromium(index, "?kind=player_input", "--dump-dom").stdout
    assert "2 of 9 episodes" in dom


def test_at_risk_table_counts_episodes_with_at_least_t_turns(index: Path) -> None:
    dom = chromium(index, "", "--dump-dom").stdout
    table = re.search(r'<table class="at-risk">.*?</table>', dom, re.S)
    assert table
    head = re.findall(r"<th>(\d+)</th>", table.group(0))
    assert head == ["0", "1", "2", "3", "4", "5"]
    rows = {m.group(1): re.findall(r"<td>(\d+|—)</td>", m.group(2))
            for m in re.finditer(r"<tr><td>(\w+)</td>(.*?)</tr>", table.group(0))}
    # steady: turns 2 (CONFLICT), 4 (SUCCESS), 5, 1 (CONFLICT), 0 (ERROR), 5; shaky: 2, 4, 1
    assert rows == {"steady": ["6", "5", "4", "3", "3", "2"], "shaky": ["3", "3", "2", "1", "1", "0"]}


def test_a_lazy_transcript_opens_from_the_readme_anchor_forms(index: Path) -> None:
    for fragment in ("#ep-r2-tiny-1", "#ep-r2-tiny%231", "#ep-r2-tiny-1-t2"):
        dom = chromium(index, fragment, "--dump-dom").stdout
        assert re.search(r'<details class="episode" id="ep-r2-tiny-1"[^>]*\bopen=', dom), fragment
    dom = chromium(index, "#ep-tiny-0", "--dump-dom").stdout  # without a run number: the first run's
    assert re.search(r'<details class="episode" id="ep-r1-tiny-0"[^>]*\bopen=', dom)
    assert dom.count('<details class="episode"') == 1, "one transcript in the DOM at a time"
