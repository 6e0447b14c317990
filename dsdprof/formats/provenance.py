"""The run's provenance entry under synthetic acceptance (``[engine] synthetic_acceptance_rates``):
``acceptance`` (stored as ``extra_acceptance`` in the files, the analysis and the exported table),
written by :mod:`dsdprof.measure.vllm.synthetic` and read by ``io`` (the opened run's rates),
``decide`` (the truth check) and ``export`` (the warning). Stdlib only."""

from __future__ import annotations

import json
import re

from dsdprof.formats.jsontypes import ProvenanceView

ACCEPTANCE_KEY = "acceptance"  # provenance key (stored as ``extra_acceptance``)
SYNTHETIC_PREFIX = "synthetic"


def acceptance_provenance(rates: list[float] | None) -> dict[str, str]:
    """The run's provenance entry under synthetic acceptance ({} when acceptance is measured)."""
    if rates is None:
        return {}
    return {ACCEPTANCE_KEY: f"{SYNTHETIC_PREFIX}: vLLM rejection_sample_method='synthetic', "
                            f"synthetic_acceptance_rates={list(rates)}; acceptance configured, not measured "
                            "(step times only)"}


def is_synthetic(provenance: ProvenanceView) -> bool:
    """Whether a run's (or table's) provenance says its acceptance was synthetic."""
    return str(provenance.get("extra_" + ACCEPTANCE_KEY, "")).startswith(SYNTHETIC_PREFIX)


def rates_from_provenance(provenance: ProvenanceView) -> list[float] | None:
    """The synthetic rates a run's provenance names (:func:`acceptance_provenance`), else None."""
    if not is_synthetic(provenance):
        return None
    found = re.search(r"synthetic_acceptance_rates=(\[[^\]]*\])", str(provenance["extra_" + ACCEPTANCE_KEY]))
    try:
        rates = json.loads(found.group(1)) if found else None
    except ValueError:
        return None
    return [float(r) for r in rates] if isinstance(rates, list) and rates else None
