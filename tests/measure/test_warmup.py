"""The warm-up wave: short (a decode shape's first step is the slow one), every K of a paired group
run once, traced as wave -1 and never summarised (docs/lab/vs-serving-sweep-2026-12-06.md)."""

from __future__ import annotations

import pytest

from dsdprof.measure.vllm.trace import Step, summarize_paired
from tests.support.recording_llm import RecordingLLM


def _waves(tmp_path, group: tuple[int, ...] = (), num_spec_tokens: int | None = None):
    from dsdprof.measure.vllm.worker import CellRequest, CellRun

    req = CellRequest(batch_size=2, num_spec_tokens=num_spec_tokens, positions=max(group or (0,)), waves=2,
                      warmup=1, output_len=128, temperature=0.0, seed=0, group=group, trace_name="c")
    llm = RecordingLLM()
    CellRun(llm, [[1, 2, 3]] * 64, req, trace_dir=str(tmp_path)).run_waves(0, 2)
    return llm.params  # the warm-up wave first


def test_warm_up_waves_are_short_and_traced(tmp_path):
    """A single cell's warm-up requests stop after 16 tokens (64 before), a paired group's once every
    K has run 2 steps at full acceptance (2 x sum(K + 1) = 30 tokens for K 0-4, 80 before), each K
    held 2 steps (the measured waves' 4); the warm-up is traced as wave -1 (it was not traced)."""
    pytest.importorskip("vllm")  # CellRun builds vLLM's SamplingParams
    from dsdprof.measure.vllm.worker import PAIRED_HOLD
    from dsdprof.plugins.names import K_SEQ_ARG, TRACE_ARG, WAVE_ARG

    warm, *measured = _waves(tmp_path / "a", num_spec_tokens=0)
    assert {p.max_tokens for p in warm} == {16}
    assert {p.max_tokens for w in measured for p in w} == {128}
    assert [w[0].extra_args[WAVE_ARG] for w in (warm, *measured)] == [-1, 0, 1]
    assert {p.extra_args[TRACE_ARG] for w in (warm, *measured) for p in w} == {"c"}

    warm, *measured = _waves(tmp_path / "b", group=(0, 1, 2, 3, 4))
    assert {p.max_tokens for p in warm} == {30}
    seq = warm[0].extra_args[K_SEQ_ARG]
    assert len(seq) == 10 and sorted(set(seq)) == [0, 1, 2, 3, 4] and seq[::2] == seq[1::2]
    assert warm[0].extra_args[WAVE_ARG] == -1
    assert all(len(w[0].extra_args[K_SEQ_ARG]) == 5 * PAIRED_HOLD for w in measured)


def test_a_traced_warm_up_changes_no_summary():
    """Warm-up steps (wave -1) in a paired trace: the same numbers as without them."""

    def step(wave, t, drafted, accepted, k_next):
        n = len(drafted)
        return Step(wave, t, n, n, 0, 0, tuple(drafted), tuple(a + 1 for a in accepted), {},
                    (False,) * n, tuple(accepted), 0, tuple(str(i) for i in range(n)), k_next)

    measured = [step(0, 10.0, [0], [0], 1), step(0, 11.0, [1], [1], 1), step(0, 12.0, [1], [0], 2),
                step(0, 13.0, [2], [2], 2), step(0, 14.5, [2], [1], 2)]
    warm = [step(-1, 0.0, [0], [0], 2), step(-1, 5.0, [2], [0], 2), step(-1, 9.0, [2], [2], 1)]
    assert (summarize_paired(warm + measured, 1, (1, 2), 2, acceptance="pooled", settle=0)
            == summarize_paired(measured, 1, (1, 2), 2, acceptance="pooled", settle=0))
