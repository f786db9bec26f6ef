"""The work a GBNF grammar asks of llama.cpp, measured before llama.cpp reads it: its repetition counts, the rules its
parser makes from them, and how many ways to read the same text its sampler may have to keep open at once.

llama.cpp's grammar parser expands `x{m,n}` into rules (`handle_repetitions` in src/llama-grammar.cpp: m copies of x
and n - m optional rules), reads a bound above 2000 as no bound at all (x{0,5000} as x*), and its sampler keeps one
stack per way the text so far can be read: nested counted repetitions over the same characters, `((a{0,50}){0,50})`
through rules, keep thousands of them, and every sampling step filters the vocabulary through each (measured on the
starter model: 1.8 ms per stack and step; 30 × 30 took 1.6 s a step, 100 × 100 over 5 s). Each measure here is
bounded, and every grammar the engine samples with is checked (engine_ext.sampling), one GrammarError line naming
the limit and the rule where it was passed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from engine_ext.params import EngineError
from engine_ext.untrusted_text import shown

MAX_REPEAT = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD: it reads a larger bound as none, and refuses a larger minimum
# Rules and symbols the parser makes from repetitions, summed over the grammar: about 200 bytes each (500,000 took
# 102 MiB and 0.37 s to parse, measured), so the bound keeps a grammar under ~50 MiB and ~0.2 s.
MAX_EXPANSION = 250_000
# Ways to read the same text a grammar may keep open at once (the sampler's stacks): each costs ~1.8 ms a step with the
# starter's 49,152 tokens (more with a larger vocabulary), so at most ~0.2 s a step on a step that filters them all.
MAX_OPEN_READINGS = 100

MAX_DEPTH = 20_000  # Python frames the measures may use: rules referring to rules, groups in groups
_ALL = (1 << 130) - 1  # a character set: bit c for ASCII c, bit 128 for any other character, bit 129 for a token


class GrammarError(EngineError):
    """A grammar or JSON schema that cannot constrain the output (one line)."""


@dataclass(eq=False)
class _Node:
    """One symbol of a rule: a terminal (`chars`: what it can start with, `width` characters long), a rule reference,
    a group of alternatives (each a sequence), or a repetition of `items[0]` from `low` to `high` (None: no bound)."""

    kind: str  # "term", "ref", "alt", "rep"
    chars: int = 0
    empty: bool = False  # a terminal that reads nothing ("")
    width: int = 1
    name: str = ""
    alternatives: list[list[_Node]] = field(default_factory=list)
    low: int = 0
    high: int | None = 0
    conflict: bool = False  # a repetition whose reader cannot tell whether it goes on (set by _Bounds.follow)


def _char_bit(code: int) -> int:
    return 1 << (code if code < 128 else 128)


class _Reader:
    """GBNF text into rules of _Nodes, as llama.cpp's parser reads it (llama-grammar.cpp parse_*); what llama.cpp
    would refuse is left to it, and only what the measures need is kept."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rules: dict[str, list[list[_Node]]] = {}

    def fail(self, what: str) -> GrammarError:
        return GrammarError(f"the grammar does not parse: {what} at character {self.pos}")

    def space(self, newlines: bool) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            char = text[self.pos]
            if char == "#":
                while self.pos < n and text[self.pos] not in "\r\n":
                    self.pos += 1
            elif char in " \t" or (newlines and char in "\r\n"):
                self.pos += 1
            else:
                return

    def name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and (
            self.text[self.pos].isascii() and self.text[self.pos].isalnum() or self.text[self.pos] == "-"
        ):
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a name")
        return self.text[start : self.pos]

    def char(self) -> int:
        """One character of a literal or class (escapes as llama.cpp's parse_char reads them): its code."""
        text = self.text
        if self.pos >= len(text):
            raise self.fail("unexpected end of input")
        if text[self.pos] != "\\":
            self.pos += 1
            return ord(text[self.pos - 1])
        escape = text[self.pos + 1 : self.pos + 2]
        digits = {"x": 2, "u": 4, "U": 8}.get(escape)
        if digits is not None:
            value = text[self.pos + 2 : self.pos + 2 + digits]
            self.pos += 2
            code = 0
            for digit in value:
                if digit not in "0123456789abcdefABCDEF":
                    break
                code = code * 16 + int(digit, 16)
                self.pos += 1
            return code
        self.pos += 2
        return {"t": 9, "r": 13, "n": 10}.get(escape, ord(escape) if escape else 0)

    def read(self) -> dict[str, list[list[_Node]]]:
        self.space(True)
        while self.pos < len(self.text):
            name = self.name()
            self.space(False)
            if not self.text.startswith("::=", self.pos):
                raise self.fail("expecting ::=")
            self.pos += 3
            self.space(True)
            self.rules.setdefault(name, []).extend(self.alternatives(nested=False))
            self.space(True)
        return self.rules

    def alternatives(self, nested: bool) -> list[list[_Node]]:
        found = [self.sequence(nested)]
        while self.text.startswith("|", self.pos):
            self.pos += 1
            self.space(True)
            found.append(self.sequence(nested))
        return found

    def sequence(self, nested: bool) -> list[_Node]:
        """Symbols up to a `|`, a `)` or (outside a group) the end of the line; groups read with an explicit stack
        of open sequences, so that nesting costs no Python recursion."""
        open_groups: list[tuple[list[list[_Node]], list[_Node]]] = []  # (the group's alternatives, the outer sequence)
        items: list[_Node] = []
        text = self.text
        while True:
            inside = nested or bool(open_groups)
            char = text[self.pos] if self.pos < len(text) else "\n"  # the end reads as the end of a line
            if char == '"':
                self.pos += 1
                first, width = 0, 0
                while self.pos < len(text) and text[self.pos] != '"':
                    code = self.char()
                    first = first or _char_bit(code)
                    width += 1
                if self.pos >= len(text):
                    raise self.fail("unexpected end of input")
                self.pos += 1
                items.append(_Node("term", chars=first, empty=width == 0, width=max(width, 1)))
            elif char == "[":
                self.pos += 1
                negated = text.startswith("^", self.pos)
                self.pos += negated
                chars = 0
                while self.pos < len(text) and text[self.pos] != "]":
                    low = self.char()
                    high = low
                    if text.startswith("-", self.pos) and text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                        self.pos += 1
                        high = self.char()
                    if high >= 128:
                        chars |= 1 << 128
                    for code in range(low, min(high, 127) + 1):
                        chars |= 1 << code
                if self.pos >= len(text):
                    raise self.fail("unexpected end of input")
                self.pos += 1
                items.append(_Node("term", chars=(_ALL ^ chars) | (1 << 128) if negated else chars))
            elif char == "." or char in "<!":
                if char != ".":
                    end = text.find(">", self.pos)
                    self.pos = len(text) if end < 0 else end
                self.pos += 1
                items.append(_Node("term", chars=_ALL if char != "<" else 1 << 129))
            elif char.isascii() and (char.isalnum() or char == "-"):
                start = self.pos
                name = self.name()
                after = self.pos
                self.space(inside)
                if not inside and text.startswith("::=", self.pos):  # the next rule starts: this one ended
                    self.pos = start
                    return items
                self.pos = after
                items.append(_Node("ref", name=name))
            elif char == "(":
                self.pos += 1
                self.space(True)
                group: list[list[_Node]] = []
                open_groups.append((group, items))
                items = []
                continue
            elif char == "|" and open_groups:
                open_groups[-1][0].append(items)
                items = []
                self.pos += 1
                self.space(True)
                continue
            elif char == ")" and open_groups:
                group, outer = open_groups.pop()
                group.append(items)
                items = outer
                self.pos += 1
                items.append(_Node("alt", alternatives=group))
            elif char in "*+?{" and items:
                self.pos += 1
                bounds: dict[str, tuple[int, int | None]] = {"*": (0, None), "+": (1, None), "?": (0, 1)}
                least, most = bounds.get(char, (0, None))
                if char == "{":
                    least, most = self.counts()
                items[-1] = _Node("rep", alternatives=[[items[-1]]], low=least, high=most)
            else:
                if open_groups:
                    raise self.fail("expecting ')'")
                return items
            self.space(nested or bool(open_groups))

    def counts(self) -> tuple[int, int | None]:
        self.space(True)
        low = self.number()
        self.space(True)
        high: int | None = low
        if self.text.startswith(",", self.pos):
            self.pos += 1
            self.space(True)
            high = self.number() if self.text[self.pos : self.pos + 1].isdigit() else None
            self.space(True)
        if not self.text.startswith("}", self.pos):
            raise self.fail("expecting '}'")
        self.pos += 1
        return low, high

    def number(self) -> int:
        start = self.pos
        while self.pos < len(self.text) and "0" <= self.text[self.pos] <= "9":
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting an int")
        digits = self.text[start : self.pos]
        return int(digits) if len(digits) <= 12 else 10**12  # a count past any bound; no huge int made


class _Bounds:
    """The measures over a grammar's rules: FIRST sets and nullability (to a fixed point), FOLLOW sets marking the
    repetitions whose reader cannot tell whether they go on, then the expansion and the open readings."""

    def __init__(self, rules: dict[str, list[list[_Node]]]) -> None:
        self.rules = rules
        self.first: dict[str, int] = dict.fromkeys(rules, 0)
        self.nullable: dict[str, bool] = dict.fromkeys(rules, False)
        self.follows: dict[str, int] = dict.fromkeys(rules, 0)
        # Fixed points by work lists: a rule is measured again only when a rule it refers to changed (a chain of
        # 30,000 rules would take 30,000 rounds over every rule otherwise).
        self.users: dict[str, set[str]] = {name: set() for name in rules}
        for name, body in rules.items():
            for node in _nodes(body):
                if node.kind == "ref" and node.name in self.users:
                    self.users[node.name].add(name)
        pending = list(rules)
        queued = set(pending)
        while pending:
            name = pending.pop()
            queued.discard(name)
            first, nullable = self.alt_first(rules[name])
            if first != self.first[name] or nullable != self.nullable[name]:
                self.first[name], self.nullable[name] = first, nullable
                for user in self.users[name] - queued:
                    pending.append(user)
                    queued.add(user)

    def node_first(self, node: _Node) -> tuple[int, bool]:
        if node.kind == "term":
            return (0, True) if node.empty else (node.chars, False)
        if node.kind == "ref":
            return self.first.get(node.name, 0), self.nullable.get(node.name, False)
        first, nullable = self.alt_first(node.alternatives)
        return first, nullable or (node.kind == "rep" and node.low == 0)

    def seq_first(self, items: list[_Node]) -> tuple[int, bool]:
        first = 0
        for item in items:
            chars, nullable = self.node_first(item)
            first |= chars
            if not nullable:
                return first, False
        return first, True

    def alt_first(self, alternatives: list[list[_Node]]) -> tuple[int, bool]:
        first, nullable = 0, False
        for items in alternatives:
            chars, empty = self.seq_first(items)
            first |= chars
            nullable = nullable or empty
        return first, nullable

    def follow(self) -> None:
        """FOLLOW of every rule to a fixed point; each repetition marked where what may follow it can also start
        another round of it (or a round can read nothing)."""
        pending = list(self.rules)
        queued = set(pending)
        while pending:
            name = pending.pop()
            queued.discard(name)
            changed: set[str] = set()
            self.walk(self.rules[name], self.follows[name], changed)
            for other in changed - queued:
                pending.append(other)
                queued.add(other)

    def walk(self, alternatives: list[list[_Node]], after: int, changed: set[str]) -> None:
        """Mark the repetitions in these alternatives, followed by `after`; rules whose FOLLOW grew go in `changed`."""
        for items in alternatives:
            following = after
            for node in reversed(items):
                if node.kind == "ref":
                    known = self.follows.get(node.name)
                    if known is not None and following & ~known:
                        self.follows[node.name] = known | following
                        changed.add(node.name)
                elif node.kind == "alt":
                    self.walk(node.alternatives, following, changed)
                elif node.kind == "rep":
                    first, nullable = self.alt_first(node.alternatives)
                    again = node.high is None or node.high > max(node.low, 1)
                    node.conflict = node.high != node.low and (nullable or bool(first & following))
                    self.walk(node.alternatives, following | first if again or node.low > 1 else following, changed)
                chars, nullable = self.node_first(node)
                following = chars | (following if nullable else 0)

    def expansion(self) -> tuple[int, str]:
        """Symbols llama.cpp's parser makes from the repetitions (each counted once where it is written), and the rule
        with the most; a count past MAX_REPEAT is refused here."""
        total, most, where = 0, -1, ""
        for name, body in self.rules.items():
            made = 0
            for node in _nodes(body):
                if node.kind != "rep":
                    continue
                for count in (node.low, node.high):
                    if count is not None and count > MAX_REPEAT:
                        raise GrammarError(
                            f"rule {shown(name)[:60]} repeats an item {count} times; llama.cpp counts to at most "
                            f"{MAX_REPEAT}"
                        )
                item = node.alternatives[0][0]
                width = item.width if item.kind == "term" else 1
                made += (node.high if node.high is not None else node.low + 1) * width
            total += made
            if made > most:
                most, where = made, name
        return total, where

    def readings(self, root: str) -> tuple[int, str]:
        """An estimate of the readings the sampler may keep open at once, from `root`, and the rule where the most
        arise. A repetition whose reader cannot tell whether it goes on keeps two; one whose rounds can end in
        more than one place, or that starts where earlier text could be read more than one way, keeps one per
        round it may be in (a rule that refers to itself adds nothing: llama.cpp's stacks for it coincide)."""
        memo: dict[tuple[str, bool], int] = {}
        ambiguous: dict[str, bool] = {}
        worst: list[tuple[int, str]] = [(0, root)]

        # Plain loops, no any()/max() over generators: the recursion stays in Python frames (no C stack).
        def rule_ambiguous(name: str) -> bool:
            if name not in ambiguous:
                ambiguous[name] = False  # a cycle adds nothing
                ambiguous[name] = any_ambiguous(self.rules.get(name, []))
            return ambiguous[name]

        def any_ambiguous(alternatives: list[list[_Node]]) -> bool:
            for node in _nodes(alternatives):
                if node.conflict or (node.kind == "ref" and rule_ambiguous(node.name)):
                    return True
            return False

        def of_rule(name: str, uncertain: bool) -> int:
            key = (name, uncertain)
            if key not in memo:
                memo[key] = 1  # a cycle adds nothing
                memo[key] = of_alternatives(self.rules.get(name, []), uncertain, name)
            return memo[key]

        def of_alternatives(alternatives: list[list[_Node]], uncertain: bool, name: str) -> int:
            most = 1
            for items in alternatives:
                most = max(most, of_sequence(items, uncertain, name))
            return most

        def of_sequence(items: list[_Node], uncertain: bool, name: str) -> int:
            product = 1
            for node in items:
                product = min(product * of_node(node, uncertain, name), MAX_OPEN_READINGS * 1000)
                uncertain = uncertain or any_ambiguous([[node]])
            if product > worst[0][0]:
                worst[0] = (product, name)
            return product

        def of_node(node: _Node, uncertain: bool, name: str) -> int:
            if node.kind == "term":
                return 1
            if node.kind == "ref":
                return of_rule(node.name, uncertain)
            if node.kind == "alt":
                return of_alternatives(node.alternatives, uncertain, name)
            items = node.alternatives[0]
            inner = uncertain or any_ambiguous([items])
            if not inner:
                rounds = 2 if node.conflict else 1
            elif node.high != node.low:  # the round it is in is not told by the text read
                rounds = node.high if node.high is not None else node.low + 1
            else:
                rounds = max(node.low, 1)
            return rounds * of_sequence(items, inner or node.conflict, name)

        of_rule(root, False)
        return worst[0]


def _nodes(alternatives: list[list[_Node]]) -> list[_Node]:
    """Every node in these alternatives, groups and repetitions opened (no rule followed)."""
    found: list[_Node] = []
    pending = [node for items in alternatives for node in items]
    while pending:
        node = pending.pop()
        found.append(node)
        if node.kind in ("alt", "rep"):
            pending.extend(n for items in node.alternatives for n in items)
    return found


def check_bounds(grammar: str, root: str = "root") -> None:
    """Refuse, in one GrammarError line, a grammar whose repetitions llama.cpp cannot take (a count over
    MAX_REPEAT), would expand past MAX_EXPANSION symbols, or whose nested repetitions may keep more than
    MAX_OPEN_READINGS readings open at once. Text llama.cpp's parser itself refuses is left to it."""
    reader = _Reader(grammar)
    try:
        rules = reader.read()
    except GrammarError:
        return  # llama.cpp says why, in its own words (engine_ext.grammar.parse_error)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, MAX_DEPTH))  # the measures recurse through groups and rules (Python frames only)
    try:
        _measure(rules, root)
    except RecursionError:
        raise GrammarError(f"the grammar's groups and rules nest too deeply to measure (over {MAX_DEPTH})") from None
    finally:
        sys.setrecursionlimit(limit)


def _measure(rules: dict[str, list[list[_Node]]], root: str) -> None:
    bounds = _Bounds(rules)
    total, where = bounds.expansion()
    if total > MAX_EXPANSION:
        raise GrammarError(
            f"the grammar's repetitions expand to {total} rules (the most in rule {shown(where)[:60]}); at most "
            f"{MAX_EXPANSION}"
        )
    bounds.follow()
    open_readings, where = bounds.readings(root)
    if open_readings > MAX_OPEN_READINGS:
        shown_count = f"{open_readings}" if open_readings < MAX_OPEN_READINGS * 1000 else "over 100000"
        raise GrammarError(
            f"the grammar nests repetitions that can read the same text in many ways (rule {shown(where)[:60]}): "
            f"{shown_count} readings open at once, each costing every sampling step; at most {MAX_OPEN_READINGS}"
        )
