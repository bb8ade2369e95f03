"""fully_shard_init/* in PyTorch (test_fully_shard_init.py; the suite's side:
conformance/fully_shard_init_scenarios.cc): fully_shard used wrongly, and the message of the
error PyTorch raises.

  double_lazy_init  Sequential(MLP(8), MLP(8)), fully_shard on 0.in_proj, 0.out_proj and the
                    root; a forward through 0.in_proj, then the root's forward
  apply_twice       fully_shard applied twice to one MLP(8)
  uneven_shard_placement  fully_shard(MLP(5), shard_placement_fn=Shard(1) for every 2-D
                    parameter): in_proj.weight [20, 5] is uneven on dim 1 (skipped before 2.6,
                    which has no shard_placement_fn)

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations


def _error_of(misuse) -> dict:
    """The observations: the message of what `misuse()` raised ("" when it returned)."""
    try:
        misuse()
    except Exception as e:  # noqa: BLE001 - the message is the observation, whatever the type
        return {"error": str(e)}, None
    return {"error": ""}, None


def double_lazy_init(request):
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.models import MLP

    def misuse():
        torch.manual_seed(0)
        model = torch.nn.Sequential(MLP(8), MLP(8))
        fully_shard(model[0].in_proj)
        fully_shard(model[0].out_proj)
        fully_shard(model)
        x = torch.zeros(2, 8)
        model[0].in_proj(x)
        model(x)

    return _error_of(misuse)


def apply_twice(request):
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.models import MLP

    def misuse():
        torch.manual_seed(0)
        model = MLP(8)
        fully_shard(model)
        fully_shard(model)

    return _error_of(misuse)


def uneven_shard_placement(request):
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, require_shard_placement_fn
    from fsdp_conform_driver.pytorch.models import MLP

    require_shard_placement_fn("a Shard(1) placement")
    from torch.distributed.tensor import Shard

    def misuse():
        torch.manual_seed(0)
        fully_shard(MLP(5), shard_placement_fn=lambda p: Shard(1) if p.dim() == 2 else None)

    return _error_of(misuse)


SCENARIOS = {
    "fully_shard_init/double_lazy_init": double_lazy_init,
    "fully_shard_init/apply_twice": apply_twice,
    "fully_shard_init/uneven_shard_placement": uneven_shard_placement,
}
