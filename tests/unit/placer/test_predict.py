"""Table tests of runtime prediction (core/predict.py) and of placement planning on it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import Backfill, Fit, JobRequest, Plan, Start, Wait, Waiting, place
from services.placer.core.predict import (
    Outcome,
    Prediction,
    Predictor,
    explained_end,
    planned_end,
    with_predictions,
)
from tests.unit.placer.helpers import T0, gang, node, running, snapshot, whole

H = 3600.0


def learned(*outcomes: Outcome) -> Predictor:
    p = Predictor()
    for o in outcomes:
        p.learn(o)
    return p


ALICE_TRAIN = (
    Outcome("alice", "train", 8, 86_400, 1000.0),
    Outcome("alice", "train", 8, 86_400, 3000.0),
)

PREDICT = {
    "no history: no prediction (plan on the limit)": (learned(), ("alice", "train", 8, 7200), None),
    "one finished job is not history enough": (
        learned(ALICE_TRAIN[0]),
        ("alice", "train", 8, 7200),
        None,
    ),
    "the same user, name and size: the mean of the last two": (
        learned(*ALICE_TRAIN),
        ("alice", "train", 8, 86_400),
        Prediction(2000, "mean of the last 2 jobs of alice named train on 8 GPUs"),
    ),
    "a new name falls back to the user's jobs of that size": (
        learned(*ALICE_TRAIN),
        ("alice", "eval", 8, 86_400),
        Prediction(2000, "mean of the last 2 jobs of alice on 8 GPUs"),
    ),
    "a new size falls back to the user's jobs": (
        learned(*ALICE_TRAIN),
        ("alice", "train", 64, 86_400),
        Prediction(2000, "mean of the last 2 jobs of alice"),
    ),
    "never past the job's own limit": (
        learned(*ALICE_TRAIN),
        ("alice", "train", 8, 1200),
        Prediction(1200, "mean of the last 2 jobs of alice named train on 8 GPUs"),
    ),
    "only the last two count": (
        learned(*ALICE_TRAIN, Outcome("alice", "train", 8, 86_400, 5000.0)),
        ("alice", "train", 8, 86_400),
        Prediction(4000, "mean of the last 2 jobs of alice named train on 8 GPUs"),
    ),
    "another user's history is not ours": (learned(*ALICE_TRAIN), ("bob", "train", 8, 7200), None),
}


@pytest.mark.parametrize(("predictor", "ask", "want"), PREDICT.values(), ids=PREDICT.keys())
def test_predict(
    predictor: Predictor, ask: tuple[str, str, int, int], want: Prediction | None
) -> None:
    assert predictor.predict(*ask) == want


ENDS = {
    "no prediction: the limit": (running(1, whole("a"), started_at=T0 - H), T0 + H),
    "a prediction not yet reached": (
        running(1, whole("a"), started_at=T0 - H, predicted_s=int(1.5 * H)),
        T0 + H / 2,
    ),
    "outlived: doubled until it passes now": (
        running(1, whole("a"), started_at=T0 - H, predicted_s=1000),
        T0 - H + 4000,
    ),
    "outlived past the limit: the limit": (
        running(1, whole("a"), started_at=T0 - 7000, predicted_s=4000),
        T0 + 200,
    ),
}


@pytest.mark.parametrize(("run", "want"), ENDS.values(), ids=ENDS.keys())
def test_planned_end(run: object, want: float) -> None:
    assert planned_end(run, T0) == want  # type: ignore[arg-type]


def test_a_job_predicted_to_end_before_the_reserved_start_is_backfilled() -> None:
    """Job 1 holds n0 for another hour; job 2 wants both nodes; job 3 asks 2 h but its
    user's jobs run 20 minutes: it is backfilled on n1 (on its limit it would wait)."""
    snap = snapshot(node("n0"), node("n1"), running=(running(1, whole("n0")),))
    wide = gang(2, nodes=2, gpus_per_node=8, priority=10)
    short = gang(3, gpus_per_node=8, time_limit_s=7200, predicted_s=1200)
    plan = place(snap, [wide, short], now=T0)
    assert plan == Plan(
        starts=(
            Start(
                job_id=3,
                grants=(whole("n1"),),
                backfilled=True,
                fit=Fit.NODE,
                backfill=Backfill.BEFORE_RESERVED_START,
                around=2,
            ),
        ),
        waits=(Wait(job_id=2, reason=Waiting.RESOURCES, estimated_start=T0 + H),),
    )
    unpredicted = place(snap, [wide, gang(3, gpus_per_node=8, time_limit_s=7200)], now=T0)
    assert not unpredicted.starts


def test_a_running_job_predicted_to_end_early_brings_the_estimated_start_forward() -> None:
    snap = snapshot(node("n0"), running=(running(1, whole("n0"), predicted_s=4000),))
    plan = place(snap, [gang(2, gpus_per_node=8)], now=T0)
    assert plan.waits == (Wait(job_id=2, reason=Waiting.RESOURCES, estimated_start=T0 - H + 4000),)


def test_the_queue_and_the_running_jobs_get_their_predictions() -> None:
    """What the placer's cycle does with the job history (services/placer/service.py)."""
    predictor = learned(*ALICE_TRAIN)
    queue = [gang(1, gpus_per_node=8, name="train", time_limit_s=86_400), gang(2, user="bob")]
    runs = (running(3, whole("a"), user="alice", name="train", time_limit_s=86_400),)
    jobs, now_running = with_predictions(predictor, queue, runs)
    assert [j.predicted_s for j in jobs] == [2000, None]
    assert [r.predicted_s for r in now_running] == [2000]
    assert jobs[1] is queue[1]


ALICE_WHY = "mean of the last 2 jobs of alice named train on 8 GPUs"
EXPLAINED = {
    "no history: no predicted end (planned on its limit)": (
        running(1, whole("a"), user="bob", name="train"), None,
    ),
    "its prediction, and the history it comes from": (
        running(1, whole("a"), user="alice", name="train", time_limit_s=86_400,
                started_at=T0 - 1000),
        (T0 + 1000, ALICE_WHY),
    ),
    "outlived: extended, and it says so": (
        running(1, whole("a"), user="alice", name="train", time_limit_s=86_400,
                started_at=T0 - 3000),
        (T0 + 1000, f"{ALICE_WHY}; extended, it outlived 2000 s"),
    ),
    "extended up to its limit": (
        running(1, whole("a"), user="alice", name="train", time_limit_s=86_400,
                started_at=T0 - 80_000),
        (T0 + 6_400, f"{ALICE_WHY}; at its limit"),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("run", "want"), EXPLAINED.values(), ids=EXPLAINED.keys())
def test_explained_end(run: object, want: tuple[float, str] | None) -> None:
    assert explained_end(learned(*ALICE_TRAIN), run, T0) == want  # type: ignore[arg-type]


# --- a window learned one outcome at a time --------------------------------------------

outcomes = st.builds(
    Outcome,
    user=st.sampled_from(["alice", "bob"]),
    name=st.sampled_from(["", "train", "eval"]),
    gpus=st.sampled_from([1, 8]),
    limit_s=st.just(86_400),
    runtime_s=st.integers(1, 10_000).map(float),
)
ASKED = [(u, n, g, 86_400) for u in ("alice", "bob") for n in ("", "train", "eval") for g in (1, 8)]


@given(st.lists(outcomes, max_size=40), st.integers(1, 12))
@settings(max_examples=300, deadline=None)
def test_a_window_learned_one_at_a_time_predicts_as_one_learned_from_the_window_alone(
    history: list[Outcome], window: int
) -> None:
    rolling = Predictor(window=window)
    for i, o in enumerate(history):
        rolling.learn(o, ident=i)
        fresh = learned(*history[max(0, i + 1 - window) : i + 1])
        assert [rolling.predict(*a) for a in ASKED] == [fresh.predict(*a) for a in ASKED]


queued = st.builds(
    lambda user, name, shape, limit: gang(
        1, nodes=shape[0], gpus_per_node=shape[1], gpus_total=shape[2], user=user, name=name,
        time_limit_s=limit,
    ),
    user=st.sampled_from(["alice", "bob"]),
    name=st.sampled_from(["", "train", "eval"]),
    shape=st.sampled_from([(1, 1, None), (1, 8, None), (2, 4, None), (1, 0, 8), (1, 0, 1)]),
    limit=st.integers(1, 20_000),
)  # fmt: skip


@given(st.lists(outcomes, max_size=30), st.integers(1, 8), st.lists(queued, max_size=12))
@settings(max_examples=300, deadline=None)
def test_the_queue_gets_exactly_what_predict_says_for_each_job(
    history: list[Outcome], window: int, queue: list[JobRequest]
) -> None:
    """with_predictions looks the means up inline (a cycle asks for every waiting job):
    the same answer as `predict`, also as the window moves."""
    p = Predictor(window=window)
    for i, o in enumerate(history):
        p.learn(o, ident=i)
    jobs, _ = with_predictions(p, queue, ())
    for job, got in zip(queue, jobs, strict=True):
        want = p.for_job(job)
        assert got.predicted_s == (None if want is None else want.seconds)
        assert (got is job) == (want is None)


def test_an_outcome_already_in_the_window_is_not_learned_twice() -> None:
    p = Predictor(window=3)
    assert p.learn(ALICE_TRAIN[0], ident=7)
    assert not p.learn(ALICE_TRAIN[0], ident=7)  # a redelivered job.finished
    assert p.predict("alice", "train", 8, 86_400) is None  # one job is not history enough
    for i in range(3):  # job 7 leaves the window: it may be learned again
        p.learn(Outcome("bob", "", 1, 600, 60.0), ident=100 + i)
    assert p.learn(ALICE_TRAIN[0], ident=7)
