"""The fleet file: which sweeps to run and where they go, validated like a sweep spec.

``[fleet]`` (:class:`FleetSettings`: ``out``, staging, Ray resources, tolerance) and either a list
of runs (``[[runs]]``: each a spec file relative to this file or an inline spec, with optional
``name``, ``hardware`` and ``shards``) or a ``base`` spec crossed with a ``[matrix]`` (models x
drafts x hardware x tensor_parallel_size, minus ``exclude``). Examples and every key:
docs/fleet.md ("The fleet file"). Unknown keys are rejected by name; every run's spec is validated
before anything is written.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.config.spec import SweepSpec, parse_spec, read_spec_toml
from dsdprof.errors import InputError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RESERVED_NAMES = ("tables",)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FleetSettings(_Strict):
    out: str = Field(description="where runs go: a directory, or a URL pyarrow opens (s3://, gs://, file://)")
    staging: str | None = Field(None, description="local directory for runs whose out is a URL")
    use_gpus: bool = Field(True,
                           description="vLLM runs ask Ray for tensor_parallel_size GPUs (false: vLLM's CPU "
                                       "build)")
    gpus_per_node: int | None = Field(None, ge=1, description="a vLLM run with a larger TP spans nodes")
    cpus_per_run: float = Field(1.0, gt=0, description="CPUs a run asks Ray for")
    max_retries: int = Field(3, ge=0, description="Ray retries of a run whose worker or node died")
    tolerance: float = Field(DEFAULT_TOLERANCE, ge=0, lt=1,
                             description="relative goodput tolerance of the K tables")


class DraftChoice(_Strict):
    draft_model: str | None = None
    method: str | None = None

    @model_validator(mode="after")
    def _something(self) -> DraftChoice:
        if self.draft_model is None and self.method is None:
            raise ValueError("a draft needs draft_model, method or both")
        return self


class RunEntry(_Strict):
    spec: str | dict[str, Any] = Field(description="spec file (relative to the fleet file) or inline spec")
    name: str | None = None
    hardware: str | None = None
    shards: int = Field(1, ge=1)


class MatrixExclude(_Strict):
    model: str | None = None
    draft: str | None = None
    hardware: str | None = None
    tensor_parallel_size: int | None = None


class Matrix(_Strict):
    models: list[str] = Field(min_length=1)
    drafts: list[str | DraftChoice] = Field(default_factory=list)
    hardware: list[str] = Field(default_factory=list)
    tensor_parallel_size: list[int] = Field(default_factory=list)
    shards: int = Field(1, ge=1)
    exclude: list[MatrixExclude] = Field(default_factory=list)


class FleetFile(_Strict):
    fleet: FleetSettings
    runs: list[RunEntry] | None = None
    base: str | dict[str, Any] | None = None
    matrix: Matrix | None = None

    @model_validator(mode="after")
    def _one_form(self) -> FleetFile:
        if self.runs is not None and (self.base is not None or self.matrix is not None):
            raise ValueError("give either [[runs]] or base + [matrix], not both")
        if self.runs is None and (self.base is None or self.matrix is None):
            raise ValueError("give [[runs]], or base + [matrix]")
        if self.runs is not None and not self.runs:
            raise ValueError("[[runs]] is empty")
        return self


@dataclass(frozen=True)
class RunPlan:
    """One run of the fleet: an ordinary sweep into ``OUT/<name>``."""

    name: str
    spec: SweepSpec
    hardware: str  # the GPU type asked for (vLLM: Ray accelerator type; sim: [sim] hardware); "" = any
    shards: int
    where: str  # where in the fleet file it came from (for messages)

    @property
    def spec_hash(self) -> str:
        return spec_digest(self.spec)

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        e = self.spec.engine
        return (e.model, e.draft_model or "", e.method, self.hardware, e.tensor_parallel_size)


@dataclass(frozen=True)
class FleetPlan:
    settings: FleetSettings
    runs: tuple[RunPlan, ...]
    source: str  # the fleet file


def spec_digest(spec: SweepSpec) -> str:
    """A stable hash of a spec (sorted-key JSON), so a resubmitted fleet recognises its runs."""
    dump = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(dump.encode()).hexdigest()


def _first_error(err: ValidationError) -> InputError:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        return InputError(loc, e.get("input"), "unknown key")
    value = e.get("input")
    if isinstance(value, dict):
        value = sorted(value)
    return InputError(loc or "fleet", value, e["msg"].removeprefix("Value error, "))


def _prefixed(err: InputError, where: str) -> InputError:
    return InputError(f"{where}.{err.field}", err.value, err.reason)


def _short(text: str) -> str:
    tail = text.rstrip("/").split("/")[-1] or text
    return re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("-.") or "x"


def _slug(spec: SweepSpec, hardware: str) -> str:
    e = spec.engine
    parts = [_short(e.model), _short(e.draft_model) if e.draft_model else _short(e.method)]
    if hardware:
        parts.append(_short(hardware))
    parts.append(f"tp{e.tensor_parallel_size}")
    return "--".join(parts)


def _read_spec_data(ref: str | dict[str, Any], base_dir: Path, where: str) -> dict[str, Any]:
    if isinstance(ref, dict):
        return copy.deepcopy(ref)
    path = (base_dir / ref) if not Path(ref).is_absolute() else Path(ref)
    return read_spec_toml(path, where, ref, f"spec file not found ({path})")


def _apply_hardware(data: dict[str, Any], hardware: str | None) -> str:
    """The run's hardware label; for the analytic engine it also sets ``[sim] hardware``."""
    engine = data.get("engine") or {}
    if engine.get("name") == "sim":
        if data.get("sim") is None:
            data["sim"] = {}
        sim = data["sim"]
        if isinstance(sim, dict):  # not a table: parse_spec names it
            if hardware:
                sim["hardware"] = hardware
            return str(sim.get("hardware") or "")
    return hardware or ""


def _build_run(data: dict[str, Any], hardware: str | None, shards: int, name: str | None,
               where: str) -> RunPlan:
    label = _apply_hardware(data, hardware)
    try:
        spec = parse_spec(data)
        if spec.engine.name == "sim":
            from dsdprof.measure.sim.config import resolve

            resolve(spec)  # unknown model / hardware / bad [sim] fails here, before any output
    except InputError as err:
        raise _prefixed(err, where) from None
    if shards > len(spec.sweep.batch_sizes):
        raise InputError(f"{where}.shards", shards,
                         f"more shards than batch sizes ({len(spec.sweep.batch_sizes)})")
    run_name = name or _slug(spec, label)
    if not _NAME_RE.match(run_name) or run_name in RESERVED_NAMES:
        raise InputError(f"{where}.name", run_name,
                         "must start with a letter or digit and hold only letters, digits, '.', '_', '-' "
                         f"(not {list(RESERVED_NAMES)})")
    return RunPlan(run_name, spec, label, shards, where)


def _unique_default_names(runs: list[RunPlan], named: set[str]) -> list[RunPlan]:
    """Default names use the last path component (``.../moe/target`` -> ``target``): where two
    default names collide, each gets a short digest of its full model and draft."""
    from collections import Counter
    from dataclasses import replace

    counts = Counter(r.name for r in runs if r.where not in named)
    out = []
    for r in runs:
        if r.where not in named and counts[r.name] > 1:
            e = r.spec.engine
            digest = hashlib.sha256(f"{e.model}\0{e.draft_model or ''}\0{e.method}".encode()).hexdigest()[:8]
            r = replace(r, name=f"{r.name}--{digest}")
        out.append(r)
    return out


def _draft_label(d: str | DraftChoice) -> str:
    if isinstance(d, str):
        return d
    return d.draft_model or d.method or ""


def _matrix_runs(fleet: FleetFile, base_dir: Path) -> list[RunPlan]:
    m = fleet.matrix
    assert m is not None and fleet.base is not None
    base = _read_spec_data(fleet.base, base_dir, "base")
    if not isinstance(base.get("engine"), dict):
        raise InputError("base.engine", base.get("engine"), "the base spec needs an [engine] table")
    drafts: list[str | DraftChoice | None] = list(m.drafts) or [None]
    hardware: list[str | None] = list(m.hardware) or [None]
    tps: list[int | None] = list(m.tensor_parallel_size) or [None]
    runs = []
    for model, draft, hw, tp in itertools.product(m.models, drafts, hardware, tps):
        if any((x.model is None or x.model == model)
               and (x.draft is None or (draft is not None and x.draft == _draft_label(draft)))
               and (x.hardware is None or x.hardware == hw)
               and (x.tensor_parallel_size is None or x.tensor_parallel_size == tp) for x in m.exclude):
            continue
        data = copy.deepcopy(base)
        engine = data["engine"]
        engine["model"] = model
        if isinstance(draft, str):
            engine["draft_model"] = draft
        elif draft is not None:
            if draft.method is not None:
                engine["method"] = draft.method
            if draft.draft_model is not None:
                engine["draft_model"] = draft.draft_model
            else:
                engine.pop("draft_model", None)
        if tp is not None:
            engine["tensor_parallel_size"] = tp
        labels = (model, draft and _draft_label(draft), hw, tp and f"tp{tp}")
        where = "matrix[" + ", ".join(str(x) for x in labels if x) + "]"
        runs.append(_build_run(data, hw, m.shards, None, where))
    if not runs:
        raise InputError("matrix.exclude", len(m.exclude), "excludes every run")
    return runs


def asks_gpus(spec: SweepSpec, settings: FleetSettings) -> bool:
    """vLLM runs ask Ray for GPUs (unless ``use_gpus = false``); the analytic engine needs none."""
    return spec.engine.name == "vllm" and settings.use_gpus


def spans_nodes(spec: SweepSpec, settings: FleetSettings) -> bool:
    """A GPU run whose tensor-parallel size exceeds one node's GPUs."""
    return (asks_gpus(spec, settings) and settings.gpus_per_node is not None
            and spec.engine.tensor_parallel_size > settings.gpus_per_node)


def _for_cluster(run: RunPlan, settings: FleetSettings) -> RunPlan:
    """A run spanning nodes uses vLLM's Ray executor (it places the TP workers across nodes)."""
    if not spans_nodes(run.spec, settings):
        return run
    extra = dict(run.spec.engine.extra)
    backend = extra.setdefault("distributed_executor_backend", "ray")
    if backend != "ray":
        raise InputError(f"{run.where}.engine.extra.distributed_executor_backend", backend,
                         f"tensor_parallel_size {run.spec.engine.tensor_parallel_size} > gpus_per_node "
                         f"{settings.gpus_per_node} spans nodes, which needs 'ray'")
    data = run.spec.model_dump(mode="json")
    data["engine"]["extra"] = extra
    return RunPlan(run.name, parse_spec(data), run.hardware, run.shards, run.where)


def parse_fleet(data: dict[str, Any], base_dir: str | Path = ".", source: str = "fleet") -> FleetPlan:
    """Validate a fleet document; spec paths are relative to ``base_dir``. Raises InputError."""
    try:
        fleet = FleetFile.model_validate(data)
    except ValidationError as err:
        raise _first_error(err) from None
    base = Path(base_dir)
    if fleet.runs is not None:
        runs = [_build_run(_read_spec_data(r.spec, base, f"runs[{i}].spec"), r.hardware, r.shards, r.name,
                           f"runs[{i}]") for i, r in enumerate(fleet.runs)]
    else:
        runs = _matrix_runs(fleet, base)
    named = {f"runs[{i}]" for i, r in enumerate(fleet.runs or []) if r.name}
    runs = _unique_default_names(runs, named)
    seen: dict[str, RunPlan] = {}
    keys: dict[tuple, RunPlan] = {}
    for run in runs:
        if run.name in seen:
            raise InputError(f"{run.where}.name", run.name, f"same run name as {seen[run.name].where}")
        if run.key in keys:
            raise InputError(f"{run.where}", run.name,
                             f"same (model, draft, method, hardware, TP) as {keys[run.key].where}: one K "
                             "table per key; give one a different hardware label or put it in another fleet")
        seen[run.name] = run
        keys[run.key] = run
    settings = fleet.fleet
    runs = [_for_cluster(run, settings) for run in runs]
    if "://" not in settings.out and not Path(settings.out).is_absolute():
        settings = settings.model_copy(update={"out": str((base / settings.out).resolve())})
    if settings.staging and not Path(settings.staging).is_absolute():
        settings = settings.model_copy(update={"staging": str((base / settings.staging).resolve())})
    return FleetPlan(settings, tuple(runs), source)


def load_fleet(path: str | Path, out: str | None = None) -> FleetPlan:
    """Read and validate a fleet file; ``out`` overrides ``[fleet] out``."""
    p = Path(path)
    data = read_spec_toml(p, "fleet")
    if out is not None and isinstance(data.get("fleet"), dict):
        data["fleet"]["out"] = out if "://" in out else str(Path(out).resolve())
    return parse_fleet(data, p.parent, str(p))


def shard_batch_sizes(batch_sizes: list[int], shards: int) -> list[list[int]]:
    """Share batch sizes over ``shards`` workers: largest first, snake order, so the costly large
    batch sizes spread evenly. Each shard's list is sorted; their union is ``batch_sizes``."""
    out: list[list[int]] = [[] for _ in range(shards)]
    order = list(range(shards)) + list(range(shards - 1, -1, -1))
    for i, b in enumerate(sorted(batch_sizes, reverse=True)):
        out[order[i % len(order)]].append(b)
    return [sorted(s) for s in out]


def shard_spec(spec: SweepSpec, batch_sizes: list[int]) -> SweepSpec:
    """``spec`` restricted to ``batch_sizes`` (same cells, same interleaving per batch size)."""
    return parse_spec({**spec.model_dump(mode="json"),
                       "sweep": {**spec.sweep.model_dump(mode="json"), "batch_sizes": batch_sizes}})


__all__ = ["FleetPlan", "FleetSettings", "RunPlan", "load_fleet", "parse_fleet", "spans_nodes",
           "shard_batch_sizes", "shard_spec", "spec_digest"]
