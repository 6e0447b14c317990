"""AdaptiveKSelector on a loaded host: step times leave the table's K only beyond their noise.

Rollout A of docs/lab/rollout-2026-12-06.md (load 9-13 on 2 cores): a load burst on the K served
at batch size 1 (K=4 steps at 259-492 ms against 135 in the table) moved the plugin's K there
4 -> 3 -> 2 -> 1 -> 0 -> 2 while the acceptance sat at the profile. The recorded steps are replayed
here open-loop (tests/data/selector-burst-2026-12-06a.json)."""

import json
import random
from pathlib import Path

from dsdprof.serve.adaptive import AdaptiveKSelector
from tests.serve.test_adaptive_live import P0, SIZES, SPEC, _table_with_undecided_point
from tests.support.simulate import synthetic_table

DATA = Path(__file__).resolve().parents[1] / "data"


def _replay(sel: AdaptiveKSelector, seed: int = 0, run: str = "a") -> list[tuple[str, dict[int, int]]]:
    """Feed a rollout's adaptive steps (acceptance drawn at the engine log's live estimate)."""
    doc = json.loads((DATA / f"selector-burst-2026-12-06{run}.json").read_text())
    accept, rng, out = doc["live_acceptance"], random.Random(seed), []
    for row in doc["rows"]:
        for bs, dec, k, seconds, drafted in row["steps"]:
            sel.observe_step(bs, k, seconds)
            if drafted and dec:
                alive, accepted, prev = dec, [], 1.0
                for p in accept[:drafted]:
                    alive = sum(1 for _ in range(alive) if rng.random() < p / prev)
                    accepted.append(alive)
                    prev = p
                sel.observe(dec, accepted, None, dec)
            out.append((row["at"], sel.ks))
    return out


def test_rollout_a_load_burst_keeps_bs1_at_the_tables_k_through_the_burst():
    """Before: K at BS 1 went to 1 at 14:31:52 and to 0 at 14:33:03 (the fit in K, through the
    burst's K=4 steps and one K=2 step, extrapolated K 0-1 to half their table time). Now it stays
    at the table's K=4 through the burst, and never goes below 2 in the whole run. (The replay is
    open loop: after 14:33 the engine ran K=2 at BS 1, 24 steps at 1.2x the table, and never K=4
    again, so the K=4 cell keeps the burst; a served K=4 would have been re-timed.)"""
    table = json.loads((DATA / "toy-dense-cpu-2026-12-06.json").read_text())
    for seed in range(3):
        sel = AdaptiveKSelector(table, max_k=4)
        assert sel.ks[1] == 4
        trace = _replay(sel, seed)
        assert min(ks[1] for _, ks in trace) >= 2, seed
        assert {ks[1] for at, ks in trace if at <= "14:33:03"} == {4}, seed


def test_a_uniform_slowdown_keeps_the_tables_handicap():
    """Every K 1.3x slower than profiled, acceptance at the profile: the table's K is kept, also
    at BS 4, where the table serves K=2 though K=4 was 5 % faster when profiled (an undecided
    point). Before, the fade of the table's handicap read the machine's level as a move away from
    the profile (log 1.3 > FADE) and BS 4 went to K=4."""
    table = _table_with_undecided_point()
    sel = AdaptiveKSelector(table, rebuild_every=1, explore_every=0)
    table_ks = dict(sel.ks)
    itl = {(c["batch_size"], c["k"]): c["itl_s"] for c in table["cells"]}
    rng = random.Random(1)
    for _ in range(300):
        for b, k in table_ks.items():
            if k:
                sel.observe(1000, [round(1000 * 0.8**i) for i in range(1, k + 1)], batch_size=b)
            sel.observe_step(b, k, 1.3 * itl[(b, k)] * rng.lognormvariate(0.0, 0.03))
    assert sel.ks == table_ks and sel.version == 0


def test_step_times_at_the_tables_ratios_at_any_level_are_the_profile():
    """The same at every level of the machine, 0.5x to 2x, with step-time noise: no K moves."""
    table = synthetic_table(SPEC, P0)
    for level in (0.5, 0.8, 1.25, 2.0):
        sel = AdaptiveKSelector(table, rebuild_every=1, explore_every=0)
        table_ks = dict(sel.ks)
        rng = random.Random(2)
        for _ in range(200):
            for b in SIZES:
                k = table_ks[b]
                if k:
                    sel.observe(1000, [round(1000 * 0.8**i) for i in range(1, k + 1)], batch_size=b)
                sel.observe_step(b, k, level * SPEC[b][k] * rng.lognormvariate(0.0, 0.05))
        assert sel.ks == table_ks, level


def test_rollout_d_keeps_bs1_at_the_tables_k_as_the_engine_did():
    """Rollout D (17:41-17:51 UTC, load 12 -> 8) served this selector: its engine log shows no
    change at BS 1. Its K=4 steps at BS 1 ran 108-241 ms with two K=3 steps beside them; the old
    selector, replayed on the same steps, went to K=1, and a first version of this rule to K=2: the
    fit's slope through K=3 and K=4 put K=0-2 at 25-54 ms, and it counted K=2's steps at other
    batch sizes as evidence for BS 1's extrapolated estimate."""
    table = json.loads((DATA / "toy-dense-cpu-2026-12-06.json").read_text())
    for seed in range(3):
        sel = AdaptiveKSelector(table, max_k=4)
        assert {ks[1] for _, ks in _replay(sel, seed, "d")} == {4}, seed
