"""Run a fleet: skip finished runs, run the rest locally (one after another) or as Ray tasks.

Each run (or shard) is one Ray task asking for what it needs: ``num_gpus =
tensor_parallel_size`` and the GPU type as the accelerator resource
(``accelerator_type:<hardware>``) for vLLM runs, CPUs only for the analytic engine or vLLM's CPU
build. A run whose tensor-parallel size exceeds ``[fleet] gpus_per_node`` spans nodes: its task
holds a CPU on a node of the right type and vLLM's Ray executor places the TP workers in a
placement group across the cluster. Ray retries a task whose worker or node died
(``max_retries``); the retry resumes the sweep. The fleet's record of each run
(``_fleet/runs/<run>.json``) holds its spec hash: a finished run is never started again, and a
run whose spec changed is refused before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypedDict, Unpack, cast

from dsdprof.errors import InputError
from dsdprof.fleet.plan import (
    FleetPlan,
    FleetSettings,
    RunPlan,
    asks_gpus,
    shard_batch_sizes,
    shard_spec,
    spans_nodes,
)
from dsdprof.fleet.runner import ShardResult, ShardTask, execute_shard
from dsdprof.fleet.store import (
    FLEET_DIR,
    FleetStore,
    RunRecord,
    RunState,
    run_record_rel,
    shard_rel,
)
from dsdprof.formats.versions import FLEET_RUN_RECORD_SCHEMA
from dsdprof.io.store import utc_now

RUN_RECORD_SCHEMA = FLEET_RUN_RECORD_SCHEMA
FLEET_LOCK = f"{FLEET_DIR}/fleet.lock"
STATE_RUNNING, STATE_DONE, STATE_INCOMPLETE = "running", "done", "incomplete"


@dataclass(frozen=True)
class FleetEvent:
    """``kind``: skip (already done) | submit | done | error."""

    kind: str
    run: str
    message: str = ""


@dataclass
class RunOutcome:
    run: RunPlan
    state: str  # done | incomplete | skipped (done earlier)
    cells: int = 0
    ok: int = 0
    measured: int = 0
    error: str = ""
    table: str = ""  # relative path of its K table, or "" (see table_note)
    table_note: str = ""


@dataclass
class FleetReport:
    out: str
    outcomes: list[RunOutcome] = field(default_factory=list)
    index: str = ""

    @property
    def complete(self) -> bool:
        return all(o.state in (STATE_DONE, "skipped") for o in self.outcomes)


Notify = Callable[[FleetEvent], None]


def run_record(run: RunPlan, state: str, **extra: Unpack[RunState]) -> RunRecord:
    e = run.spec.engine
    return RunRecord(schema=RUN_RECORD_SCHEMA, run=run.name, state=state, spec_hash=run.spec_hash,
                     engine=e.name, model=e.model, draft_model=e.draft_model or "", method=e.method,
                     hardware=run.hardware, tensor_parallel_size=e.tensor_parallel_size, shards=run.shards,
                     **extra)


def shard_tasks(run: RunPlan, settings: FleetSettings, cwd: str) -> list[ShardTask]:
    spans = spans_nodes(run.spec, settings)
    if run.shards == 1:
        return [ShardTask(run.name, 0, 1, run.spec, settings.out, settings.staging, cwd, spans)]
    return [ShardTask(run.name, i, run.shards, shard_spec(run.spec, bs), settings.out, settings.staging, cwd,
                      spans)
            for i, bs in enumerate(shard_batch_sizes(run.spec.sweep.batch_sizes, run.shards))]


class RayOptions(TypedDict, total=False):
    """Ray's ``remote.options`` for one task."""

    num_cpus: float
    max_retries: int
    retry_exceptions: bool
    name: str
    num_gpus: int
    resources: dict[str, float]


def ray_task_options(task: ShardTask, hardware: str, settings: FleetSettings) -> RayOptions:
    """Resources one task asks Ray for (see the module docstring)."""
    opts: RayOptions = {"num_cpus": settings.cpus_per_run, "max_retries": settings.max_retries,
                            "retry_exceptions": False, "name": f"dsdprof-fleet:{task.label}"}
    if asks_gpus(task.spec, settings):
        opts["num_gpus"] = 0 if task.spans_nodes else task.spec.engine.tensor_parallel_size
        if hardware:
            opts["resources"] = {f"accelerator_type:{hardware}": 0.001}
    return opts


def _check_records(plan: FleetPlan, store: FleetStore) -> dict[str, RunRecord | None]:
    """Each run's stored record; a run whose spec changed, or an unfinished run resubmitted with
    other ``shards`` (its finished cells are stored per shard: new shards would measure and store
    them again), is refused before anything is written."""
    records: dict[str, RunRecord | None] = {}
    for run in plan.runs:
        rec = cast("RunRecord | None", store.read_json(run_record_rel(run.name)))
        if rec is not None and rec.get("spec_hash") != run.spec_hash:
            raise InputError(f"{run.where}", run.name,
                             f"its spec differs from the run already in {store.describe(run.name)}; "
                             "name it differently or choose another [fleet] out")
        old_shards = int((rec or {}).get("shards") or 1)
        if rec is not None and rec.get("state") != STATE_DONE and old_shards != run.shards:
            raise InputError(f"{run.where}.shards", run.shards,
                             f"differs from the unfinished run {run.name!r} in {store.describe(run.name)} "
                             f"(was {old_shards}); its finished cells are stored per shard, so resubmit with "
                             f"shards = {old_shards} to finish it (no cell is measured or stored twice)")
        records[run.name] = rec
    return records


def _write_run_manifest(store: FleetStore, run: RunPlan) -> None:
    """The sharded run directory's manifest, once: shard 0's, with every batch size of the run."""
    if store.exists(f"{run.name}/_sweep.json"):
        return
    doc = store.read_json(f"{shard_rel(run.name, 0)}/_sweep.json")
    if doc is None:
        return
    doc["spec"]["sweep"]["batch_sizes"] = list(run.spec.sweep.batch_sizes)
    if "spec_hash" in doc:
        from dsdprof.io.manifest import spec_hash

        doc["spec_hash"] = spec_hash(doc["spec"])
    starts = [d["started_at"] for d in (store.read_json(f"{shard_rel(run.name, i)}/_sweep.json")
                                            for i in range(run.shards)) if d and d.get("started_at")]
    if starts:
        doc["started_at"] = min(starts)
    doc["shards"] = [{"shard": i, "batch_sizes": bs, "dir": shard_rel(run.name, i)}
                     for i, bs in enumerate(shard_batch_sizes(run.spec.sweep.batch_sizes, run.shards))]
    store.write_json(f"{run.name}/_sweep.json", doc)


OnResult = Callable[[ShardTask, "ShardResult | str"], None]


def _run_local(tasks: list[ShardTask], notify: Notify, on_result: OnResult) -> None:
    for task in tasks:
        notify(FleetEvent("submit", task.label))
        result: ShardResult | str
        try:
            result = execute_shard(task)
        except InputError as err:
            result = str(err)
        except Exception as err:  # noqa: BLE001 - one run failing does not stop the fleet
            result = f"{type(err).__name__}: {err}"
        on_result(task, result)


def _ray_error(err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    if cause is not None and not isinstance(cause, type(err)):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def _run_ray(tasks: list[ShardTask], hardware: dict[str, str], settings: FleetSettings,
             address: str | None, notify: Notify, on_result: OnResult) -> None:
    try:
        import ray
    except ImportError:
        raise InputError("--ray", address or True,
                         "Ray is not installed: pip install 'dsdprof[ray]'") from None
    owns = not ray.is_initialized()
    if owns:
        ray.init(address=address)
    try:
        remote = ray.remote(execute_shard)
        refs = {}
        for task in tasks:
            refs[remote.options(**ray_task_options(task, hardware[task.run], settings)).remote(task)] = task
            notify(FleetEvent("submit", task.label))
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                res: ShardResult | str
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayError as err:
                    res = _ray_error(err)
                notify(FleetEvent("error" if isinstance(res, str) else "shard", refs[ref].label,
                                  res if isinstance(res, str) else ""))
                on_result(refs[ref], res)
    finally:
        if owns:
            ray.shutdown()


@contextmanager
def _fleet_lock(store: FleetStore):
    """One fleet driver per local OUT at a time (an OS lock, dropped if the driver dies)."""
    if store.remote:
        yield  # object stores have no locks: do not start two fleets on one URL
        return
    from filelock import FileLock, Timeout

    path = store.local_path(FLEET_LOCK)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise InputError("fleet.out", store.out, "another dsdprof fleet is running on it") from None
    try:
        yield
    finally:
        lock.release()


def run_fleet(plan: FleetPlan, use_ray: bool = False, address: str | None = None,
              on_event: Notify | None = None, export: bool = True) -> FleetReport:
    """Run every unfinished run of ``plan``; then write the K tables and their index."""
    store = FleetStore(plan.settings.out, plan.settings.staging)
    with _fleet_lock(store):
        return _run_fleet(plan, store, use_ray, address, on_event or (lambda _e: None), export)


def _finish_run(store: FleetStore, run: RunPlan, mine: list, started_at: str, notify: Notify) -> RunOutcome:
    """Write ``run``'s record from its tasks' results (``ShardResult`` or an error string)."""
    errors = [r for r in mine if isinstance(r, str)]
    done = [r for r in mine if not isinstance(r, str)]
    outcome = RunOutcome(run, STATE_INCOMPLETE if errors else STATE_DONE, sum(r.total for r in done),
                         sum(r.ok for r in done), sum(r.measured for r in done), "; ".join(errors))
    if errors:
        rec = run_record(run, STATE_INCOMPLETE, started_at=started_at, error=outcome.error)
    else:
        if run.shards > 1:
            _write_run_manifest(store, run)
        rec = run_record(run, STATE_DONE, started_at=started_at, finished_at=utc_now(),
                         cells=outcome.cells, ok=outcome.ok, failed=outcome.cells - outcome.ok,
                         speculation_mode=done[0].speculation_mode if done else "",
                         workers=[{"shard": r.shard, "host": r.host, "pid": r.pid, "measured": r.measured,
                                   "skipped": r.skipped, "wall_s": round(r.wall_s, 3)} for r in done])
    store.write_json(run_record_rel(run.name), rec)
    notify(FleetEvent("error" if errors else "done", run.name, outcome.error))
    return outcome


def _run_fleet(plan: FleetPlan, store: FleetStore, use_ray: bool, address: str | None, notify: Notify,
               export: bool) -> FleetReport:
    settings = plan.settings
    records = _check_records(plan, store)
    report = FleetReport(settings.out)
    pending: list[RunPlan] = []
    for run in plan.runs:
        rec = records[run.name]
        if rec is not None and rec.get("state") == STATE_DONE:
            report.outcomes.append(RunOutcome(run, "skipped", rec.get("cells", 0), rec.get("ok", 0)))
            notify(FleetEvent("skip", run.name, "finished earlier"))
        else:
            pending.append(run)
    started = {r.name: (records[r.name] or {}).get("started_at") or utc_now() for r in pending}
    for run in pending:
        store.write_json(run_record_rel(run.name), run_record(run, STATE_RUNNING,
                                                              started_at=started[run.name]))
    tasks = [t for run in pending for t in shard_tasks(run, settings, os.getcwd())]
    by_run = {run.name: [t.label for t in tasks if t.run == run.name] for run in pending}
    got: dict[str, dict[str, ShardResult | str]] = {name: {} for name in by_run}
    plans = {run.name: run for run in pending}

    def on_result(task: ShardTask, result: ShardResult | str) -> None:
        """A run's record is written as soon as its last task returns (a driver that dies later
        keeps it)."""
        got[task.run][task.label] = result
        if len(got[task.run]) == len(by_run[task.run]):
            mine = [got[task.run][label] for label in by_run[task.run]]
            report.outcomes.append(_finish_run(store, plans[task.run], mine, started[task.run], notify))

    if use_ray:
        if tasks:
            _run_ray(tasks, {r.name: r.hardware for r in pending}, settings, address, notify, on_result)
    else:
        _run_local(tasks, notify, on_result)
    report.outcomes.sort(key=lambda o: [r.name for r in plan.runs].index(o.run.name))
    if export:
        from dsdprof.fleet.export import current_index, export_fleet

        # A resubmitted, finished fleet writes nothing: its index is reused when nothing ran.
        names = [r.name for r in plan.runs]
        index = (current_index(store, settings.tolerance, names) if not pending else None) \
            or export_fleet(settings.out, settings.staging, tolerance=settings.tolerance)
        report.index = index.path
        tables = {e["run"]: e for e in index.doc["tables"]}
        skipped = {s["run"]: s["reason"] for s in index.doc["skipped"]}
        for o in report.outcomes:
            if o.run.name in tables:
                o.table = tables[o.run.name]["table"]
            else:
                o.table_note = skipped.get(o.run.name, "not exported")
    return report


__all__ = ["FleetEvent", "FleetReport", "RunOutcome", "ray_task_options", "run_fleet", "shard_tasks"]
