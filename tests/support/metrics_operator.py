"""The operator's check of dsdprof's metrics on a running ``dsdprof serve`` (issue 34), shared by the
real-server test of tests/jobs/test_serve.py (one server start for both) and the dashboard renderer.

A real OpenAI client (the ``openai`` package; urllib at the same API when it is missing) sends
completions; ``/metrics`` is read as Prometheus would. dsdprof's spec-decode counters, written in
the engine core, must equal vLLM's own ``vllm:spec_decode_*`` counters, written by the API server
from the same steps; requests with hostile ``vllm_xargs`` (dsdprof keys asking for K=0, a forged
run secret, NaN, a path, a huge list) must change none of them and be counted as ignored."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from dsdprof.plugins.names import K_EXTRA_ARG, K_SEQ_ARG, RUN_ARG

# the profiling scheduler's own keys (dsdprof.plugins.names; K_SEQ_ARG was misspelt "dsdprof_k_seq" here)
HOSTILE = [{K_EXTRA_ARG: 0, RUN_ARG: "f" * 32}, {K_EXTRA_ARG: "nan"},
           {"dsdprof_trace": "../../etc/passwd", "dsdprof_wave": -1}, {K_SEQ_ARG: [0] * 1000}]
PROMPTS = ["the quick brown fox", "once upon a time", "in the beginning", "hello world"]


def complete(port: int, model: str, prompt: str, max_tokens: int = 16, xargs: dict | None = None,
             extra: dict | None = None) -> dict[str, Any]:
    """One completion through the OpenAI client (``extra_body`` for vLLM's ``vllm_xargs``)."""
    body = {**({"vllm_xargs": xargs} if xargs else {}), **(extra or {})}
    try:
        from openai import OpenAI
    except ImportError:  # the same API over urllib
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", headers={
            "Content-Type": "application/json"}, data=json.dumps({
                "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                **body}).encode())
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120, max_retries=0)
    out = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                    extra_body=body or None)
    return out.model_dump()


def settled(port: int, timeout: float = 15.0) -> dict[str, Any]:
    """A snapshot of ``/metrics`` once dsdprof's and vLLM's counters agree (the engine flushes its
    counters when it runs out of requests; vLLM's API server records the same step's stats when
    the step's output arrives): the last snapshot if they never do."""
    from dsdprof.report.watch import snapshot

    deadline = time.monotonic() + timeout
    while True:
        snap = snapshot(f"http://127.0.0.1:{port}")
        if (snap["agree"] and snap["vllm"]["drafts"]) or time.monotonic() > deadline:
            return snap
        time.sleep(0.5)


def check_metrics_as_operator(port: int, model: str, mode: str = "adaptive") -> dict[str, Any]:
    """Plain requests, then hostile ones; asserts what an operator reads on ``/metrics``; returns
    the last snapshot."""
    for prompt in PROMPTS[:3]:
        assert complete(port, model, prompt)["usage"]["completion_tokens"] == 16
    before = settled(port)
    assert before["mode"] == mode and not before["warnings"], before
    assert before["vllm"]["drafts"] > 0 and before["agree"], before  # vLLM's counters, not vacuous
    assert before["acceptance"]["accepted_per_pos"] == before["vllm"]["accepted_per_pos"]
    steps = sum(sum(r["steps"].values()) for r in before["schedule"])
    assert steps >= 3 * 16 // (1 + max(r["table_k"] or 0 for r in before["schedule"])), before
    assert before["alarms"]["silent_noop_steps"] == 0 and before["alarms"]["ignored_requests"] == 0
    k0 = before["steps_k0"]
    for i, xargs in enumerate(HOSTILE):  # the first asks K=0 with a forged secret
        assert complete(port, model, PROMPTS[i % len(PROMPTS)],
                        xargs=xargs)["usage"]["completion_tokens"] == 16
    assert complete(port, model, "top-level junk", extra={"dsdprof_num_spec_tokens": 0})["choices"]
    after = settled(port)
    assert after["agree"] and after["vllm"]["drafts"] > before["vllm"]["drafts"], after
    assert after["alarms"]["ignored_requests"] == len(HOSTILE), after["alarms"]  # vllm_xargs ones
    assert after["alarms"]["silent_noop_steps"] == 0 and after["steps_k0"] == k0, after
    check_watch(port, after)
    return after


def check_watch(port: int, snap: dict[str, Any]) -> None:
    """``dsdprof watch URL --json`` and the live view (two refreshes) on the running server."""
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    runner = CliRunner()
    res = runner.invoke(app, ["watch", f"http://127.0.0.1:{port}", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["acceptance"] == snap["acceptance"] and got["alarms"] == snap["alarms"], (got, snap)
    res = runner.invoke(app, ["watch", f"http://127.0.0.1:{port}/metrics", "--count", "2",
                              "--interval", "0.2"])
    assert res.exit_code == 0 and "K per batch-size bucket" in res.output, res.output
    assert max(map(len, res.output.splitlines())) <= 80, res.output
