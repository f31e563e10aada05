"""The synthetic LLM-development mix: seeded, shaped as documented in sim/llm_mix.py."""

from __future__ import annotations

import itertools

from sim.llm_mix import llm_mix, summary


def test_same_seed_same_jobs_other_seed_other_jobs() -> None:
    assert llm_mix(10, 16, seed=3) == llm_mix(10, 16, seed=3)
    assert llm_mix(10, 16, seed=3) != llm_mix(10, 16, seed=4)


def test_eval_jobs_dominate_counts_pretraining_gangs_dominate_gpu_time() -> None:
    jobs = llm_mix(60, 64, load=0.8, seed=0)
    s = summary(jobs)
    assert s["eval_job_share"] > 0.7
    assert s["pretrain_job_share"] < 0.02
    assert s["pretrain_gpu_time_share"] > 0.6
    assert s["gpus_median"] == 1
    assert s["run_max_s"] > 86400  # multi-day pretraining runs
    pretrain = [j for j in jobs if j.account == "pretrain"]
    assert pretrain and all(j.nodes >= 16 and j.gpus_per_node == 8 for j in pretrain)
    assert [j.job_id for j in jobs] == list(range(1, len(jobs) + 1))
    assert all(a.submit_s <= b.submit_s for a, b in itertools.pairwise(jobs))


def test_the_offered_load_scales_the_arrival_rate() -> None:
    light, heavy = llm_mix(30, 32, load=0.4, seed=1), llm_mix(30, 32, load=0.8, seed=1)
    assert 1.5 < len(heavy) / len(light) < 2.5
