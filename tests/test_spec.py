from __future__ import annotations

import shutil
from pathlib import Path

from conftest import FIXTURES

from ncpbench import load
from ncpbench.dataset import bundled, load_folder
from ncpbench.spec import Spec, derive_links, dump_yaml, parse_yaml


def test_yaml_round_trip_is_lossless(tiny: Spec) -> None:
    again = Spec.model_validate(parse_yaml(dump_yaml(tiny)))
    assert again == tiny
    assert dump_yaml(again) == dump_yaml(tiny)


def test_every_bundled_spec_round_trips_through_yaml() -> None:
    for spec in bundled():
        assert Spec.model_validate(parse_yaml(dump_yaml(spec))) == spec


def test_from_link_uses_its_yaml_name(tiny: Spec) -> None:
    data = parse_yaml(dump_yaml(tiny.model_copy(update={"commitments": [
        tiny.commitments[1].model_copy(update={"from_": "s_0"})]})))
    assert data["commitments"][0]["from"] == "s_0"
    assert "from_" not in data["commitments"][0]


def test_published_folder_loads_with_links_derived_by_plot_position() -> None:
    ds = load(FIXTURES / "published")
    spec = ds["movie90"]
    c = {x.id: x for x in spec.commitments}
    # "s_2 occurs only after s_1": named later node first; derived by position, not mention.
    assert (c["c_0"].before, c["c_0"].after) == ("s_1", "s_2")
    assert (c["c_1"].from_, c["c_1"].until) == (None, "s_2")
    assert (c["c_2"].from_, c["c_2"].until) == ("s_0", "s_3")
    assert c["c_3"].node == "s_3"
    assert c["c_4"].links() == {}


def test_derive_links_reports_what_it_could_not_derive() -> None:
    spec = load(FIXTURES / "published")["movie90"]
    raw = spec.model_copy(update={"commitments": [c.model_copy(update={
        "before": None, "after": None, "from_": None, "until": None, "node": None}) for c in spec.commitments]})
    _, underived = derive_links(raw)
    assert underived == ["c_4"]


def test_published_loader_warns_about_negated_initial_fact_and_missing_links() -> None:
    ds = load(FIXTURES / "published")
    messages = {(f.id, f.field): f.message for f in ds.findings}
    assert "negated" in messages[("f_1", "negated")]
    assert ("c_4", "links") in messages


def test_our_folder_without_index_loads_every_yaml(tmp_path: Path, tiny: Spec) -> None:
    shutil.copy(FIXTURES / "tiny.yaml", tmp_path / "tiny.yaml")
    ds = load_folder(tmp_path)
    assert list(ds.specs) == ["tiny"]
    assert ds["tiny"] == tiny


def test_bundled_environments_follow_the_index_order() -> None:
    index = parse_yaml((Path(bundled().root) / "index.yaml").read_text())["environments"]
    assert list(bundled().specs) == index
