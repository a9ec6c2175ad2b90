"""What importing costs. The layering rules themselves are import-linter contracts in pyproject.toml,
checked by `make imports` (part of `make test`)."""

from __future__ import annotations

import subprocess
import sys


def imported_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


def test_import_ncpbench_and_a_scripted_env_do_not_import_the_openai_sdk() -> None:
    modules = imported_after(
        "import ncpbench\n"
        "from ncpbench.agents import ScriptedPlayer\n"
        "from ncpbench.auditors import ReplayAuditor\n"
        "env = ncpbench.make('iron-man', player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True))\n"
        "env.reset(seed=0); env.step('An opening.')")
    assert "openai" not in modules and "matplotlib" not in modules


def test_the_llm_roles_are_still_importable_from_their_packages() -> None:
    modules = imported_after("from ncpbench.agents import LLMNarrator\nfrom ncpbench.auditors import LLMAuditor")
    assert "ncpbench.models.client" in modules  # the model layer loads with them, when asked for
    assert "openai" not in modules, "the SDK is loaded only by a role whose endpoint uses the sdk transport"
