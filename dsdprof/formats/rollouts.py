"""Rollout and serving rows (Parquet): one row per (kind, variant, repeat, rate) run of
``dsdprof rollout``, in the measurement schema family (same metadata key, its own version
:data:`dsdprof.formats.versions.ROLLOUT_SCHEMA_VERSION`, the same provenance columns and modes).

A row keeps its per-request and per-step series as list columns, so that every statistic, the
replay prediction and the plots can be recomputed from the file alone. Stdlib only at import time.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict, cast

from dsdprof.formats.measurements import ProvenanceColumns, row_columns

KIND_ROLLOUT = "rollout"  # every request submitted at t = 0, heavy-tailed output lengths
KIND_SERVING = "serving"  # Poisson arrivals at rate_per_s
ROLLOUT_FILE = "rollout.parquet"  # the run directory's one row file

class _RunColumns(TypedDict):
    row_id: Annotated[str, "'<kind>-<variant>-r<repeat>' (serving: '-rate<rate>' appended)"]
    kind: Annotated[str, "rollout (every request at t = 0) | serving (Poisson arrivals at rate_per_s)"]
    variant: Annotated[str, "vanilla | fixed-<K> | dsd (the table on vLLM's schedule) | adaptive (the "
                       "plugin)"]
    mode: Annotated[str, "vanilla | fixed | dsd | adaptive (as in measurement rows)"]
    num_spec_tokens: Annotated[int, "fixed K; dsd/adaptive: the engine's num_speculative_tokens; vanilla 0"]
    repeat: Annotated[int, "repeat index: every variant of a repeat ran the same requests, back to back"]
    order: Annotated[int, "position of the variant within its repeat (rotated from repeat to repeat)"]
    rate_per_s: Annotated[float, "serving: requests per second of the Poisson arrivals; rollout: 0"]
    status: Annotated[str, "ok | failed"]
    error: Annotated[str, "error message for failed runs, empty otherwise"]
    num_requests: Annotated[int, "requests submitted"]
    output_tokens: Annotated[int, "output tokens delivered"]
    makespan_s: Annotated[float, "first arrival to the last request's last token"]
    tokens_per_s: Annotated[float, "output_tokens / makespan_s"]
    tail_s: Annotated[float, "time spent in the tail: from the finish of the request that completes 90 % of "
                      "them to the end"]
    ttft_p50_s: Annotated[float, "time to first token (from the request's arrival), median over requests"]
    ttft_p90_s: Annotated[float, "TTFT, 90th percentile"]
    ttft_p99_s: Annotated[float, "TTFT, 99th percentile"]
    tpot_p50_s: Annotated[float, "per-user TPOT = (last token - first token) / (tokens - 1), median"]
    tpot_p90_s: Annotated[float, "TPOT, 90th percentile over requests"]
    tpot_p99_s: Annotated[float, "TPOT, 99th percentile over requests"]
    itl_p50_s: Annotated[float, "inter-token latency: gaps between a request's streamed chunks (vLLM's bench "
                         "serve definition), median over every gap"]
    itl_p90_s: Annotated[float, "ITL, 90th percentile"]
    itl_p99_s: Annotated[float, "ITL, 99th percentile"]
    e2e_p50_s: Annotated[float, "request latency (arrival to last token), median"]
    goodput_req_s: Annotated[float, "requests per second that met the SLOs (slo_ttft_s, slo_tpot_s; 0 = "
                             "none)"]
    slo_ttft_s: Annotated[float, "TTFT SLO of goodput_req_s (0: none)"]
    slo_tpot_s: Annotated[float, "TPOT SLO of goodput_req_s (0: none)"]
    mean_k: Annotated[float, "draft tokens per request-step over the decode steps: the K actually served"]
    steps: Annotated[int, "engine steps traced"]
    lookup_differs: Annotated[float, "fraction of steps whose lookup batch size (every scheduled request, "
                              "prefill chunks included: vLLM's dynamic_sd_lookup[len(num_scheduled_tokens)]) "
                              "differs from the requests decoding"]
    table_k_differs: Annotated[float, "fraction of steps where the table's K at the lookup batch size "
                               "differs from its K at the decoding batch size (the steady batch size the "
                               "table was measured at)"]
    request_arrival_s: Annotated[list[float], "per request: arrival, seconds after the run's start"]
    request_first_token_s: Annotated[list[float], "per request: first token"]
    request_finish_s: Annotated[list[float], "per request: last token"]
    request_output_len: Annotated[list[int], "per request: output tokens"]
    itl_samples_s: Annotated[list[float], "every chunk gap of every request (ITL samples)"]
    step_t_s: Annotated[list[float], "per engine step: end time, seconds after the run's start"]
    step_batch_size: Annotated[list[int], "per step: lookup batch size (requests scheduled)"]
    step_decoding: Annotated[list[int], "per step: requests decoding (no prefill tokens)"]
    step_prefill_tokens: Annotated[list[int], "per step: prompt tokens scheduled"]
    step_k: Annotated[list[int], "per step: K it scheduled (drafts proposed for the next step; -1 unknown)"]
    step_drafted: Annotated[list[float], "per step: mean drafts verified per decoding request"]
    lengths: Annotated[str, "the output-length distribution or file (rollout) / lengths of the serving run"]
    table: Annotated[str, "the K table served (path)"]


class RolloutRow(_RunColumns, ProvenanceColumns):
    """A rollout row as Python holds it before it is written: each key a column of the file, in
    order, with its Python type and its meaning; the provenance as in measurement rows (the seed
    draws the lengths, the arrivals and the prompts)."""

    created_at: Annotated[str, "UTC ISO-8601 time the run finished"]



ROLLOUT_COLUMNS = row_columns(RolloutRow)
ROLLOUT_COLUMN_NAMES = tuple(c.name for c in ROLLOUT_COLUMNS)


def empty_rollout_row() -> RolloutRow:
    """Every column, with NaN / 0 / "" / [] defaults."""
    defaults: dict[str, Any] = {"string": "", "int64": 0, "float64": float("nan"), "bool": False}
    return cast(RolloutRow, {c.name: [] if c.arrow_type.startswith("list") else defaults[c.arrow_type]
                             for c in ROLLOUT_COLUMNS})
