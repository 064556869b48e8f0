"""The batching policy (strata.generation.batch_policy) on costs given, not timed: it batches where a batch of n has
cost less than n lone steps, measures what it has not seen, tries a losing size again after REPROBE_AFTER
decisions, and keeps each key's costs apart."""

from strata.generation.batch_policy import REPROBE_AFTER, SMOOTHING, BatchPolicy


def test_unmeasured_sizes_are_tried():
    policy = BatchPolicy()
    assert policy.batches("m", 2)  # nothing measured
    policy.record("m", 1, 0.010)
    assert policy.batches("m", 4)  # the lone step measured, not the batch of 4


def test_a_batch_runs_where_it_costs_less_than_its_rows_alone():
    policy = BatchPolicy()
    policy.record("vram", 1, 0.0025)
    policy.record("vram", 2, 0.0041)   # 2 lone steps: 0.0050
    policy.record("vram", 8, 0.0116)   # 8 lone steps: 0.0200
    assert policy.batches("vram", 2) and policy.batches("vram", 8)
    policy.record("cpu", 1, 0.0094)
    policy.record("cpu", 2, 0.0259)    # 2 lone steps: 0.0188
    assert not policy.batches("cpu", 2)
    assert policy.batches("cpu", 3)    # another size, never measured


def test_a_losing_size_is_tried_again_after_reprobe_after_decisions():
    policy = BatchPolicy()
    policy.record("k", 1, 0.01)
    policy.record("k", 4, 0.05)
    decisions = [policy.batches("k", 4) for _ in range(2 * REPROBE_AFTER)]
    assert decisions.count(True) == 2
    assert decisions.index(True) == REPROBE_AFTER - 1


def test_costs_are_moving_averages_kept_per_key():
    policy = BatchPolicy()
    policy.record("a", 1, 1.0)
    policy.record("a", 1, 2.0)
    policy.record("b", 2, 3.0)
    assert policy.costs("a") == {"lone": 1.0 + SMOOTHING * 1.0, "batch": {}}
    assert policy.costs("b") == {"lone": None, "batch": {2: 3.0}}
    assert policy.costs("c") == {"lone": None, "batch": {}}
