"""examples/pytorch/train.py: killed with SIGKILL mid-run, resumed, every sample trained on
exactly once counting the steps the checkpoints kept."""

import collections
import os
import subprocess
import sys

from test_data import write_shards

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN = os.path.join(REPO, "examples", "pytorch", "train.py")


def test_killed_and_resumed_training_sees_every_sample_once(tmp_path):
    data = str(tmp_path / "data")
    expected = write_shards(data, samples=203, per_shard=25)
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "train.log")
    args = [sys.executable, TRAIN, "--data", data, "--ckpt", ckpt, "--log", log,
            "--batch-size", "8", "--workers", "2", "--save-every", "4"]
    first = subprocess.run(args + ["--crash-after", "12"], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == -9, first.stdout + first.stderr
    second = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    resumed_at = int(second.stdout.split("resumed at step ")[1].split()[0])
    assert resumed_at in (8, 12), second.stdout  # the save of step 12 may not have committed
    # Lines are appended by both runs; the first run's steps after the checkpoint it resumed
    # from were trained again by the second run, which continued from that checkpoint.
    steps = [(int(s), k) for s, k in (line.split() for line in open(log))]
    # Both runs appended to the log: the second starts again at resumed_at + 1, so where the
    # steps go back is where it begins. Of the first run, only the steps its checkpoint kept
    # count: the second run trained the later ones again.
    start = next(i for i in range(1, len(steps)) if steps[i][0] < steps[i - 1][0])
    assert steps[start][0] == resumed_at + 1
    kept = collections.Counter(k for s, k in steps[:start] if s <= resumed_at)
    kept.update(k for _, k in steps[start:])
    assert set(kept) == set(expected)
    assert set(kept.values()) == {1}
    assert "epoch 0 done" in second.stdout
