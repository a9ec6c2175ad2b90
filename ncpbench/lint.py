"""Spec quality rules beyond validity: `ncpbench lint`.

A spec can pass the validator and still make a poor environment: a condition that tests what the
player character thinks (the player, not the narrator, decides that), an ordering nothing could
break, an achievement after the player has left the story, a reference plot that never reaches
SUCCESS. Each rule below turns one such problem into `LintFinding`s, which are validator
`Finding`s (`file:id:field: severity: message`) that also name their rule.

Rules (`RULES`):

    player-mind          a mental-state or speech verb with the player character as its subject in a
                         trigger_event, key_delta, satisfaction_condition or violation_condition
                         (warning; the verb found is quoted)
    impossible-ordering  an ordering whose before and after are the same node, or whose before does
                         not come strictly earlier in plot order (errors); an ordering on a node and
                         its direct predecessor whose violation condition only restates the
                         satisfaction with the nodes swapped (warning)
    missing-link         a commitment without the links its type needs: ordering before + after,
                         achievement node, invariant from or until (error)
    after-exit           a node, or a commitment link, after a node marked `exit: true` (error); a key
                         delta whose wording says the player character dies or leaves for good,
                         without the marker (warning)
    replay               the reference-plot replay (`replay_reference`): commitments that a faithful
                         in-order narration violates (error) or never settles (warning), and a replay
                         that does not reach SUCCESS (error)
    conditions           satisfaction and violation conditions with the same text (error)
    future-fact          an initial fact worded in the future tense ("will ...") (warning)
    duplicate-node       two plot nodes with the same description, trigger event or key delta (warning)
    version              a negative meta.version (error)

Pure: `lint_spec` works on a parsed spec; `lint_file` reads one file through the validator.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

from ncpbench.commitments import Status
from ncpbench.spec import Commitment, CommitmentType, Node, Spec
from ncpbench.validation import Finding, Severity, errors, validate_file

RULES = ("player-mind", "impossible-ordering", "missing-link", "after-exit", "replay", "conditions",
         "future-fact", "duplicate-node", "version")
STRUCTURAL = frozenset({"replay", "impossible-ordering"})
"""Rules whose warnings the builder sends back to the model like errors (the structure is wrong)."""


@dataclass(frozen=True)
class LintFinding(Finding):
    rule: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.id}:{self.field}: {self.severity.value}: {self.message} [{self.rule}]"


class _Out:
    """Collects the findings of one spec."""

    def __init__(self, file: str, rules: Collection[str] | None) -> None:
        self.file = file
        self.rules = rules
        self.found: list[LintFinding] = []

    def wants(self, rule: str) -> bool:
        return self.rules is None or rule in self.rules

    def add(self, rule: str, ident: str, name: str, message: str, severity: Severity) -> None:
        self.found.append(LintFinding(self.file, ident, name, message, severity, rule))

    def error(self, rule: str, ident: str, name: str, message: str) -> None:
        self.add(rule, ident, name, message, Severity.ERROR)

    def warn(self, rule: str, ident: str, name: str, message: str) -> None:
        self.add(rule, ident, name, message, Severity.WARNING)


# -- the player character's name -----------------------------------------------------------------

_TITLES = frozenset("""
mr mrs ms miss dr doctor sir dame lord lady captain capt cpt cpl corporal sgt sergeant lt lieutenant col colonel
gen general major maj admiral adm commander cmdr sheriff deputy detective det officer agent inspector prince
princess king queen emperor professor prof father mother sister brother uncle aunt saint st the a an of
jr sr ii iii iv
""".split())

_OPENERS = frozenset("""
then when before after once until while if later finally meanwhile now only so and but or as because since
here there at in on by with without from no the a an every each nobody whether although though unless soon
eventually instead also still afterwards yet even both neither either
""".split())
"""Capitalised words that open sentences: one of them before a surname is not another first name."""


def player_names(role: str) -> tuple[list[str], set[str]]:
    """The ways a spec names its player character, longest first, and the single-word parts.

    The full role text, the full name without a nickname, and every word of it that is not a title,
    suffix or initial: "Captain Benjamin L. Willard" -> Benjamin, Willard; "Sam 'Ace' Rothstein" ->
    Sam, Ace, Rothstein. A qualifier after " - " ("Ed Bloom - Young") is dropped.
    """
    text = re.sub(r"\(.*?\)", " ", role)
    text = re.split(r"\s[-–—]\s", text)[0].strip()
    nicknames = re.findall(r"['\"‘“]([^'\"’”]+)['\"’”]", text)
    plain = " ".join(re.sub(r"['\"‘“][^'\"’”]+['\"’”]", " ", text).split())
    words: set[str] = set()
    for token in re.findall(r"[A-Za-z][\w'’-]*\.?", plain) + nicknames:
        bare = token.rstrip(".")
        if len(bare) > 1 and bare.lower() not in _TITLES and bare[:1].isupper():
            words.add(bare)
    core = " ".join(t for t in plain.split() if t.rstrip(".").lower() not in _TITLES)
    names = {n for n in (" ".join(text.split()), plain, core) if n} | words
    return sorted(names, key=lambda n: (-len(n), n)), words


_AUX = (r"(?:(?:does|did|do|has|have|had|will|would|must|can|could|may|might|should|shall)\s+)?"
        r"(?:(?:not|never|no\s+longer|n't)\s+)?")
_ADVERB = r"(?:\w+ly|now|finally|also|still|then|already|never|not|first|again|soon|even|too|at\s+last|alone)"
_STATE = (r"(?:is|was|are|were|becomes|became|become|remains|remained|gets|got|grows|grew)\s+(?:now\s+|finally\s+)?"
          r"(?:determined|convinced|certain|sure|aware|resolved|desperate|afraid|jealous|suspicious|in\s+love|"
          r"worried|ashamed|eager|willing|unwilling|reluctant|persuaded)")

MIND_VERBS = (
    r"believes?|believed|believing", r"reali[sz](?:e|es|ed|ing)", r"decides?|decided|deciding", _STATE,
    r"wants?|wanted|wanting", r"feels?|felt|feeling", r"suspects?|suspected|suspecting",
    r"learns?|learned|learnt|learning", r"knows?|knew|knowing", r"understands?|understood|understanding",
    r"(?:falls?|fell|falling|fallen)\s+in\s+love", r"fears?|feared|fearing", r"hopes?|hoped|hoping",
    r"wish(?:es|ed|ing)?", r"thinks?|thought|thinking", r"wonders?|wondered|wondering", r"doubts?|doubted",
    r"(?:dis)?trusts?|(?:dis)?trusted", r"forgives?|forgave|forgiven|forgiving", r"regrets?|regretted",
    r"remembers?|remembered|remembering", r"recalls?|recalled", r"intends?|intended|intending",
    r"resolves?|resolved", r"chooses?|chose|chosen|choosing", r"loves?|loved", r"hates?|hated",
    r"recogni[sz](?:e|es|ed)", r"worries|worried", r"accepts?|accepted|accepting", r"plans?|planned|planning",
    r"imagines?|imagined", r"assumes?|assumed", r"concludes?|concluded", r"trusts?",
)
SPEECH_VERBS = (
    r"says?|said|saying", r"tells?|told|telling", r"declares?|declared|declaring", r"states?|stated|stating",
    r"announces?|announced|announcing", r"admits?|admitted|admitting", r"confess(?:es|ed|ing)?",
    r"promises?|promised|promising", r"vows?|vowed|vowing", r"swears?|swore|sworn|swearing",
    r"agrees?|agreed|agreeing", r"refuses?|refused|refusing", r"asks?|asked|asking", r"insists?|insisted",
    r"proclaims?|proclaimed", r"apologi[sz](?:e|es|ed)", r"repl(?:y|ies|ied)",
    r"threatens?|threatened", r"begs?|begged", r"pleads?|pleaded", r"accuses?|accused", r"lies\s+to|lied\s+to",
    r"shouts?|shouted|yells?|yelled|whispers?|whispered|screams?|screamed",
)
MIND_FIELDS = ("trigger_event", "key_delta", "satisfaction_condition", "violation_condition")


def _spec_text(spec: Spec) -> str:
    parts = [spec.synopsis, *(f.content for f in spec.initial_facts)]
    parts += [t for c in spec.commitments for t in (c.description, c.satisfaction_condition, c.violation_condition)]
    parts += [t for n in spec.trajectory for t in (n.description, n.trigger_event, n.key_delta)]
    return "\n".join(parts)


def _other_person(prev: str, own: Collection[str]) -> bool:
    """Whether the capitalised word `prev`, right before a name word, makes it someone else's name."""
    bare = prev.rstrip(".").lower()
    if prev.endswith(".") and len(bare) > 1 and bare not in _TITLES:
        return False  # the end of a sentence
    return bare not in own and bare not in _OPENERS


def spec_player_names(spec: Spec) -> list[str]:
    """`player_names` of the spec's role, without a surname the spec also uses for someone else.

    A surname is taken as shared when one sentence names both the first name and the bare surname
    as two people ("Danielle's father, Foussard, ..."), or when the surname follows a title the
    role does not have ("Mrs. Foussard"). Another first name right before a word ("Howard Stark")
    is handled where it occurs.
    """
    names, words = player_names(spec.meta.player_role)
    order = [w for w in re.findall(r"[A-Za-z][\w'’-]*", spec.meta.player_role) if w in words]
    if len(order) < 2:
        return names
    first, rest = order[0], set(order[1:])
    own = {w.lower().rstrip(".") for w in re.findall(r"[\w'’.-]+", spec.meta.player_role)}
    shared = set()
    for sentence in re.split(r"(?<=[.!?;])\s+|\n", _spec_text(spec)):
        for w in rest:
            bare = [m for m in re.finditer(rf"(?<![\w'’-]){re.escape(w)}(?![\w'’-])", sentence)
                    if not re.search(rf"{re.escape(first)}\s+(?:[A-Z][\w'’.-]*\s+)*$", sentence[:m.start()])]
            if not bare:
                continue
            if re.search(rf"(?<![\w'’-]){re.escape(first)}(?![\w-])(?!\s+(?:[A-Z][\w'’.-]*\s+)*{re.escape(w)})",
                         sentence):
                shared.add(w)
            for m in bare:
                title = re.search(r"\b([A-Z][a-z]{0,3})\.?\s+$", sentence[:m.start()])
                if title and title.group(1).lower() in _TITLES and title.group(1).lower() not in own:
                    shared.add(w)
    return [n for n in names if n not in shared]


@dataclass(frozen=True)
class _NameMatcher:
    regex: re.Pattern[str]
    words: frozenset[str]
    speech: re.Pattern[str]

    @classmethod
    def of(cls, spec: Spec) -> _NameMatcher | None:
        names = spec_player_names(spec)
        if not names:
            return None
        name = "|".join(re.escape(n) for n in names)
        other = r"[A-Z][\w'’-]*(?:\s+[A-Z][\w'’-]*)?"
        verbs = "|".join(f"(?:{v})" for v in (*MIND_VERBS, *SPEECH_VERBS))
        pattern = (rf"(?<![\w'’.-])(?P<name>{name})(?![\w'’-])(?:\s*,?\s+(?:and|or)\s+{other})?\s+"
                   rf"(?i:{_AUX}(?:{_ADVERB}\s+){{0,3}}(?P<verb>{verbs}))(?![\w'’-])")
        speech = re.compile("|".join(f"(?:{v})" for v in SPEECH_VERBS), re.I)
        return cls(re.compile(pattern), frozenset(n for n in names if " " not in n), speech)

    def find(self, text: str) -> list[tuple[str, str]]:
        """(name, verb) pairs in which the player character is the one who thinks or speaks."""
        out = []
        for m in self.regex.finditer(text):
            name, verb = m.group("name"), " ".join(m.group("verb").split())
            if name in self.words:
                before = re.search(r"\b([A-Z][\w'’-]*\.?)[ \t]+$", text[:m.start()])
                if before and _other_person(before.group(1), {w.lower() for w in self.words} | _TITLES):
                    continue  # "Howard Stark knows": someone else who shares the surname
            rest = text[m.end():]
            if verb.lower() == "told" and re.match(r"\s+(?:of|about|that|where|what|who|how|when|why|whether|if)\b",
                                                   rest):
                continue  # "shows Lina told of it", "Cross told where she is": someone else tells them
            if self.is_speech(verb) and re.search(r"\bwhat(?:ever)?\s+$", text[:m.start()]):
                continue  # "a recording of what Troy said": the words as an object in the world
            if verb.lower().startswith("know") and _ACQUAINTED.match(rest):
                continue  # "Harry and Mary know each other", "Bean knows Sabine.": acquainted, not a thought
            out.append((name, verb))
        return out

    def is_speech(self, verb: str) -> bool:
        return bool(self.speech.fullmatch(verb))


_ACQUAINTED = re.compile(r"\s+(?:each\s+other|one\s+another|(?:[A-Z][\w'’-]*(?:\s+(?:and\s+)?[A-Z][\w'’-]*)*))"
                         r"\s*(?:[.,;]|$|\s+(?:by|as|from|and|but|well|only|personally)\b)")


def _player_mind(spec: Spec, out: _Out) -> None:
    matcher = _NameMatcher.of(spec)
    if matcher is None:
        return
    items: list[tuple[str, Node | Commitment]] = [(n.id, n) for n in spec.trajectory]
    items += [(c.id, c) for c in spec.commitments]
    for ident, item in items:
        for name in MIND_FIELDS:
            text = getattr(item, name, None)
            if not isinstance(text, str):
                continue
            for who, verb in matcher.find(text):
                if matcher.is_speech(verb):
                    what = (f"a speech act of the player character ({who!r} {verb!r}): what {who} says is the "
                            "player's move, not something the narration can establish; test what happens in "
                            "the world")
                else:
                    what = (f"a mental state of the player character ({who!r} {verb!r}): the narration cannot "
                            f"show what {who} thinks, feels or decides; test what the narration shows in the "
                            "world")
                out.warn("player-mind", ident, name, what)


# -- the plot's structure ------------------------------------------------------------------------


def requires_graph(spec: Spec) -> nx.DiGraph[str]:
    """The plot graph from `requires` alone (default linear), without the ordering commitments' edges."""
    g: nx.DiGraph[str] = nx.DiGraph()
    ids = spec.node_ids()
    g.add_nodes_from(ids)
    for i, node in enumerate(spec.trajectory):
        preds = node.requires if node.requires is not None else ([ids[i - 1]] if i else [])
        for p in preds:
            if p in g:
                g.add_edge(p, node.id)
    return g


def direct_predecessors(spec: Spec, node: str) -> list[str]:
    ids = spec.node_ids()
    if node not in ids:
        return []
    i = ids.index(node)
    requires = spec.trajectory[i].requires
    return list(requires) if requires is not None else ([ids[i - 1]] if i else [])


_REF = re.compile(r"\bs_\d+\b")
_FILLER = frozenset("""
before after first then later earlier until till prior to precedes precede preceded follows follow followed
is are was were be been being the a an of in on at by and or only once has have had not no never it its any
story narration narrated narrates shows shown show happens happened happen completes completed complete
occurs occurred node nodes s
""".split())


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", _REF.sub(" ", text.lower())) if w not in _FILLER}


def is_mirror(satisfaction: str, violation: str) -> bool:
    """True when the violation condition says nothing the satisfaction does not: the same content words
    (node ids, ordering words and negations aside), so it is only the order of the nodes reversed."""
    sat, vio = _content_words(satisfaction), _content_words(violation)
    if not vio:
        return True
    return vio <= sat or len(sat & vio) / len(sat | vio) >= 0.8


def _orderings(spec: Spec, out: _Out) -> None:
    position = {nid: i for i, nid in enumerate(spec.node_ids())}
    for c in spec.commitments:
        if c.type is not CommitmentType.ORDERING or c.before is None or c.after is None:
            continue
        if c.before not in position or c.after not in position:
            continue
        if c.before == c.after:
            out.error("impossible-ordering", c.id, "after",
                      f"before and after are both {c.before}: a node cannot complete before itself")
        elif position[c.before] > position[c.after]:
            out.error("impossible-ordering", c.id, "before",
                      f"before {c.before} comes after {c.after} in plot order: the reference plot itself breaks "
                      "this ordering")
        elif c.before in direct_predecessors(spec, c.after) and is_mirror(c.satisfaction_condition,
                                                                          c.violation_condition):
            out.warn("impossible-ordering", c.id, "violation_condition",
                     f"{c.after} directly follows {c.before} and the violation condition only restates the "
                     "satisfaction with the nodes swapped: describe what breaking it looks like in the story "
                     f"(what would have to happen before {c.before}), or order nodes that are further apart")


def _missing_links(spec: Spec, out: _Out) -> None:
    for c in spec.commitments:
        if c.type is CommitmentType.ORDERING:
            for name, value in (("before", c.before), ("after", c.after)):
                if value is None:
                    out.error("missing-link", c.id, name, f"an ordering needs `{name}`: the node it constrains")
        elif c.type is CommitmentType.ACHIEVEMENT and c.node is None:
            out.error("missing-link", c.id, "node",
                      "an achievement needs `node`: the plot node whose completion reaches it")
        elif c.type is CommitmentType.INVARIANT and c.from_ is None and c.until is None:
            out.error("missing-link", c.id, "until",
                      "an invariant needs `from` or `until` (one may be omitted, not both): the stretch of "
                      "the plot it holds over")


_GONE = (r"(?:is|was|has\s+been|gets|got)\s+(?:\w+ly\s+)?(?:killed|murdered|executed|shot\s+dead|beaten\s+to\s+death|"
         r"put\s+to\s+death|hanged|buried)|(?:dies|died|is\s+dead|lies\s+dead|has\s+died)|"
         r"(?:leaves|left|departs|departed|sails\s+away|rides\s+away|walks\s+away|drives\s+away|flies\s+away)\b"
         r"[^.;]*?\b(?:for\s+good|forever|for\s+ever|never\s+to\s+return|for\s+the\s+last\s+time)")


def _exit_wording(spec: Spec) -> re.Pattern[str] | None:
    names = spec_player_names(spec)
    if not names:
        return None
    name = "|".join(re.escape(n) for n in names)
    return re.compile(rf"(?<![\w'’.-])(?:{name})(?![\w'’-])\s+(?i:(?:\w+ly\s+)?(?:{_GONE}))|"
                      rf"(?i:\b(?:kills|killed|murders|murdered|executes|executed)\s+)(?:{name})(?![\w'’-])")


def _after_exit(spec: Spec, out: _Out) -> None:
    ids = spec.node_ids()
    position = {nid: i for i, nid in enumerate(ids)}
    exits = [n for n in spec.trajectory if n.exit]
    if exits:
        first = exits[0]
        later = ids[position[first.id] + 1:]
        for nid in later:
            out.error("after-exit", nid, "id", f"comes after {first.id}, where the player character leaves the "
                                               "story (exit: true): nothing after it can be witnessed")
        for c in spec.commitments:
            for name, target in c.links().items():
                if target in later:
                    out.error("after-exit", c.id, name,
                              f"links to {target}, after the player character leaves the story at {first.id}")
    wording = _exit_wording(spec)
    if wording is None:
        return
    for i, n in enumerate(spec.trajectory):
        m = None if n.exit else wording.search(n.key_delta)
        if m is None:
            continue
        tail = ids[i + 1:]
        follow = (f"; {', '.join(tail)} follow{'s' if len(tail) == 1 else ''} it" if tail
                  else "; mark it so nothing can be added after it")
        out.warn("after-exit", n.id, "key_delta",
                 f"says the player character leaves the story ({' '.join(m.group(0).split())!r}) but the node "
                 f"is not marked exit: true{follow}")


# -- the reference-plot replay -------------------------------------------------------------------


@dataclass
class ReplayResult:
    """What a narration that completes every plot node in order, and does nothing else, would score."""

    order: list[str] = field(default_factory=list)
    """Nodes completed, in the order the replay completed them."""
    statuses: dict[str, Status] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each violated or unsettled commitment ended as it did."""
    success: bool = False
    """Every achievement was satisfied: the episode ends in SUCCESS."""
    ended_by: str = "plot"
    """"success" (the last achievement), "exit" (the player character left), or "plot" (no node left)."""
    ended_at: str | None = None
    """The node whose completion ended the replay."""

    def violated(self) -> list[str]:
        return [c for c, s in self.statuses.items() if s is Status.VIOLATED]

    def unsettled(self) -> list[str]:
        return [c for c, s in self.statuses.items() if s is Status.PENDING]

    nodes: list[str] = field(default_factory=list)
    """Every plot node, in plot order."""

    @property
    def unreached(self) -> list[str]:
        """Plot nodes the replay never completed."""
        return [n for n in self.nodes if n not in self.order]


def replay_reference(spec: Spec) -> ReplayResult:
    """Complete the plot nodes in plot order, judging each commitment by its structural links alone.

    The next node is always the first one in list order whose `requires` are complete (so a linear
    plot is replayed as written). Ordering commitments are not used to pick the order: they are what
    is being checked. When a node completes, an achievement on it is satisfied; an ordering whose
    `after` it is, is satisfied if `before` is complete, else violated; an invariant whose `until` it
    is, is satisfied. The replay ends, as an episode would, when every achievement is satisfied
    (SUCCESS), when a node marked `exit: true` completes, or when no node is left; open invariants are
    then satisfied (the story ended without breaking them), other commitments stay PENDING.
    """
    graph = requires_graph(spec)
    result = ReplayResult(statuses={c.id: Status.PENDING for c in spec.commitments}, nodes=spec.node_ids())
    nodes = {n.id: n for n in spec.trajectory}
    done: set[str] = set()
    achievements = [c.id for c in spec.achievements()]

    def settle(cid: str, status: Status, reason: str = "") -> None:
        if result.statuses[cid] is Status.PENDING:
            result.statuses[cid] = status
            if reason:
                result.reasons[cid] = reason

    while True:
        nxt = next((n for n in spec.node_ids() if n not in done and all(p in done for p in graph.predecessors(n))),
                   None)
        if nxt is None:
            break
        done.add(nxt)
        result.order.append(nxt)
        for c in spec.commitments:
            if c.type is CommitmentType.ACHIEVEMENT and c.node == nxt:
                settle(c.id, Status.SATISFIED)
            elif c.type is CommitmentType.ORDERING and c.after == nxt and c.before is not None:
                if c.before in done and c.before != nxt:
                    settle(c.id, Status.SATISFIED)
                else:
                    settle(c.id, Status.VIOLATED, f"the replay completes {nxt} (after) before {c.before} (before)")
            elif c.type is CommitmentType.INVARIANT and c.until == nxt:
                settle(c.id, Status.SATISFIED)
        if achievements and all(result.statuses[a] is Status.SATISFIED for a in achievements):
            result.success, result.ended_by, result.ended_at = True, "success", nxt
            break
        if nodes[nxt].exit:
            result.ended_by, result.ended_at = "exit", nxt
            break
    if result.ended_at is None and result.order:
        result.ended_at = result.order[-1]
    for c in spec.commitments:
        if c.type is CommitmentType.INVARIANT:
            settle(c.id, Status.SATISFIED)
    end = {"success": f"the episode ends in SUCCESS when {result.ended_at} completes",
           "exit": f"the player character leaves the story at {result.ended_at}",
           "plot": "the replay runs out of nodes"}[result.ended_by]
    for c in spec.commitments:
        if result.statuses[c.id] is Status.PENDING:
            target = c.node if c.type is CommitmentType.ACHIEVEMENT else c.after
            if target is None:
                result.reasons[c.id] = "no structural link settles it"
            else:
                result.reasons[c.id] = f"{end} before {target} is reached"
    return result


def _replay(spec: Spec, out: _Out) -> None:
    result = replay_reference(spec)
    for cid in result.violated():
        out.error("replay", cid, "after", f"the reference plot violates it: {result.reasons[cid]}")
    by_id = {c.id: c for c in spec.commitments}
    for cid in result.unsettled():
        c = by_id[cid]
        if c.type is CommitmentType.ACHIEVEMENT:
            continue  # reported once below, with the outcome
        out.warn("replay", cid, "after" if c.type is CommitmentType.ORDERING else "node",
                 f"the reference plot never settles it: {result.reasons[cid]}")
    if not result.success:
        missing = [a.id for a in spec.achievements() if result.statuses[a.id] is not Status.SATISFIED]
        why = "; ".join(f"{a}: {result.reasons.get(a, 'pending')}" for a in missing) or "no achievement"
        out.error("replay", "-", "commitments", f"the reference plot does not reach SUCCESS ({why})")
    elif result.unreached:
        tail = result.unreached
        last = next(c.id for c in spec.achievements() if c.node == result.ended_at)
        out.warn("replay", last, "node",
                 f"the episode ends in SUCCESS when {result.ended_at} completes, so {', '.join(tail)} can never "
                 "be played: the last achievement should be the final node")


# -- cheap text rules ----------------------------------------------------------------------------


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _conditions(spec: Spec, out: _Out) -> None:
    for c in spec.commitments:
        if _norm(c.satisfaction_condition) == _norm(c.violation_condition):
            out.error("conditions", c.id, "violation_condition",
                      "the same text as the satisfaction condition: the two must exclude each other")


_FUTURE = re.compile(r"\b(?:will|won't|shall)\s+(?:not\s+|never\s+)?\w+")
_WILL_NOUN = frozenset("his her its their our your my the a free own good ill of against with at by last "
                       "whose".split())
"""Words before "will" that make it the noun (a last will, free will, against her will). A capital
"Will" is taken as a name and never matched."""


_REPORTED = re.compile(r"\b(?:that|who|whom|whose|which|what|how|when|where|whether|if|told|tells|said|says|"
                       r"promised|promises|announced|announces|decided|knows?|knew|believes?|thinks?|fears?|"
                       r"hopes?|expects?|foretells?|predicts?|prophes\w+|claims?|swore|swears|warned|warns)\b", re.I)
"""Words that make a following "will" reported or subordinate: the fact is the report, true now."""


def _future(text: str) -> str | None:
    for m in _FUTURE.finditer(text):
        head = text[:m.start()]
        prev = re.search(r"(\w+)\W*$", head)
        if m.group(0).startswith("will") and prev and prev.group(1).lower() in _WILL_NOUN:
            continue
        if _REPORTED.search(re.split(r"[.;:]", head)[-1]):
            continue  # "does not know who will ...", "has been told the fleet will ...": true now
        return m.group(0)
    return None


def _future_facts(spec: Spec, out: _Out) -> None:
    for f in spec.initial_facts:
        found = _future(f.content)
        if found:
            out.warn("future-fact", f.id, "content",
                     f"worded in the future tense ({found!r}): an initial fact states what is true at t=0; "
                     "what happens later belongs in the plot")


def _duplicate_nodes(spec: Spec, out: _Out) -> None:
    for name in ("description", "trigger_event", "key_delta"):
        seen: dict[str, str] = {}
        for n in spec.trajectory:
            key = _norm(getattr(n, name))
            if key in seen:
                out.warn("duplicate-node", n.id, name, f"the same {name} as {seen[key]}: every node is a distinct "
                                                       "event")
            else:
                seen[key] = n.id


def _version(spec: Spec, out: _Out) -> None:
    if spec.meta.version < 0:
        out.error("version", "meta", "version", f"{spec.meta.version} is negative: versions count up from 0")


_CHECKS = {
    "player-mind": _player_mind, "impossible-ordering": _orderings, "missing-link": _missing_links,
    "after-exit": _after_exit, "replay": _replay, "conditions": _conditions, "future-fact": _future_facts,
    "duplicate-node": _duplicate_nodes, "version": _version,
}
assert tuple(_CHECKS) == RULES


def lint_spec(spec: Spec, file: str = "-", rules: Iterable[str] | None = None) -> list[LintFinding]:
    """Every finding of the chosen rules (default all) on a parsed spec, in rule order."""
    chosen = None if rules is None else set(rules)
    unknown = (chosen or set()) - set(RULES)
    if unknown:
        raise ValueError(f"unknown lint rule(s): {', '.join(sorted(unknown))}; rules: {', '.join(RULES)}")
    out = _Out(file, chosen)
    ids = set(spec.node_ids())
    dangling = any(t not in ids for c in spec.commitments for t in c.links().values()) or any(
        r not in ids for n in spec.trajectory for r in n.requires or [])
    for rule, check in _CHECKS.items():
        if not out.wants(rule):
            continue
        if rule == "replay" and (dangling or not spec.trajectory):
            continue  # the validator reports the dangling links; a replay needs them resolved
        check(spec, out)
    return out.found


def lint_file(path: Path, rules: Iterable[str] | None = None) -> tuple[Spec | None, list[Finding]]:
    """Validate and lint one file. Spec None: the file is not a valid spec and the findings are the
    validator's errors; otherwise they are the lint findings."""
    spec, found = validate_file(path)
    if spec is None:
        return None, errors(found)
    return spec, list(lint_spec(spec, str(path), rules))


def builder_findings(spec: Spec, file: str) -> list[LintFinding]:
    """The lint findings a builder should send back: errors, and warnings of the structural rules."""
    return [f for f in lint_spec(spec, file) if f.severity is Severity.ERROR or f.rule in STRUCTURAL]
