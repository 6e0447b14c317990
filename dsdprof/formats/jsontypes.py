"""JSON as dsdprof reads and writes it, typed at the edge. Stdlib only.

``JSON`` is a parsed JSON value (what :func:`json.loads` returns): a reader narrows it (or checks
it into a ``TypedDict`` / model) before it uses a value, instead of trusting ``Any``. ``Scalar``
is a JSON leaf; ``ProvenanceRecord`` is the flat record of where rows came from (engine, model,
hardware, seed, ``extra_*``) that every Parquet file's metadata, a manifest, an analysis and a
K table carry; ``ManifestDoc`` is a run directory's ``_sweep.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypeAlias, TypedDict

Scalar: TypeAlias = str | int | float | bool | None
JSON: TypeAlias = Scalar | list["JSON"] | dict[str, "JSON"]
JSONObject: TypeAlias = dict[str, JSON]
ProvenanceRecord: TypeAlias = dict[str, Scalar]
ProvenanceView: TypeAlias = Mapping[str, Scalar]  # what a reader of provenance takes


def json_object(value: JSON) -> JSONObject:
    """``value`` if it is a JSON object, else an empty one (a missing or malformed section)."""
    return value if isinstance(value, dict) else {}


class ManifestDoc(TypedDict):
    """A run directory's manifest (``_sweep.json``), as ``dsdprof.io.manifest`` writes and checks it."""

    manifest: str
    schema_version: str
    spec_hash: str
    versions: dict[str, str]
    spec: JSONObject  # the spec that ran, as JSON (what ``spec_hash`` hashes)
    provenance: ProvenanceRecord | None  # None until the engine has reported it
    started_at: str
    resumed_at: NotRequired[str]
