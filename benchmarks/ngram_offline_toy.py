"""Offline cross-check of n-gram drafting on the shipped category prompts (no vLLM).

Greedy outputs of the toy dense target (HF transformers, 32 tokens, EOS suppressed as vLLM's
ignore_eos), and per category the share of output positions whose token an n-gram lookup over the
context (longest match of 4..2 tokens, latest occurrence first) predicts: an independent estimate
of the first-position acceptance vLLM's n-gram drafter should show (docs/lab/drafts-cpu.md).
    python benchmarks/ngram_offline_toy.py N_PROMPTS_PER_CATEGORY
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def lookup(ctx: list[int], nmin: int = 2, nmax: int = 4) -> int | None:
    for n in range(nmax, nmin - 1, -1):
        if len(ctx) <= n:
            continue
        suf = ctx[-n:]
        for i in range(len(ctx) - n - 1, -1, -1):
            if ctx[i:i + n] == suf:
                return ctx[i + n]
    return None


def main(n: int) -> None:
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained("toy_models/dense/target")
    m = AutoModelForCausalLM.from_pretrained("toy_models/dense/target", dtype=torch.float32).eval()
    with open("sweeps/prompts/toy-domains.jsonl") as fh:
        recs = [json.loads(line) for line in fh]
    for cat in ("code", "text"):
        hits = tot = 0
        for r in [x for x in recs if x["category"] == cat][:n]:
            ids = tok.encode(r["prompt"], add_special_tokens=False)[:128]
            with torch.no_grad():
                out = m.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32,
                                 do_sample=False)[0].tolist()
            for j, t in enumerate(out[len(ids):]):
                hits += lookup(out[:len(ids) + j]) == t
                tot += 1
        print(f"{cat}: next-token n-gram hit rate {hits / tot:.3f} over {tot} tokens", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
