"""fully_shard_init/* in PyTorch (test_fully_shard_init.py; the suite's side:
conformance/fully_shard_init_scenarios.cc): fully_shard used wrongly, and the message of the
error PyTorch raises.

  double_lazy_init  Sequential(MLP(8), MLP(8)), fully_shard on 0.in_proj, 0.out_proj and the
                    root; a forward through 0.in_proj, then the root's forward
  apply_twice       fully_shard applied twice to one MLP(8)

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


SCENARIOS = {
    "fully_shard_init/double_lazy_init": double_lazy_init,
    "fully_shard_init/apply_twice": apply_twice,
}
