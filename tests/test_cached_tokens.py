"""Cached prompt tokens: read in each server's dialect, summed per role / turn / episode / run,
priced at the cached rate, and shown by run.json, the live display and the report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile_endpoint import HostileEndpoint

from ncpbench.models import call_context
from ncpbench.models.client import ModelClient, read_usage
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.pricing import Price, parse_prices, total_cost
from ncpbench.reports import build_report
from ncpbench.runner import Budget, Progress, run_batch
from ncpbench.verdict import Usage

MESSAGES = [{"role": "system", "content": "You are the narrator of a long story. " * 40},
            {"role": "user", "content": "Turn 1: the player opens the door."}]
LATER = [MESSAGES[0], {"role": "user", "content": "Turn 2: the player climbs the stairs."}]


@pytest.mark.parametrize(("body", "cached", "prompt"), [
    ({"usage": {"prompt_tokens": 900, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 768}}},
     768, 900),  # OpenAI
    ({"usage": {"prompt_tokens": 900, "completion_tokens": 10,
                "prompt_tokens_details": {"cached_tokens": None, "audio_tokens": None}}}, 0, 900),  # vLLM, details off
    ({"usage": {"prompt_tokens": 900, "completion_tokens": 10, "prompt_cache_hit_tokens": 512}}, 512, 900),  # DeepSeek
    ({"usage": {"prompt_tokens": 900, "completion_tokens": 10}, "timings": {"cache_n": 850, "prompt_n": 50}},
     850, 900),  # llama.cpp server
    ({"usage": {}, "timings": {"cache_n": 850, "prompt_n": 50}}, 850, 900),  # llama.cpp without usage counts
    ({"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 5000}}}, 100, 100),  # capped
    ({"usage": {"prompt_tokens": "lots", "prompt_tokens_details": {"cached_tokens": -3}}}, 0, 0),  # nonsense
])
def test_cached_tokens_are_read_in_each_servers_dialect(body: dict[str, Any], cached: int, prompt: int) -> None:
    usage = read_usage(body)
    assert (usage.cached_tokens, usage.prompt_tokens) == (cached, prompt)


def test_cached_tokens_arrive_over_http_from_a_llama_cpp_shaped_answer() -> None:
    with HostileEndpoint("good", top={"timings": {"cache_n": 40, "prompt_n": 2}},
                         usage={"prompt_tokens": 42, "completion_tokens": 3}) as endpoint:
        async def go() -> Usage:
            client = ModelClient()
            out = await client.chat(RoleConfig(model="openai/x", base_url=endpoint.base_url), MESSAGES)
            await client.aclose()
            return out.usage

        usage = asyncio.run(go())
    assert usage == Usage(prompt_tokens=42, completion_tokens=3, calls=1, cached_tokens=40)


@pytest.mark.parametrize("dialect", ["openai", "llama.cpp"])
def test_the_mock_reports_the_prefix_shared_with_the_previous_prompt_of_the_same_episode_and_stage(
        dialect: str) -> None:
    with MockServer(MockConfig(cache_report=dialect)) as server:
        async def go() -> list[Usage]:
            client = ModelClient()
            role = RoleConfig(model="mock/default", base_url=server.base_url)
            out = []
            for episode, messages in (("a#0", MESSAGES), ("a#0", LATER), ("b#0", LATER)):
                with call_context(episode=episode, role="narrator"):
                    out.append((await client.chat(role, messages)).usage)
            await client.aclose()
            return out

        first, second, other_episode = asyncio.run(go())
    shared = len("system\n" + MESSAGES[0]["content"] + "\nuser\nTurn ")
    assert first.cached_tokens == 0, "nothing to reuse on the first call"
    assert second.cached_tokens == shared // 4 and 0 < second.cached_tokens < second.prompt_tokens
    assert other_episode.cached_tokens == 0, "another episode has its own cache line"


def test_cached_prompt_tokens_are_priced_at_the_cached_rate() -> None:
    usage = Usage(prompt_tokens=1_000_000, cached_tokens=800_000, completion_tokens=100_000)
    assert Price(prompt=2.0, completion=8.0).cost(usage) == pytest.approx(2.0 + 0.8)
    assert Price(prompt=2.0, completion=8.0, cached=0.5).cost(usage) == pytest.approx(0.2 * 2 + 0.8 * 0.5 + 0.8)
    assert parse_prices({"m": [2, 8, 0.5]}) == {"m": Price(prompt=2, completion=8, cached=0.5)}
    assert total_cost({"m": usage, "unpriced": usage}, {"m": Price(prompt=2, completion=8)}) == pytest.approx(2.8)
    for bad in ([1], [1, 2, 3, 4], ["a", 1], [1, -2], "2,8", [True, 1]):
        with pytest.raises(ValueError, match="price of 'm'"):
            parse_prices({"m": bad})


def test_a_batch_shows_cached_share_and_cost_in_run_json_records_progress_and_report(tmp_path: Path) -> None:
    prices = {"mock/default": Price(prompt=1.0, completion=2.0, cached=0.1)}
    seen: list[Progress] = []
    with MockServer() as server:
        r = RoleConfig(model="mock/default", base_url=server.base_url)
        asyncio.run(run_batch(tmp_path / "r", RunConfig(narrator=r, player=r, auditor=r), envs="iron-man",
                              replicates=2, max_turns=4, prices=prices, on_change=seen.append))
    stats = json.loads((tmp_path / "r" / "run.json").read_text())["sessions"][-1]["call_stats"]
    assert stats["cached_tokens"] == server.stats.cached_tokens > 0
    assert 0 < stats["cached_share"] < 1 and stats["prompt_tokens"] > stats["cached_tokens"]
    full = Price(prompt=1.0, completion=2.0).cost(Usage(**stats["by_model"]["mock/default"]))
    assert 0 < stats["cost_usd"] < full, "cached tokens are billed at the cached rate"

    records = [json.loads(x) for x in (tmp_path / "r" / "episodes.jsonl").read_text().splitlines()]
    per_turn = sum(t["usage"].get("auditor", {}).get("cached_tokens", 0) for rec in records for t in rec["history"])
    per_episode = sum(rec["usage"]["auditor"]["cached_tokens"] for rec in records)
    assert per_turn == per_episode > 0, "turn usage adds up to the episode's"

    progress = seen[-1]
    assert progress.cached_share() is not None and 0 < (progress.cached_share() or 0) < 1
    assert Budget(prices=prices).cost(progress.by_model) == pytest.approx(
        total_cost(progress.by_model, prices))

    (tmp_path / "prices.yaml").write_text(yaml.safe_dump({"mock/default": [1.0, 2.0, 0.1]}))
    build_report([tmp_path / "r"], tmp_path / "rep", resamples=50, prices=parse_prices(
        yaml.safe_load((tmp_path / "prices.yaml").read_text())))
    usage_md = (tmp_path / "rep" / "usage.md").read_text()
    assert "cached share" in usage_md and "auditor" in usage_md
    row = next(line for line in usage_md.splitlines() if "| all |" in line)
    assert "%" in row and "—" not in row.split("|")[-2], "a total with a share and a cost"
    html = (tmp_path / "rep" / "index.html").read_text()
    assert 'id="usage"' in html and "cached share" in html
    metrics = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert any(u["role"] == "all" and u["cached_tokens"] > 0 and u["cost_usd"] > 0 for u in metrics["usage"])


def test_the_live_display_shows_the_cached_share_and_the_cost_at_the_cached_rate() -> None:
    from rich.console import Console

    from ncpbench.cli.batch import progress_table

    progress = Progress(total=2)
    progress.add_usage("m", Usage(prompt_tokens=1_000_000, cached_tokens=750_000, completion_tokens=0, calls=3))
    console = Console(width=120, record=True)
    console.print(progress_table(progress, Budget(prices={"m": Price(prompt=4.0, completion=8.0, cached=0.4)})))
    text = console.export_text()
    assert "75% of prompt cached" in text and "~$1.3000" in text  # 0.25 * 4 + 0.75 * 0.4
