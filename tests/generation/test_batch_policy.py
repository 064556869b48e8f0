"""The batching policy (strata.generation.batch_policy) on costs given, not timed: it measures the lone step and each
group's size once, then plans the split that costs least by what it measured (taking turns among the splits, so a
batch dearer than its steps alone is not taken and a size that wins is, also inside a larger group), tries a size it
left out again after REPROBE_AFTER plans, keeps each key's costs apart; and over long runs of stated costs it is
never slower than taking turns but for its probes, which are bounded."""

import numpy as np
import pytest

from strata.generation.batch_policy import REPROBE_AFTER, SMOOTHING, BatchPolicy, chunks


def measured(costs: dict[int, float], key: str = "k") -> BatchPolicy:
    policy = BatchPolicy()
    for rows, seconds in costs.items():
        policy.record(key, rows, seconds)
    return policy


def test_what_is_not_measured_is_measured_first_the_lone_step_then_the_groups_size():
    policy = BatchPolicy()
    assert policy.plan("m", 8) == [1, 7]       # nothing measured: one step alone, the rest as one batch
    policy.record("m", 1, 0.010)
    policy.record("m", 7, 0.020)
    assert policy.plan("m", 8) == [8]          # the lone step measured, not the batch of 8
    assert policy.plan("m", 10, limit=4) == [4, 4, 2]
    assert policy.plan("m", 1) == [1] and policy.plan("m", 5, limit=1) == [1] * 5 and policy.plan("m", 0) == []


def test_a_batch_runs_where_it_costs_less_than_its_rows_alone_and_a_winning_size_inside_a_losing_group():
    vram = measured({1: 0.0025, 2: 0.0036, 8: 0.0090})   # the GPU box, every expert in VRAM (2026-12-06)
    assert vram.plan("k", 2) == [2] and vram.plan("k", 8) == [8]
    cpu = measured({1: 0.0094, 2: 0.0259, 8: 0.0730})     # experts on the CPU (2026-12-03): 2 lose, 8 barely win
    assert cpu.plan("k", 2) == [1, 1] and cpu.plan("k", 8) == [8]
    assert cpu.plan("k", 3) == [3]                        # another size, never measured
    mixed = measured({1: 1.0, 4: 3.0, 8: 9.0})            # 4 wins, 8 loses to two 4s
    assert mixed.plan("k", 8) == [4, 4]
    assert mixed.plan("k", 8, limit=4) == [4, 4]
    with_lone = measured({1: 1.0, 4: 3.0, 5: 6.0})
    assert with_lone.plan("k", 5) == [4, 1]               # a 4 and one alone beat a 5 and five alone


def test_a_losing_size_is_tried_again_after_reprobe_after_plans():
    costs = {1: 0.01, 4: 0.05}
    policy = measured(costs)
    plans = []
    for _ in range(2 * REPROBE_AFTER):
        plans.append(policy.plan("k", 4))
        for rows in plans[-1]:  # what ran is measured
            policy.record("k", rows, costs[rows])
    probes = [i for i, plan in enumerate(plans) if plan == [4]]
    assert probes == [REPROBE_AFTER - 1, 2 * REPROBE_AFTER - 1]
    assert all(plan == [1, 1, 1, 1] for i, plan in enumerate(plans) if i not in probes)


def test_the_lone_step_is_measured_again_after_reprobe_after_plans_without_one():
    policy = measured({1: 0.01, 4: 0.02})
    plans = [policy.plan("k", 4) for _ in range(REPROBE_AFTER)]
    assert plans[:-1] == [[4]] * (REPROBE_AFTER - 1) and plans[-1] == [1, 3]
    policy.record("k", 1, 0.01)  # it ran: the count starts over
    assert policy.plan("k", 4) == [4]


def test_gathering_is_worth_it_while_batches_win_or_are_measured():
    policy = BatchPolicy()
    assert policy.gathers("k")                      # nothing known
    policy.plan("k", 2)
    assert policy.gathers("k")                      # probing
    policy.record("k", 1, 1.0)
    policy.record("k", 2, 3.0)
    assert policy.plan("k", 2) == [1, 1] and not policy.gathers("k")
    policy.record("k", 2, 0.5)                      # a reprobe found it cheaper now (averaged: 2.5, still dearer)
    assert policy.plan("k", 2) == [1, 1]
    for _ in range(20):
        policy.record("k", 2, 0.5)
    assert policy.plan("k", 2) == [2] and policy.gathers("k")


def test_costs_are_moving_averages_kept_per_key():
    policy = BatchPolicy()
    policy.record("a", 1, 1.0)
    policy.record("a", 1, 2.0)
    policy.record("b", 2, 3.0)
    assert policy.costs("a") == {"lone": 1.0 + SMOOTHING * 1.0, "batch": {}}
    assert policy.costs("b") == {"lone": None, "batch": {2: 3.0}}
    assert policy.costs("c") == {"lone": None, "batch": {}}


def test_chunks_split_by_a_size():
    assert chunks(8, 8) == [8] and chunks(10, 4) == [4, 4, 2] and chunks(3, 1) == [1, 1, 1] and chunks(0, 2) == []


# What a step of n rows costs, in milliseconds, for each stated cost model: every expert in VRAM (the GPU box's
# 2026-12-06 step of several rows: 2.5 ms alone, 1.9 + 0.88 n batched), experts on the CPU (2026-12-03: a batch
# dearer than its rows alone at every size), and one where only larger batches win (5 + 3 n against 4 a row).
MODELS = {"vram": lambda n: 2.5 if n == 1 else 1.9 + 0.88 * n,
          "cpu": lambda n: 9.4 if n == 1 else 9.4 * n * 1.1,
          "large wins": lambda n: 4.0 if n == 1 else 5.0 + 3.0 * n}


def optimum(cost, rows: int, limit: int) -> float:
    """The cheapest split of `rows` into sizes of at most `limit` under `cost`."""
    best = [0.0]
    for n in range(1, rows + 1):
        best.append(min(best[n - k] + cost(k) for k in range(1, min(n, limit) + 1)))
    return best[rows]


@pytest.mark.parametrize("model", MODELS)
def test_over_a_long_run_the_policy_is_never_slower_than_taking_turns_but_for_bounded_probes(model, rng):
    """4,000 rounds of 1..16 waiting steps (limit 8) under stated costs: the plans' total is within the probes'
    bound of the optimum, and so never above taking turns by more than the probes' excess."""
    cost, limit, rounds = MODELS[model], 8, 4000
    policy = BatchPolicy()
    total = turns = best = 0.0
    probes_excess = 0.0
    for rows in rng.integers(1, 17, rounds):
        plan = policy.plan(model, int(rows), limit) if rows > 1 else [1]
        assert sum(plan) == rows and max(plan) <= limit
        spent = sum(cost(k) for k in plan)
        for k in plan:
            policy.record(model, k, cost(k))
        total += spent
        turns += rows * cost(1)
        floor = optimum(cost, int(rows), limit)
        best += floor
        probes_excess += spent - floor
    # a probe is one of: the lone step's (every REPROBE_AFTER plans), a group size's first, a left-out size's again
    sizes = limit + 1
    probes = sizes * (1 + rounds // REPROBE_AFTER) + (1 + rounds // REPROBE_AFTER)
    worst_probe = max(16 * cost(1), 2 * cost(limit) + cost(1))  # the dearest way 16 rows can run
    assert probes_excess <= probes * worst_probe
    assert total <= turns + probes * worst_probe
    assert total <= 1.01 * best  # the probes are few: within 1 % of the best split every round
    if model == "cpu":           # batches never win: taking turns, and the probes
        assert total <= 1.01 * turns
    elif model == "vram":        # the winning sizes are taken: half of taking turns
        assert total <= 0.6 * turns
