"""Every bundled film: its reference plot, played faithfully in order, reaches SUCCESS without breaking
a commitment, `ncpbench lint --strict` finds nothing, and the set keeps the published proportions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ncpbench.dataset import bundled
from ncpbench.lint import lint_spec, replay_reference
from ncpbench.registry import bundled_slugs


@pytest.mark.parametrize("slug", bundled_slugs())
def test_the_reference_plot_reaches_success_and_breaks_nothing(slug: str) -> None:
    spec = bundled()[slug]
    result = replay_reference(spec)
    assert result.success, result.reasons
    assert result.violated() == [] and result.unsettled() == [], result.reasons
    assert result.unreached == []


@pytest.mark.parametrize("slug", bundled_slugs())
def test_lint_finds_nothing(slug: str) -> None:
    spec = bundled()[slug]
    assert [str(f) for f in lint_spec(spec, f"{slug}.yaml")] == []


def test_lint_strict_passes_on_the_bundled_films() -> None:
    out = subprocess.run([sys.executable, "-m", "ncpbench", "lint", "--strict"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 errors, 0 warnings" in out.stdout


def test_the_bundled_set_keeps_the_published_sizes_and_kinds() -> None:
    specs = list(bundled().specs.values())
    assert len(specs) == 100
    mean = {name: sum(len(getattr(s, name)) for s in specs) / len(specs)
            for name in ("initial_facts", "commitments", "trajectory")}
    assert mean["initial_facts"] >= 16 and mean["commitments"] >= 12 and mean["trajectory"] >= 15, mean
    for s in specs:
        assert {c.type.value for c in s.commitments} == {"invariant", "ordering", "achievement"}, s.key
        assert len(s.achievements()) >= 2, s.key


def test_the_revised_films_are_version_one_and_the_changelog_lists_every_one() -> None:
    from pathlib import Path

    changelog = (Path(__file__).resolve().parent.parent / "docs" / "ENVIRONMENT_CHANGES.md").read_text()
    for slug, spec in bundled().specs.items():
        assert spec.meta.version == 1, slug
        assert f"## {slug} (v0 -> v1)" in changelog, f"{slug} is missing from docs/ENVIRONMENT_CHANGES.md"
