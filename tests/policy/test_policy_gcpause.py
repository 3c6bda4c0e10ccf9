"""Policy rounds pause the cyclic garbage collector and give it back as found."""

from __future__ import annotations

import gc
import threading

import numpy as np

from sia_grpc.bench.scenarios import sample_jobs
from sia_grpc.policy.cluster import paper_hetero_cluster
from sia_grpc.policy.gcpause import collection_paused
from sia_grpc.policy.sia import SiaPolicy


@collection_paused
def _inside(nested: bool = False) -> list[bool]:
    seen = [gc.isenabled()]
    if nested:
        seen += _inside()
    return seen


def test_paused_inside_and_restored_after_also_when_nested():
    assert gc.isenabled()
    assert _inside(nested=True) == [False, False]
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled():
    gc.disable()
    try:
        _inside()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_rounds_on_threads_give_the_collector_back_once_all_end():
    inside, release = threading.Barrier(3), threading.Event()

    @collection_paused
    def round_() -> None:
        inside.wait(5)
        release.wait(5)

    threads = [threading.Thread(target=round_) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(5)
    assert not gc.isenabled()
    release.set()
    for t in threads:
        t.join(5)
    assert gc.isenabled()


def test_a_sia_round_runs_without_a_collection():
    cluster = paper_hetero_cluster(1)
    jobs = sample_jobs(np.random.default_rng(0), 20, cluster)
    collections = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        SiaPolicy().optimize(cluster, jobs, {})
    finally:
        gc.callbacks.remove(seen)
    assert collections == [] and gc.isenabled()
