from __future__ import annotations

import subprocess
import sys

from ncpbench.registry import bundled_slugs, env_id


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ncpbench", *args], capture_output=True, text=True, timeout=120)


def test_list_shows_every_bundled_environment_with_counts() -> None:
    out = run("list")
    assert out.returncode == 0, out.stderr
    assert f"{len(bundled_slugs())} environments" in out.stdout
    assert "iron-man" in out.stdout and "Tony Stark" in out.stdout


def test_show_prints_an_env_card() -> None:
    out = run("show", "iron-man")
    assert out.returncode == 0, out.stderr
    for text in ("env card", env_id("iron-man"), "player role", "first plot node", "achievement c_"):
        assert text in out.stdout


def test_unknown_slug_is_one_line_and_exit_2() -> None:
    out = run("show", "no-such-film")
    assert out.returncode == 2
    assert "no environment 'no-such-film'" in out.stderr and "Traceback" not in out.stderr


def test_no_module_imports_another_modules_private_names() -> None:
    """A private name is its module's own business: `cli.report` once imported `cli.batch._prices`."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for folder in ("ncpbench", "agents", "auditors"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("ncpbench")):
                    found += [f"{path.relative_to(root)}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
