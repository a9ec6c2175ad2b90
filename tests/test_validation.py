"""The validator as a specification: each broken file is rejected naming file, id and field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES

from ncpbench.dataset import bundled_dir
from ncpbench.validation import Severity, errors, validate_file

EXPECTED = yaml.safe_load((FIXTURES / "broken_expected.yaml").read_text())
BROKEN = sorted((FIXTURES / "broken").glob("*.yaml"))


def test_the_broken_corpus_is_large_and_fully_described() -> None:
    assert len(BROKEN) >= 15
    assert {p.stem for p in BROKEN} == set(EXPECTED)


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_broken_spec_is_rejected_naming_file_id_and_field(path: Path) -> None:
    spec, findings = validate_file(path)
    assert spec is None
    want = EXPECTED[path.stem]
    found = [(f.file, f.id, f.field) for f in errors(findings)]
    assert (str(path), want["id"], want["field"]) in found, found
    for f in errors(findings):
        assert str(f).startswith(f"{path}:{f.id}:{f.field}: error: ")


def test_validate_command_prints_findings_and_exits_1_without_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "ncpbench", "validate", *map(str, BROKEN)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"{len(BROKEN)} files checked: 0 valid" in proc.stderr
    assert "yaml-syntax.yaml:yaml-syntax:-: error: invalid YAML at line 4" in proc.stdout


def test_validate_command_passes_on_the_bundled_environments() -> None:
    proc = subprocess.run([sys.executable, "-m", "ncpbench", "validate"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 errors, 0 warnings" in proc.stdout


def test_every_bundled_environment_is_validator_clean() -> None:
    for path in sorted(bundled_dir().glob("*.yaml")):
        if path.name == "index.yaml":
            continue
        spec, findings = validate_file(path)
        assert spec is not None and findings == [], [str(f) for f in findings]


def test_yaml_python_tags_are_never_constructed(tmp_path: Path) -> None:
    marker = tmp_path / "owned"
    bad = tmp_path / "evil.yaml"
    bad.write_text(f"meta: !!python/object/apply:os.system ['touch {marker}']\n")
    spec, findings = validate_file(bad)
    assert spec is None and not marker.exists()
    assert "could not determine a constructor" in findings[0].message


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"synopsis: " + b"a" * 3_000_000 + b"\n")
    spec, findings = validate_file(big)
    assert spec is None and "byte limit" in findings[0].message


def test_deeply_nested_yaml_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("synopsis: " + "[" * 50_000 + "]" * 50_000 + "\n")
    spec, findings = validate_file(deep)
    assert spec is None and findings and findings[0].severity is Severity.ERROR
