"""Checkpoint files: atomic writes, and only complete files are restore sources."""

from __future__ import annotations

import pytest
import torch

from sia_grpc.train import checkpoint as ck


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
