"""The dependency rules of DESIGN.md, checked on the import statements."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ["spec", "validation", "ledger", "commitments", "trajectory", "state", "verdict", "dataset"]
EDGE = ("ncpbench.agents", "ncpbench.auditors", "ncpbench.models", "ncpbench.runner", "ncpbench.reports",
        "ncpbench.cli", "openai", "httpx")


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def offenders(files: list[Path], banned: tuple[str, ...]) -> list[str]:
    return [f"{f.name}: {m}" for f in files for m in imports(f) if m.startswith(banned)]


def test_core_imports_no_model_layer_agents_auditors_runner_reports_or_cli() -> None:
    assert offenders([ROOT / "ncpbench" / f"{m}.py" for m in CORE], EDGE) == []


def test_agents_never_import_auditors() -> None:
    assert offenders(sorted((ROOT / "agents").rglob("*.py")), ("ncpbench.auditors",)) == []


def test_auditors_never_import_agents() -> None:
    assert offenders(sorted((ROOT / "auditors").rglob("*.py")), ("ncpbench.agents",)) == []


def test_metrics_and_reports_never_call_a_model() -> None:
    files = [p for name in ("metrics", "reports", "survival") for p in (ROOT / "ncpbench").glob(f"{name}*.py")]
    files += sorted((ROOT / "ncpbench" / "reports").rglob("*.py"))
    assert files
    assert offenders(files, ("openai", "httpx", "ncpbench.models", "ncpbench.agents", "ncpbench.auditors")) == []
