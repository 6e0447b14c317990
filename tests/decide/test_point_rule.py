"""decide.rule's K rule on points (``point_rule``: ``rule_index`` on one row) is the table's
rule, :func:`dsdprof.formats.ktable.choose_k`, on every goodput vector; the analysis calls the
former so that it never calls back into formats (tests/export/test_walk.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dsdprof.decide.rule import point_rule
from dsdprof.formats.ktable import choose_k


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.01, 1e4), min_size=1, max_size=8), st.floats(0.0, 0.5))
def test_point_rule_is_choose_k(goodputs, tolerance):
    ks = list(range(len(goodputs)))
    best = max(goodputs)
    ratio = {k: g / goodputs[goodputs.index(best)] for k, g in zip(ks, goodputs)}
    assert point_rule(ks, ratio, tolerance) == choose_k(ratio, tolerance)


def test_point_rule_can_disagree_with_a_wrong_tolerance():
    ratio = {0: 0.97, 1: 1.0}
    assert point_rule([0, 1], ratio, 0.05) == 0 and point_rule([0, 1], ratio, 0.01) == 1
