"""Gymnasium ids carry each environment's version: `ncpbench/IronMan-v{meta.version}`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
from ncpbench.auditors import ReplayAuditor

import ncpbench
from ncpbench import registry
from ncpbench.dataset import bundled_dir, index_entries
from ncpbench.registry import bundled_versions, env_id, header_version
from ncpbench.validation import validate_file


def test_the_header_version_of_every_bundled_spec_is_its_parsed_meta_version() -> None:
    files, _ = index_entries(bundled_dir())
    for path in files:
        spec, findings = validate_file(path)
        assert spec is not None, findings
        assert header_version(path) == spec.meta.version, path.name


@pytest.mark.parametrize(("text", "version"), [
    ("meta:\n  id: x\n  version: 3\n  title: X\nsynopsis: s\n", 3),
    ("# a comment\nmeta:\n  id: x\n\n  # note\n  version: '12'  # bumped\n", 12),
    ("meta: {id: x, version: 2, title: X}\n", 2),
    ("meta:\n  id: x\nsynopsis: s\n  version: 9\n", 0),
    ("meta: {id: x}\n", 0),
    ("synopsis: s\n", 0),
], ids=["block", "quoted-with-comments", "flow", "after-meta", "flow-without", "no-meta"])
def test_header_version_reads_meta_only(tmp_path: Path, text: str, version: int) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(text, encoding="utf-8")
    assert header_version(path) == version
    assert header_version(tmp_path / "missing.yaml") == 0


def test_env_id_is_the_current_versioned_id_and_every_bundled_env_is_registered() -> None:
    versions = bundled_versions()
    assert len(versions) == len(index_entries(bundled_dir())[0])
    for slug, version in versions.items():
        eid = env_id(slug)
        assert eid.endswith(f"-v{version}") and eid in gym.registry
    assert env_id("iron-man", 7) == "ncpbench/IronMan-v7"
    assert env_id("not-bundled") == "ncpbench/NotBundled-v0"
    assert ncpbench.register_all() == [env_id(s) for s in versions]


def test_make_builds_the_current_version() -> None:
    env = ncpbench.make("iron-man", auditor=ReplayAuditor(advance=True))
    try:
        assert env.spec is not None and env.spec.id == env_id("iron-man")
        assert env.unwrapped.story.meta.version == bundled_versions()["iron-man"]  # type: ignore[attr-defined]
    finally:
        env.close()


def test_reading_the_versions_stays_cheap() -> None:
    registry.bundled_versions.cache_clear()
    start = time.perf_counter()
    bundled_versions()
    assert time.perf_counter() - start < 0.5  # ~3 ms for 100 files; no YAML is parsed


def test_import_does_not_parse_any_spec() -> None:
    code = ("import ncpbench, sys\nfrom ncpbench import dataset\n"
            "assert dataset.bundled.cache_info().currsize == 0\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
