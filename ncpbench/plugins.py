"""Your own role from the command line: `--narrator module:attr` or `--narrator path/to/file.py:attr`.

`load_role("narrator", "examples/my_narrator.py:narrate")` imports the object and turns it into a
role: a `Narrator` (anything with `narrate`) as it is, a factory (a class, or a function taking no
arguments) called once, and for a narrator a plain `str -> str` function wrapped with
`ncpbench.agents.as_narrator` (`ncpbench.roles.load_role` does that). An auditor must have `audit`; a player `act`. The run records the
role by its import path and a hash of its source file (`PluginRef`), so a resumed run refuses a
changed file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

RoleName = Literal["narrator", "player", "auditor"]
METHOD = {"narrator": "narrate", "player": "act", "auditor": "audit"}
_REF = re.compile(r"^(?P<target>[^:]+(?:\.py)?):(?P<attr>[A-Za-z_][\w.]*)$")


class PluginError(ValueError):
    """A role reference that cannot be loaded; the message says what to fix."""


class PluginRef(BaseModel):
    """How a run records a user's own role: where it came from and what its source was."""

    model_config = ConfigDict(frozen=True)

    ref: str
    """As given: `module:attr` or `path.py:attr`."""
    source_sha256: str | None
    """Hash of the file that defines it (None when there is no file, e.g. a built-in module)."""


def is_plugin_ref(value: str) -> bool:
    """`module:attr` or `file.py:attr`, as opposed to a model string `provider/model`."""
    match = _REF.match(value)
    return match is not None and ("/" not in value or match.group("target").endswith(".py"))


def _import(target: str) -> Any:
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise PluginError(f"{target}: no such file")
        name = f"ncpbench_user_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PluginError(f"{target}: cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise PluginError(f"{target}: cannot import it ({e})") from None


def load_object(ref: str) -> tuple[Any, PluginRef]:
    match = _REF.match(ref)
    if match is None:
        raise PluginError(f"{ref!r}: expected module:attr or path/to/file.py:attr")
    module = _import(match.group("target"))
    obj: Any = module
    for part in match.group("attr").split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{ref}: {match.group('target')} has no attribute {match.group('attr')!r}")
        obj = getattr(obj, part)
    source = getattr(module, "__file__", None)
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest() if source and Path(source).is_file() else None
    return obj, PluginRef(ref=ref, source_sha256=digest)


def as_role(role: RoleName, obj: Any, ref: str, text_narrator: Callable[[Any], Any] | None = None) -> Any:
    """The object as a role: itself when it has the role's method, the result of calling it when it
    is a factory, or (narrator only) a plain `str -> str` function wrapped by `text_narrator`
    (`ncpbench.agents.as_narrator`; passed in, so the model layer that reads references never
    depends on the agents)."""
    method = METHOD[role]
    if hasattr(obj, method) and not inspect.isclass(obj):
        return obj
    if callable(obj):
        params = [p for p in inspect.signature(obj).parameters.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if inspect.isclass(obj) or not params:
            made = obj()
            if hasattr(made, method):
                return made
            raise PluginError(f"{ref}: calling it gave a {type(made).__name__}, which has no {method}() method")
        if role == "narrator" and len(params) == 1 and text_narrator is not None:
            return text_narrator(obj)
    def a(word: str) -> str:
        return f"an {word}" if word[0] in "aeiou" else f"a {word}"

    raise PluginError(f"{ref}: {a(role)} needs {a(method)}() method, a factory returning one"
                      + (", or a function str -> str" if role == "narrator" else ""))


def load_role(role: RoleName, ref: str, text_narrator: Callable[[Any], Any] | None = None) -> tuple[Any, PluginRef]:
    """Load `ref` and make it the given role (see the module docstring; `ncpbench.roles.load_role`
    supplies the narrator wrapper)."""
    obj, recorded = load_object(ref)
    return as_role(role, obj, ref, text_narrator), recorded
