"""`ncpbench lint` as a specification: for each rule a small bad spec it catches and a good one it passes.

Every spec here is the tiny fixture with one change. `clean` is the fixture made lint-clean (its
s_1 key delta said "Mara knows ...", a mental state of the player character).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ncpbench.commitments import Status
from ncpbench.lint import RULES, LintFinding, lint_file, lint_spec, player_names, replay_reference
from ncpbench.spec import Commitment, Spec, dump_yaml
from ncpbench.validation import Severity


@pytest.fixture
def clean(tiny: Spec) -> Spec:
    return node(tiny, "s_1", key_delta="The cellar door stands unlocked.")


def node(spec: Spec, nid: str, **change: Any) -> Spec:
    return spec.model_copy(update={"trajectory": [n.model_copy(update=change) if n.id == nid else n
                                                  for n in spec.trajectory]})


def commitment(spec: Spec, cid: str, **change: Any) -> Spec:
    return spec.model_copy(update={"commitments": [c.model_copy(update=change) if c.id == cid else c
                                                   for c in spec.commitments]})


def add(spec: Spec, **fields: Any) -> Spec:
    c = Commitment.model_validate({"id": f"c_{len(spec.commitments)}", **fields})
    return spec.model_copy(update={"commitments": [*spec.commitments, c]})


def found(spec: Spec, rule: str) -> list[tuple[str, str, Severity]]:
    return [(f.id, f.field, f.severity) for f in lint_spec(spec, "x.yaml", [rule])]


def messages(spec: Spec, rule: str) -> str:
    return "\n".join(str(f) for f in lint_spec(spec, "x.yaml", [rule]))


def test_the_clean_fixture_passes_every_rule(clean: Spec) -> None:
    assert lint_spec(clean, "x.yaml") == []


def test_a_finding_is_a_validator_finding_that_names_its_rule(tiny: Spec) -> None:
    (f,) = lint_spec(tiny, "tiny.yaml")
    assert isinstance(f, LintFinding) and f.rule == "player-mind" and f.severity is Severity.WARNING
    assert str(f).startswith("tiny.yaml:s_1:key_delta: warning: ") and str(f).endswith(" [player-mind]")
    assert "'Mara' 'knows'" in str(f)
    with pytest.raises(ValueError, match="unknown lint rule"):
        lint_spec(tiny, rules=["no-such-rule"])


# -- player-mind ---------------------------------------------------------------------------------


def test_player_mind_catches_thoughts_decisions_and_words_of_the_player(clean: Spec) -> None:
    bad = node(clean, "s_2", trigger_event="Mara finally decides to open the vault.")
    bad = commitment(bad, "c_0", violation_condition="Mara says she has opened the vault before s_1.")
    bad = commitment(bad, "c_1", satisfaction_condition="Mara and Ewan believe the key is safe until s_2.")
    assert found(bad, "player-mind") == [("s_2", "trigger_event", Severity.WARNING),
                                         ("c_0", "violation_condition", Severity.WARNING),
                                         ("c_1", "satisfaction_condition", Severity.WARNING)]
    text = messages(bad, "player-mind")
    assert "'Mara' 'decides'" in text and "mental state" in text
    assert "'Mara' 'says'" in text and "speech act" in text and "'Mara' 'believe'" in text


def test_player_mind_passes_what_others_do_to_the_player_and_what_the_world_shows(clean: Spec) -> None:
    good = node(clean, "s_1", trigger_event="Ewan tells Mara which door the key opens.",
                key_delta="Mara's uncle's letter, which says the key opens the cellar, is in her hands.")
    good = commitment(good, "c_0", violation_condition="Mara is told about the vault and opens it before s_1.")
    good = commitment(good, "c_1", satisfaction_condition="Nobody knows where Mara keeps the key until s_2.")
    good = node(good, "s_2", key_delta="Ewan holds a recording of what Mara said on the pier.")
    good = commitment(good, "c_3", violation_condition="Before s_3 the narration shows Mara told where the lens "
                                                      "is hidden.")
    assert found(good, "player-mind") == []
    assert found(node(good, "s_1", trigger_event="Mara tells Ewan which door the key opens."), "player-mind")


def test_player_mind_matches_the_full_name_first_name_and_surname_but_not_a_relative(clean: Spec) -> None:
    spec = clean.model_copy(update={"meta": clean.meta.model_copy(update={"player_role": "Dr. Mara Quill"})})
    assert player_names("Dr. Mara Quill") == (["Dr. Mara Quill", "Mara Quill", "Quill", "Mara"], {"Mara", "Quill"})
    assert player_names("Sam 'Ace' Rothstein")[1] == {"Sam", "Ace", "Rothstein"}
    bad = node(spec, "s_2", key_delta="Quill knows what the vault holds.")
    assert found(bad, "player-mind") == [("s_2", "key_delta", Severity.WARNING)]
    other = node(spec, "s_2", key_delta="Edwin Quill knows what the vault holds.")
    assert found(other, "player-mind") == []


# -- impossible-ordering -------------------------------------------------------------------------


def test_impossible_ordering_catches_self_reversed_and_mirrored_orderings(clean: Spec) -> None:
    same = commitment(clean, "c_0", before="s_2", after="s_2")
    assert found(same, "impossible-ordering") == [("c_0", "after", Severity.ERROR)]
    reversed_ = commitment(clean, "c_0", before="s_2", after="s_1")
    assert found(reversed_, "impossible-ordering") == [("c_0", "before", Severity.ERROR)]
    mirror = commitment(clean, "c_0", satisfaction_condition="s_1 is narrated before s_2.",
                        violation_condition="s_2 is narrated before s_1.")
    assert found(mirror, "impossible-ordering") == [("c_0", "violation_condition", Severity.WARNING)]
    assert "only restates the satisfaction" in messages(mirror, "impossible-ordering")


def test_impossible_ordering_passes_an_ordering_whose_violation_is_a_story_event(clean: Spec) -> None:
    # c_0 orders adjacent nodes, but its violation says what breaking it looks like.
    assert clean.commitments[0].violation_condition == "Mara opens the vault before s_1."
    assert found(clean, "impossible-ordering") == []
    far = commitment(clean, "c_0", before="s_0", after="s_2", satisfaction_condition="s_0 is narrated before s_2.",
                     violation_condition="s_2 is narrated before s_0.")
    assert found(far, "impossible-ordering") == []  # not adjacent: a mirror is not flagged
    assert found(commitment(far, "c_0", before="s_1"), "impossible-ordering")  # the same mirror, adjacent


# -- missing-link --------------------------------------------------------------------------------


def test_missing_link_catches_commitments_without_the_links_their_type_needs(clean: Spec) -> None:
    bad = commitment(clean, "c_3", node=None)
    bad = commitment(bad, "c_0", after=None)
    bad = commitment(bad, "c_1", until=None)
    assert sorted(found(bad, "missing-link")) == [("c_0", "after", Severity.ERROR), ("c_1", "until", Severity.ERROR),
                                                  ("c_3", "node", Severity.ERROR)]


def test_missing_link_allows_an_invariant_with_only_one_end(clean: Spec) -> None:
    assert clean.commitments[1].from_ is None and clean.commitments[1].until == "s_2"
    opened = add(clean, type="invariant", description="The lamp stays lit from s_3.",
                 satisfaction_condition="The beam keeps turning after s_3.",
                 violation_condition="The lamp goes out after s_3.", **{"from": "s_3"})
    assert found(opened, "missing-link") == []
    assert found(commitment(opened, "c_4", from_=None), "missing-link") == [("c_4", "until", Severity.ERROR)]


# -- after-exit ----------------------------------------------------------------------------------


def test_after_exit_catches_nodes_and_links_after_the_player_leaves(clean: Spec) -> None:
    bad = node(clean, "s_2", exit=True)
    assert found(bad, "after-exit") == [("s_3", "id", Severity.ERROR), ("c_3", "node", Severity.ERROR)]
    worded = node(clean, "s_2", key_delta="Mara is killed when the vault floor gives way.")
    assert found(worded, "after-exit") == [("s_2", "key_delta", Severity.WARNING)]
    assert "'Mara is killed'" in messages(worded, "after-exit") and "s_3 follows it" in messages(worded, "after-exit")


def test_after_exit_passes_an_exit_on_the_final_node_and_other_peoples_deaths(clean: Spec) -> None:
    good = node(clean, "s_3", exit=True, key_delta="The lighthouse works and Mara leaves the island for good.")
    assert found(good, "after-exit") == []
    other = node(clean, "s_2", key_delta="Ewan is killed when the vault floor gives way.")
    assert found(other, "after-exit") == []
    assert found(node(good, "s_2", exit=True), "after-exit")  # the same exit one node earlier


# -- replay --------------------------------------------------------------------------------------


def test_replay_of_the_fixture_reaches_success_in_plot_order(clean: Spec) -> None:
    result = replay_reference(clean)
    assert result.success and result.ended_by == "success" and result.ended_at == "s_3"
    assert result.order == ["s_0", "s_1", "s_2", "s_3"] and result.unreached == []
    assert set(result.statuses.values()) == {Status.SATISFIED}
    assert found(clean, "replay") == []
    assert found(commitment(clean, "c_3", node=None), "replay")


def test_replay_catches_a_violated_ordering_and_a_plot_without_success(clean: Spec) -> None:
    # s_1 and s_2 both follow s_0; the plot replays s_1 first, so "s_2 before s_1" is broken.
    branches = node(node(node(clean, "s_1", requires=["s_0"]), "s_2", requires=["s_0"]), "s_3",
                    requires=["s_1", "s_2"])
    bad = commitment(branches, "c_0", before="s_2", after="s_1")
    result = replay_reference(bad)
    assert result.violated() == ["c_0"] and result.success
    assert ("c_0", "after", Severity.ERROR) in found(bad, "replay")
    unreachable = commitment(clean, "c_3", node=None)
    assert not replay_reference(unreachable).success
    assert found(unreachable, "replay") == [("-", "commitments", Severity.ERROR)]


def test_replay_warns_when_success_comes_before_the_plot_ends(clean: Spec) -> None:
    early = commitment(clean, "c_3", node="s_2")
    early = add(early, type="ordering", description="The vault opens (s_2) before the lamp is lit (s_3).",
                satisfaction_condition="The lens is in the lamp room when the beam first turns.",
                violation_condition="The beam turns before anyone has the lens.", before="s_2", after="s_3")
    result = replay_reference(early)
    assert result.success and result.ended_at == "s_2" and result.unreached == ["s_3"]
    assert result.unsettled() == ["c_4"]
    assert found(early, "replay") == [("c_4", "after", Severity.WARNING), ("c_3", "node", Severity.WARNING)]


def test_replay_stops_where_the_player_leaves(clean: Spec) -> None:
    result = replay_reference(node(clean, "s_2", exit=True))
    assert result.ended_by == "exit" and not result.success and result.unreached == ["s_3"]
    assert result.statuses["c_3"] is Status.PENDING
    assert found(node(clean, "s_2", exit=True), "replay") == [("-", "commitments", Severity.ERROR)]


# -- conditions, future-fact, duplicate-node, version --------------------------------------------


def test_conditions_catches_identical_satisfaction_and_violation(clean: Spec) -> None:
    bad = commitment(clean, "c_2", violation_condition="s_0 completes.")
    assert found(bad, "conditions") == [("c_2", "violation_condition", Severity.ERROR)]
    assert found(clean, "conditions") == []


def test_future_fact_catches_a_prediction_but_not_a_will_or_a_report(clean: Spec) -> None:
    facts = list(clean.initial_facts)
    bad = clean.model_copy(update={"initial_facts": [*facts[:3], facts[3].model_copy(
        update={"content": "The lighthouse will be lit again by Mara."})]})
    assert found(bad, "future-fact") == [("f_3", "content", Severity.WARNING)]
    good = clean.model_copy(update={"initial_facts": [*facts[:2], facts[2].model_copy(
        update={"content": "Mara does not know who will meet her on the pier."}), facts[3].model_copy(
        update={"content": "Mara's uncle left her the key in his will."})]})
    assert found(good, "future-fact") == []


def test_duplicate_node_catches_a_repeated_event(clean: Spec) -> None:
    bad = node(clean, "s_3", key_delta="The lamp's missing lens is in Mara's hands.")
    assert found(bad, "duplicate-node") == [("s_3", "key_delta", Severity.WARNING)]
    assert "the same key_delta as s_2" in messages(bad, "duplicate-node")
    assert found(clean, "duplicate-node") == []


def test_version_catches_a_negative_version(clean: Spec) -> None:
    bad = clean.model_copy(update={"meta": clean.meta.model_copy(update={"version": -1})})
    assert found(bad, "version") == [("meta", "version", Severity.ERROR)]
    assert found(clean.model_copy(update={"meta": clean.meta.model_copy(update={"version": 3})}), "version") == []


def test_every_rule_is_covered_here() -> None:
    here = Path(__file__).read_text(encoding="utf-8")
    assert all(f'"{rule}")' in here for rule in RULES)


# -- files and the command -----------------------------------------------------------------------


def write(tmp_path: Path, spec: Spec, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_yaml(spec), encoding="utf-8")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ncpbench", "lint", *args], capture_output=True, text=True,
                          timeout=120)


def test_lint_file_returns_the_validator_errors_of_an_invalid_spec(tmp_path: Path, clean: Spec) -> None:
    bad = commitment(clean, "c_3", node="s_9")
    spec, findings = lint_file(write(tmp_path, bad))
    assert spec is None and findings and all(not isinstance(f, LintFinding) for f in findings)
    (tmp_path / "ok").mkdir()
    spec, findings = lint_file(write(tmp_path / "ok", clean))
    assert spec is not None and findings == []


def test_the_command_prints_findings_a_summary_and_fails_on_warnings_only_when_strict(tmp_path: Path,
                                                                                      tiny: Spec) -> None:
    path = write(tmp_path, tiny)
    out = run(str(path))
    assert out.returncode == 0, out.stderr
    assert f"{path}:s_1:key_delta: warning:" in out.stdout
    assert "1 files linted: 0 clean, 0 errors, 1 warnings (player-mind 1)" in out.stdout
    assert run("--strict", str(path)).returncode == 1
    only = run("--strict", "--rule", "replay", str(tmp_path))
    assert only.returncode == 0 and "1 clean" in only.stdout


def test_the_command_fails_on_lint_errors(tmp_path: Path, clean: Spec) -> None:
    out = run(str(write(tmp_path, commitment(clean, "c_2", violation_condition="s_0 completes."))))
    assert out.returncode == 1 and "[conditions]" in out.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, clean: Spec) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("meta: [unclosed\n", encoding="utf-8")
    for args, text in (([str(tmp_path / "missing.yaml")], "no such file or folder"),
                       ([str(broken)], "invalid YAML at line")):
        out = run(*args)
        assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and text in out.stderr
    assert run(str(broken), str(write(tmp_path, clean))).returncode == 2


def test_lint_is_a_registered_subcommand() -> None:
    import argparse

    from ncpbench.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "lint" in sub.choices

