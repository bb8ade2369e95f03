"""FSDP2's public API wherever this torch keeps it: torch.distributed.fsdp (2.6 and later) or
torch.distributed._composable.fsdp (2.4, 2.5); and the value of fully_shard's options as a
case's parameters spell them.

Thread-safety: import-time only.
"""

try:  # torch >= 2.6
    from torch.distributed.fsdp import fully_shard, FSDPModule  # noqa: F401
except ImportError:  # torch 2.4 / 2.5
    from torch.distributed._composable.fsdp import fully_shard, FSDPModule  # noqa: F401


def reshard_after_forward_of(request):
    """The case's reshard_after_forward: True, False, an int, or None (torch-2.8 profile)."""
    value = request.param("reshard_after_forward")
    if value in ("True", "False"):
        return value == "True"
    if value == "None":
        return None
    return int(value)
