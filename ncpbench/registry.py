"""Gymnasium registration: one id per bundled environment, e.g. `ncpbench/IronMan-v1`.

The `-vN` of an id is the spec's `meta.version`, so a revision that changes what a narration must
do gets a new id and its scores never mix with the old ones. Registration reads only the index and
the `version:` line of each file's `meta` block (`header_version`, no YAML parsing), so
`import ncpbench` stays cheap; each spec is loaded when its env is made.

Every id's entry point is `ncpbench.integrations.gym_plugin:make_env`, which turns role arguments
(objects, model strings, or nothing: the scripted player and a labelled stand-in auditor) into
roles; its `max_episode_steps` is the opening plus the env's default 100 turns, so Gymnasium's
TimeLimit never cuts an episode the env would finish itself. docs/INTEGRATIONS.md has the details.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import gymnasium as gym

from ncpbench.dataset import bundled_dir, index_entries

NAMESPACE = "ncpbench"
_HEADER_LINES = 60
"""`meta` is the first block of a spec and a handful of lines long; no need to read further."""
_BLOCK_VERSION = re.compile(r"^\s+version:\s*(['\"]?)(\d+)\1\s*(?:#.*)?$")
_FLOW_VERSION = re.compile(r"[{,]\s*version:\s*(['\"]?)(\d+)\1\s*[,}]")


def header_version(path: Path) -> int:
    """`meta.version` read from the file's first lines (0 when absent or unreadable).

    Handles `meta:` as a block (`  version: 2`) or in flow style (`meta: {id: x, version: 2}`).
    `tests/test_registry.py` checks it against the parsed spec of every bundled environment.
    """
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            in_meta = False
            for _, line in zip(range(_HEADER_LINES), f, strict=False):
                line = line.rstrip("\n")
                if line.startswith("meta:"):
                    flow = _FLOW_VERSION.search(line)
                    if flow or "{" in line:
                        return int(flow.group(2)) if flow else 0
                    in_meta = True
                    continue
                if not in_meta or not line.strip() or line.lstrip().startswith("#"):
                    continue
                if not line[:1].isspace():
                    break  # the next top-level key: meta has no version
                block = _BLOCK_VERSION.match(line)
                if block:
                    return int(block.group(2))
    except OSError:
        return 0
    return 0


@cache
def bundled_versions() -> dict[str, int]:
    """slug -> meta.version of every bundled environment, in index order."""
    files, _ = index_entries(bundled_dir())
    return {p.stem: header_version(p) for p in files}


def env_name(slug: str) -> str:
    """`iron-man` -> `IronMan`."""
    return "".join(part[:1].upper() + part[1:] for part in slug.split("-"))


def env_id(slug: str, version: int | None = None) -> str:
    """`iron-man` -> `ncpbench/IronMan-vN`: the current id, N = the bundled spec's meta.version (else 0)."""
    if version is None:
        version = bundled_versions().get(slug, 0)
    return f"{NAMESPACE}/{env_name(slug)}-v{version}"


def bundled_slugs() -> list[str]:
    return list(bundled_versions())


ENTRY_POINT = "ncpbench.integrations.gym_plugin:make_env"
MAX_EPISODE_STEPS = 101
"""The opening plus NarrativeEnv's default 100 turns (`gym_plugin.MAX_EPISODE_STEPS`, checked by a test)."""


def parse_envs(envs: str | Sequence[str]) -> list[str]:
    """`iron-man,alien` (or a list, or `all`) -> bundled slugs; unknown ones are an error."""
    slugs = [s.strip() for s in (envs.split(",") if isinstance(envs, str) else envs) if s.strip()]
    known = bundled_slugs()
    if slugs == ["all"]:
        return known
    unknown = [s for s in slugs if s not in known]
    if unknown or not slugs:
        raise ValueError(f"unknown environments {unknown or slugs}; `ncpbench list` shows them")
    return slugs


def register_all() -> list[str]:
    ids = []
    for slug in bundled_slugs():
        eid = env_id(slug)
        if eid not in gym.registry:
            gym.register(id=eid, entry_point=ENTRY_POINT, kwargs={"spec": slug},
                         max_episode_steps=MAX_EPISODE_STEPS, disable_env_checker=False)
        ids.append(eid)
    return ids


def make(slug: str, **kwargs: Any) -> gym.Env[Any, Any]:
    """`ncpbench.make("iron-man", player=..., auditor=...)`: gymnasium.make by slug (or by id).

    Unless given, `max_episode_steps` follows `max_turns` (its + 1), so a longer episode than the
    registered default is never cut by the TimeLimit wrapper.
    """
    if "max_turns" in kwargs and "max_episode_steps" not in kwargs:
        kwargs["max_episode_steps"] = int(kwargs["max_turns"]) + 1
    if "/" in slug:
        return gym.make(slug, **kwargs)
    eid = env_id(slug)
    if eid not in gym.registry:
        raise KeyError(f"no bundled environment {slug!r}; `ncpbench list` shows them")
    return gym.make(eid, **kwargs)
