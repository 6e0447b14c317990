"""The shipped toy sets of prompts by category (``sweeps/prompts/toy-domains.jsonl``, docs/drafts.md):
``code`` (repetitive code-like lines, where an n-gram match in the context predicts the next
tokens) and ``text`` (free text drawn word by word, with few repeated n-grams). Synthetic; not part
of the dsdprof package (it made a data file; a test checks the file is still its output)."""

from __future__ import annotations

import random

from dsdprof.measure.categories import CATEGORY_KEY

_WORDS = (
    "the a of and to in is it that for on with as was at by this from be are or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do first "
    "any my now such like our over man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little state "
    "good very make world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came right used "
    "take three river garden window morning letter music market doctor winter forest silver question"
).split()
_NAMES = ("x", "y", "total", "count", "item", "value", "row", "col", "key", "buf")
_OPS = ("+", "-", "*")


def _code_prompt(rng: random.Random) -> str:
    """Code-like lines repeating one template with small changes (an n-gram drafter's case)."""
    fn = rng.choice(("load", "parse", "check", "update", "scale"))
    var, op = rng.choice(_NAMES), rng.choice(_OPS)
    start = rng.randrange(1, 50)
    lines = [f"def {fn}_{i}({var}):\n    {var} = {var} {op} {i}\n    return {fn}({var}, {i})\n"
             for i in range(start, start + 10)]
    return "".join(lines)


def _text_prompt(rng: random.Random) -> str:
    """Free text: words drawn independently, sentences of random length (few repeated n-grams)."""
    out: list[str] = []
    while sum(len(s.split()) for s in out) < 80:
        sentence = [rng.choice(_WORDS) for _ in range(rng.randrange(6, 16))]
        out.append(sentence[0].capitalize() + " " + " ".join(sentence[1:]) + ".")
    return " ".join(out)


def toy_category_prompts(n_per_category: int = 64, seed: int = 0) -> list[dict[str, str]]:
    """The shipped toy set: ``n_per_category`` ``code`` and ``text`` records, reproducible."""
    rng = random.Random(seed)
    records = []
    for i in range(n_per_category):
        records.append({"id": f"code-{i}", CATEGORY_KEY: "code", "prompt": _code_prompt(rng)})
        records.append({"id": f"text-{i}", CATEGORY_KEY: "text", "prompt": _text_prompt(rng)})
    return records
