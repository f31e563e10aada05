"""Tests of the trace simulator: loaders, clusters, the event loop and its metrics."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from services.placer.core import JobRequest
from shared.states import NodeState
from sim import TraceJob, load, load_topology, make_cluster, run
from sim.baselines import slurm_priority
from sim.cli import main
from sim.metrics import wide_over
from sim.traces import traces_root

TRACES = {
    "philly": (
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
        "2017-10-09 07:00:55,10.0,12,120.0,6214e9\n",
        [
            TraceJob(
                job_id=1,
                submit_s=0.0,
                duration_s=10.0,
                nodes=2,
                gpus_total=12,
                user="vc-6214e9",
                account="vc-6214e9",
            ),
            TraceJob(
                job_id=2,
                submit_s=60.0,
                duration_s=66.0,
                gpus_per_node=1,
                user="vc-11cb48",
                account="vc-11cb48",
            ),
        ],
    ),
    "kalos": (
        "job_id,arrival_time,num_iteration,iteration_computing_time,gpu_workers\n"
        "0,100.0,208,0.5,16\n",
        [
            TraceJob(
                job_id=1, submit_s=0.0, duration_s=104.0, nodes=2, gpus_per_node=8, account="kalos"
            )
        ],
    ),
    "openb": (
        "name,num_gpu,gpu_milli,qos,creation_time,deletion_time,scheduled_time\n"
        "p0,1,460,LS,10,500,40\n"
        "p1,1,1000,BE,20,90,\n",
        [
            TraceJob(
                job_id=1,
                submit_s=0.0,
                duration_s=460.0,
                gpus_per_node=1,
                user="LS",
                account="LS",
                production_delay_s=30.0,
            )
        ],
    ),
    "csv": (
        "submit_time,duration_s,nodes,gpus_per_node,user,account,time_limit_s\n"
        "5,100,2,4,ann,lab,600\n",
        [
            TraceJob(
                job_id=1,
                submit_s=0.0,
                duration_s=100.0,
                nodes=2,
                gpus_per_node=4,
                user="ann",
                account="lab",
                time_limit_s=600,
            )
        ],
    ),
}


@pytest.mark.parametrize(("fmt", "text", "want"), [(k, *v) for k, v in TRACES.items()])
def test_loaders_read_each_format(
    fmt: str, text: str, want: list[TraceJob], tmp_path: Path
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    assert load(path, fmt) == want


def test_the_real_traces_load_whole() -> None:
    root = traces_root()  # CI has ../shared beside the clone: a missing folder fails here
    assert len(load(root / "acme/kalos_converted.csv", "kalos")) == 319
    assert len(load(root / "philly/philly.csv", "philly", limit=1000)) == 1000


TOPOLOGY = """
gpus_per_node = 4
locality_groups = 2
[[switch]]
name = "spine0"
  [[switch.switch]]
  name = "leaf0"
  nodes = 2
  block = "nvl0"
  [[switch.switch]]
  name = "leaf1"
  nodes = 1
  gpus_per_node = 8
"""


def test_a_topology_file_builds_the_switch_tree(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(TOPOLOGY)
    nodes = load_topology(path)
    assert [(n.name, n.topology, n.block, len(n.gpus)) for n in nodes] == [
        ("node0000", ("spine0", "leaf0"), "nvl0", 4),
        ("node0001", ("spine0", "leaf0"), "nvl0", 4),
        ("node0002", ("spine0", "leaf1"), None, 8),
    ]
    assert [g.locality for g in nodes[0].gpus] == [0, 0, 1, 1]


def test_make_cluster_hangs_leaves_under_spines() -> None:
    nodes = make_cluster(nodes=5, gpus_per_node=2, nodes_per_leaf=2, leaves_per_spine=2)
    assert [n.topology for n in nodes] == [
        ("spine0", "leaf0"),
        ("spine0", "leaf0"),
        ("spine0", "leaf1"),
        ("spine0", "leaf1"),
        ("spine1", "leaf2"),
    ]


def job(job_id: int, submit: float, duration: float, nodes: int, **kw: object) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        submit_s=submit,
        duration_s=duration,
        nodes=nodes,
        gpus_per_node=8,
        time_limit_s=int(duration),
        **kw,  # type: ignore[arg-type]
    )


# Slurm's classic, replayed: a 1-node job runs, a 4-node job must wait for it, a short
# 3-node job fits in the gap under EASY (backfill) but not under FIFO.
CLASSIC = [job(1, 0, 1000, 1), job(2, 1, 500, 4), job(3, 2, 100, 3)]

DELAYS = {
    "fifo": {1: 0.0, 2: 999.0, 3: 1498.0},
    "easy": {1: 0.0, 2: 999.0, 3: 0.0},
    "muster": {1: 0.0, 2: 999.0, 3: 0.0},
}


@pytest.mark.parametrize(("policy", "want"), DELAYS.items(), ids=DELAYS.keys())
def test_backfill_fills_the_gap_fifo_leaves(policy: str, want: dict[int, float]) -> None:
    result = run(CLASSIC, make_cluster(nodes=4, nodes_per_leaf=4), policy)
    assert result.finished == 3
    assert result.queue_delay_mean_s == pytest.approx(sum(want.values()) / 3)
    assert result.queue_delay_median_s == sorted(want.values())[1]
    assert result.gpu_seconds_by_account == {"default": 8 * 1000 + 32 * 500 + 24 * 100}


def test_an_urgent_job_preempts_and_the_victim_is_requeued() -> None:
    work = [job(1, 0, 1000, 2), job(2, 10, 100, 2, tier=1, can_preempt=True)]
    result = run(work, make_cluster(nodes=2), "muster")
    assert (result.preemptions, result.requeues, result.finished) == (1, 1, 2)
    assert result.queue_delay_median_s == 0.0


def test_failures_are_reproducible_from_the_seed() -> None:
    work = [job(i, i * 50.0, 400.0, 1) for i in range(1, 40)]
    cluster = make_cluster(nodes=4)
    one = run(work, cluster, "muster", mtbf_s=2000.0, repair_s=300.0, rng=random.Random(3))
    two = run(work, cluster, "muster", mtbf_s=2000.0, repair_s=300.0, rng=random.Random(3))
    strip = {"wall_s": 0.0}
    assert msgspec.structs.replace(one, **strip) == msgspec.structs.replace(two, **strip)
    assert one.failures > 0 and one.finished == len(work)


def test_failures_need_an_rng() -> None:
    with pytest.raises(ValueError, match="rng"):
        run([job(1, 0, 10, 1)], make_cluster(nodes=1), "fifo", mtbf_s=100.0)


def test_a_priority_hook_reorders_the_queue_by_account_usage() -> None:
    seen: list[tuple[int, float]] = []

    def fair(req: JobRequest, now: float, usage: Mapping[str, float]) -> float:
        seen.append((req.job_id, now))
        return -usage.get(req.account, 0.0)

    work = [
        job(1, 0, 100, 1, account="heavy"),
        job(2, 1, 100, 1, account="heavy"),
        job(3, 2, 100, 1, account="light"),
    ]
    result = run(work, make_cluster(nodes=1), "fifo", priority_fn=fair)
    assert seen, "the hook is called"
    # job 3 (light account) overtakes job 2 (heavy) once job 1 has used GPU time
    assert result.queue_delay_mean_s == pytest.approx((0 + 98 + 199) / 3)


def test_cli_prints_a_policy_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(TRACES["csv"][0])
    assert main([str(path), "--nodes", "2", "--policy", "all"]) == 0
    assert "queue delay mean" in capsys.readouterr().out
    assert main([str(path), "--nodes", "2", "--json"]) == 0
    assert '"policy": "muster"' in capsys.readouterr().out
    assert main([str(tmp_path / "missing.csv")]) == 2


def test_down_nodes_in_a_topology_are_not_used() -> None:
    nodes = make_cluster(nodes=2)
    down = (msgspec.structs.replace(nodes[0], state=NodeState.DOWN), nodes[1])
    result = run([job(1, 0, 10, 2)], down, "muster")
    assert result.never_started == 1


def test_the_shipped_fat_tree_and_a_plot(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[3] / "sim/topologies/fat_tree_64.toml"
    nodes = load_topology(example)
    assert len(nodes) == 64 and {n.topology[0] for n in nodes} == {"spine0", "spine1"}
    pytest.importorskip("matplotlib")
    path = tmp_path / "jobs.csv"
    path.write_text(TRACES["csv"][0])
    assert main([str(path), "--topology", str(example), "--plot", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out/policies.png").exists()


def test_slurm_ranks_a_light_account_ahead_and_old_jobs_climb() -> None:
    """The slurm baseline's multifactor priority (sim/baselines.py)."""
    fresh = JobRequest(job_id=1, user="u", account="light", submitted_at=1000.0)
    heavy = msgspec.structs.replace(fresh, job_id=2, account="heavy")
    usage = {"heavy": 900.0, "light": 100.0}
    assert slurm_priority(fresh, 1000.0, usage) > slurm_priority(heavy, 1000.0, usage)
    week = 7 * 86_400.0
    assert slurm_priority(heavy, 1000.0 + week, usage) - slurm_priority(
        heavy, 1000.0, usage
    ) == pytest.approx(1000.0)
    assert slurm_priority(fresh, 1000.0, {}) == pytest.approx(11_000.0 - 1000.0)


def test_slurm_backfills_the_classic_gap_on_user_limits() -> None:
    result = run(CLASSIC, make_cluster(nodes=4, nodes_per_leaf=4), "slurm")
    assert result.queue_delay_mean_s == pytest.approx((0 + 999 + 0) / 3)


def test_each_jobs_first_estimated_start_is_compared_with_its_real_start() -> None:
    exact = run(CLASSIC, make_cluster(nodes=4, nodes_per_leaf=4), "easy")
    assert (exact.estimated_jobs, exact.estimate_error_median_s) == (1, 0.0)
    # job 1 asks twice what it runs: job 2's booking says 2,000 s, it starts at 1,000 s
    padded = [msgspec.structs.replace(CLASSIC[0], time_limit_s=2000), *CLASSIC[1:]]
    early = run(padded, make_cluster(nodes=4, nodes_per_leaf=4), "easy")
    assert (early.estimated_jobs, early.estimate_error_median_s) == (1, 1000.0)
    assert early.estimate_late_share == 0.0


def test_the_one_leaf_share_of_gangs_a_leaf_holds_leaves_out_wider_ones() -> None:
    """Two leaves of 2 nodes: a 2-node gang fits one, a 3-node gang never can."""
    work = [job(1, 0, 100, 2), job(2, 200, 100, 3)]
    result = run(work, make_cluster(nodes=4, nodes_per_leaf=2), "easy")
    assert result.multi_node_in_one_leaf == 0.5
    assert result.multi_node_fitting_in_one_leaf == 1.0


WIDE = {  # job 7's wait against easy's 1,000 s: over when above 1.5 x 1,000 + 60
    "at the bar": ({7: 1560.0}, []),
    "over it": ({7: 1561.0}, [7]),
    "shorter than under easy": ({7: 10.0}, []),
    "a wide job easy never waited for: over past a minute": ({7: 1000.0, 8: 61.0}, [8]),
}


@pytest.mark.parametrize(("waits", "want"), WIDE.values(), ids=WIDE.keys())
def test_wide_over_counts_the_wide_jobs_over_one_and_a_half_times_their_easy_wait(
    waits: dict[int, float], want: list[int]
) -> None:
    base = run(CLASSIC, make_cluster(nodes=4, nodes_per_leaf=4), "easy")
    easy = msgspec.structs.replace(base, waits_64gpu_s={7: 1000.0})
    assert wide_over(msgspec.structs.replace(base, waits_64gpu_s=waits), easy) == want
