"""Bad specs: every broken file is rejected naming file, id and field, without a traceback, in
bounded time and memory. docs/RELIABILITY.md lists the guarantees this file proves.

The committed corpus is tests/fixtures/broken/ (expected id and field per file stem in
tests/fixtures/broken_expected.yaml); files too big to commit are generated into tmp_path.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES

from ncpbench.dataset import load_file
from ncpbench.validation import MAX_SPEC_BYTES, Finding, SpecError, errors, validate_file

EXPECTED = yaml.safe_load((FIXTURES / "broken_expected.yaml").read_text())
BROKEN = sorted((FIXTURES / "broken").glob("*.yaml"))
MAX_SECONDS = 5.0
MAX_BYTES = 200_000_000
KINDS = {
    "YAML syntax": ["yaml-syntax", "yaml-unclosed-quote", "yaml-tab-indent", "yaml-null-byte", "yaml-duplicate-key"],
    "wrong types": ["genres-wrong-type", "fact-content-not-string", "facts-not-list", "negated-not-bool",
                    "trajectory-item-not-mapping", "not-a-mapping", "bad-commitment-type"],
    "missing fields": ["missing-title", "missing-trigger", "missing-commitments", "missing-meta", "empty-file"],
    "duplicate ids": ["duplicate-fact-id", "duplicate-node-id", "duplicate-commitment-id"],
    "dangling links": ["dangling-before", "dangling-until", "dangling-requires", "dangling-achievement-node"],
    "ordering cycles": ["ordering-backwards", "ordering-cycle-via-requires", "ordering-cycle-between-commitments",
                        "requires-cycle"],
    "invalid UTF-8": ["invalid-utf8", "invalid-utf8-surrogate"],
    "deep nesting": ["deeply-nested"],
    "Python object tags": ["python-tag", "python-object-new", "python-name"],
    "alias expansion": ["billion-laughs"],
}


def measured(path: Path) -> tuple[list[Finding], float, int]:
    """(findings, seconds, peak traced bytes); time and memory are measured in separate passes."""
    started = time.perf_counter()
    spec, findings = validate_file(path)
    seconds = time.perf_counter() - started
    assert spec is None, f"{path.name} was accepted"
    tracemalloc.start()
    try:
        validate_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return findings, seconds, peak


def assert_rejected(path: Path, ident: str, field: str) -> None:
    findings, seconds, peak = measured(path)
    found = [(f.file, f.id, f.field) for f in errors(findings)]
    assert (str(path), ident, field) in found, found[:10]
    for f in errors(findings):
        assert str(f).startswith(f"{path}:{f.id}:{f.field}: error: ")
        assert "\n" not in f.message and "Traceback" not in f.message
    assert seconds < MAX_SECONDS, f"{path.name}: {seconds:.2f} s"
    assert peak < MAX_BYTES, f"{path.name}: {peak / 1e6:.0f} MB"
    with pytest.raises(SpecError):  # the loader refuses it the same way: a SpecError, nothing else
        load_file(path)


def test_the_corpus_has_thirty_files_covering_every_kind_of_breakage() -> None:
    assert len(BROKEN) >= 30
    assert {p.stem for p in BROKEN} == set(EXPECTED)
    for kind, stems in KINDS.items():
        assert set(stems) <= set(EXPECTED), (kind, set(stems) - set(EXPECTED))


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_each_broken_file_is_rejected_by_file_id_and_field_in_bounded_time_and_memory(path: Path) -> None:
    want = EXPECTED[path.stem]
    assert_rejected(path, want["id"], want["field"])


def test_a_fifty_megabyte_file_is_refused_without_being_read(tmp_path: Path) -> None:
    path = tmp_path / "fifty-megabytes.yaml"
    with path.open("w") as f:
        f.write("meta:\n  id: fifty-megabytes\nsynopsis: ")
        for _ in range(50):
            f.write("a" * 1_000_000)
    assert path.stat().st_size > 50_000_000
    assert_rejected(path, "fifty-megabytes", "-")
    assert "byte limit" in validate_file(path)[1][0].message


def test_the_densest_yaml_under_the_size_limit_parses_in_bounded_time_and_memory(tmp_path: Path) -> None:
    path = tmp_path / "dense.yaml"
    items = (MAX_SPEC_BYTES - 100) // len("{a: b},")
    path.write_text("junk: [" + "{a: b}," * items + "{}]\n")
    assert MAX_SPEC_BYTES - 200 < path.stat().st_size <= MAX_SPEC_BYTES
    assert_rejected(path, "meta", "meta")


def test_an_alias_fan_out_under_the_size_limit_is_rejected_in_bounded_time_and_memory(tmp_path: Path) -> None:
    tiny = (FIXTURES / "tiny.yaml").read_text().replace("id: tiny", "id: fan-out").replace("slug: tiny", "slug: fan-out")
    head, tail = tiny.split("initial_facts:\n", 1)
    fanout = (MAX_SPEC_BYTES - len(tiny)) // len("  - *f\n")
    facts = "initial_facts:\n  - &f {id: f_0, content: Mara waits., negated: false}\n" + "  - *f\n" * fanout
    path = tmp_path / "fan-out.yaml"
    path.write_text(head + facts + tail[tail.index("commitments:"):])
    assert path.stat().st_size <= MAX_SPEC_BYTES
    assert_rejected(path, "f_0", "id")


def test_a_thirty_level_alias_bomb_is_rejected_in_bounded_time_and_memory(tmp_path: Path) -> None:
    lines = ["bomb:", "  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 30)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nsynopsis: *l29\n")  # 9^30 strings, were it expanded
    assert_rejected(path, "-", "synopsis")


def test_python_object_tags_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "owned"
    path = tmp_path / "popen.yaml"
    path.write_text(f"meta: !!python/object/new:subprocess.Popen [[touch, '{marker}']]\n"
                    f"synopsis: !!python/object/apply:os.system ['touch {marker}']\n")
    assert_rejected(path, "popen", "-")
    assert not marker.exists()


def test_validate_command_on_generated_monsters_exits_1_without_traceback(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"synopsis: " + b"a" * 50_000_000)
    deep = tmp_path / "deep.yaml"
    deep.write_text("synopsis: " + "{a: " * 100_000 + "}" * 100_000 + "\n")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00meta: [")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ncpbench", "validate", str(big), str(deep), str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    for path in (big, deep, bad):
        assert f"{path}:{path.stem}:-: error: " in proc.stdout
    assert time.perf_counter() - started < 30
