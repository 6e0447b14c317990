"""``dsdprof rollout``: the table where users feel it -- an RL rollout and live serving on real vLLM,
each variant side by side on engines alive for the whole run.

Variants (one vLLM engine each, the same engines as ``validate``: :func:`dsdprof.jobs.validate.
validation_engine`): ``vanilla``; ``fixed-<K>`` (by default the best fixed K *for this rollout*,
predicted by the replay, :mod:`dsdprof.decide.makespan`, from the table's own grid); ``dsd`` (the
table on vLLM's schedule, ``num_speculative_tokens_per_batch_size``); ``adaptive`` (the plugin).

* **Rollout**: ``num_requests`` requests submitted at once (the first step schedules all of them),
  output lengths from a heavy-tailed distribution or a file (:mod:`dsdprof.measure.live_workload`),
  so the batch shrinks from N to 1 as requests finish.
* **Serving**: Poisson arrivals at each rate of ``rates`` (``serving_requests`` requests each).

Each repeat runs every variant on the same requests (same lengths, prompts and arrival times),
back to back, in an order rotated from one repeat to the next (:func:`dsdprof.decide.live_stats.
rotated_orders`), so drift between repeats cancels in the paired ratios. Every engine has started
and run an unmeasured warm-up before the first measured run. Every run is one row of
``OUT/rollout.parquet`` (:mod:`dsdprof.formats.rollouts`), rewritten after each run; ``--resume``
skips the rows already ``ok``. Engine logs and step traces: ``OUT/_logs``,
``OUT/_traces``; the plan (lengths, arrivals, variants): ``OUT/_rollout.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from dsdprof.decide.live_stats import request_times, rotated_orders, summarize_requests, summarize_steps
from dsdprof.errors import InputError
from dsdprof.formats.ktable_types import KTable
from dsdprof.formats.measurements import MODE_ADAPTIVE, MODE_DSD, MODE_FIXED, MODE_VANILLA, PROVENANCE_FIELDS
from dsdprof.formats.rollouts import KIND_ROLLOUT, KIND_SERVING, ROLLOUT_FILE, RolloutRow, empty_rollout_row
from dsdprof.io.atomic import write_json_atomic

PLAN_FILE = "_rollout.json"


@dataclass(frozen=True)
class RolloutPlan:
    """What a rollout run submits (written to ``OUT/_rollout.json`` before any engine starts)."""

    variants: tuple[str, ...]
    lengths: tuple[int, ...]  # the rollout's output lengths
    lengths_spec: str
    repeats: int
    rates: tuple[float, ...] = ()
    serving_lengths: tuple[int, ...] = ()
    serving_arrivals: dict[str, list[float]] = field(default_factory=dict)  # rate -> arrival times
    seed: int = 0
    slo_ttft_s: float = 0.0
    slo_tpot_s: float = 0.0
    predicted: dict[str, float] = field(default_factory=dict)  # replay: variant -> makespan (choice of K)

    def runs(self) -> list[tuple[str, int, float, int, str]]:
        """(kind, repeat, rate, order, variant) in run order: per repeat the rollout, then every rate."""
        out = []
        blocks = [(KIND_ROLLOUT, 0.0)] + [(KIND_SERVING, r) for r in self.rates]
        orders = rotated_orders(self.variants, self.repeats * len(blocks))
        turn = 0
        for rep in range(self.repeats):
            for kind, rate in blocks:
                out += [(kind, rep, rate, i, v) for i, v in enumerate(orders[turn])]
                turn += 1
        return out


def row_id(kind: str, variant: str, repeat: int, rate: float) -> str:
    return f"{kind}-{variant}-r{repeat}" + (f"-rate{rate:g}" if kind == KIND_SERVING else "")


def engine_key(variant: str) -> str:
    """The engine pool's key for a variant (the ones :class:`VllmEngine` knows)."""
    return variant  # vanilla, fixed-<K>, dsd, adaptive


def variant_mode(variant: str, table: KTable, adaptive_k: int | None) -> tuple[str, int]:
    if variant.startswith("fixed-"):
        return MODE_FIXED, int(variant.split("-", 1)[1])
    if variant == MODE_DSD:
        return MODE_DSD, max(int(r[2]) for r in table["ranges"])
    if variant == MODE_ADAPTIVE:
        return MODE_ADAPTIVE, int(adaptive_k or 0)
    return MODE_VANILLA, 0


def build_row(result, kind: str, variant: str, repeat: int, order: int, rate: float, plan: RolloutPlan,
              table: KTable, adaptive_k: int | None) -> RolloutRow:
    """A row from a worker's :class:`~dsdprof.measure.vllm.arrivals.ArrivalsResult`."""
    reqs = [request_times(a, t, n)
            for a, t, n in zip(result.arrival_s, result.chunk_t_s, result.chunk_tokens)]
    steps = result.steps
    row = _row_head(kind, variant, repeat, order, rate, table, adaptive_k, "ok")
    row.update({"num_requests": len(reqs), "slo_ttft_s": plan.slo_ttft_s, "slo_tpot_s": plan.slo_tpot_s})
    # the summaries' keys are row columns (decide.live_stats names them so)
    row.update(cast(RolloutRow, summarize_requests(reqs, plan.slo_ttft_s, plan.slo_tpot_s)))
    step_stats = summarize_steps([s.lookup_batch_size for s in steps], [s.decoding for s in steps],
                                 [s.drafted for s in steps], [list(r) for r in table["ranges"]])
    row.update(cast(RolloutRow, step_stats))
    row.update({
        "request_arrival_s": [r.arrival for r in reqs],
        "request_first_token_s": [r.first for r in reqs],
        "request_finish_s": [r.finish for r in reqs],
        "request_output_len": [r.tokens for r in reqs],
        "itl_samples_s": [g for r in reqs for g in r.itls],
        "step_t_s": [s.t_end for s in steps],
        "step_batch_size": [s.lookup_batch_size for s in steps],
        "step_decoding": [s.decoding for s in steps],
        "step_prefill_tokens": [s.prefill_tokens for s in steps],
        "step_k": [s.k_next for s in steps],
        "step_drafted": [s.drafted for s in steps],
    })
    return row


def failed_row(err: BaseException, kind: str, variant: str, repeat: int, order: int, rate: float,
               table: KTable, adaptive_k: int | None) -> RolloutRow:
    row = _row_head(kind, variant, repeat, order, rate, table, adaptive_k, "failed")
    row["error"] = " ".join(str(err).split())[:2000]
    return row


def _row_head(kind: str, variant: str, repeat: int, order: int, rate: float, table: KTable,
              adaptive_k: int | None, status: str) -> RolloutRow:
    """An empty row with what names it: run kind, variant, K served, repeat, order, rate, status."""
    row = empty_rollout_row()
    mode, k = variant_mode(variant, table, adaptive_k)
    row.update({"row_id": row_id(kind, variant, repeat, rate), "kind": kind, "variant": variant, "mode": mode,
                "num_spec_tokens": k, "repeat": repeat, "order": order, "rate_per_s": rate, "status": status})
    return row


def parse_rates(values: list[str]) -> list[float]:
    """Serving rates from ``--rate`` values, each a number or a comma list: finite, > 0, distinct."""
    out: list[float] = []
    for text in values:
        for part in str(text).split(","):
            try:
                r = float(part)
            except ValueError:
                raise InputError("--rate", text, "must be a number of requests/s (or a comma list)") from None
            if not (math.isfinite(r) and r > 0):
                raise InputError("--rate", part.strip(), "must be > 0 requests/s")
            if any(f"{r:g}" == f"{x:g}" for x in out):
                raise InputError("--rate", part.strip(), "given twice")
            out.append(r)
    return out


def make_plan(table: KTable, spec, lengths_spec, num_requests: int, repeats: int, rates: list[float],
              serving_requests: int, fixed_ks: list[int] | None, adaptive: bool, seed: int,
              slo_ttft_s: float = 0.0, slo_tpot_s: float = 0.0) -> RolloutPlan:
    """The plan: lengths, arrivals, variants (the best fixed K by the replay when ``fixed_ks`` is None)."""
    from dsdprof.decide.makespan import best_fixed_k, predict_all
    from dsdprof.measure.live_workload import draw_lengths, poisson_arrivals

    if repeats < 1:
        raise InputError("--repeats", repeats, "must be >= 1")
    max_len = spec.engine.max_model_len - spec.workload.input_len
    lengths = draw_lengths(lengths_spec, num_requests, seed, max_len=max_len)
    predictions = predict_all(table, lengths)
    ks = list(fixed_ks) if fixed_ks else [best_fixed_k(predictions)]
    for k in ks:
        if k < 1:
            raise InputError("--fixed-k", k, "must be >= 1 (K=0 is the vanilla engine)")
    variants = ["vanilla", *[f"fixed-{k}" for k in sorted(set(ks))], MODE_DSD]
    if adaptive:
        variants.append(MODE_ADAPTIVE)
    serving_lengths: list[int] = []
    arrivals: dict[str, list[float]] = {}
    if rates:
        if serving_requests < 1:
            raise InputError("--serving-requests", serving_requests, "must be >= 1")
        serving_lengths = draw_lengths(lengths_spec, serving_requests, seed + 1, max_len=max_len)
        arrivals = {f"{r:g}": poisson_arrivals(r, serving_requests, seed + 2 + i)
                    for i, r in enumerate(rates)}
    return RolloutPlan(tuple(variants), tuple(lengths), lengths_spec.describe(), repeats, tuple(rates),
                       tuple(serving_lengths), arrivals, seed, slo_ttft_s, slo_tpot_s,
                       {p.variant: round(p.makespan_s, 4) for p in predictions})


def _plan_doc(plan: RolloutPlan, table_path: str) -> dict[str, Any]:
    from dataclasses import asdict

    return {"rollout_plan": "dsdprof.rollout-plan/v1", "table": table_path, **asdict(plan)}


def _existing_rows(out: Path, plan_doc: dict[str, Any], resume: bool) -> list[RolloutRow]:
    plan_path = out / PLAN_FILE
    if not plan_path.exists():
        return []
    if not resume:
        raise InputError("--out", str(out), "holds a rollout run; pass --resume to continue it or choose "
                         "another --out")
    if json.loads(plan_path.read_text()) != json.loads(json.dumps(plan_doc)):
        raise InputError("--resume", str(out), "the run there has another plan (table, lengths, rates, "
                         "variants or seed); start a new --out")
    if not (out / ROLLOUT_FILE).exists():
        return []
    from dsdprof.io.rollouts import read_rollout_rows

    df = read_rollout_rows(out)
    return [r for r in df.to_dict("records") if r["status"] == "ok"]


WARMUP = ((0.0,) * 4, (8,) * 4)  # each engine's unmeasured first requests (its first steps run slow)


def arrivals_request(plan: RolloutPlan, kind: str, rep: int, rate: float, temperature: float, rid: str):
    """The worker request of one run: a rollout gates all N requests into its first step."""
    from dsdprof.measure.vllm.arrivals import ArrivalsRequest

    n_max = max(len(plan.lengths), len(plan.serving_lengths))
    if kind == KIND_ROLLOUT:
        arrivals, lengths, gate = (0.0,) * len(plan.lengths), plan.lengths, len(plan.lengths)
    else:
        arrivals, lengths, gate = tuple(plan.serving_arrivals[f"{rate:g}"]), plan.serving_lengths, 0
    return ArrivalsRequest(arrivals, tuple(lengths), gate, trace_name=rid, temperature=temperature,
                           seed=plan.seed, prompt_offset=rep * n_max)


def warm_up(engine, variant: str, plan: RolloutPlan, warmed: set[str]) -> None:
    """Start ``variant``'s engine if it has not started, and run its unmeasured warm-up once."""
    from dsdprof.measure.vllm.arrivals import ArrivalsRequest

    if variant not in warmed:
        with engine.pool.exclusive(engine_key(variant)) as worker:
            worker.run(ArrivalsRequest(*WARMUP, 4, seed=plan.seed), engine.cell_timeout_s)
        warmed.add(variant)


def run_one(engine, plan: RolloutPlan, run: tuple, table: KTable, table_path: str,
            adaptive_k: int | None, temperature: float, warmed: set[str]) -> RolloutRow:
    """One (kind, repeat, rate, order, variant) run on its engine: its row (failed: a failed row)."""
    from dsdprof.io.store import provenance_dict

    kind, rep, rate, order, variant = run
    rid = row_id(kind, variant, rep, rate)
    try:
        warm_up(engine, variant, plan, warmed)
        with engine.pool.exclusive(engine_key(variant)) as worker:
            result = worker.run(arrivals_request(plan, kind, rep, rate, temperature, rid),
                                engine.cell_timeout_s * 4)
        row = build_row(result, kind, variant, rep, order, rate, plan, table, adaptive_k)
    except Exception as err:  # noqa: BLE001 - a failed run is a row
        row = failed_row(err, kind, variant, rep, order, rate, table, adaptive_k)
    prov = provenance_dict(engine.provenance())
    row.update(cast(RolloutRow, {k: prov[k] for k in PROVENANCE_FIELDS}))
    row.update({"seed": plan.seed, "lengths": plan.lengths_spec, "table": table_path,
                "created_at": datetime.now(UTC).isoformat(timespec="seconds")})
    return row


def run_rollout(table: KTable, spec, out_dir: str | Path, plan: RolloutPlan, table_path: str = "",
                adaptive_options: dict[str, Any] | None = None, resume: bool = False,
                on_row: Callable[[RolloutRow], None] | None = None,
                start_worker: Callable[..., Any] | None = None) -> list[RolloutRow]:
    """Run ``plan`` on vLLM (see the module docstring); returns every row of the run."""
    from dsdprof.io.rollouts import write_rollout_rows
    from dsdprof.io.runlock import RunLock
    from dsdprof.io.store import provenance_dict
    from dsdprof.jobs.validate import (
        ADAPTIVE_TABLE_FILE,
        adaptive_max_k,
        check_validate_spec,
        validation_engine,
    )

    check_validate_spec(spec)
    n_max = max(len(plan.lengths), len(plan.serving_lengths))
    spec = spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"batch_sizes": [n_max]})})
    adaptive_k = adaptive_max_k(table, adaptive_options) if MODE_ADAPTIVE in plan.variants else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out)
    lock.acquire(datetime.now(UTC).isoformat(timespec="seconds"))
    try:
        doc = _plan_doc(plan, table_path)
        rows = _existing_rows(out, doc, resume)
        write_json_atomic(out / PLAN_FILE, doc, force=True)
        done = {r["row_id"] for r in rows}
        adaptive = None
        if adaptive_k is not None:
            table_file = write_json_atomic(out / ADAPTIVE_TABLE_FILE, table, force=True)
            adaptive = (str(table_file.resolve()), adaptive_k, dict(adaptive_options or {}))
        n_fixed = sum(1 for v in plan.variants if v.startswith("fixed-"))
        engine = validation_engine(spec, table, out, n_fixed, adaptive, table_path, start_worker)
        warmed: set[str] = set()
        try:
            engine.check_models()
            todo = [r[4] for r in plan.runs() if row_id(r[0], r[4], r[1], r[2]) not in done]
            engine.prestart([engine_key(v) for v in dict.fromkeys(todo)])  # side by side, on a CPU host
            # Every engine started and warm before the first measured run: the first one, measured
            # while the others still started, ran 1.2-2.4x slower (docs/lab/rollout-2026-12-06.md).
            for variant in dict.fromkeys(todo):
                try:
                    warm_up(engine, variant, plan, warmed)
                except Exception:  # noqa: BLE001, S112 - its first run retries, and fails as a row
                    continue
            for run in plan.runs():
                rid = row_id(run[0], run[4], run[1], run[2])
                if rid in done:
                    continue
                row = run_one(engine, plan, run, table, table_path, adaptive_k, spec.workload.temperature,
                              warmed)
                rows = [r for r in rows if r["row_id"] != rid] + [row]
                write_rollout_rows(out / ROLLOUT_FILE, rows, provenance_dict(engine.provenance()))
                if on_row is not None:
                    on_row(row)
        finally:
            engine.close()
        return rows
    finally:
        lock.release()
