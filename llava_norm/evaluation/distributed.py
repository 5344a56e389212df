"""Ranks for data-parallel evaluation: torchrun's environment, or a single process.

Owns process-group setup and teardown (gloo on CPU, NCCL on GPU), the rank's device, and a
barrier that is a no-op in a single process. Evaluation needs nothing more: every rank
writes its own prediction file and rank 0 merges from disk, so no tensors are exchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Ranks:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls) -> "Ranks":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        if world_size == 1:
            return cls(device=device)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), device, owns)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
