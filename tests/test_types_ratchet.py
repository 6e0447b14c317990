"""The untyped-data ratchet: ``dict[str, Any]``, ``Mapping[str, Any]`` and bare ``Any`` in the package
may only become fewer.

The ceilings below are the counts when they were last lowered. A change that adds one fails here;
one that removes some should lower the ceiling in the same commit, so the next change cannot spend
the difference. Counted in code, by token (comments, docstrings and ``from typing import Any`` do
not count; an ``Any`` inside ``dict[str, Any]`` or ``Mapping[str, Any]`` counts there, not as bare).
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "dsdprof"

CEILINGS = {"dict[str, Any]": 57, "Mapping[str, Any]": 15, "Any": 199}


def count_untyped(source: str) -> dict[str, int]:
    """Occurrences of each ratcheted form in ``source``'s code tokens."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type in (tokenize.NAME, tokenize.OP, tokenize.NEWLINE)]
    counts = dict.fromkeys(CEILINGS, 0)
    in_import = False
    i = 0
    while i < len(toks):
        t = toks[i]
        starts_statement = i == 0 or toks[i - 1].type == tokenize.NEWLINE
        if t.type == tokenize.NEWLINE:
            in_import = False
        elif t.type == tokenize.NAME and t.string in ("import", "from") and starts_statement:
            in_import = True
        elif t.type == tokenize.NAME and t.string in ("dict", "Dict", "Mapping", "MutableMapping") \
                and [x.string for x in toks[i + 1:i + 6]] == ["[", "str", ",", "Any", "]"]:
            counts["dict[str, Any]" if t.string in ("dict", "Dict") else "Mapping[str, Any]"] += 1
            i += 6
            continue
        elif t.type == tokenize.NAME and t.string == "Any" and not in_import:
            counts["Any"] += 1
        i += 1
    return counts


def package_counts() -> dict[str, int]:
    total = dict.fromkeys(CEILINGS, 0)
    for path in sorted(PKG.rglob("*.py")):
        for form, n in count_untyped(path.read_text()).items():
            total[form] += n
    return total


def test_counter_tells_the_forms_apart():
    src = ('"""dict[str, Any] in a docstring"""\n'
           "from typing import Any, Mapping  # dict[str, Any]\n"
           "def f(a: dict[str, Any], b: Mapping[str, Any], c: Any) -> dict[str, int]:\n"
           "    return typing.Dict[str, Any]\n")
    assert count_untyped(src) == {"dict[str, Any]": 2, "Mapping[str, Any]": 1, "Any": 1}


def test_untyped_data_only_falls():
    got = package_counts()
    over = {form: f"{got[form]} > {ceiling}" for form, ceiling in CEILINGS.items() if got[form] > ceiling}
    assert not over, f"more untyped data than the ratchet allows (type it at the edge instead): {over}"
