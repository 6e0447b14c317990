"""The private vLLM names dsdprof relies on (docs/vllm-internals.md) still exist: one clear line
naming the first that changed when another vLLM version is installed."""

import importlib
import inspect

import pytest

pytest.importorskip("vllm")

INTERNALS = [  # (module, attribute path, parameters it must accept or None)
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule", None),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", ["scheduler_output", "model_runner_output"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.has_requests", None),
    ("vllm.v1.core.sched.scheduler", "Scheduler.add_request", ["request"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_draft_token_ids", ["draft_token_ids"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.make_spec_decoding_stats",
     ["spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens", "num_invalid_spec_tokens", "request_id"]),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler", None),
    ("vllm.v1.core.sched.output", "SchedulerOutput", None),
    ("vllm.v1.outputs", "ModelRunnerOutput", None),
    ("vllm.v1.spec_decode.metrics", "SpecDecodingStats.observe_draft", ["num_draft_tokens", "num_accepted_tokens"]),
    ("vllm.v1.spec_decode.dynamic.utils", "build_dynamic_sd_schedule_lookup", None),
    ("vllm.engine.arg_utils", "EngineArgs.create_engine_config", ["usage_context"]),
    ("vllm.platforms.interface", "UnspecifiedPlatform.support_static_graph_mode", None),
    ("vllm.platforms", "_current_platform", None),
]
FIELDS = [
    ("vllm.v1.core.sched.output", "SchedulerOutput", ["num_scheduled_tokens", "scheduled_new_reqs",
     "scheduled_spec_decode_tokens", "num_invalid_spec_tokens", "num_spec_tokens_to_schedule", "finished_req_ids"]),
    ("vllm.v1.outputs", "ModelRunnerOutput", ["sampled_token_ids", "req_id_to_index"]),
    ("vllm.v1.spec_decode.metrics", "SpecDecodingStats", ["num_drafts", "num_accepted_tokens_per_pos",
     "num_draft_tokens_per_pos"]),
]
SCHEDULER_ATTRS = ["dynamic_sd_lookup", "num_spec_tokens", "max_num_running_reqs", "num_sampled_tokens_per_step",
                   "log_stats", "requests", "running", "waiting", "finished_req_ids"]


def _get(module, path):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def test_private_vllm_names_dsdprof_uses_exist():
    import vllm

    problems = []
    for module, path, params in INTERNALS:
        try:
            obj = _get(module, path)
        except (ImportError, AttributeError):
            problems.append(f"{module}.{path} is gone")
            continue
        if params is not None:
            have = list(inspect.signature(obj).parameters)
            missing = [p for p in params if p not in have]
            if missing:
                problems.append(f"{module}.{path} lost parameters {missing}")
    for module, cls, fields in FIELDS:
        names = set(getattr(_get(module, cls), "__dataclass_fields__", {})) | set(dir(_get(module, cls)))
        problems += [f"{module}.{cls}.{f} is gone" for f in fields if f not in names]
    src = inspect.getsource(_get("vllm.v1.core.sched.scheduler", "Scheduler.__init__"))
    problems += [f"Scheduler.{a} is no longer set in __init__" for a in SCHEDULER_ATTRS if f"self.{a}" not in src]
    assert not problems, (f"vLLM {vllm.__version__} changed what dsdprof's scheduler relies on "
                          f"(docs/vllm-internals.md): {problems[0]}")
