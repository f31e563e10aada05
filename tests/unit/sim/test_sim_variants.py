"""bench/sim_variants.py --seeds: each variant against easy under the same drawn limits."""

from __future__ import annotations

from bench.sim_variants import over_seeds
from sim import make_cluster
from sim.workload import TraceJob

HOUR = 3600.0


def queue() -> list[TraceJob]:
    """A 16-GPU cluster kept busy: one wide job behind a stream of one-node ones."""
    jobs = [
        TraceJob(job_id=i + 1, submit_s=i * 600.0, duration_s=(1 + i % 3) * HOUR,
                 gpus_per_node=8, user=f"u{i % 4}")
        for i in range(30)
    ]  # fmt: skip
    jobs.append(TraceJob(job_id=99, submit_s=650.0, duration_s=HOUR, nodes=8, gpus_per_node=8))
    return sorted(jobs, key=lambda j: j.submit_s)


def test_easy_against_itself_is_even_under_every_seed() -> None:
    cluster = make_cluster(nodes=8, nodes_per_leaf=8, leaves_per_spine=4)
    (got,) = over_seeds(queue(), cluster, ["easy"], seeds=3)
    assert len(got["per_seed"]) == 3
    for row in got["per_seed"]:
        assert (row["mean_vs_easy"], row["p99_vs_easy"], row["wide_over"]) == (0.0, 0.0, 0)
        assert row["wide"] == 1  # job 99, 64 GPUs


def test_the_seeds_draw_different_limits_so_the_figures_differ() -> None:
    cluster = make_cluster(nodes=8, nodes_per_leaf=8, leaves_per_spine=4)
    (got,) = over_seeds(queue(), cluster, ["order_trust=0"], seeds=4)
    means = {round(r["mean_vs_easy"], 6) for r in got["per_seed"]}
    assert len(means) > 1
    assert got["mean"]["mean_vs_easy"] == sum(r["mean_vs_easy"] for r in got["per_seed"]) / 4
