"""FSDP2's public API wherever this torch keeps it: torch.distributed.fsdp (2.6 and later) or
torch.distributed._composable.fsdp (2.4, 2.5); and the value of fully_shard's options as a
case's parameters spell them.

Thread-safety: import-time only.
"""

try:  # torch >= 2.6
    from torch.distributed.fsdp import (CPUOffloadPolicy, fully_shard, FSDPModule,  # noqa: F401
                                        MixedPrecisionPolicy)
except ImportError:  # torch 2.4 / 2.5
    from torch.distributed._composable.fsdp import (CPUOffloadPolicy, fully_shard,  # noqa: F401
                                                    FSDPModule, MixedPrecisionPolicy)


def reshard_after_forward_of(request):
    """The case's reshard_after_forward: True, False, an int, or None (torch-2.8 profile)."""
    value = request.param("reshard_after_forward")
    if value in ("True", "False"):
        return value == "True"
    if value == "None":
        return None
    return int(value)


def require_shard_placement_fn(what):
    """Skips the case (`what` needs it) on a torch whose fully_shard has no shard_placement_fn
    (before 2.6)."""
    import inspect

    if "shard_placement_fn" not in inspect.signature(fully_shard).parameters:
        import torch

        from fsdp_conform_driver.driver import ScenarioSkipped
        raise ScenarioSkipped(f"{what} needs fully_shard(shard_placement_fn=...), "
                              f"which torch {torch.__version__} does not have (2.6 and later do)")


def shard_placement_kwargs(request, shard_world):
    """fully_shard's shard_placement_fn for the case's shard_placement: none for dim0 (Shard(0),
    fully_shard's default) or a case without the parameter; for largest_dim, Shard of each
    parameter's largest dim that `shard_world` divides evenly (the first of equal sizes; dim 0
    when no later dim qualifies), as the suite's expectations assume, a dim after 0 given from the
    end (Shard(dim - ndim), which fully_shard normalizes). Skips the case on a torch
    whose fully_shard has no shard_placement_fn (before 2.6)."""
    if request.params.get("shard_placement", "dim0") != "largest_dim":
        return {}
    require_shard_placement_fn("shard_placement=largest_dim")
    from torch.distributed.tensor import Shard

    def largest_even_dim(param):
        best = 0
        for d in range(1, param.dim()):
            if param.shape[d] % shard_world == 0 and param.shape[d] > param.shape[best]:
                best = d
        return Shard(best - param.dim() if best else 0)
    return {"shard_placement_fn": largest_even_dim}
