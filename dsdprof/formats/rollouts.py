"""Rollout and serving rows (Parquet): one row per (kind, variant, repeat, rate) run of
``dsdprof rollout``, in the measurement schema family (same metadata key, its own version
:data:`dsdprof.formats.versions.ROLLOUT_SCHEMA_VERSION`, the same provenance columns and modes).

A row keeps its per-request and per-step series as list columns, so that every statistic, the
replay prediction and the plots can be recomputed from the file alone. Stdlib only at import time.
"""

from __future__ import annotations

from typing import Any, TypedDict, cast

from dsdprof.formats.measurements import PROVENANCE_FIELDS, Column, columns_schema

KIND_ROLLOUT = "rollout"  # every request submitted at t = 0, heavy-tailed output lengths
KIND_SERVING = "serving"  # Poisson arrivals at rate_per_s
KINDS = (KIND_ROLLOUT, KIND_SERVING)
ROLLOUT_FILE = "rollout.parquet"  # the run directory's one row file

ROLLOUT_COLUMNS: tuple[Column, ...] = (
    Column("row_id", "string", "'<kind>-<variant>-r<repeat>' (serving: '-rate<rate>' appended)"),
    Column("kind", "string", "rollout (every request at t = 0) | serving (Poisson arrivals at rate_per_s)"),
    Column("variant", "string",
           "vanilla | fixed-<K> | dsd (the table on vLLM's schedule) | adaptive (the plugin)"),
    Column("mode", "string", "vanilla | fixed | dsd | adaptive (as in measurement rows)"),
    Column("num_spec_tokens", "int64",
           "fixed K; dsd/adaptive: the engine's num_speculative_tokens; vanilla 0"),
    Column("repeat", "int64", "repeat index: every variant of a repeat ran the same requests, back to back"),
    Column("order", "int64", "position of the variant within its repeat (rotated from repeat to repeat)"),
    Column("rate_per_s", "float64", "serving: requests per second of the Poisson arrivals; rollout: 0"),
    Column("status", "string", "ok | failed"),
    Column("error", "string", "error message for failed runs, empty otherwise"),
    Column("num_requests", "int64", "requests submitted"),
    Column("output_tokens", "int64", "output tokens delivered"),
    Column("makespan_s", "float64", "first arrival to the last request's last token"),
    Column("tokens_per_s", "float64", "output_tokens / makespan_s"),
    Column("tail_s", "float64",
           "time spent in the tail: from the finish of the request that completes 90 % of them to the end"),
    Column("ttft_p50_s", "float64", "time to first token (from the request's arrival), median over requests"),
    Column("ttft_p90_s", "float64", "TTFT, 90th percentile"),
    Column("ttft_p99_s", "float64", "TTFT, 99th percentile"),
    Column("tpot_p50_s", "float64", "per-user TPOT = (last token - first token) / (tokens - 1), median"),
    Column("tpot_p90_s", "float64", "TPOT, 90th percentile over requests"),
    Column("tpot_p99_s", "float64", "TPOT, 99th percentile over requests"),
    Column("itl_p50_s", "float64", "inter-token latency: gaps between a request's streamed chunks (vLLM's "
           "bench serve definition), median over every gap"),
    Column("itl_p90_s", "float64", "ITL, 90th percentile"),
    Column("itl_p99_s", "float64", "ITL, 99th percentile"),
    Column("e2e_p50_s", "float64", "request latency (arrival to last token), median"),
    Column("goodput_req_s", "float64",
           "requests per second that met the SLOs (slo_ttft_s, slo_tpot_s; 0 = none)"),
    Column("slo_ttft_s", "float64", "TTFT SLO of goodput_req_s (0: none)"),
    Column("slo_tpot_s", "float64", "TPOT SLO of goodput_req_s (0: none)"),
    Column("mean_k", "float64", "draft tokens per request-step over the decode steps: the K actually served"),
    Column("steps", "int64", "engine steps traced"),
    Column("lookup_differs", "float64",
           "fraction of steps whose lookup batch size (every scheduled request, prefill chunks included: "
           "vLLM's dynamic_sd_lookup[len(num_scheduled_tokens)]) differs from the requests decoding"),
    Column("table_k_differs", "float64",
           "fraction of steps where the table's K at the lookup batch size differs from its K at the "
           "decoding batch size (the steady batch size the table was measured at)"),
    Column("request_arrival_s", "list<float64>", "per request: arrival, seconds after the run's start"),
    Column("request_first_token_s", "list<float64>", "per request: first token"),
    Column("request_finish_s", "list<float64>", "per request: last token"),
    Column("request_output_len", "list<int64>", "per request: output tokens"),
    Column("itl_samples_s", "list<float64>", "every chunk gap of every request (ITL samples)"),
    Column("step_t_s", "list<float64>", "per engine step: end time, seconds after the run's start"),
    Column("step_batch_size", "list<int64>", "per step: lookup batch size (requests scheduled)"),
    Column("step_decoding", "list<int64>", "per step: requests decoding (no prefill tokens)"),
    Column("step_prefill_tokens", "list<int64>", "per step: prompt tokens scheduled"),
    Column("step_k", "list<int64>",
           "per step: K it scheduled (drafts proposed for the next step; -1 unknown)"),
    Column("step_drafted", "list<float64>", "per step: mean drafts verified per decoding request"),
    Column("lengths", "string",
           "the output-length distribution or file (rollout) / lengths of the serving run"),
    Column("table", "string", "the K table served (path)"),
    Column("engine", "string", "vllm"),
    Column("engine_version", "string", "engine library version"),
    Column("model", "string", "target model"),
    Column("draft_model", "string", "draft model"),
    Column("method", "string", "speculative method"),
    Column("hardware", "string", "GPU name or CPU model"),
    Column("dtype", "string", "weights/activations dtype"),
    Column("dataset", "string", "prompt dataset"),
    Column("seed", "int64", "seed of lengths, arrivals and prompts"),
    Column("dsdprof_version", "string", "dsdprof version that wrote the row"),
    Column("created_at", "string", "UTC ISO-8601 time the run finished"),
)
ROLLOUT_COLUMN_NAMES = tuple(c.name for c in ROLLOUT_COLUMNS)
assert set(PROVENANCE_FIELDS) <= set(ROLLOUT_COLUMN_NAMES)




class RolloutRow(TypedDict):
    """A rollout row as Python holds it before it is written: :data:`ROLLOUT_COLUMNS`, in order, each
    with the Python type of its arrow type (:data:`dsdprof.formats.measurements.PYTHON_TYPES`)."""

    row_id: str
    kind: str
    variant: str
    mode: str
    num_spec_tokens: int
    repeat: int
    order: int
    rate_per_s: float
    status: str
    error: str
    num_requests: int
    output_tokens: int
    makespan_s: float
    tokens_per_s: float
    tail_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    e2e_p50_s: float
    goodput_req_s: float
    slo_ttft_s: float
    slo_tpot_s: float
    mean_k: float
    steps: int
    lookup_differs: float
    table_k_differs: float
    request_arrival_s: list[float]
    request_first_token_s: list[float]
    request_finish_s: list[float]
    request_output_len: list[int]
    itl_samples_s: list[float]
    step_t_s: list[float]
    step_batch_size: list[int]
    step_decoding: list[int]
    step_prefill_tokens: list[int]
    step_k: list[int]
    step_drafted: list[float]
    lengths: str
    table: str
    engine: str
    engine_version: str
    model: str
    draft_model: str
    method: str
    hardware: str
    dtype: str
    dataset: str
    seed: int
    dsdprof_version: str
    created_at: str


def rollout_arrow_schema() -> Any:  # a pyarrow.Schema (formats/ imports the stdlib only)
    return columns_schema(ROLLOUT_COLUMNS)


def empty_rollout_row() -> RolloutRow:
    """Every column, with NaN / 0 / "" / [] defaults."""
    defaults: dict[str, Any] = {"string": "", "int64": 0, "float64": float("nan"), "bool": False}
    return cast(RolloutRow, {c.name: [] if c.arrow_type.startswith("list") else defaults[c.arrow_type]
                             for c in ROLLOUT_COLUMNS})
