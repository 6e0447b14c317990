"""Which draft: rank drafts of one target per batch size, their memory, a recommendation.

Input: per draft, its category grid (:func:`dsdprof.decide.domains.category_grid`) and a traffic
mix. Per batch size each draft is taken at its own best K for the mix
(:func:`dsdprof.decide.domains.mix_table`); drafts are ranked by that speedup over vanilla. The
leader **wins** a batch size when its interval's lower end is above every other draft's upper end;
otherwise the drafts whose intervals reach the leader's point are **tied** with it (more waves
could reorder them). Where the drafts' own vanillas (the same configuration) disagree by more
than ``VANILLA_TOLERANCE`` in any category the mix includes, checked per category before any
weighting, the machine drifted between sweeps and no verdict is given there: a mix inherits its
worst category (one category's 28 % drift is not averaged with another's 1 % into "tied").
The recommendation is one draft when it leads every batch size, else the
batch-size ranges each draft leads (ties named).

**Memory** (:func:`draft_memory`): the draft's weights (its safetensors files, or nothing for a
draftless method such as n-gram or suffix decoding) and its KV cache per request, ``2 x layers x
kv_heads x head_dim x dtype bytes`` per token over ``input_len + output_len + K`` tokens (a draft
model keeps the whole sequence's KV; an MTP/EAGLE head's layers are counted the same way from its
config). The target's own KV is the same for every draft and is not counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from dsdprof.decide.domains import mix_table

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "auto": 2,
                "fp8": 1, "float8_e4m3fn": 1}


def draft_memory(draft_model: str | None, dtype: str, input_len: int, output_len: int, k: int,
                 batch_size: int = 1) -> dict[str, float]:
    """``weights_bytes``, ``kv_bytes_per_token`` and ``kv_bytes`` (for ``batch_size`` requests) of a
    draft model directory; all 0 without a draft model (n-gram, suffix decoding)."""
    if not draft_model:
        return {"weights_bytes": 0.0, "kv_bytes_per_token": 0.0, "kv_bytes": 0.0}
    path = Path(draft_model)
    weights = float(sum(f.stat().st_size for f in path.glob("*.safetensors"))) if path.is_dir() else math.nan
    cfg_path = path / "config.json"
    per_token = math.nan
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        cfg = cfg.get("text_config", cfg)
        layers = cfg.get("num_hidden_layers")
        heads = cfg.get("num_attention_heads")
        kv_heads = cfg.get("num_key_value_heads", heads)
        head_dim = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads if heads else None)
        nbytes = _DTYPE_BYTES.get(dtype if dtype != "auto" else str(cfg.get("torch_dtype", "auto")), 2)
        if layers and kv_heads and head_dim:
            per_token = float(2 * layers * kv_heads * head_dim * nbytes)
    tokens = input_len + output_len + k
    return {"weights_bytes": weights, "kv_bytes_per_token": per_token,
            "kv_bytes": per_token * tokens * batch_size}


def comparison_memory(spec: Mapping[str, Any], drafts: list[Mapping[str, Any]]
                      ) -> tuple[int, int, list[tuple[Mapping[str, Any], dict[str, float]]]]:
    """(largest batch size, largest K, [(draft, :func:`draft_memory` at both)]) of a compare-drafts
    spec's drafts: the memory every report of the comparison shows."""
    sweep, work, eng = spec.get("sweep", {}), spec.get("workload", {}), spec.get("engine", {})
    kmax, bmax = max(sweep.get("num_spec_tokens", [0])), max(sweep.get("batch_sizes", [1]))
    return bmax, kmax, [(d, draft_memory(d.get("draft_model"), str(eng.get("dtype", "auto")),
                                         int(work.get("input_len", 0)), int(sweep.get("output_len", 0)),
                                         kmax, bmax)) for d in drafts]


VANILLA_TOLERANCE = 0.15  # drafts' own vanillas further apart than this: the ranking is not settled


def mix_vanilla(grid: pd.DataFrame, weights: Mapping[str, float]) -> dict[int, float]:
    """Per batch size, a draft's sweep's own vanilla goodput for the mix (categories by weight)."""
    if "vanilla_goodput" not in grid.columns:
        return {}
    out: dict[int, float] = {}
    for b, g in grid.groupby("batch_size"):
        per_cat = g.groupby("category")["vanilla_goodput"].mean()
        w = {c: float(weights.get(c, 0.0)) for c in per_cat.index if per_cat[c] == per_cat[c]}
        total = sum(w.values())
        if total > 0:
            out[int(b)] = sum(w[c] * float(per_cat[c]) for c in w) / total
    return out


def vanilla_spreads(grids: Mapping[str, pd.DataFrame], weights: Mapping[str, float]) -> pd.DataFrame:
    """Per (batch size, category of positive weight): how far the drafts' own vanillas disagree,
    ``spread`` = largest / smallest - 1 (NaN with fewer than two drafts measured there), before any
    weighting: a category's drift is not averaged away by another category that agrees."""
    rows: list[dict[str, object]] = []
    for name, grid in grids.items():
        if "vanilla_goodput" not in grid.columns:
            continue
        for (b, c), g in grid.groupby(["batch_size", "category"]):
            v = float(g["vanilla_goodput"].mean())
            if float(weights.get(str(c), 0.0)) > 0 and v == v:
                rows.append({"batch_size": int(b), "category": str(c), "draft": name, "vanilla": v})
    cols = ["batch_size", "category", "drafts", "spread"]
    if not rows:
        return pd.DataFrame(columns=cols)
    out = []
    for (b, c), g in pd.DataFrame(rows).groupby(["batch_size", "category"]):
        lo, hi = float(g["vanilla"].min()), float(g["vanilla"].max())
        spread = hi / lo - 1 if len(g) > 1 and lo > 0 else math.nan
        out.append({"batch_size": b, "category": c, "drafts": len(g), "spread": spread})
    return pd.DataFrame(out)[cols]


def worst_spread(spreads: pd.DataFrame) -> dict[int, tuple[float, str]]:
    """Per batch size, the widest category spread of :func:`vanilla_spreads` and its category: what
    a mix of those categories inherits."""
    out: dict[int, tuple[float, str]] = {}
    for b, g in spreads.dropna(subset=["spread"]).groupby("batch_size"):
        r = g.loc[g["spread"].astype(float).idxmax()]
        out[int(b)] = (float(r["spread"]), str(r["category"]))
    return out


def rank_drafts(grids: Mapping[str, pd.DataFrame], weights: Mapping[str, float],
                vanilla_tolerance: float = VANILLA_TOLERANCE) -> pd.DataFrame:
    """Per (batch size, draft): its mix K and speedup with interval, ``rank`` (1 = highest speedup)
    and ``verdict``: ``wins`` | ``tied`` (interval reaches the leader's point) | ``behind`` | ``no
    interval`` (some draft's interval at that batch size is unknown) | ``vanillas disagree``.

    Each draft's speedup is over its own sweep's vanilla, the same configuration on the same
    prompts: their goodputs must agree. The check runs per category before any weighting
    (:func:`vanilla_spreads`): where, in any category the mix includes, the drafts' largest vanilla
    is more than ``vanilla_tolerance`` above the smallest (``vanilla_spread``, the worst category's,
    named in ``vanilla_category``), the machine drifted between the sweeps (a cells-design
    draft's vanilla runs minutes from its K cells), the speedups' intervals do not hold that drift,
    and no verdict is given at that batch size: re-measure it. ``vanilla_goodput`` is the draft's
    mix-weighted vanilla, for display."""
    tables = []
    for name, grid in grids.items():
        t = mix_table(grid, weights)
        t.insert(0, "draft", name)
        van = mix_vanilla(grid, weights)
        t["vanilla_goodput"] = [van.get(int(b), math.nan) for b in t["batch_size"]]
        tables.append(t)
    front = ["batch_size", "draft", "k", "speedup", "speedup_low", "speedup_high", "rank", "verdict",
             "vanilla_goodput", "vanilla_spread", "vanilla_category"]
    if not tables:
        return pd.DataFrame(columns=front)
    worst = worst_spread(vanilla_spreads(grids, weights))
    df = pd.concat(tables, ignore_index=True)
    out = []
    for b, g in df.groupby("batch_size"):
        g = g.sort_values(["speedup", "draft"], ascending=[False, True]).reset_index(drop=True)
        lead = g.iloc[0]
        others_high = g["speedup_high"].iloc[1:]
        clear = bool(len(g) == 1 or (others_high < lead["speedup_low"]).all())
        known = bool(g[["speedup_low", "speedup_high"]].notna().all().all())
        spread, category = worst.get(int(b), (math.nan, ""))
        for i, r in g.iterrows():
            if spread > vanilla_tolerance:
                verdict = "vanillas disagree"
            elif not known:
                verdict = "no interval"  # e.g. analytic (sim) rows: the order is the points'
            elif i == 0:
                verdict = "wins" if clear else "tied"
            else:
                verdict = "tied" if not r["speedup_high"] < lead["speedup"] else "behind"
            out.append({**r.to_dict(), "rank": i + 1, "verdict": verdict, "vanilla_spread": spread,
                        "vanilla_category": category})
    return pd.DataFrame(out)[front]


def unsettled(ranking: pd.DataFrame) -> dict[int, tuple[float, str]]:
    """The batch sizes ``rank_drafts`` gave no verdict (the drafts' vanillas disagree): their worst
    category's spread and name, for every renderer to mark them the same way."""
    bad = ranking[ranking["verdict"] == "vanillas disagree"]
    return {int(b): (float(g["vanilla_spread"].iloc[0]), str(g["vanilla_category"].iloc[0]))
            for b, g in bad.groupby("batch_size")}


def unsettled_note(ranking: pd.DataFrame) -> str:
    """One sentence naming the unsettled batch sizes, their worst category and spread ("" if none)."""
    bad = unsettled(ranking)
    if not bad:
        return ""
    return ("not settled at " + ", ".join(f"BS {b} ({c}: vanillas {100 * s:.0f} % apart)"
                                          for b, (s, c) in bad.items())
            + ": the drafts' own vanillas disagree (machine drift), re-measure there")


def recommend(ranking: pd.DataFrame) -> dict[str, Any]:
    """``{"draft": name}`` when one draft leads every batch size, else ``{"ranges": [[lo, hi,
    draft, tied_with], ...]}`` (``hi`` None: and above), with ``text`` a one-line summary either way."""
    leaders = []
    for b, g in ranking.groupby("batch_size"):
        lead = g[g["rank"] == 1].iloc[0]
        tied = sorted(g.loc[(g["rank"] > 1) & (g["verdict"] == "tied"), "draft"])
        leaders.append((int(b), str(lead["draft"]), tied, str(lead["verdict"])))
    if not leaders:
        return {"text": "no measured batch size"}
    unsettled_bs = sorted(unsettled(ranking))
    note = unsettled_note(ranking)
    caveat = f"; {note}" if note else ""
    names = {d for _, d, _, _ in leaders}
    if len(names) == 1:
        (name,) = names
        ties = sorted({t for _, _, ts, _ in leaders for t in ts})
        tie = f" (tied within intervals with {', '.join(ties)} at some batch sizes)" if ties else ""
        return {"draft": name, "text": f"{name} at every measured batch size{tie}{caveat}",
                "unsettled": unsettled_bs}
    ranges: list[list[Any]] = []
    for b, d, tied, _ in leaders:
        if ranges and ranges[-1][2] == d:
            ranges[-1][1] = b
            ranges[-1][3] = sorted(set(ranges[-1][3]) | set(tied))
        else:
            ranges.append([b, b, d, tied])
    for i in range(len(ranges) - 1):
        ranges[i][1] = ranges[i + 1][0] - 1
    ranges[-1][1] = None
    parts = [f"BS {lo}{'+' if hi is None else ('' if hi == lo else f'-{hi}')}: {d}"
             + (f" (tied: {', '.join(t)})" if t else "") for lo, hi, d, t in ranges]
    return {"ranges": ranges, "text": "; ".join(parts) + caveat, "unsettled": unsettled_bs}
