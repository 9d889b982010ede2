"""Which modules a run's code imports, read from its text: to choose the zygote that forks it.

A guess on the safe side, never a parse: every `import x` and `from x import`
in the text counts, in strings and comments too (such a run goes to the
preloaded zygote, where it is served as fast as ever), and code that imports by
name at run time (`__import__`, `importlib.import_module`) is not told apart
(None). What this misses (an import built from pieces, `exec` of a decoded
string) is still served, by the lean zygote, which imports what the run asks
for as any interpreter does, as it does a package no zygote preloads: the
import's time and memory are then the run's own (the memory counts in the run's
limit). Both zygotes confine their children alike.
"""

from __future__ import annotations

import re

# Possessive quantifiers only (Python 3.11+): nothing is tried twice, so a hostile code is read in time
# linear in its length (a lazy or backtracking pattern took seconds for 16 kB of spaces on one line).
_STATEMENT = re.compile(
    r"\bfrom[ \t\f]++(\.*+[\w.]*+)[ \t\f]++import\b"  # from a.b import c (relative ones name nothing of ours)
    r"|\bimport[ \t\f]++([\w.]++(?:[ \t\f]*+,[ \t\f]*+[\w.]++|[ \t\f]++as[ \t\f]++\w++)*+)"  # import a.b as c, d
)  # (space, tab and form feed: what Python's tokenizer takes for blanks)
_BY_NAME = re.compile(r"\b__import__\b|\bimport_module\b")
READ_AT_MOST = 32 * 1024  # characters: a longer code is not read (the service reads it on its event loop)


def imported_modules(code: str) -> frozenset[str] | None:
    """The top-level names of the modules code imports, or None when it imports by name at run time or is
    longer than READ_AT_MOST (a few ms of reading at most, hostile or not)."""
    if "import" not in code:
        return frozenset()
    if len(code) > READ_AT_MOST or _BY_NAME.search(code):
        return None
    names = set()
    joined = code.replace("\\\r\n", " ").replace("\\\n", " ")  # statements continued on the next line
    for match in _STATEMENT.finditer(joined):
        source, listed = match.groups()
        if source is not None:
            if not source.startswith("."):
                names.add(source.partition(".")[0])
            continue
        for part in listed.split(","):
            names.add(part.split()[0].partition(".")[0])
    return frozenset(names)
