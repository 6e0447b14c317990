"""GPU engine parity and pre-engine checks, shown without a GPU: the vLLM kwargs a GPU spec
produces give vanilla and DSD engines the same CUDA-graph mode after vLLM's own config logic, and
decode graphs for every (batch size, K) of the grid."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from dsdprof.measure.vllm.engine import VllmEngine
from dsdprof.errors import InputError
from dsdprof.config.spec import check_workload_for_engine, parse_spec


def _spec(tmp_path, **over):
    for name in ("tgt", "drf"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text("{}")
    d = {"engine": {"name": "vllm", "model": str(tmp_path / "tgt"), "draft_model": str(tmp_path / "drf"),
                    "method": "eagle3", "max_model_len": 4096},
         "sweep": {"batch_sizes": [1, 4, 64, 128], "num_spec_tokens": [0, 1, 3, 5], "output_len": 64},
         "workload": {"input_len": 128}}
    for k, v in over.items():
        d[k] = {**d[k], **v}
    return parse_spec(d)


def test_vanilla_and_dsd_engines_share_piecewise_graphs_covering_every_k(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from vllm.config import CompilationConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: True)
    spec = _spec(tmp_path)
    engine = VllmEngine(spec, out_dir=None, start_worker=lambda c, t: None)
    vanilla, dsd = engine.llm_kwargs("vanilla"), engine.llm_kwargs("dsd")
    modes = {}
    for key, kw in (("vanilla", vanilla), ("dsd", dsd)):
        cc = CompilationConfig(**kw["compilation_config"])
        spec_cfg = kw.get("speculative_config")
        if spec_cfg:  # vLLM's own steps for a dynamic-SD engine: mode override, sizes rounded to K+1
            VllmConfig._maybe_override_dynamic_sd_cudagraph_mode(NS(
                speculative_config=NS(uses_dynamic_speculative_decoding=lambda: True),
                compilation_config=cc, use_v2_model_runner=False))
            cc.adjust_cudagraph_sizes_for_spec_decode(spec_cfg["num_speculative_tokens"] + 1)
        modes[key] = cc.cudagraph_mode
        ks = [0] if key == "vanilla" else spec.sweep.num_spec_tokens
        for b in spec.sweep.batch_sizes:
            for k in ks:
                need = b * (k + 1)
                assert any(size >= need for size in cc.cudagraph_capture_sizes), (key, b, k, cc.cudagraph_capture_sizes)
    assert modes["vanilla"] == modes["dsd"] == CUDAGraphMode.PIECEWISE
    assert engine.provenance().extra["cudagraph_mode"] == "PIECEWISE"
    assert max(dsd["compilation_config"]["cudagraph_capture_sizes"]) == 128 * 6  # beyond vLLM's default 512


def test_no_graph_settings_on_cpu_eager_or_user_compilation_config(tmp_path, monkeypatch):
    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: False)
    assert "compilation_config" not in VllmEngine(_spec(tmp_path), start_worker=lambda c, t: None).base_kwargs()
    monkeypatch.setattr("dsdprof.measure.vllm.engine._cuda_available", lambda: True)
    eager = _spec(tmp_path, engine={"extra": {"enforce_eager": True}})
    assert "compilation_config" not in VllmEngine(eager, start_worker=lambda c, t: None).base_kwargs()
    mine = _spec(tmp_path, engine={"extra": {"compilation_config": {"cudagraph_mode": "FULL"}}})
    assert VllmEngine(mine, start_worker=lambda c, t: None).base_kwargs()["compilation_config"] == {"cudagraph_mode": "FULL"}


def test_lengths_and_datasets_fail_before_any_engine(tmp_path):
    with pytest.raises(InputError, match=r"engine.max_model_len=197: must be >= .* = 198"):
        check_workload_for_engine(_spec(tmp_path, engine={"max_model_len": 197}))
    check_workload_for_engine(_spec(tmp_path, engine={"max_model_len": 198}))
    with pytest.raises(InputError, match="workload.dataset='nope.jsonl'"):
        check_workload_for_engine(_spec(tmp_path, workload={"dataset": "nope.jsonl"}))
    with pytest.raises(InputError, match="workload.dataset='sharegtp'"):
        check_workload_for_engine(_spec(tmp_path, workload={"dataset": "sharegtp"}))
    (tmp_path / "d.jsonl").write_text('{"prompt": "x"}\n')
    check_workload_for_engine(_spec(tmp_path, workload={"dataset": str(tmp_path / "d.jsonl")}))
    started = []
    engine = VllmEngine(_spec(tmp_path, engine={"max_model_len": 100}), start_worker=lambda c, t: started.append(c))
    with pytest.raises(InputError, match="engine.max_model_len"):
        engine.speculation_mode
    assert started == []  # no engine was started
