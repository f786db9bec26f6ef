"""`.gitignore` rules, as git reads them, for the folders llmtui reads documents from: patterns per folder (blank
lines and `#` comments skipped, `!` negation, a trailing `/` for folders only, a `/` inside or in front anchoring to
the folder, `*`, `?`, `[...]` within a name and `**` across folders); the last rule that matches decides."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RULES = 2000  # rules read from one .gitignore (past them, the rest are not read)
MAX_LINE = 1000  # characters of one rule


@dataclass(frozen=True)
class Rule:
    base: str  # the folder of the .gitignore, relative to the source's root ("" at the root), with a trailing "/"
    pattern: re.Pattern[str]
    negated: bool
    folders_only: bool


def _translate(glob: str) -> str:
    """A gitignore glob (without its anchoring) as a regular expression over a relative path."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if glob.startswith("/**", i) and i + 3 == len(glob):
            out.append("/.*")
            i += 3
            continue
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = glob.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : end].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end
        elif c == "\\" and i + 1 < len(glob):
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_rules(text: str, base: str) -> list[Rule]:
    """The rules of one .gitignore found in folder `base` (relative, "" for the root)."""
    rules: list[Rule] = []
    prefix = base + "/" if base else ""
    for raw in text.splitlines()[:MAX_RULES]:
        line = raw[:MAX_LINE].rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line
        folders_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _translate(line.lstrip("/"))
        expr = body if anchored else "(?:.*/)?" + body
        try:
            pattern = re.compile("(?s)" + expr + r"(?:/.*)?\Z")
        except re.error:
            continue
        rules.append(Rule(prefix, pattern, negated, folders_only))
    return rules


def ignored(rules: list[Rule], relative: str, is_folder: bool) -> bool:
    """Whether `relative` (a path under the source's root, `/`-separated) is ignored by `rules` (outer first)."""
    verdict = False
    for rule in rules:
        if not relative.startswith(rule.base):
            continue
        rest = relative[len(rule.base) :]
        if rule.folders_only and not is_folder:
            continue
        if rule.pattern.match(rest):
            verdict = not rule.negated
    return verdict
