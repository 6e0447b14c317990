"""has_requests / update_draft_token_ids per call: today's serving scheduler vs 5addc82's (loaded by
benchmarks/bench_scheduler_overhead.py's --before loader). Run from the repository root:
``python docs/lab/data/plugin-composed-frames.py`` (docs/lab/plugin-composed.md)."""

import copy
import json
import os
import sys
import tempfile
import timeit

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()


def main() -> None:
    import bench_scheduler_overhead as bench
    from vllm.v1.outputs import DraftTokenIds

    from dsdprof.plugins import vllm_adaptive as va
    from dsdprof.serve.settings import adaptive_additional_config
    from tests.vllm_fakes import make_scheduler, vllm_config

    old = bench.before_module("5addc82", tempfile.mkdtemp())[1]
    path = os.path.join(tempfile.mkdtemp(), "t.json")
    with open(path, "w") as fh:
        fh.write(json.dumps(bench.table(3, 8)))
    cfg = copy.copy(vllm_config(3, 8, max_model_len=512))
    drafts = DraftTokenIds(["x"], [[1, 2, 3]])
    for metrics in (False, True):
        cfg.additional_config = {**adaptive_additional_config(path), "dsdprof_metrics": metrics}
        scheds = {"new": make_scheduler(va.AdaptiveScheduler, cfg),
                  "old": make_scheduler(old.AdaptiveScheduler, cfg)}
        for name, stmt in (("has_requests", "s.has_requests()"),
                           ("update_draft_token_ids", "s.update_draft_token_ids(d)")):
            best: dict[str, float] = {}
            for which in ("old", "new") * 4:  # interleaved
                ns = min(timeit.repeat(stmt, globals={"s": scheds[which], "d": drafts}, number=20000,
                                       repeat=7)) / 20000 * 1e9
                best[which] = min(best.get(which, ns), ns)
            print(f"metrics={metrics} {name}: old {best['old']:.0f} ns, new {best['new']:.0f} ns, "
                  f"{best['new'] - best['old']:+.0f} ns")


if __name__ == "__main__":
    main()
