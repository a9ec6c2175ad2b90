"""Gymnasium registration: one id per bundled environment, e.g. `ncpbench/IronMan-v0`.

Registration reads only the index (no spec parsing), so `import ncpbench` stays cheap; each spec
is loaded when its env is made.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from ncpbench.dataset import bundled_dir, index_entries

NAMESPACE = "ncpbench"


def env_id(slug: str) -> str:
    """`iron-man` -> `ncpbench/IronMan-v0`."""
    name = "".join(part[:1].upper() + part[1:] for part in slug.split("-"))
    return f"{NAMESPACE}/{name}-v0"


def bundled_slugs() -> list[str]:
    files, _ = index_entries(bundled_dir())
    return [p.stem for p in files]


def register_all() -> list[str]:
    ids = []
    for slug in bundled_slugs():
        eid = env_id(slug)
        if eid not in gym.registry:
            gym.register(id=eid, entry_point="ncpbench.env:NarrativeEnv", kwargs={"spec": slug},
                         disable_env_checker=False)
        ids.append(eid)
    return ids


def make(slug: str, **kwargs: Any) -> gym.Env[Any, Any]:
    """`ncpbench.make("iron-man", player=..., auditor=...)`: gymnasium.make by slug."""
    if "/" in slug:
        return gym.make(slug, **kwargs)
    eid = env_id(slug)
    if eid not in gym.registry:
        raise KeyError(f"no bundled environment {slug!r}; `ncpbench list` shows them")
    return gym.make(eid, **kwargs)
