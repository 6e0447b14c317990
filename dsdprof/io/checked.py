"""A run checked once for the analysis: :func:`check_run` raises every refusal of a
:class:`dsdprof.io.runs.Run` in the order the analysis raises them and returns a
:class:`CheckedRun` -- plain data (rows, provenance, coverage, validated rows, context slices)
that ``decide`` reads without calling back into ``io``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError
from dsdprof.formats.provenance import is_synthetic, rates_from_provenance
from dsdprof.io.readers import validate_measurements
from dsdprof.io.runs import Coverage, Run, open_run


def _validated(rows: Any) -> Any:
    """``rows``' ok rows validated, or the InputError validating them raised (raised by the
    analysis in its own order: :func:`dsdprof.decide.analysis.analyze`)."""
    try:
        return validate_measurements(rows)
    except InputError as err:
        return err


@dataclass(frozen=True)
class CheckedRun:
    """What the analysis needs of a run, checked and computed in one call (:meth:`Run.checked`),
    so that ``decide`` reads plain data and calls back into ``io`` no more.

    ``provenance``: the run's (with the runs pooled on the batch-size path); ``valid``: the
    validated ok rows or the InputError validating them raised; ``contexts``: rows per context
    (None without a context axis), each with its ``context_coverage`` and ``context_valid``;
    ``synthetic`` / ``synthetic_rates``: what the provenance says of synthetic acceptance
    (:mod:`dsdprof.formats.provenance`), derived when made."""

    path: Path
    rows: Any
    provenance: dict[str, Any]
    coverage: Coverage | None = None
    valid: Any = None
    contexts: dict[int, Any] | None = None
    context_coverage: dict[int, Coverage] = field(default_factory=dict)
    context_valid: dict[int, Any] = field(default_factory=dict)
    synthetic: bool = field(init=False)  # the provenance says acceptance was synthetic
    synthetic_rates: list[float] | None = field(init=False)  # ... and names these rates

    def __post_init__(self) -> None:
        object.__setattr__(self, "synthetic", is_synthetic(self.provenance))
        object.__setattr__(self, "synthetic_rates", rates_from_provenance(self.provenance))


def check_run(run: Run, command: str, allow_mixed: bool, by_context: bool = True) -> CheckedRun:
    """Every refusal of ``run`` in the order the analysis raises them, then what it needs.

    ``command`` (``export``, ``analyze``; "" none): a validate run is refused first. With
    ``by_context``: mixed provenance, then the context slices; a run without a context axis
    then has its pooled runs checked (only when a ``command`` asks for the analysis). Without:
    the pooled runs, then mixed provenance (``analyze_path``'s order)."""
    if command:
        run.refuse_validate(command)
    pooled = None if by_context else run.pooled(allow_mixed)
    run.check_mixed(allow_mixed)
    contexts = run.contexts if by_context else None
    if contexts is not None:
        return _by_context(run, contexts)
    if not command:
        return CheckedRun(run.path, run.rows, {})
    return _pooled(run, pooled or run.pooled(allow_mixed))


def check_analyze_run(source: str | Path | Run, allow_mixed: bool) -> CheckedRun:
    """``dsdprof analyze``'s checks of a run (or the path to open), each once, in its order: mixed
    provenance, then a context sweep's slices; a run without a context axis is then refused if it
    is a validate run, and has its pooled runs checked."""
    run = source if isinstance(source, Run) else open_run(source)
    run.check_mixed(allow_mixed)
    if run.contexts is not None:
        return _by_context(run, run.contexts)
    run.refuse_validate("analyze")
    return _pooled(run, run.pooled(allow_mixed))


def _by_context(run: Run, contexts: dict[int, Any]) -> CheckedRun:
    return CheckedRun(run.path, run.rows, run.run_provenance(), contexts=contexts,
                      context_coverage=run.context_coverage,
                      context_valid={c: _validated(part) for c, part in contexts.items()})


def _pooled(run: Run, pooled: Any) -> CheckedRun:
    prov = run.run_provenance()
    prov.update(pooled.provenance())
    return CheckedRun(run.path, run.rows, prov, run.coverage, _validated(run.rows))
