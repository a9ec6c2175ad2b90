"""The planted-conflict suite: labelled audit cases generated from the environment specs.

Every case is one reply to audit: an `EpisodeState` built with the pure state functions (the
opening, 1–3 committed exchanges, some plot nodes completed, the facts those turns established),
a player action, a narrator reply, and a gold label. The reply is templated in our own words from
the spec's fact contents, node trigger events / key deltas and commitment violation conditions,
and the label follows from how the reply was built — never from a model.

Categories (equal shares; the case index decides the category, so any prefix is balanced):

    clean                   acknowledges the action; idles, completes the frontier node, or only
                            foreshadows it
    fact_contradiction      states the negation of an active fact with no in-story cause
    step_skip               narrates a later node's trigger and key delta before an ordering
                            commitment's `before` node
    invariant_break         narrates an open invariant's violation condition (secrets first)
    action_ignored          ignores or rewrites the player's action
    action_blocked          refuses the action with no in-story reason
    hn_blocked_with_reason  refuses the action, with a reason inside the story   (hard negative)
    hn_fact_event           changes an established fact through an explicit event (hard negative)
    hn_rumour               a rumour near a guarded secret that confirms nothing  (hard negative)

Long-range categories (opt-in: `generate_suite(..., long_range=M)` appends M of them, in rotation,
after the n cases above, so no existing index moves):

    long_fact_ledger        contradicts a detail narrated in turn 1-2 and committed as a fact,
                            10-14 committed turns of unrelated narration before the reply
    long_fact_narration     the same, but the early turn's fact update added nothing: the detail
                            lives only in the narration
    hn_long_consistent      the same long history (either variant), a reply consistent with the
                            early detail                                        (hard negative)

They measure what an audit context that drops old exchanges (`compact`) costs in recall.

Deterministic: case i depends only on (seed, i, the spec list), so the same seed gives identical
cases and `generate_suite(specs, 40, s)` is a prefix of `generate_suite(specs, 540, s)`; long-range
case j depends only on (seed, j, the spec list).
See docs/AUDITOR_VALIDITY.md for the construction and why each label holds.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.commitments import Status, structural_updates
from ncpbench.jsonl import write_jsonl
from ncpbench.ledger import FactDiff
from ncpbench.protocol import DEFAULT_PROTOCOL, GROUNDED, AuditProtocol, apply_turn
from ncpbench.protocols import AuditRequest
from ncpbench.spec import Commitment, CommitmentType, Node, Spec
from ncpbench.state import EpisodeState
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import ConflictKind, Verdict

CATEGORIES: tuple[str, ...] = (
    "clean", "fact_contradiction", "step_skip", "invariant_break", "action_ignored", "action_blocked",
    "hn_blocked_with_reason", "hn_fact_event", "hn_rumour",
)
CLEAN_CATEGORIES = ("clean", "hn_blocked_with_reason", "hn_fact_event", "hn_rumour")
"""Categories whose gold label has no conflict: the controls for the false-positive rate."""
HARD_NEGATIVES = ("hn_blocked_with_reason", "hn_fact_event", "hn_rumour")
LONG_RANGE_CATEGORIES: tuple[str, ...] = ("long_fact_ledger", "long_fact_narration", "hn_long_consistent")
"""Opt-in (`long_range=M`): an early detail, >= 10 committed turns of unrelated narration, then the reply."""
ALL_CATEGORIES = CATEGORIES + LONG_RANGE_CATEGORIES
LONG_CLEAN = ("hn_long_consistent",)
LONG_GAP = (10, 14)
"""Committed turns of unrelated narration between the detail's turn and the reply (inclusive range)."""
DEFAULT_CASES = 60 * len(CATEGORIES)
"""540: sixty per category."""
MAX_ATTEMPTS = 64
"""Specs tried per case before giving up (a category some specs cannot host moves to the next spec)."""


class GenerationError(ValueError):
    """No spec in the list can host a case of some category (e.g. a spec set with no invariants)."""


# -- the data ------------------------------------------------------------------------------------


class Gold(BaseModel):
    """The label, known from construction."""

    model_config = ConfigDict(frozen=True)

    kinds: list[ConflictKind] = Field(default_factory=list)
    """Conflict kinds the auditor must confirm (empty = a clean reply)."""
    targets: dict[str, list[str]] = Field(default_factory=dict)
    """Per kind, the ids a correct claim may name (the planted one first)."""
    tolerated: list[ConflictKind] = Field(default_factory=list)
    """Kinds a careful auditor may also claim (a skipped plot event can contradict a fact too):
    claiming one is neither a hit nor a false alarm."""
    completes: bool = False
    """Whether the frontier node completes with this reply."""
    satisfied: list[str] = Field(default_factory=list)
    """Commitments that become SATISFIED if the reply is committed (the plot graph proves them)."""
    why: str
    """One sentence on why the label holds."""

    @property
    def is_clean(self) -> bool:
        return not self.kinds


class AuditCase(BaseModel):
    """One labelled reply to audit."""

    model_config = ConfigDict(frozen=True)

    id: str
    index: int
    category: str
    variant: str
    env_id: str
    state: EpisodeState
    player_action: str
    reply: str
    frontier: tuple[str, ...]
    frontier_node: str | None
    """The node a clean reply may complete (the first frontier node in plot order)."""
    planted: str = ""
    """The sentence that carries the violation (or the hard negative's bait); empty for clean."""
    gold: Gold
    detail: str = ""
    """Long-range cases: the early narrated sentence the reply contradicts (or agrees with)."""
    detail_turn: int | None = None
    """Long-range cases: the committed turn that narrated `detail` (1 or 2)."""

    @property
    def detail_distance(self) -> int | None:
        """Turns from the detail's turn to the reply under audit (state.turn + 1 - detail_turn)."""
        return None if self.detail_turn is None else self.state.turn + 1 - self.detail_turn

    def request(self, spec: Spec, protocol: AuditProtocol | None = None) -> AuditRequest:
        """The audit request; `protocol` (default: the published preset) decides the audit context."""
        return AuditRequest(spec=spec, state=self.state, player_action=self.player_action, reply=self.reply,
                            frontier=self.frontier, protocol=protocol or DEFAULT_PROTOCOL)


# -- the player's actions and the replies that go with them --------------------------------------


@dataclass(frozen=True)
class Action:
    act: str
    """The player's first-person action."""
    ack: str
    """A reply that carries it out."""
    rewrite: str
    """A reply that makes the character do something else."""
    ignore: str
    """A reply that says nothing about it."""
    block_bare: str
    """A refusal with no reason."""
    block_reason: str
    """A refusal with a reason inside the story."""


ACTIONS: tuple[Action, ...] = (
    Action("I ask the person nearest to me, out loud, what they are hiding from me.",
           "You ask the question out loud. The person nearest to you meets your eyes, says they are hiding "
           "nothing, and goes back to what they were doing.",
           "You decide to say nothing at all and keep your question to yourself.",
           "A long, uneventful moment passes. Somewhere in the distance a door bangs shut.",
           "You open your mouth to ask, but you cannot. Nothing happens.",
           "You turn to ask, but the person nearest to you has already hurried out of earshot, so the "
           "question has to wait."),
    Action("I sit down for a moment and catch my breath.",
           "You sit down and catch your breath. For a moment nobody needs anything from you.",
           "You spring to your feet and run off at full speed, without pausing to rest.",
           "Elsewhere, people go about their business as if nothing at all were different today.",
           "You try to sit down, but you can't. Nothing happens.",
           "You look for somewhere to sit, but every seat nearby is taken and the ground is soaking wet, so "
           "you lean against the wall to catch your breath instead."),
    Action("I stop and listen carefully to the sounds around me.",
           "You stand still and listen. You hear ordinary sounds: footsteps, voices, the hum of the place "
           "around you.",
           "You start talking loudly to no one in particular, drowning out every sound around you.",
           "Meanwhile the light shifts a little, and the day goes on.",
           "You try to stop and listen, but you cannot. Nothing happens.",
           "You try to listen, but a sudden burst of loud clattering close by drowns out everything else "
           "until it stops."),
    Action("I drink some water to clear my head.",
           "You take a long drink of water, and your head clears a little.",
           "You push the water away untouched, and your head stays as foggy as before.",
           "The talk around you drifts on to other things.",
           "You reach for some water, but you can't drink it. Nothing happens.",
           "You look for water, but there is none within reach, so you will have to go without for now."),
    Action("I go through my belongings, one item at a time.",
           "You go through your belongings carefully, one item at a time.",
           "You leave your belongings alone and never look at them.",
           "Somewhere nearby, someone laughs at a joke you did not hear.",
           "You try to go through your belongings, but you cannot. Nothing happens.",
           "You start to go through your belongings, but someone calls your name urgently and you turn to "
           "answer them first."),
    Action("I nod to the people around me and wait to see who speaks first.",
           "You nod and wait. After a pause, someone clears their throat and starts talking about the day.",
           "You shout at the people around you and storm off before anyone can speak.",
           "The hours drag on, slow and uneventful.",
           "You try to nod and wait, but you can't. Nothing happens.",
           "You try to catch someone's eye, but everyone around you has their back turned, busy with their "
           "own work, so nobody sees you nod."),
    Action("I rub my tired eyes and take stock of the situation.",
           "You rub your tired eyes and take stock. The situation is what it was a moment ago.",
           "You close your eyes and fall asleep on the spot, taking stock of nothing.",
           "A cold draught moves through the place and is gone.",
           "You try to rub your eyes and take stock, but you cannot. Nothing happens.",
           "You raise a hand to your eyes, but someone bumps into you hard and you have to steady yourself "
           "before you can think."),
)

PROPS = ("a small notebook", "a folded letter", "an old coin", "a short length of rope", "a stub of pencil")

FACT_FRAMES = (
    "{neg} It has always been that way.",
    "{neg} Nobody around you finds anything strange about it.",
    "It is simply the case, as it always was: {neg}",
)
INVARIANT_FRAMES = (
    "Right then, in front of you, it happens: {clause}.",
    "It happens without warning: {clause}.",
)


# -- fact negation -------------------------------------------------------------------------------

_RELATIVE = {"who", "which", "that", "whose", "whom", "where", "when", "while", "if", "because", "although"}
_PARTICIPLES = set(
    "been seen told met made known given taken gone done left lost won kept brought found got gotten become "
    "come run heard held built sent spent written broken chosen fallen hidden stolen drunk sung flown grown "
    "shown thrown worn sworn torn beaten bitten eaten forgotten ridden risen shaken spoken woken paid said "
    "sold sat stood struck taught thought bought caught fought sought felt dealt led fed fled met read shot "
    "lit hit put set cut quit let shut spread hurt slept swept wept begun drawn sunk spun hung dug stuck "
    "understood".split())
_NEGATORS = {"no", "nobody", "nothing", "none", "neither", "nor"}
_POSSESSIVES = ("to", "the", "a", "an", "his", "her", "their", "its", "my", "your", "our")
_ADVERBS = {"just", "already", "recently", "also", "still", "once"}
_VERBS_3 = set(
    "knows believes works lives carries holds owns wants loves hates trusts suspects admires regards serves "
    "leads runs keeps wears fears thinks expects plans hopes intends remembers needs likes commands controls "
    "guards rules teaches hides sees hears means feels follows protects shares uses plays sings studies "
    "writes drives flies stays remains sleeps waits owes seeks understands considers despises respects "
    "recognizes realizes suspects answers reports belongs carries visits drinks smokes speaks".split())
_VERBS_PLURAL = set(
    "know believe work live carry hold own want love hate trust suspect admire regard serve lead keep wear "
    "fear think expect plan hope intend remember need like share use stay remain".split())


def _base(verb: str) -> str:
    if verb.endswith("ies"):
        return verb[:-3] + "y"
    if re.search(r"(ch|sh|ss|x|z|o)es$", verb):
        return verb[:-2]
    return verb[:-1]


def negate_fact(text: str) -> str | None:
    """A sentence that contradicts `text`, or None when the sentence shape is not one we handle.

    Rewrites the main clause's first auxiliary or known verb (within the first eight words, before
    any relative pronoun): `is` <-> `is not`, `has met` -> `has not met`, `has X` -> `does not have
    X`, `has never` -> `has`, `cannot` <-> `can`, `does not` -> `does`, `knows` -> `does not know`,
    `believe` -> `do not believe`, ...
    """
    sentence = text.strip().rstrip(".")
    if not sentence or ";" in sentence:
        return None
    words = sentence.split(" ")
    if words[0].lower() in ("no", "nobody", "none", "neither", "nothing", "never"):
        return None
    for i, raw in enumerate(words[:8]):
        w = raw.lower().strip(",")
        if w in _RELATIVE:
            return None
        if i == 0:
            continue
        nxt = words[i + 1].lower() if i + 1 < len(words) else ""
        after = words[i + 2].lower() if i + 2 < len(words) else ""
        head, rest = words[:i], words[i + 1:]

        def build(middle: list[str], tail: list[str], _head: list[str] = head) -> str:
            return " ".join([*_head, *middle, *tail]) + "."

        if w in ("is", "are", "was", "were"):
            if nxt == "not" and after == "yet":
                return build([raw, "already"], rest[2:])
            if nxt in ("not", "never"):
                return build([raw], rest[1:])
            if nxt == "no" and after == "longer":
                return build([raw, "still"], rest[2:])
            if nxt in _NEGATORS:
                return None
            return build([raw, "not"], rest)
        if w in ("has", "have", "had"):
            do = {"has": "does", "have": "do", "had": "did"}[w]
            if nxt in ("not", "never") and after == "yet":
                return build([raw, "already"], rest[2:])
            if nxt in ("not", "never"):
                return build([raw], rest[1:])
            if nxt == "always":
                return build([raw, "never"], rest[1:])
            if nxt in _NEGATORS:
                return None
            tail = rest[1:] if nxt in _ADVERBS else rest
            first = tail[0].lower() if tail else ""
            if first in _PARTICIPLES or (first.endswith("ed") and len(first) > 3):
                return build([raw, "not"], tail)
            return build([do, "not", "have"], rest)
        if w in ("cannot", "can't"):
            return build(["can"], rest)
        if w == "can":
            if nxt == "not":
                return build(["can"], rest[1:])
            return build(["cannot"], rest)
        if w in ("will", "would"):
            if nxt in ("not", "never"):
                return build([raw], rest[1:])
            return build([raw, "not"], rest)
        if w in ("won't",):
            return build(["will"], rest)
        if w in ("does", "do", "did"):
            if nxt == "not":
                return build([raw], rest[1:])
            return None
        if w in ("doesn't", "don't", "didn't"):
            return build([w[:-3]], rest)
        if w == "must":
            return build(["need", "not"], rest)
        if w == "never":
            return None
        if w in _VERBS_3 and words[i - 1].lower() not in _POSSESSIVES:
            if nxt in _NEGATORS:
                return None
            return build(["does", "not", _base(w)], rest)
        if w in _VERBS_PLURAL and words[i - 1].lower() not in _POSSESSIVES:
            return build(["do", "not", w], rest)
    return None


# -- invariant violation conditions -> narration -------------------------------------------------

_NODE = r"s_\d+"
_CLEAN_PATTERNS = [
    rf"^before or during\s+{_NODE},?\s+",
    rf",?\s+before or during\s+{_NODE}\s*$",
    r",?\s+(?:for example|for instance|including|such as|other than|even)\b.*$",
    rf"\s+(?:before|after|during|until)\s+the\s+[\w' -]+?\s+(?:of|in|at)\s+{_NODE}\s*$",
    rf"^(?:at any point |any time |anytime )?(?:before|after|from|since|between|until|up to|once|following)\s+"
    rf"(?:the (?:end|start) of )?(?:{_NODE})(?:\s+(?:and|to|through|until)\s+(?:the (?:end|start) of )?(?:{_NODE}))?"
    rf"(?:\s+onwards?)?,?\s+",
    rf",?\s+(?:at any (?:point|time)\s+)?(?:before|after|from|since|between|until|up to|through|during|in|by|prior to)"
    rf"\s+(?:the (?:end|start) of )?(?:{_NODE})(?:\s+(?:and|to|through|until)\s+(?:the (?:end|start) of )?(?:{_NODE}))?"
    rf"(?:\s+onwards?)?\s*$",
    rf"\s*\((?:{_NODE})\)",
    r",?\s+at any (?:point|time)\s*$",
]


def narrate_violation(condition: str) -> str | None:
    """The violation condition as a plain clause, its timing words removed; None when node ids remain
    or too little is left (such invariants are not used)."""
    text = condition.strip().rstrip(".")
    for _ in range(3):
        for pattern in _CLEAN_PATTERNS:
            text = re.sub(pattern, "", text, flags=re.I)
    text = text.strip(" ,")
    if re.search(_NODE, text) or len(text.split()) < 2 or re.search(r"\b(the story|narrat)", text, re.I):
        return None
    return text[0].upper() + text[1:]


_SECRET = re.compile(r"\b(learn|learns|know|knows|discover|discovers|discovered|reveal|reveals|revealed|"
                     r"told|tell|tells|find out|finds out|exposed|identity|secret|truth|confess|confesses|"
                     r"realize|realizes|recognize|recognizes|identified|disclose|discloses|proven)\b", re.I)
_NAME = re.compile(r"\b[A-Z][a-z]+(?:[ -][A-Z][a-z]+)*\b")
_NOT_NAMES = {"Before", "After", "Between", "From", "During", "Until", "Any", "The", "No", "Nobody", "Only", "If",
              "When", "While", "Once", "At", "In", "On", "Neither", "Either", "None", "Everyone", "Anyone",
              "Someone", "It", "A", "An"}


def is_secret(c: Commitment) -> bool:
    return bool(_SECRET.search(c.violation_condition) or _SECRET.search(c.description))


def secret_subject(c: Commitment) -> str | None:
    """Whose secret it is: the first name after a knowledge verb in the violation condition, else the
    first name in it (names that start the sentence count; sentence words like `Before` do not)."""
    text = c.violation_condition
    m = _SECRET.search(text)
    for start in ([m.end()] if m else []) + [0]:
        for found in _NAME.finditer(text, start):
            name = found.group(0)
            if name.split()[0] not in _NOT_NAMES:
                return name
    return None


# -- states --------------------------------------------------------------------------------------

_STOP = set("a an the and or of to in on at by for with from is are was were be been has have had not no "
            "his her their its he she they it this that who which as into out than then there all any".split())


def _content(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z']+", text.lower()) if w not in _STOP and len(w) > 2}


def node_text(n: Node) -> str:
    return f"{n.trigger_event} {n.key_delta}"


@dataclass(frozen=True)
class Prop:
    fact: str
    """The fact the transcript established, e.g. 'Ripley is carrying an old coin.'"""
    obj: str
    fact_id: str


def build_state(spec: Spec, graph: TrajectoryGraph, rng: random.Random, completed: int,
                prop: str | None = None) -> tuple[EpisodeState, Prop | None]:
    """Opening + 1–3 committed turns completing the first `completed` plot nodes, via the pure state
    functions. Each completed node's key delta is added as a fact (what a fact update would record).
    With `prop`, the first turn has the player pick it up and the ledger records that they carry it."""
    role = spec.meta.player_role
    facts = spec.initial_facts
    opening = f"The story begins. You are {role}. " + " ".join(f.content for f in facts[:2])
    state = EpisodeState.initial(spec).with_opening(opening, FactDiff())
    nodes = [graph.descriptions[n] for n in graph.order[:completed]]
    turns = rng.randint(1, 3)
    groups: list[list[Node]] = [[] for _ in range(turns)]
    if nodes:
        lead = max(0, len(nodes) - turns)  # the first turn summarises the early nodes
        groups[max(0, turns - len(nodes))].extend(nodes[:lead + 1])
        for j, node in enumerate(nodes[lead + 1:]):
            groups[max(0, turns - len(nodes)) + 1 + j].append(node)
    actions = rng.sample(ACTIONS, turns)
    made: Prop | None = None
    for t, (group, action) in enumerate(zip(groups, actions, strict=True)):
        act, reply = action.act, action.ack
        add: list[str] = []
        if t == 0 and prop is not None:
            act = f"I pick up {prop} and keep it with me."
            reply = f"You pick up {prop} and keep it with you."
            fact = f"{role} is carrying {prop}."
            made = Prop(fact=fact, obj=prop, fact_id=state.ledger.next_id())
            add.append(fact)
        if len(group) == 1:
            reply += f" {node_text(group[0])}"
        elif group:
            reply += " Much happens after that. " + " ".join(n.description for n in group)
        add += [n.key_delta for n in group]
        verdict = Verdict(fact_diff=FactDiff(add=add), completed_nodes=[n.id for n in group])
        # The grounded rules credit several nodes per turn and the satisfactions the graph proves.
        state = apply_turn(spec, graph, state, act, reply, verdict, GROUNDED, max_turns=10**6).state
    return state, made


def newly_satisfied(spec: Spec, state: EpisodeState, node: str) -> list[str]:
    """Commitments the plot graph proves once `node` completes, among those still PENDING."""
    pending = {c.id for c in state.commitments.items if c.status is Status.PENDING}
    done = {*state.completed_nodes, node}
    return [u.id for u in structural_updates(spec.commitments, done) if u.id in pending]


def _window_open(c: Commitment, done: set[str]) -> bool:
    return (c.from_ is None or c.from_ in done) and (c.until is None or c.until not in done)


def _lower_first(text: str) -> str:
    """Lower-case a leading determiner ('The ship...' -> 'the ship...'), never a name."""
    first = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if first in _DETERMINERS else text


_DETERMINERS = {"The", "A", "An", "Someone", "Something", "There", "It", "His", "Her", "Their", "Its", "One", "Two"}


# -- one case per category -------------------------------------------------------------------------


class _Skip(Exception):
    """This spec cannot host this category (for this draw): try the next spec."""


@dataclass
class _Draft:
    variant: str
    state: EpisodeState
    action: str
    reply: str
    planted: str
    gold: Gold


def _max_completed(spec: Spec, cap: int = 6) -> int:
    return max(1, min(cap, len(spec.trajectory) - 3))


def _clean(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    k = rng.randint(1, _max_completed(spec))
    state, _ = build_state(spec, graph, rng, k)
    action = rng.choice(ACTIONS)
    node = graph.descriptions[graph.order[k]]
    variant = ("advance", "idle", "advance", "foreshadow")[(i // len(CATEGORIES)) % 4]
    if variant == "advance":
        planted = node_text(node)
        return _Draft(variant, state, action.act, f"{action.ack} {planted}", "", Gold(
            completes=True, satisfied=newly_satisfied(spec, state, node.id),
            why=f"carries out the action and narrates the frontier node {node.id}'s trigger event and key delta"))
    if variant == "foreshadow":
        event = node.trigger_event.rstrip(".")
        planted = (f"Someone remarks that sooner or later this may happen: {_lower_first(event)}. "
                   "For now it has not happened, and nothing has changed.")
        return _Draft(variant, state, action.act, f"{action.ack} {planted}", planted, Gold(
            why=f"carries out the action; {node.id}'s trigger is only mentioned as a possibility, so the node "
                "does not complete"))
    return _Draft(variant, state, action.act, f"{action.ack} Nothing else changes for now.", "", Gold(
        why="carries out the action and changes nothing else"))


def _fact_contradiction(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    action = rng.choice(ACTIONS)
    if (i // len(CATEGORIES)) % 3 == 2:  # a fact the transcript established: the carried prop
        prop = rng.choice(PROPS)
        state, made = build_state(spec, graph, rng, rng.randint(1, 2), prop=prop)
        assert made is not None
        planted = f"Your hands and pockets are empty; you have not carried {prop} at any point today."
        return _Draft("prop_denied", state, action.act, f"{action.ack} {planted}", planted, Gold(
            kinds=[ConflictKind.FACT], targets={"fact": [made.fact_id]}, tolerated=[ConflictKind.COMMITMENT],
            why=f"{made.fact_id} ('{made.fact}') was committed with turn 1 and the reply denies it with no event "
                "that removed the object"))
    k = rng.randint(1, 2)
    state, _ = build_state(spec, graph, rng, k)
    touched = set().union(*(_content(node_text(graph.descriptions[n]) + " " + graph.descriptions[n].description)
                            for n in state.completed_nodes))
    role_words = _content(spec.meta.player_role)
    candidates = []
    for f in spec.initial_facts:
        neg = negate_fact(f.content)
        if neg is None or len(neg) > 220:
            continue
        if len((_content(f.content) - role_words) & touched) >= 2:
            continue  # the completed plot may already have changed this fact
        candidates.append((f.id, f.content, neg))
    if not candidates:
        raise _Skip
    fid, content, neg = rng.choice(candidates)
    planted = rng.choice(FACT_FRAMES).format(neg=neg)
    return _Draft("negated_initial", state, action.act, f"{action.ack} {planted}", planted, Gold(
        kinds=[ConflictKind.FACT], targets={"fact": [fid]}, tolerated=[ConflictKind.COMMITMENT],
        why=f"states the negation of active fact {fid} ('{content}') as if it had always been so"))


def _step_skip(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    k = rng.randint(1, _max_completed(spec))
    order = graph.order
    options = [c for c in spec.commitments if c.type is CommitmentType.ORDERING and c.before and c.after
               and order.index(c.before) >= k and order.index(c.after) > k]
    if not options:
        raise _Skip
    c = rng.choice(options)
    assert c.after is not None and c.before is not None
    state, _ = build_state(spec, graph, rng, k)
    done = set(state.completed_nodes)
    later = graph.descriptions[c.after]
    planted = node_text(later)
    action = rng.choice(ACTIONS)
    also = [o.id for o in spec.commitments if o.id != c.id and (
        (o.type is CommitmentType.ORDERING and o.after == c.after and o.before not in done)
        or (o.type is CommitmentType.INVARIANT and _window_open(o, done) and c.after in _refs(o)))]
    return _Draft("ordering", state, action.act, f"{action.ack} {planted}", planted, Gold(
        kinds=[ConflictKind.COMMITMENT], targets={"commitment": [c.id, *also]}, tolerated=[ConflictKind.FACT],
        why=f"narrates {c.after}'s trigger and key delta while {c.before} is not complete, which {c.id} forbids "
            f"({c.before} before {c.after})"))


def _refs(c: Commitment) -> set[str]:
    return set(re.findall(_NODE, c.prose())) | set(c.links().values())


def _invariant_break(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    k = rng.randint(1, _max_completed(spec))
    done = set(graph.order[:k])
    usable: list[tuple[Commitment, str]] = []
    for c in spec.commitments:
        clause = narrate_violation(c.violation_condition) if c.type is CommitmentType.INVARIANT else None
        if clause and _window_open(c, done):
            usable.append((c, clause))
    if not usable:
        raise _Skip
    secrets = [(c, t) for c, t in usable if is_secret(c)]
    plain = [(c, t) for c, t in usable if " or " not in t]
    pool = secrets if secrets and (i // len(CATEGORIES)) % 2 == 0 else (plain or usable)
    c, clause = rng.choice(pool)
    state, _ = build_state(spec, graph, rng, k)
    action = rng.choice(ACTIONS)
    planted = rng.choice(INVARIANT_FRAMES).format(clause=clause)
    window = f"{c.from_ or 'the start'}..{c.until or 'the end'}"
    return _Draft("secret" if is_secret(c) else "state", state, action.act, f"{action.ack} {planted}", planted,
                  Gold(kinds=[ConflictKind.COMMITMENT], targets={"commitment": [c.id]}, tolerated=[ConflictKind.FACT],
                       why=f"narrates invariant {c.id}'s violation condition ('{c.violation_condition}') while its "
                           f"window ({window}) is open: {len(done)} nodes done"))


def _action_ignored(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    state, _ = build_state(spec, graph, rng, rng.randint(1, _max_completed(spec)))
    action = rng.choice(ACTIONS)
    if (i // len(CATEGORIES)) % 2 == 0:
        return _Draft("rewritten", state, action.act, action.rewrite, action.rewrite, Gold(
            kinds=[ConflictKind.PLAYER_INPUT],
            why="the reply makes the player's character do the opposite of the stated action"))
    return _Draft("ignored", state, action.act, action.ignore, action.ignore, Gold(
        kinds=[ConflictKind.PLAYER_INPUT], why="the reply says nothing about the player's action"))


def _action_blocked(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    state, _ = build_state(spec, graph, rng, rng.randint(1, _max_completed(spec)))
    action = rng.choice(ACTIONS)
    return _Draft("no_reason", state, action.act, action.block_bare, action.block_bare, Gold(
        kinds=[ConflictKind.PLAYER_INPUT], why="the reply refuses the action and gives no reason inside the story"))


def _hn_blocked(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    state, _ = build_state(spec, graph, rng, rng.randint(1, _max_completed(spec)))
    action = rng.choice(ACTIONS)
    return _Draft("in_story_reason", state, action.act, action.block_reason, action.block_reason, Gold(
        why="the action is refused, but the reply gives a reason inside the story, which the protocol allows"))


def _hn_fact_event(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    prop = rng.choice(PROPS)
    state, made = build_state(spec, graph, rng, rng.randint(1, _max_completed(spec)), prop=prop)
    assert made is not None
    act = f"I put {prop} down and leave it behind."
    planted = f"You put {prop} down and leave it where it lies. You are no longer carrying it."
    return _Draft("put_down", state, act, planted, planted, Gold(
        why=f"{made.fact_id} ('{made.fact}') stops being true through an event the reply narrates: the player "
            "puts the object down, as the action said"))


def _hn_rumour(spec: Spec, graph: TrajectoryGraph, rng: random.Random, i: int) -> _Draft:
    k = rng.randint(1, _max_completed(spec))
    done = set(graph.order[:k])
    options = [(c, secret_subject(c)) for c in spec.commitments
               if c.type is CommitmentType.INVARIANT and _window_open(c, done) and is_secret(c)]
    options = [(c, s) for c, s in options if s]
    if not options:
        raise _Skip
    c, subject = rng.choice(options)
    state, _ = build_state(spec, graph, rng, k)
    action = rng.choice(ACTIONS)
    planted = (f"Someone nearby mutters a rumour that there is more to {subject} than anyone has let on. Nobody "
               "can back it up, nobody confirms a thing, and you learn nothing certain.")
    return _Draft("unconfirmed", state, action.act, f"{action.ack} {planted}", planted, Gold(
        why=f"the rumour comes near the secret guarded by {c.id} but states no part of it and confirms nothing, "
            "so the violation condition is not met"))


def _advance(d: _Draft, spec: Spec, graph: TrajectoryGraph) -> _Draft:
    """A hard negative that also completes the frontier node (its trigger and key delta follow)."""
    current = graph.current(d.state.completed_nodes)
    if current is None:
        return d
    node = graph.descriptions[current]
    gold = d.gold.model_copy(update={"completes": True, "satisfied": newly_satisfied(spec, d.state, current),
                                     "why": f"{d.gold.why}; then {current}'s trigger event and key delta are narrated"})
    return _Draft(d.variant + "+advance", d.state, d.action, f"{d.reply} {node_text(node)}", d.planted, gold)


_BUILDERS = {
    "clean": _clean, "fact_contradiction": _fact_contradiction, "step_skip": _step_skip,
    "invariant_break": _invariant_break, "action_ignored": _action_ignored, "action_blocked": _action_blocked,
    "hn_blocked_with_reason": _hn_blocked, "hn_fact_event": _hn_fact_event, "hn_rumour": _hn_rumour,
}


def make_case(specs: Sequence[Spec], graphs: Sequence[TrajectoryGraph], index: int, seed: int,
              category: str | None = None) -> AuditCase:
    """Case `index` of the suite for `seed`: its category is CATEGORIES[index % 9] unless given."""
    cat = category or CATEGORIES[index % len(CATEGORIES)]
    start = index % len(specs)
    for attempt in range(min(MAX_ATTEMPTS, len(specs) * 2)):
        j = (start + attempt) % len(specs)
        spec, graph = specs[j], graphs[j]
        rng = random.Random(f"ncpbench-auditeval|{seed}|{index}|{attempt}")
        try:
            d = _BUILDERS[cat](spec, graph, rng, index)
        except _Skip:
            continue
        if cat in HARD_NEGATIVES and (index // len(CATEGORIES)) % 2 == 1:
            d = _advance(d, spec, graph)
        front = tuple(graph.frontier(d.state.completed_nodes))
        return AuditCase(id=f"{index:04d}-{cat}-{spec.key}", index=index, category=cat, variant=d.variant,
                         env_id=spec.key, state=d.state, player_action=d.action, reply=d.reply, frontier=front,
                         frontier_node=graph.current(d.state.completed_nodes), planted=d.planted, gold=d.gold)
    raise GenerationError(f"no spec can host a {cat!r} case (tried {min(MAX_ATTEMPTS, len(specs) * 2)} draws)")


def generate_suite(specs: Iterable[Spec], n: int = DEFAULT_CASES, seed: int = 0,
                   long_range: int = 0) -> list[AuditCase]:
    """`n` labelled cases over `specs`, categories in rotation (balanced to within one), specs in a
    seeded order. The same (specs, n, seed) always gives the same cases; a smaller `n` gives a prefix.
    `long_range` appends that many long-range cases (LONG_RANGE_CATEGORIES in rotation) after them,
    indices n, n+1, ...; their content and ids do not depend on `n`."""
    pool = sorted(specs, key=lambda s: s.key)
    if not pool:
        raise GenerationError("no specs to generate cases from")
    random.Random(f"ncpbench-auditeval-order|{seed}").shuffle(pool)
    graphs = [TrajectoryGraph(s) for s in pool]
    return ([make_case(pool, graphs, i, seed) for i in range(n)]
            + [make_long_case(pool, graphs, j, seed, index=n + j) for j in range(long_range)])


# -- long-range cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detail:
    """A concrete detail the player establishes early, and three ways to speak of it later."""

    kind: str
    act: str
    """The player's action in the detail's turn."""
    narration: str
    """The detail's turn's reply: the one place the story says it."""
    fact: str
    """What a fact update would record (the ledger variant commits it; the narration variant does not)."""
    contra: str
    """A sentence that contradicts it with no in-story cause."""
    consistent: str
    """A sentence that agrees with it (the hard negative)."""
    key: str
    """A phrase of the detail that no filler turn ever uses (tests look for it)."""


DETAIL_KINDS = ("object", "ribbon", "wound")
_COLOURS = (("red", "blue"), ("green", "yellow"), ("white", "black"))
FILLER = ("A little time passes.", "Nobody pays you much attention.", "The air grows a little cooler.",
          "Voices rise somewhere nearby, then fade.", "For a while nothing much happens.", "")
"""Ambient sentences appended to filler turns: they mention no object, no colour, no body part."""


def make_detail(kind: str, role: str, rng: random.Random) -> Detail:
    if kind == "object":
        obj = rng.choice(PROPS)
        return Detail(kind, f"I pick up {obj} and keep it with me.", f"You pick up {obj} and keep it with you.",
                      f"{role} is carrying {obj}.",
                      f"Your hands and pockets are empty; you have not carried {obj} at any point today.",
                      f"You check your pockets: {obj} is still with you, just where you put it.", obj)
    if kind == "ribbon":
        colour, other = rng.choice(_COLOURS)
        return Detail(kind, f"I tie a {colour} ribbon around my left wrist.",
                      f"You find a strip of {colour} ribbon and tie it around your left wrist.",
                      f"{role} wears a {colour} ribbon tied around the left wrist.",
                      f"You glance at the ribbon around your left wrist: it is {other}, as it has been since you "
                      "tied it on.",
                      f"You glance at the {colour} ribbon around your left wrist; it is still tied fast.",
                      f"{colour} ribbon")
    return Detail(kind, "I bind the cut on my right hand with a strip of cloth.",
                  "You bind the cut on your right hand with a strip of cloth. It stings, but it will heal.",
                  f"{role} has a cut on the right hand, bound with cloth.",
                  "You flex your right hand. The skin is whole and unmarked; it has never been cut or bound.",
                  "Your bound right hand still stings where it was cut.", "right hand")


def build_long_state(spec: Spec, graph: TrajectoryGraph, rng: random.Random, detail: Detail, in_ledger: bool,
                     completed: int) -> tuple[EpisodeState, int, str | None]:
    """Opening, then turn 1 or 2 narrates `detail` (and commits `detail.fact` when `in_ledger`; else
    its fact update adds nothing), then LONG_GAP committed turns of ordinary narration that never
    mention it, completing the first `completed` plot nodes on turns of their own. Returns the state,
    the detail's turn and the detail's fact id (None when not in the ledger)."""
    role = spec.meta.player_role
    opening = f"The story begins. You are {role}. " + " ".join(f.content for f in spec.initial_facts[:2])
    state = EpisodeState.initial(spec).with_opening(opening, FactDiff())
    detail_turn = rng.randint(1, 2)
    turns = detail_turn + rng.randint(*LONG_GAP)
    nodes = [graph.descriptions[n] for n in graph.order[:completed]]
    slots = sorted(rng.sample([t for t in range(1, turns + 1) if t != detail_turn], len(nodes)))
    node_at = dict(zip(slots, nodes, strict=True))
    fact_id: str | None = None
    last: Action | None = None
    for t in range(1, turns + 1):
        add: list[str] = []
        done: list[str] = []
        if t == detail_turn:
            act, reply = detail.act, detail.narration
            if in_ledger:
                fact_id = state.ledger.next_id()
                add.append(detail.fact)
        else:
            action = rng.choice([a for a in ACTIONS if a is not last])
            last = action
            act, reply = action.act, f"{action.ack} {rng.choice(FILLER)}".strip()
            node = node_at.get(t)
            if node is not None:
                reply += f" {node_text(node)}"
                add.append(node.key_delta)
                done.append(node.id)
        verdict = Verdict(fact_diff=FactDiff(add=add), completed_nodes=done)
        state = apply_turn(spec, graph, state, act, reply, verdict, GROUNDED, max_turns=10**6).state
    return state, detail_turn, fact_id


def make_long_case(specs: Sequence[Spec], graphs: Sequence[TrajectoryGraph], j: int, seed: int,
                   index: int | None = None) -> AuditCase:
    """Long-range case `j` for `seed` (category LONG_RANGE_CATEGORIES[j % 3]); `index` is its place in
    the suite (default j). Rotation: the detail kind is DETAIL_KINDS[(j // 3) % 3]; a hard negative
    has the ledger variant when (j // 3) is even, so every (kind, variant) pair recurs every 18 cases."""
    cat = LONG_RANGE_CATEGORIES[j % len(LONG_RANGE_CATEGORIES)]
    kind = DETAIL_KINDS[(j // 3) % len(DETAIL_KINDS)]
    in_ledger = cat == "long_fact_ledger" or (cat == "hn_long_consistent" and (j // 3) % 2 == 0)
    start = j % len(specs)
    for attempt in range(min(MAX_ATTEMPTS, len(specs) * 2)):
        spec, graph = specs[(start + attempt) % len(specs)], graphs[(start + attempt) % len(specs)]
        rng = random.Random(f"ncpbench-auditeval-long|{seed}|{j}|{attempt}")
        detail = make_detail(kind, spec.meta.player_role, rng)
        state, turn, fid = build_long_state(spec, graph, rng, detail, in_ledger,
                                            rng.randint(1, _max_completed(spec)))
        later = " ".join([*(ex.narrator_reply + " " + " ".join(ex.facts_added) for ex in state.transcript[turn + 1:]),
                          *(f.content for f in spec.initial_facts)])
        if state.done or detail.key.lower() in later.lower():
            continue  # a plot turn or a premise that speaks of the detail would give it away (or change it)
        action = rng.choice(ACTIONS)
        gap = state.turn - turn
        where = (f"{fid} ('{detail.fact}') was committed with turn {turn}" if fid else
                 f"turn {turn} narrated it ('{detail.narration}') and its fact update added nothing, so no fact id "
                 "holds it")
        variant = f"{kind}+{'ledger' if in_ledger else 'narration'}"
        if cat == "hn_long_consistent":
            planted = detail.consistent
            gold = Gold(why=f"{where}; {gap} committed turns of unrelated narration later the reply agrees with it")
        else:
            planted = detail.contra
            gold = Gold(kinds=[ConflictKind.FACT], targets={"fact": [fid]} if fid else {},
                        tolerated=[ConflictKind.COMMITMENT],
                        why=f"{where}; {gap} committed turns of unrelated narration later the reply contradicts it "
                            "with no event that changed it" + ("" if fid else
                                                               " (a conflict with earlier narration: any fact id, or "
                                                               "none, is accepted)"))
        front = tuple(graph.frontier(state.completed_nodes))
        i = j if index is None else index
        return AuditCase(id=f"L{j:03d}-{cat}-{spec.key}", index=i, category=cat, variant=variant, env_id=spec.key,
                         state=state, player_action=action.act, reply=f"{action.ack} {planted}", frontier=front,
                         frontier_node=graph.current(state.completed_nodes), planted=planted, gold=gold,
                         detail=detail.narration, detail_turn=turn)
    raise GenerationError(f"no spec can host a {cat!r} case")


# -- files ---------------------------------------------------------------------------------------


def dump_cases(cases: Iterable[AuditCase], path: str | Path) -> None:
    """One JSON object per line, keys sorted, so the same suite gives byte-identical files."""
    write_jsonl(cases, Path(path))


def load_cases(path: str | Path) -> list[AuditCase]:
    with Path(path).open(encoding="utf-8") as fh:
        return [AuditCase.model_validate_json(line) for line in fh if line.strip()]
