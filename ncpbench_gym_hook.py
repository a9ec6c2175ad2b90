"""Startup hook: register ncpbench's environments with Gymnasium whenever Gymnasium is imported.

Gymnasium 1.x no longer loads `gymnasium.envs` entry-point plugins, so the wheel installs a
`ncpbench-gymnasium.pth` file whose one line calls `install()` at interpreter start. `install()`
only puts a finder on `sys.meta_path` (standard library, microseconds); the first `import
gymnasium` then runs `ncpbench.registry.register_all()` right after Gymnasium has loaded, so
`gymnasium.make("ncpbench/IronMan-v1")` works without `import ncpbench`. Processes that never
import Gymnasium pay nothing. Set NCPBENCH_GYM_PLUGIN=0 to switch the hook off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TRIGGER = "gymnasium"


def _register() -> None:
    if "ncpbench" in sys.modules:
        return  # ncpbench is being imported (it imports Gymnasium itself) and registers at its end
    try:
        from ncpbench.integrations.gym_plugin import register_envs

        register_envs()
    except Exception as e:  # a broken plugin must never break `import gymnasium`
        warnings.warn(f"ncpbench could not register its Gymnasium environments: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=2)


class _AfterGymnasium(importlib.abc.MetaPathFinder):
    """Wraps the loader of `gymnasium` so registration runs once Gymnasium is fully imported."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRIGGER:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps the lookup below from finding us again
        spec = importlib.util.find_spec(fullname)
        loader: Any = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _register()

        loader.exec_module = exec_module
        return spec


def install() -> None:
    if os.environ.get("NCPBENCH_GYM_PLUGIN", "1") == "0":
        return
    if TRIGGER in sys.modules:  # imported before the hook ran (unusual): register now
        _register()
    elif not any(isinstance(f, _AfterGymnasium) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterGymnasium())
