"""Prices per model and what a usage costs, with the cheaper rate for cached prompt tokens.

A price table maps a model string to `[usd_per_1M_prompt, usd_per_1M_completion]` or
`[usd_per_1M_prompt, usd_per_1M_completion, usd_per_1M_cached_prompt]`. Cached prompt tokens are
a part of the prompt tokens; without a cached price they cost the ordinary prompt price. Pure:
the runner (budget), the CLI (live display) and the reports share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from ncpbench.verdict import Usage


class Price(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt: float
    """USD per 1M prompt tokens."""
    completion: float
    """USD per 1M completion tokens."""
    cached: float | None = None
    """USD per 1M cached prompt tokens (None: the prompt price)."""

    def cost(self, usage: Usage) -> float:
        cached = min(max(usage.cached_tokens, 0), usage.prompt_tokens)
        cached_rate = self.prompt if self.cached is None else self.cached
        return ((usage.prompt_tokens - cached) * self.prompt + cached * cached_rate
                + usage.completion_tokens * self.completion) / 1e6


def as_price(value: Price | tuple[float, ...] | list[float]) -> Price:
    if isinstance(value, Price):
        return value
    numbers = list(value)
    if len(numbers) not in (2, 3):
        raise ValueError(f"a price is [prompt, completion] or [prompt, completion, cached] (got {numbers!r})")
    return Price(prompt=numbers[0], completion=numbers[1], cached=numbers[2] if len(numbers) == 3 else None)


def parse_prices(data: Mapping[str, Any]) -> dict[str, Price]:
    """A price table read from YAML/JSON; raises ValueError naming the model whose entry is wrong."""
    out: dict[str, Price] = {}
    for model, value in data.items():
        ok = isinstance(value, list | tuple) and len(value) in (2, 3) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in value)
        if not ok:
            raise ValueError(f"price of {model!r} must be [usd_per_1M_prompt, usd_per_1M_completion] or "
                             f"[usd_per_1M_prompt, usd_per_1M_completion, usd_per_1M_cached_prompt], "
                             f"non-negative numbers (got {value!r})")
        out[str(model)] = as_price([float(v) for v in value])
    return out


def total_cost(usage_by_model: Mapping[str, Usage], prices: Mapping[str, Price]) -> float | None:
    """Estimated USD for the usage of every model (None without a price table; unpriced models cost 0)."""
    if not prices:
        return None
    return sum(prices[m].cost(u) for m, u in usage_by_model.items() if m in prices)


def cached_share(usage: Usage) -> float | None:
    """The share of prompt tokens served from the endpoint's prefix cache (None without prompt tokens)."""
    return usage.cached_tokens / usage.prompt_tokens if usage.prompt_tokens else None
