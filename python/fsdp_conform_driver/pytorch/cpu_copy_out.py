"""The all-gather copy-out of PyTorch 2.4 / 2.5's FSDP2 on a CPU, made to leave autograd
version counters as its CUDA path does (pytorch/pytorch#132014, fixed in later releases).

foreach_all_gather_copy_out writes every all-gathered parameter into its unsharded storage
with torch.ops.fsdp.split_with_sizes_copy(..., out=[views of the all-gather outputs]). On a
CPU that write bumps the version counter of the unsharded parameters, so a parameter that
autograd saved in forward and that FSDP all-gathers again in backward (reshard after forward)
fails the backward with "one of the variables needed for gradient computation has been
modified by an inplace operation". install() wraps exactly that op: after the copy, each out
tensor's version counter is restored to its value before the copy
(torch.autograd._unsafe_preserve_version_counter); the copied values are untouched. It is a
no-op when the release's copy-out does not call torch.ops.fsdp.split_with_sizes_copy.

Ownership: replaces the attribute torch.ops.fsdp.split_with_sizes_copy for the life of the
process. Thread-safety: call install() once, before fully_shard, on the main thread.
"""

from __future__ import annotations

import contextlib

import torch

_installed = False


def needed() -> bool:
    try:
        from torch.distributed._composable.fsdp import _fsdp_collectives
    except ImportError:
        return False
    return hasattr(torch.ops.fsdp, "split_with_sizes_copy") and hasattr(
        _fsdp_collectives, "foreach_all_gather_copy_out")


def install() -> bool:
    """Applies the change above when needed(); returns whether it did."""
    global _installed
    if _installed:
        return True
    if not needed():
        return False
    original = torch.ops.fsdp.split_with_sizes_copy

    def split_with_sizes_copy(all_gather_output, all_gather_input_split_sizes, dim=0, *, out):
        with contextlib.ExitStack() as stack:
            for t in out:
                stack.enter_context(torch.autograd._unsafe_preserve_version_counter(t))
            original(all_gather_output, all_gather_input_split_sizes, dim=dim, out=out)

    setattr(torch.ops.fsdp, "split_with_sizes_copy", split_with_sizes_copy)
    _installed = True
    return True
