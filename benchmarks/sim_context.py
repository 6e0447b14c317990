"""K by batch size x context on the analytic engine (issue 21): the heatmap grid per context and
the numbers behind docs/context.md, for Llama-3.1-8B + EAGLE-3 on H100 and Qwen3-30B-A3B + Qwen3-0.6B
(a separate draft model) and with a derived EAGLE-3 head on H200, contexts 1k-128k, geometric
acceptance alpha = 0.8.

    python benchmarks/sim_context.py [OUT_DIR]      # default docs/img
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from dsdprof.config.spec import parse_spec
from dsdprof.decide.context import analyze_contexts_path
from dsdprof.io.runs import open_run
from dsdprof.measure.runner import run_sweep
from dsdprof.measure.sim.catalog import MODELS
from dsdprof.measure.sim.model import arch_features
from dsdprof.report.context_plots import context_heatmaps_figure, context_k_figure
from dsdprof.report.plots import render_png, write_png
from tests.support.sim_grid import free_draft_length

CONTEXTS = [1024, 4096, 16384, 65536, 128000]
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
KS = [0, 1, 2, 3, 4, 6, 8, 12, 15, 16, 24, 31, 32]
CASES = {
    "llama8b-h100": {"model": "Llama-3.1-8B", "method": "eagle3", "hardware": "H100 SXM"},
    "llama8b-h100-alpha095": {"model": "Llama-3.1-8B", "method": "eagle3", "hardware": "H100 SXM",
                              "alpha": 0.95},
    "qwen3-30b-a3b-h200": {"model": "Qwen3-30B-A3B", "method": "eagle3", "hardware": "H200 SXM"},
    "qwen3-30b-a3b-qwen06b-h200": {"model": "Qwen3-30B-A3B", "method": "draft_model",
                                   "draft_model": "Qwen3-0.6B", "hardware": "H200 SXM"},
}


def run_case(name: str, case: dict, out_dir: Path, work: Path) -> None:
    eng = {"name": "sim", "model": case["model"], "method": case["method"], "max_model_len": 131072}
    if case.get("draft_model"):
        eng["draft_model"] = case["draft_model"]
    spec = parse_spec({"engine": eng, "sweep": {"batch_sizes": BATCH_SIZES, "num_spec_tokens": KS,
                                                "context_lens": CONTEXTS, "waves": 3, "output_len": 64},
                       "sim": {"hardware": case["hardware"], "acceptance_alpha": case.get("alpha", 0.8)}})
    run = work / name
    run_sweep(spec, run)
    res = analyze_contexts_path(open_run(run, "analyze"))
    prov = res.slices[res.default_context].provenance
    write_png(out_dir / f"context-{name}.png", render_png(context_heatmaps_figure(res, prov)))
    write_png(out_dir / f"context-{name}-k.png", render_png(context_k_figure(res, prov)))
    g = float(arch_features(MODELS[case["model"]], "bfloat16", 1).q_per_kv)
    draft = case.get("draft_model") or f"{case['method']} (derived)" if case["method"] != "eagle3" or \
        case["model"] != "Llama-3.1-8B" else "EAGLE3-Llama-3.1-8B"
    print(f"\n### {case['model']} + {draft} on {case['hardware']} "
          f"(G = {g:.0f}: 128/G - 1 = {int(free_draft_length(g))}), alpha {case.get('alpha', 0.8)}\n")
    print("| batch size | " + " | ".join(str(c) for c in CONTEXTS) + " |")
    print("|---:|" + "---:|" * len(CONTEXTS))
    for b in BATCH_SIZES:
        row = []
        for c in CONTEXTS:
            opt = res.slices[c].optimal.set_index("batch_size") if c in res.slices else None
            if opt is None or b not in opt.index:
                row.append("KV full")
            else:
                p = opt.loc[b]
                row.append(f"{int(p['k'])} ({p['speedup_vs_baseline']:.2f}x)")
        print(f"| {b} | " + " | ".join(row) + " |")


def main() -> None:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img")
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in CASES.items():
            run_case(name, case, out_dir, Path(tmp))


if __name__ == "__main__":
    main()
