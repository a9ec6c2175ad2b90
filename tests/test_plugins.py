"""Your own role from the command line: `module:attr` and `file.py:attr` references."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from ncpbench.plugins import PluginError, is_plugin_ref
from ncpbench.roles import load_role

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "my_narrator.py"


def test_a_plain_function_becomes_a_narrator_and_is_recorded_with_its_source_hash() -> None:
    narrator, ref = load_role("narrator", f"{EXAMPLE}:narrate")
    assert hasattr(narrator, "narrate")
    assert ref.ref.endswith("my_narrator.py:narrate")
    assert ref.source_sha256 == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()


def test_a_class_is_a_factory_and_an_object_with_the_method_is_used_as_it_is() -> None:
    narrator, _ = load_role("narrator", f"{EXAMPLE}:EchoNarrator")
    assert narrator.narrate(None) == "The world holds its breath, and then goes on."
    auditor, ref = load_role("auditor", "ncpbench.auditors.scripted:ReplayAuditor")
    assert hasattr(auditor, "audit") and ref.source_sha256 is not None


@pytest.mark.parametrize(("role", "ref", "message"), [
    ("narrator", "no_such_module_here:narrate", "cannot import it"),
    ("narrator", "missing/file.py:narrate", "no such file"),
    ("narrator", "ncpbench.agents.scripted:NoSuchThing", "has no attribute"),
    ("auditor", f"{EXAMPLE}:narrate", "an auditor needs an audit() method"),
    ("narrator", "plainly wrong", "expected module:attr"),
])
def test_bad_references_say_what_to_fix(role: str, ref: str, message: str) -> None:
    with pytest.raises(PluginError, match=re.escape(message)):
        load_role(role, ref)  # type: ignore[arg-type]


def test_model_strings_are_not_mistaken_for_references() -> None:
    assert is_plugin_ref("mypkg.narrators:narrate") and is_plugin_ref("examples/my_narrator.py:narrate")
    assert not is_plugin_ref("openai/gpt-4o") and not is_plugin_ref("openai/qwen2.5:latest")
    assert not is_plugin_ref("openai/llama3.1:8b") and not is_plugin_ref("mock/default")


def test_the_cli_runs_your_narrator_and_the_record_names_it(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    ref = f"{EXAMPLE}:narrate"
    out = subprocess.run([sys.executable, "-m", "ncpbench", "run", "--envs", "iron-man,alien", "--narrator", ref,
                          "--auditor", "mock/default", "--player-mode", "scripted", "--max-turns", "2",
                          "--out", str(tmp_path / "run"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert {r["env_id"] for r in records} == {"iron-man", "alien"}
    assert all(r["config"]["narrator"]["model"] == ref for r in records)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["identity"]["plugins"]["narrator"]["source_sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()


def test_a_reference_that_does_not_import_is_a_one_line_usage_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ncpbench", "run", "--envs", "iron-man", "--narrator",
                          "nowhere/missing.py:narrate", "--auditor", "mock/default", "--player-mode", "scripted",
                          "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "missing.py: no such file" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
