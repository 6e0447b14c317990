"""Under async scheduling the profiling scheduler reads a kept step's sampled-token counts after
vLLM's ``update_from_output`` (issue 30, part 5: no copy before it), when vLLM has already cut the
list of every request it stopped inside the step's tokens (``del new_token_ids[num_new:]``, in
place). ``_dsdprof_uncut`` puts each cut back from the request's output placeholders. Checked here
on vLLM's real ``AsyncScheduler`` driven by the fake runner: every count the idle build gets is the
count a copy before vLLM's update reads (the previous way), and what it records as delivered is what
vLLM left; with EOS stops and max-token stops inside multi-token steps (some cut, counted), K
sequences, aborts, in both call orders. The records themselves are compared with the per-step
build's in ``test_profiler_own_time.py``; here too, on the stop-heavy waves."""

from __future__ import annotations

import json
import random
import zlib

import pytest

pytest.importorskip("vllm")

from dsdprof.plugins import vllm_profiling as vs  # noqa: E402
from tests.plugins.test_profiler_own_time import TOKEN, AbortingRunner, add_wave  # noqa: E402
from tests.vllm_fakes import drive, make_scheduler, vllm_config  # noqa: E402


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", TOKEN)
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(tmp_path))
    return tmp_path


class Watched(vs.TracingAsyncScheduler):
    """Logs, per update, each request's sampled count before and after vLLM's update, and every
    kept step the idle build gets."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.counts: dict[int, tuple[dict, dict]] = {}  # update -> ({req: before}, {req: after})
        self.built: list[tuple] = []

    def update_from_output(self, scheduler_output, model_runner_output):
        sampled, index = model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
        before = {r: len(sampled[i]) for r, i in index.items()} if sampled else {}
        result = super().update_from_output(scheduler_output, model_runner_output)
        after = {r: len(sampled[i]) for r, i in index.items()} if sampled else {}
        self.counts[self._dsdprof_u] = (before, after)
        return result

    def _dsdprof_build(self) -> None:
        self.built.extend(self._dsdprof_pending)
        super()._dsdprof_build()


def h(*key) -> int:
    return zlib.crc32(repr(key).encode())


def run_waves(order: str, scenario: str, seed: int, defer: bool = True) -> Watched:
    cls = Watched if defer else type("PerStepWatched", (Watched,), {"_dsdprof_defer": False})
    sched = make_scheduler(cls, vllm_config(5, 8, num_blocks=4096))
    # the async idle build reads the counts after vLLM's update on vLLM 0.32 (vs.LATE_COUNTS; 0.33
    # subtracts a stop's trimmed tokens from its placeholders too, so it copies them before)
    assert sched._dsdprof_late == (defer and vs.LATE_COUNTS)
    rng = random.Random(seed)
    for w in range(3):
        eos = scenario != "max_tokens"
        eos_at = {f"w{w}-r{i}": rng.randrange(3, 40) for i in range(8)} if eos else {}
        k_seq = [5, 5, 2, 4, 0, 3] if scenario == "k_seq" else None
        add_wave(sched, w, 8, f"cut-{order}-{scenario}-{seed}-{defer}", lambda w, i: 23 + 5 * i, k=5, eos=eos,
                 k_seq=k_seq)
        aborts = {5 + w: f"w{w}-r3", 8: f"w{w}-r6"} if scenario == "abort" else {}

        def accept(r, s, d, w=w):  # mostly long accepted runs: stops land inside a step's tokens
            return d if h(r, s, w, seed) % 256 < 200 else h(s, r) % (d + 1)

        drive(sched, AbortingRunner(accept, sched, aborts, eos_at), order, spec=True)
    return sched


@pytest.mark.parametrize("scenario", ["eos", "max_tokens", "abort", "k_seq"])
@pytest.mark.parametrize("order", ["async", "sync"])
def test_counts_read_after_the_update_are_the_counts_before_it(run_env, order, scenario):
    cuts = compared = 0
    for seed in (1, 2):
        sched = run_waves(order, scenario, seed)
        assert sched.built and not sched._dsdprof_pending and not sched._dsdprof_cut
        for _so, _arm, u, index, lens, _invalid, trimmed, _t_end, _own in sched.built:
            before, after = sched.counts[u]
            for req_id, i in index.items():
                assert lens[i] == before[req_id], (u, req_id)  # the count vLLM sampled: cut put back
                assert (trimmed or {}).get(req_id, lens[i]) == after[req_id]  # what vLLM delivered
                compared += 1
                cuts += before[req_id] != after[req_id]
    assert compared > 150
    assert cuts >= 5  # stops inside a step's tokens were there (without _dsdprof_uncut, lens == after)


def trace(tmp_path, name: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("t_end", "t_own")}
            for line in (tmp_path / f"{name}.jsonl").read_text().splitlines() for r in json.loads(line)]


@pytest.mark.parametrize("scenario", ["eos", "max_tokens", "abort", "k_seq"])
@pytest.mark.parametrize("order", ["async", "sync"])
def test_stop_heavy_idle_build_writes_the_per_step_records(run_env, order, scenario):
    """The idle build (counts read after the update, cuts put back) and the per-step build (counts
    read before it) write the same records through waves that stop inside multi-token steps."""
    run_waves(order, scenario, 3, defer=True)
    run_waves(order, scenario, 3, defer=False)
    kept = trace(run_env, f"cut-{order}-{scenario}-3-True")
    per_step = trace(run_env, f"cut-{order}-{scenario}-3-False")
    assert len(kept) > 20
    assert kept == per_step
    assert any(g > d for r in kept for g, d in zip(r["generated"], (r["delivered"][i] for i in r["ids"])))
    if scenario == "k_seq":  # the sequence ran: its K per step recorded (``arm``)
        assert {r.get("arm") for r in kept} >= {5, 2, 4, 0, 3}


class LiveIndexRunner(AbortingRunner):
    """A model runner handing the same ``req_id_to_index`` dict every step, right for each step while
    vLLM processes its output and rebuilt in place for the next (what a runner passing its live batch
    index would do): the scheduler must copy it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.live: dict[str, int] = {}
        self.index: dict[int, dict[str, int]] = {}

    def execute(self, so):
        mro = super().execute(so)
        self.index[id(so)], mro.req_id_to_index = mro.req_id_to_index, self.live
        return mro

    def before_update(self, so) -> None:
        super().before_update(so)
        self.live.clear()
        self.live.update(self.index.pop(id(so)))


@pytest.mark.skipif(not vs.LATE_COUNTS, reason="the index is kept by reference on the late-count path only")
@pytest.mark.parametrize("live", [False, True])
def test_req_id_to_index_kept_by_reference_only_when_new_every_step(run_env, live):
    from dsdprof.plugins import profiling_records

    traces = {}
    for defer in (True, False):
        cls = Watched if defer else type("PerStepWatched", (Watched,), {"_dsdprof_defer": False})
        sched = make_scheduler(cls, vllm_config(5, 8, num_blocks=4096))
        rng = random.Random(5)
        for w in range(2):
            eos_at = {f"w{w}-r{i}": rng.randrange(3, 40) for i in range(8)}
            add_wave(sched, w, 8, f"index-{live}-{defer}", lambda w, i: 23 + 5 * i, k=5, eos=True)
            runner = (LiveIndexRunner if live else AbortingRunner)(
                lambda r, s, d: h(r, s) % (d + 1), sched, {}, eos_at)
            drive(sched, runner, "async", spec=True)
        traces[defer] = trace(run_env, f"index-{live}-{defer}")
        if defer:
            kept = sched
    assert len(traces[True]) > 20
    assert traces[True] == traces[False]
    # a runner's own dict seen twice: copied for good; new dicts: kept by reference
    assert kept._dsdprof_index_fresh is not live
    assert (kept._dsdprof_index is profiling_records._LIVE) is live


def test_late_counts_only_on_the_vllm_whose_placeholders_they_read():
    import vllm

    assert vs.LATE_COUNTS == vllm.__version__.startswith("0.32.")
