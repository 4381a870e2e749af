"""A rank of tests/unit/ops/test_generations.py's two-process check (trainer/dataset.py check_same_generation),
kept in its own module so that each spawned process imports torch and the trainer only."""
from __future__ import annotations

import os


def rank_generation(rank, store, result_dir, generations):
    import torch.distributed as dist

    from trainer.dataset import check_same_generation

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        check_same_generation(generations[rank])  # as if a commit landed between the two ranks' reads
        outcome = "agreed"
    except RuntimeError as e:
        outcome = str(e)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
        f.write(outcome)
