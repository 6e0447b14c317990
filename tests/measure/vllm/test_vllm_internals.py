"""The private vLLM names dsdprof relies on (docs/vllm-internals.md) still exist: one clear line
naming the first that changed when another vLLM version is installed."""

import importlib
import inspect

import pytest

pytest.importorskip("vllm")

INTERNALS = [  # (module, attribute path, parameters it must accept or None)
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule", None),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output",
     ["scheduler_output", "model_runner_output"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.has_requests", None),
    ("vllm.v1.core.sched.scheduler", "Scheduler._handle_stopped_request", ["request"]),  # the stop hook
    ("vllm.v1.core.sched.scheduler", "Scheduler._preempt_request", ["request"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.add_request", ["request"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_draft_token_ids", ["draft_token_ids"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.make_spec_decoding_stats",
     ["spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens", "num_invalid_spec_tokens",
      "request_id"]),
    ("vllm.v1.core.sched.async_scheduler", "AsyncScheduler", None),
    ("vllm.v1.core.sched.output", "SchedulerOutput", None),
    ("vllm.v1.outputs", "ModelRunnerOutput", None),
    ("vllm.v1.spec_decode.metrics", "SpecDecodingStats.observe_draft",
     ["num_draft_tokens", "num_accepted_tokens"]),
    ("vllm.v1.spec_decode.dynamic.utils", "build_dynamic_sd_schedule_lookup", None),
    ("vllm.engine.arg_utils", "EngineArgs.create_engine_config", ["usage_context"]),
    ("vllm.platforms.interface", "UnspecifiedPlatform.support_static_graph_mode", None),
    ("vllm.platforms", "_current_platform", None),
]
FIELDS = [
    ("vllm.v1.core.sched.output", "SchedulerOutput", ["num_scheduled_tokens", "scheduled_new_reqs",
     "scheduled_spec_decode_tokens", "num_invalid_spec_tokens", "num_spec_tokens_to_schedule",
     "finished_req_ids"]),
    ("vllm.v1.outputs", "ModelRunnerOutput", ["sampled_token_ids", "req_id_to_index"]),
    ("vllm.v1.spec_decode.metrics", "SpecDecodingStats", ["num_drafts", "num_accepted_tokens_per_pos",
     "num_draft_tokens_per_pos"]),
]
SCHEDULER_ATTRS = ["dynamic_sd_lookup", "num_spec_tokens", "max_num_running_reqs",
                   "num_sampled_tokens_per_step", "log_stats", "requests", "running", "waiting",
                   "finished_req_ids"]

REQUEST_ATTRS = ["num_output_placeholders", "num_computed_tokens", "num_prompt_tokens"]
# model runners whose ModelRunnerOutput.req_id_to_index the async profiler keeps by reference
RUNNERS = ["vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"]


def _live_index_outputs() -> list[str]:
    """A ``ModelRunnerOutput(...)`` of a runner handed its live ``self....req_id_to_index`` (not a
    copy or a dict built for the step): the profiler would copy every step (records stay right,
    ``_dsdprof_fresh``; its own time in an async step grows by a dict copy)."""
    import importlib.util
    import re

    problems = []
    for module in RUNNERS:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue  # not in this vLLM build
        with open(spec.origin) as fh:
            text = fh.read()
        for m in re.finditer(r"(?<![\w])ModelRunnerOutput\(", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            arg = re.search(r"req_id_to_index=([^,]+?)\s*(?:,|$)", text[m.end():i - 1])
            if arg and re.fullmatch(r"self\.[\w.]+", arg.group(1).strip()):
                problems.append(f"{module}'s ModelRunnerOutput gets its live {arg.group(1).strip()}")
    return problems


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
    problems += [f"Scheduler.{a} is no longer set in __init__" for a in SCHEDULER_ATTRS
                 if f"self.{a}" not in src]
    src = inspect.getsource(_get("vllm.v1.request", "Request.__init__"))
    problems += [f"Request.{a} is no longer set in __init__" for a in REQUEST_ATTRS if f"self.{a}" not in src]
    problems += _live_index_outputs()
    assert not problems, (f"vLLM {vllm.__version__} changed what dsdprof's scheduler relies on "
                          f"(docs/vllm-internals.md): {problems[0]}")
