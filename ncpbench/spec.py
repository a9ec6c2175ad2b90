"""The environment spec: the published NCP-Bench format plus our structured links.

Pure data (pydantic models) and YAML (de)serialisation. Loading whole folders lives in
`dataset`; checking a spec's meaning lives in `validation`. Structured links missing from a
published file are derived from its prose here (`derive_links`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

NODE_REF = re.compile(r"\bs_(\d+)\b")


class SpecModel(BaseModel):
    # Unknown keys are errors: a typo in a field name must not silently drop data.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Meta(SpecModel):
    id: str
    """Equals the file name (published: movieNN; ours: the slug)."""
    title: str
    genres: list[str]
    player_role: str
    """The character the player plays."""
    slug: str | None = None
    """Our extension: the roster slug."""
    source_id: str | None = None
    """Our extension: the published id of the same film."""
    version: int = 0
    """Our extension: the environment's version, the `-vN` of its Gymnasium id. Bumped whenever a
    revision changes what a narration must do to pass, so scores of different versions never mix."""


class Fact(SpecModel):
    id: str
    content: str
    negated: bool = False


class CommitmentType(StrEnum):
    INVARIANT = "invariant"
    ORDERING = "ordering"
    ACHIEVEMENT = "achievement"


class Commitment(SpecModel):
    id: str
    type: CommitmentType
    description: str
    satisfaction_condition: str
    violation_condition: str
    before: str | None = None
    """ordering: the node that must complete first."""
    after: str | None = None
    """ordering: the node that may start only once `before` completed."""
    from_: str | None = Field(default=None, alias="from")
    """invariant: window start (None = from the beginning)."""
    until: str | None = None
    """invariant: window end (None = to the end of the story)."""
    node: str | None = None
    """achievement: the node whose completion achieves it."""

    def links(self) -> dict[str, str]:
        """The structured links present, keyed by their YAML field name."""
        pairs = {"before": self.before, "after": self.after, "from": self.from_, "until": self.until,
                 "node": self.node}
        return {k: v for k, v in pairs.items() if v is not None}

    def prose(self) -> str:
        return " ".join((self.description, self.satisfaction_condition, self.violation_condition))


class Node(SpecModel):
    id: str
    description: str
    trigger_event: str
    key_delta: str
    requires: list[str] | None = None
    """Predecessors; None = the previous node in list order (a linear plot)."""
    exit: bool = False
    """Our extension: the player character leaves the story in this node (dies, departs for good).
    Nothing can be witnessed after it, so no node may follow it and no commitment may depend on a later one."""


class Spec(SpecModel):
    meta: Meta
    synopsis: str
    initial_facts: list[Fact]
    commitments: list[Commitment]
    trajectory: list[Node]

    @property
    def key(self) -> str:
        """The name users type: our slug, or the published id."""
        return self.meta.slug or self.meta.id

    def node_ids(self) -> list[str]:
        return [n.id for n in self.trajectory]

    def achievements(self) -> list[Commitment]:
        return [c for c in self.commitments if c.type is CommitmentType.ACHIEVEMENT]


def spec_to_data(spec: Spec) -> dict[str, Any]:
    """Plain data in the file's field order, omitting absent optional links."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not data["meta"].get("version"):
        data["meta"].pop("version", None)
    for node in data["trajectory"]:
        if not node.get("exit"):
            node.pop("exit", None)
    return data


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = ">" if "\n" not in value and len(value) > 200 else None
    if "\n" in value:
        style = "|"
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_yaml(spec: Spec) -> str:
    return yaml.dump(spec_to_data(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


# libyaml's safe loader when PyYAML has it (about 10x faster; it also caps nesting depth).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """Safe YAML only: tags that would construct Python objects are rejected by the safe loader."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def node_refs(text: str) -> list[str]:
    """Distinct s_N references in order of first mention."""
    seen: list[str] = []
    for m in NODE_REF.finditer(text):
        ref = f"s_{m.group(1)}"
        if ref not in seen:
            seen.append(ref)
    return seen


_UNTIL_WORDS = re.compile(r"\b(until|till|before|up to|through|prior to|by)\s+(?:the\s+)?(?:node\s+)?s_(\d+)\b", re.I)
_FROM_WORDS = re.compile(r"\b(after|from|once|since|following|beginning (?:at|with))\s+(?:the\s+)?(?:node\s+)?s_(\d+)\b", re.I)


def derive_links(spec: Spec) -> tuple[Spec, list[str]]:
    """Fill missing structured links from the prose; return the new spec and the ids not derived.

    Published prose names nodes in either order, so links go by plot position, not by mention.
    """
    position = {nid: i for i, nid in enumerate(spec.node_ids())}
    new: list[Commitment] = []
    underived: list[str] = []
    for c in spec.commitments:
        if c.links():
            new.append(c)
            continue
        refs = sorted((r for r in node_refs(c.prose()) if r in position), key=position.__getitem__)
        update: dict[str, str] = {}
        if c.type is CommitmentType.ORDERING and len(refs) >= 2:
            update = {"before": refs[0], "after": refs[-1]}
        elif c.type is CommitmentType.INVARIANT and len(refs) >= 2:
            update = {"from_": refs[0], "until": refs[-1]}
        elif c.type is CommitmentType.INVARIANT and len(refs) == 1:
            text = c.prose()
            until = {f"s_{m.group(2)}" for m in _UNTIL_WORDS.finditer(text)}
            start = {f"s_{m.group(2)}" for m in _FROM_WORDS.finditer(text)}
            if until and not start:
                update = {"until": refs[0]}
            elif start and not until:
                update = {"from_": refs[0]}
        elif c.type is CommitmentType.ACHIEVEMENT and len(refs) == 1:
            update = {"node": refs[0]}
        if update:
            new.append(c.model_copy(update=update))
        else:
            new.append(c)
            underived.append(c.id)
    return spec.model_copy(update={"commitments": new}), underived
