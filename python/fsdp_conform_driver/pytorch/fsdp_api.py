"""FSDP2's public API wherever this torch keeps it: torch.distributed.fsdp (2.6 and later) or
torch.distributed._composable.fsdp (2.4, 2.5).

Thread-safety: import-time only.
"""

try:  # torch >= 2.6
    from torch.distributed.fsdp import fully_shard, FSDPModule  # noqa: F401
except ImportError:  # torch 2.4 / 2.5
    from torch.distributed._composable.fsdp import fully_shard, FSDPModule  # noqa: F401
