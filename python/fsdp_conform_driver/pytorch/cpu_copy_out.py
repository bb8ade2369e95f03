"""The all-gather copy-out of PyTorch 2.4 / 2.5's FSDP2 on a CPU, made to leave autograd
version counters as its CUDA path does (pytorch/pytorch#132014, fixed in later releases).

foreach_all_gather_copy_out writes every all-gathered parameter into its unsharded storage
with torch.ops.fsdp.split_with_sizes_copy(..., out=[views of the all-gather outputs]). On a
CPU that write bumps the version counter of the unsharded parameters, so a parameter that
autograd saved in forward and that FSDP all-gathers again in backward (reshard after forward)
fails the backward with "one of the variables needed for gradient computation has been
modified by an inplace operation". install() wraps exactly that function (as
FSDPParamGroup calls it, _fsdp_param_group.foreach_all_gather_copy_out): the version counter
of every all-gather output that exists before the copy (fsdp_param.all_gather_outputs, the
storage of the unsharded parameters) is restored to its value before the copy
(torch.autograd._unsafe_preserve_version_counter); the copied values are untouched. It is a
no-op for releases without that function.

Ownership: replaces the attribute foreach_all_gather_copy_out of FSDP2's _fsdp_param_group
module for the life of the process. Thread-safety: call install() once, before fully_shard,
on the main thread.
"""

from __future__ import annotations

import contextlib

import torch

_installed = False


def _param_group_module():
    try:
        from torch.distributed._composable.fsdp import _fsdp_param_group
    except ImportError:
        return None
    return _fsdp_param_group


def needed() -> bool:
    module = _param_group_module()
    return module is not None and hasattr(module, "foreach_all_gather_copy_out")


def install() -> bool:
    """Applies the change above when needed(); returns whether it did."""
    global _installed
    if _installed:
        return True
    if not needed():
        return False
    module = _param_group_module()
    original = module.foreach_all_gather_copy_out

    def foreach_all_gather_copy_out(all_gather_result, fsdp_params, group):
        with contextlib.ExitStack() as stack:
            for fsdp_param in fsdp_params:
                for t in getattr(fsdp_param, "all_gather_outputs", None) or ():
                    stack.enter_context(torch.autograd._unsafe_preserve_version_counter(t))
            return original(all_gather_result, fsdp_params, group)

    module.foreach_all_gather_copy_out = foreach_all_gather_copy_out
    _installed = True
    return True
