"""What each audit stage must answer: pydantic models, sent to the model as JSON schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.models.client import schema_of


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


# Length caps are part of the schema: a grammar-constrained backend cannot run away, and any
# other backend's runaway answer is invalid (and re-asked) instead of flooding the state.
SHORT = 300


Fact = Annotated[str, Field(max_length=SHORT)]
Ident = Annotated[str, Field(max_length=80)]


class FactUpdateOutput(_Out):
    add: list[Fact] = Field(description="New atomic facts the reply clearly establishes", max_length=8)
    negate: list[str] = Field(description="Ids (f_N) of active facts the reply clearly makes false", max_length=8)


class ClaimedConflict(_Out):
    kind: Literal["fact", "commitment", "player_input"]
    target: str | None = Field(description="The fact id or commitment id broken; null for player_input")
    evidence: str = Field(description="An exact quote from the narrator reply", max_length=SHORT)
    reason: str = Field(max_length=SHORT)


class ConflictCheckOutput(_Out):
    conflicts: list[ClaimedConflict] = Field(max_length=3)


class Decision(_Out):
    claim: int = Field(description="The claim number being judged")
    confirmed: bool
    reason: str = Field(max_length=SHORT)
    evidence: str | None = Field(default=None, description="A corrected exact quote, if the claim's quote was wrong",
                                 max_length=SHORT)


class DoubleCheckOutput(_Out):
    decisions: list[Decision] = Field(max_length=4)


class TrajectoryOutput(_Out):
    completed: list[str] = Field(description="Ids of frontier nodes whose trigger and key delta both happened",
                                 max_length=4)
    evidence: str = Field(default="", max_length=SHORT)


class NodeJudgement(_Out):
    node: str = Field(description="The current node's id")
    trigger_happened: bool = Field(description="Its trigger event has explicitly happened in the story so far")
    key_delta_happened: bool = Field(description="Its key delta has explicitly happened in the story so far")
    evidence: str = Field(default="", description="A short quote or turn reference that shows it", max_length=SHORT)


class StatusUpdate(_Out):
    id: str
    status: Literal["SATISFIED", "PENDING"]
    evidence: list[Ident] = Field(default_factory=list, description="Fact ids or node ids that show it", max_length=6)


class StatusOutput(_Out):
    updates: list[StatusUpdate] = Field(max_length=8)


def narrowed(model: type[BaseModel], enums: dict[tuple[str, str], list[str]],
             nullable: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset()
             ) -> dict[str, Any]:
    """`model`'s JSON schema with some string fields limited to the given values.

    Keys are (definition name, property); the definition is `model` itself or one in its $defs.
    A list property gets the enum on its items.
    """
    schema = schema_of(model)
    for (definition, prop), values in enums.items():
        target = schema if definition == model.__name__ else schema["$defs"][definition]
        enum: dict[str, Any] = {"type": "string", "enum": values} if values else {"type": "null"}
        if (definition, prop) in nullable and values:
            enum = {"anyOf": [enum, {"type": "null"}]}
        field = target["properties"][prop]
        if field.get("type") == "array":
            field["items"] = enum
            if not values:
                field["maxItems"] = 0
        else:
            description = field.get("description")
            target["properties"][prop] = {**enum, **({"description": description} if description else {})}
    return schema


class StatusJudgement(_Out):
    status: Literal["SATISFIED", "PENDING"]
    evidence: list[Ident] = Field(default_factory=list, description="Fact ids or node ids that show it", max_length=6)


class StatusJudgements(_Out):
    """The published status check: every listed commitment judged, SATISFIED or PENDING.

    An object keyed by commitment id, not a list: the schema sent (`judgement_schema`) requires each
    listed id exactly once, so a grammar-constrained backend cannot skip or repeat one."""

    judgements: dict[str, StatusJudgement] = Field(max_length=40)


def judgement_schema(ids: list[str]) -> dict[str, Any]:
    """StatusJudgements' JSON schema with one required property per listed commitment id."""
    schema = schema_of(StatusJudgements)
    ref = {"$ref": "#/$defs/StatusJudgement"}
    schema["properties"]["judgements"] = {"type": "object", "properties": {i: ref for i in ids},
                                          "required": list(ids), "additionalProperties": False}
    return schema


def claim_schema(fact_ids: list[str], commitment_ids: list[str]) -> dict[str, Any]:
    """ConflictCheckOutput's JSON schema with each claim's target tied to its kind: a fact claim names
    a fact id, a commitment claim a commitment id, a player_input claim null. Sent as a choice of three
    shapes, so a grammar-constrained backend cannot pair a kind with the wrong id (we still check)."""
    schema = schema_of(ConflictCheckOutput)
    base = schema["$defs"]["ClaimedConflict"]

    def shape(kind: str, target: dict[str, Any]) -> dict[str, Any]:
        props = {**base["properties"], "kind": {"type": "string", "enum": [kind]}, "target": target}
        return {"type": "object", "properties": props, "required": base["required"], "additionalProperties": False}

    def ids(values: list[str]) -> dict[str, Any]:
        return {"type": "string", "enum": values} if values else {"type": "null"}

    schema["$defs"]["ClaimedConflict"] = {"anyOf": [shape("fact", ids(fact_ids)),
                                                    shape("commitment", ids(commitment_ids)),
                                                    shape("player_input", {"type": "null"})]}
    return schema
