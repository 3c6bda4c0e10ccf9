"""Checkpoint files: atomic writes, only complete files are restore sources, and
loading one never runs code planted in it."""

from __future__ import annotations

import os
import pickle
import random
import subprocess

import numpy as np
import pytest
import torch
from train_support import Workers, read_log

from sia_grpc.train import checkpoint as ck
from sia_grpc.train.jobstate import JobState
from sia_grpc.train.noise import GradientNoise
from sia_grpc.train.sampler import Position
from sia_grpc.train.telemetry import SampleKey


def _data(tag: int) -> dict:
    return {"sia": {"tag": tag}, "model": {"w": torch.full((3,), float(tag))}}


def test_newest_complete_generation_wins(tmp_path):
    ck.save_atomic(_data(3), ck.checkpoint_path(tmp_path, 3))
    ck.save_atomic(_data(5), ck.checkpoint_path(tmp_path, 5))
    gen, path, data = ck.newest_loadable(tmp_path)
    assert (gen, path.name, data["sia"]["tag"]) == (5, "ckpt-gen5.pt", 5)
    # A worker of generation 4 never resumes from a later generation's file.
    assert ck.newest_loadable(tmp_path, max_generation=4)[0] == 3
    assert ck.newest_loadable(tmp_path / "absent") is None


def test_partial_temp_file_is_never_a_restore_source(tmp_path):
    ck.save_atomic(_data(1), ck.checkpoint_path(tmp_path, 1))
    # A writer of generation 2 killed mid-write leaves only its temporary file.
    full = tmp_path / "full.pt"
    ck.save_atomic(_data(2), full)
    (tmp_path / ".ckpt-gen2.pt.tmp-4242").write_bytes(full.read_bytes()[:40])
    full.unlink()
    gen, _, data = ck.newest_loadable(tmp_path)
    assert gen == 1 and data["sia"]["tag"] == 1
    # Pruning on the next successful save removes the dead writer's leftover.
    ck.save_atomic(_data(3), ck.checkpoint_path(tmp_path, 3))
    ck.prune_checkpoints(tmp_path, keep=2, generation=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-gen1.pt", "ckpt-gen3.pt"]


def test_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = ck.checkpoint_path(tmp_path, 7)
    ck.save_atomic(_data(1), path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ck.save_atomic(_data(2), path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-gen7.pt"]  # no temp file left
    monkeypatch.undo()
    assert ck.newest_loadable(tmp_path)[2]["sia"]["tag"] == 1


def test_damaged_newest_file_falls_back_to_an_older_one(tmp_path):
    ck.save_atomic(_data(1), ck.checkpoint_path(tmp_path, 1))
    ck.checkpoint_path(tmp_path, 2).write_bytes(b"not a checkpoint")
    assert ck.newest_loadable(tmp_path)[0] == 1


# ---- loading without running anything (weights_only with an allow-list) ----------------


class _Planted:
    """What an attacker plants: unpickling it would run `func(*args)`."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _trained_states() -> dict:
    """Everything the library writes, after some training: model, Adam and a
    scheduler, the job state with gradient noise and timings, and RNG states a
    script registers (torch, numpy's legacy and Generator states, python's)."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
    job = JobState(Position(2, 40, 1), samples_done=1000, steps=30, si_steps=31.5,
                   init_batch_size=16, dataset_len=480, seed=7)
    job.noise = GradientNoise(16)
    job.noise.update(3.0, 1.0, 4, 1.0)
    job.table.add(SampleKey("cpu-test", 1, 2, 8, 1), 0.02, 0.005)
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
           "generator": np.random.default_rng(3).bit_generator.state,
           "python": random.getstate(), "array": np.arange(4, dtype=np.float32),
           "scalar": np.float64(0.25)}
    return {"sia": {**job.state_dict(), "generation": 3, "world_size": 2,
                    "shape": [2, 8, 1], "time": 1.5},
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "lr_scheduler": sched.state_dict(), "rng": rng}


def test_everything_the_library_writes_loads_back_without_pickle(tmp_path):
    data = _trained_states()
    ck.save_atomic(data, ck.checkpoint_path(tmp_path, 3))
    gen, _, back = ck.newest_loadable(tmp_path)
    assert gen == 3 and back["sia"] == data["sia"]
    assert JobState.from_state_dict(back["sia"]).noise == GradientNoise(
        16, **{k: v for k, v in data["sia"]["noise"].items() if k != "init_batch_size"})
    for k, v in data["model"].items():
        assert torch.equal(back["model"][k], v)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    opt.load_state_dict(back["optimizer"])  # restores as the library does
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10).load_state_dict(
        back["lr_scheduler"])
    rng = back["rng"]
    assert torch.equal(rng["torch"], data["rng"]["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    assert rng["generator"] == data["rng"]["generator"]
    assert np.array_equal(rng["array"], data["rng"]["array"]) and rng["scalar"] == 0.25
    assert str(rng["numpy"][1].dtype) == "uint32"
    # The allow-list was for that load only: the process's own torch.load is unchanged.
    with pytest.raises(pickle.UnpicklingError):
        torch.load(ck.checkpoint_path(tmp_path, 3), weights_only=True)


@pytest.mark.parametrize("how", ["torch", "raw pickle"])
@pytest.mark.parametrize("func", [os.system, subprocess.call, exec])
def test_planted_newest_checkpoint_is_refused_not_run(tmp_path, caplog, how, func):
    marker = tmp_path / "pwned"
    arg = (f"touch {marker}" if func is os.system else ["touch", str(marker)]
           if func is subprocess.call else f"open({str(marker)!r}, 'w').close()")
    ck.save_atomic(_data(1), ck.checkpoint_path(tmp_path, 1))  # an honest older one
    planted = ck.checkpoint_path(tmp_path, 2)
    payload = {"sia": {"tag": 2}, "x": _Planted(func, arg)}
    if how == "torch":
        torch.save(payload, planted)
    else:
        planted.write_bytes(pickle.dumps(payload))
    with pytest.raises(ck.CheckpointRefused, match="does not allow") as err:
        ck.newest_loadable(tmp_path)
    assert str(planted) in str(err.value) and err.value.path == str(planted)
    assert err.value.offending.endswith(func.__name__)
    assert func.__name__ in str(err.value)
    assert not marker.exists()
    # Loud: the refusal is logged as an error, and no older checkpoint is restored.
    assert any(r.levelname == "ERROR" and str(planted) in r.getMessage()
               for r in caplog.records)
    with pytest.raises(ck.CheckpointRefused):
        ck.load_checkpoint(planted)
    assert not marker.exists()


def test_truncated_newest_checkpoint_is_still_skipped(tmp_path):
    ck.save_atomic(_data(1), ck.checkpoint_path(tmp_path, 1))
    full = ck.checkpoint_path(tmp_path, 2)
    ck.save_atomic(_data(2), full)
    full.write_bytes(full.read_bytes()[:200])
    assert ck.newest_loadable(tmp_path)[0] == 1


@pytest.mark.xdist_group("heavy")
@pytest.mark.timeout(120)
def test_workers_resuming_from_a_planted_checkpoint_fail_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    planted = ck.checkpoint_path(tmp_path / "ckpt", 1)
    ck.save_atomic({"sia": {"tag": 1}, "x": _Planted(os.system, f"touch {marker}")}, planted)
    w = Workers(tmp_path, 2, 2, TEST_N=64, TEST_EPOCHS=1)
    codes = w.wait(90)
    out = w.output()
    assert codes == [1, 1], out
    assert "CheckpointRefused" in out and str(planted) in out and "posix.system" in out, out
    assert "rank 0 refused the newest checkpoint" in out, out  # rank 1 did not hang
    assert not marker.exists()
    assert not read_log(tmp_path)  # no step was trained
