"""Real multi-process gloo runs: resizes through SIGTERM checkpoints, and a
SIGKILL'd worker resuming from its last periodic checkpoint."""

from __future__ import annotations

import signal
import statistics

import pytest
import torch
from train_support import Workers, epoch_indices, read_log, wait_until

from sia_grpc.train.contract import EXIT_CHECKPOINTED, EXIT_COMPLETED

# Heavy and timing-sensitive: the "heavy" xdist group (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("heavy")

N = 480


def _exactly_once(rows: list[dict], epochs: int) -> None:
    by_epoch = epoch_indices(rows)
    assert sorted(by_epoch) == list(range(epochs))
    for e, idx in by_epoch.items():
        dup = len(idx) - len(set(idx))
        missing = sorted(set(range(N)) - set(idx))
        assert dup == 0 and not missing, f"epoch {e}: {dup} repeated, missing {missing[:20]}"


def _first_losses(rows: list[dict], k: int = 3) -> float:
    steps: dict[int, list[float]] = {}
    for r in rows:
        steps.setdefault(r["step"], []).append(r["loss"])
    return statistics.mean(statistics.mean(v) for _, v in sorted(steps.items())[:k])


@pytest.mark.timeout(120)
def test_two_one_two_workers_through_sigterms(tmp_path):
    common = {"TEST_N": N, "TEST_EPOCHS": 3, "SIA_CHECKPOINT_INTERVAL_S": 0}

    # 2 replicas × 8, stopped a few steps into epoch 0.
    w = Workers(tmp_path, 1, 2, SIA_BATCH_SIZE=16, SIA_ATOMIC_BATCH_SIZE=8, SIA_ACCUM_STEPS=0,
                TEST_STEP_SLEEP=0.02, **common)
    wait_until(lambda: len(read_log(tmp_path, 1, 0)) >= 6, 60, "6 steps", w)
    w.signal(signal.SIGTERM)
    assert w.wait() == [EXIT_CHECKPOINTED] * 2, w.output()
    gen1 = read_log(tmp_path, 1)
    assert {r["epoch"] for r in gen1} == {0} and len(gen1) < N // 8  # mid-epoch
    assert (tmp_path / "ckpt" / "ckpt-gen1.pt").is_file()

    # 1 replica, 8 × 2 micro-batches (same global batch through accumulation).
    w = Workers(tmp_path, 2, 1, SIA_BATCH_SIZE=16, SIA_ATOMIC_BATCH_SIZE=8, SIA_ACCUM_STEPS=1,
                TEST_STEP_SLEEP=0.01, **common)
    wait_until(lambda: len(read_log(tmp_path, 2)) >= 12, 60, "12 micro-steps", w)
    w.signal(signal.SIGTERM)
    assert w.wait() == [EXIT_CHECKPOINTED], w.output()
    gen2 = read_log(tmp_path, 2)
    assert {tuple(r["shape"]) for r in gen2} == {(8, 1)}
    assert len(gen2) % 2 == 0  # whole steps only (16 samples: 2 micro-steps each)
    assert min(r["step"] for r in gen2) == max(r["step"] for r in gen1) + 1

    # 2 replicas × 16 (a larger batch) to the end.
    w = Workers(tmp_path, 3, 2, SIA_BATCH_SIZE=32, SIA_ATOMIC_BATCH_SIZE=16, SIA_ACCUM_STEPS=0,
                **common)
    assert w.wait() == [EXIT_COMPLETED] * 2, w.output()
    gen3 = read_log(tmp_path, 3)
    assert min(r["step"] for r in gen3) == max(r["step"] for r in gen2) + 1
    assert {tuple(r["shape"]) for r in gen3} == {(16, 0)}
    assert max(r["batch"] for r in gen3) == 32  # an epoch's last step may be smaller

    rows = read_log(tmp_path)
    _exactly_once(rows, 3)
    # Within each step the ranks' shares are disjoint (implied above) and non-empty.
    assert all(r["idx"] for r in rows)
    # The loss keeps falling across both resizes: each generation starts where
    # the previous one stopped, not from scratch, and training converges.
    l1, l2, l3 = (_first_losses(g) for g in (gen1, gen2, gen3))
    assert l2 < l1 and l3 < l2, (l1, l2, l3)
    last_epoch = [r["loss"] for r in gen3 if r["epoch"] == 2]
    assert statistics.mean(last_epoch) < 0.05 * l1


@pytest.mark.timeout(90)
def test_sigkilled_worker_resumes_from_its_last_periodic_checkpoint(tmp_path):
    common = {"TEST_N": N, "TEST_EPOCHS": 2}
    ckpt = tmp_path / "ckpt" / "ckpt-gen1.pt"
    w = Workers(tmp_path, 1, 1, SIA_ATOMIC_BATCH_SIZE=8, TEST_STEP_SLEEP=0.01,
                SIA_CHECKPOINT_INTERVAL_S=0.2, **common)
    wait_until(ckpt.is_file, 60, "a periodic checkpoint", w)
    seen = len(read_log(tmp_path, 1))
    wait_until(lambda: len(read_log(tmp_path, 1)) >= seen + 10, 60, "10 more steps", w)
    w.signal(signal.SIGKILL)
    assert w.wait() == [-signal.SIGKILL]

    state = torch.load(ckpt, weights_only=False)["sia"]
    done = state["samples_done"]
    gen1 = read_log(tmp_path, 1)
    assert 0 < done < sum(len(r["idx"]) for r in gen1) <= 2 * N  # steps after it are lost

    w = Workers(tmp_path, 2, 1, SIA_ATOMIC_BATCH_SIZE=8, **common)
    assert w.wait() == [EXIT_COMPLETED], w.output()
    gen2 = read_log(tmp_path, 2)
    assert gen2[0]["step"] == state["steps"]
    # What the checkpoint holds of generation 1, then generation 2: each sample
    # of each epoch exactly once.
    kept, n = [], 0
    for r in gen1:
        if n >= done:
            break
        kept.append(r)
        n += len(r["idx"])
    assert n == done
    _exactly_once(kept + gen2, 2)
