"""The spec validator: every finding names file, id and field.

Reading a file never raises: size, encoding, YAML and schema problems all become findings, so a
bad file never produces a traceback. Semantic checks follow SPEC_FORMAT.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ncpbench.spec import CommitmentType, Spec, derive_links, node_refs
from ncpbench.trajectory import TrajectoryGraph

MAX_SPEC_BYTES = 256_000
"""A real spec is ~10 KB (the largest bundled one 17 KB); anything this big is a mistake or an attack,
so it is not parsed. Parsed YAML takes ~180 MB of Python objects per MB of dense input (and the
pure-Python parser, used when libyaml is missing, ~6 s per MB), so this limit is what keeps every
file within seconds and tens of MB."""

RANGES = {"initial_facts": (8, 31), "commitments": (5, 24), "trajectory": (6, 28)}


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """`spec.parse_yaml`'s safe loader (libyaml when present), except that a key repeated in one
    mapping is an error.

    Plain PyYAML keeps the last value, so a second `synopsis:` or `initial_facts:` would silently
    replace the first. Merge keys (`<<`) may still be overridden, as YAML intends.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, f"duplicate key {key_node.value!r}",
                        key_node.start_mark)
                seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def parse_unique_yaml(text: str) -> Any:
    """`spec.parse_yaml` (safe: no Python objects) that also refuses duplicate keys."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a safe loader subclass: no Python objects


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    file: str
    id: str
    field: str
    message: str
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        return f"{self.file}:{self.id}:{self.field}: {self.severity.value}: {self.message}"


class SpecError(Exception):
    """A spec that cannot be used; carries the findings that say why."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        errors = [f for f in findings if f.severity is Severity.ERROR]
        super().__init__("; ".join(str(f) for f in errors[:5]) + (" ..." if len(errors) > 5 else ""))


def read_spec_data(path: Path) -> tuple[Any, list[Finding]]:
    """Bytes -> YAML data, every failure as a finding with file `path`."""
    name = str(path)
    stem = path.stem

    def fail(message: str) -> tuple[Any, list[Finding]]:
        return None, [Finding(name, stem, "-", message)]

    try:
        size = path.stat().st_size
    except OSError as e:
        return fail(f"cannot read file: {e.strerror}")
    if size > MAX_SPEC_BYTES:
        return fail(f"file is {size} bytes, over the {MAX_SPEC_BYTES} byte limit for a spec")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return fail(f"not valid UTF-8 (byte {e.start})")
    except OSError as e:
        return fail(f"cannot read file: {e.strerror}")
    try:
        data = parse_unique_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        return fail(f"invalid YAML{where}: {problem}")
    except RecursionError:
        return fail("YAML nested too deeply")
    if not isinstance(data, dict):
        return fail(f"top level must be a mapping, got {type(data).__name__}")
    return data, []


def _item_id(data: Any, loc: tuple[int | str, ...]) -> tuple[str, str]:
    """Map a pydantic error location to (id of the offending item, field path inside it)."""
    if not loc:
        return "-", "-"
    section = str(loc[0])
    if section == "meta":
        return "meta", ".".join(str(x) for x in loc[1:]) or "meta"
    if len(loc) >= 2 and isinstance(loc[1], int):
        items = data.get(section) if isinstance(data, dict) else None
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        ident = item.get("id") if isinstance(item, dict) else None
        field = ".".join(str(x) for x in loc[2:]) or section
        return (str(ident) if ident is not None else f"{section}[{loc[1]}]"), field
    return "-", ".".join(str(x) for x in loc)


def parse_spec(data: Any, file: str) -> tuple[Spec | None, list[Finding]]:
    try:
        return Spec.model_validate(data), []
    except ValidationError as e:
        out = []
        for err in e.errors():
            ident, field = _item_id(data, tuple(err["loc"]))
            out.append(Finding(file, ident, field, err["msg"]))
        return None, out
    except RecursionError:
        return None, [Finding(file, "-", "-", "data nested too deeply")]


def check_spec(spec: Spec, file: str, expected_id: str | None = None) -> list[Finding]:
    """Semantic checks of SPEC_FORMAT.md on a schema-valid spec."""
    out: list[Finding] = []
    ours = spec.meta.slug is not None

    def err(ident: str, field: str, msg: str) -> None:
        out.append(Finding(file, ident, field, msg))

    def warn(ident: str, field: str, msg: str) -> None:
        out.append(Finding(file, ident, field, msg, Severity.WARNING))

    if expected_id is not None and spec.meta.id != expected_id:
        err("meta", "id", f"meta.id {spec.meta.id!r} does not match the file name {expected_id!r}")
    if ours and spec.meta.slug != spec.meta.id:
        err("meta", "slug", f"slug {spec.meta.slug!r} differs from id {spec.meta.id!r}")
    for field in ("id", "title", "player_role"):
        if not str(getattr(spec.meta, field)).strip():
            err("meta", field, "must not be empty")
    if not spec.meta.genres:
        err("meta", "genres", "must list at least one genre")
    if not spec.synopsis.strip():
        err("-", "synopsis", "must not be empty")

    sections: list[tuple[str, str, list[str]]] = [
        ("initial_facts", "f", [f.id for f in spec.initial_facts]),
        ("commitments", "c", [c.id for c in spec.commitments]),
        ("trajectory", "s", [n.id for n in spec.trajectory]),
    ]
    for section, prefix, items in sections:
        seen: set[str] = set()
        for i, ident in enumerate(items):
            if ident in seen:
                err(ident, "id", f"duplicate id in {section} (entry {i})")
            elif ident != f"{prefix}_{i}":
                err(ident, "id", f"expected {prefix}_{i}: ids are {prefix}_0..{prefix}_{len(items) - 1} in order")
            seen.add(ident)
        lo, hi = RANGES[section]
        if not lo <= len(items) <= hi:
            warn("-", section, f"{len(items)} entries, outside the usual {lo}-{hi}")

    for f in spec.initial_facts:
        if not f.content.strip():
            err(f.id, "content", "must not be empty")
        if f.negated:
            warn(f.id, "negated", "an initial fact is flagged negated (a double negative?)")
    texts = Counter(f.content.strip().lower() for f in spec.initial_facts)
    for f in spec.initial_facts:
        if texts[f.content.strip().lower()] > 1:
            warn(f.id, "content", "duplicate fact text")

    node_ids = set(spec.node_ids())
    for n in spec.trajectory:
        for field in ("description", "trigger_event", "key_delta"):
            if not getattr(n, field).strip():
                err(n.id, field, "must not be empty")
        for r in n.requires or []:
            if r not in node_ids:
                err(n.id, "requires", f"unknown node {r!r}")

    if not spec.achievements():
        err("-", "commitments", "no achievement commitment: an episode could never end in SUCCESS")

    dangling = False
    for c in spec.commitments:
        for field in ("description", "satisfaction_condition", "violation_condition"):
            if not getattr(c, field).strip():
                err(c.id, field, "must not be empty")
        for field, target in c.links().items():
            if target not in node_ids:
                err(c.id, field, f"links to unknown node {target!r}")
                dangling = True
        for ref in node_refs(c.prose()):
            if ref not in node_ids:
                warn(c.id, "description", f"prose names unknown node {ref!r}")
        wrong = {
            CommitmentType.ORDERING: {"from", "until", "node"},
            CommitmentType.INVARIANT: {"before", "after", "node"},
            CommitmentType.ACHIEVEMENT: {"before", "after", "from", "until"},
        }[c.type] & set(c.links())
        for field in sorted(wrong):
            err(c.id, field, f"{field!r} is not a link of an {c.type.value} commitment")
        if c.type is CommitmentType.ORDERING and (c.before is None) != (c.after is None):
            err(c.id, "before" if c.before is None else "after", "an ordering link needs both before and after")
        if c.type is CommitmentType.ORDERING and c.before is not None and c.before == c.after:
            err(c.id, "after", "before and after name the same node")
        if not c.links():
            if ours:
                err(c.id, "links", "our specs link every commitment to its plot nodes")
            else:
                warn(c.id, "links", "no node link (none could be derived from the prose)")

    if dangling or any(f.field == "requires" for f in out):
        return out  # the graph checks below need every link to resolve

    graph = TrajectoryGraph(spec)
    cycle = graph.cycle()
    if cycle:
        culprits = [graph.graph.edges[a, b]["why"] for a, b in cycle]
        ident = next((w for w in culprits if w != "requires"), "-")
        path = " -> ".join([cycle[0][0], *[b for _, b in cycle]])
        err(ident, "after" if ident != "-" else "requires",
            f"ordering contradicts the plot graph (cycle {path})")
    else:
        for c in spec.commitments:
            if c.type is CommitmentType.INVARIANT and c.from_ and c.until and graph.is_ancestor(c.until, c.from_):
                err(c.id, "until", f"window ends at {c.until} before it starts at {c.from_}")
    return out


def validate_file(path: Path, *, published: bool | None = None) -> tuple[Spec | None, list[Finding]]:
    """Read, parse and check one spec file; the spec is returned only when it has no errors.

    Published files (no meta.slug) get their links derived from prose before checking.
    """
    data, findings = read_spec_data(path)
    if data is None:
        return None, findings
    spec, findings = parse_spec(data, str(path))
    if spec is None:
        return None, findings
    if spec.meta.slug is None and published is not False:
        spec, _ = derive_links(spec)
    findings = check_spec(spec, str(path), expected_id=path.stem)
    if any(f.severity is Severity.ERROR for f in findings):
        return None, findings
    return spec, findings


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.ERROR]
