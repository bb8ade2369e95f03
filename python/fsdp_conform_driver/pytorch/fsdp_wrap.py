"""fsdp_wrap/size_based_auto_wrap_policy, fsdp_wrap/size_based_auto_wrap_policy_mlp and
fsdp_wrap/module_wrap_policy in PyTorch: the zoo's Transformer (MLP for the _mlp scenario) under
FullyShardedDataParallel(model, auto_wrap_policy=...) with
functools.partial(size_based_auto_wrap_policy, min_num_params, force_leaf_modules,
exclude_wrap_modules) or ModuleWrapPolicy(module_classes), as test_wrap.py's TestAutoWrap builds
them, then trained `steps` steps (parity._train).

Each rank reports `fsdp1_instances`: the FullyShardedDataParallel instances in named_modules()
order, each as [FQN, [FQNs of its flat parameter's original parameters]], FQNs without
`_fsdp_wrapped_module` (the root's ""), a parameter's FQN being its instance's FQN joined to
`_handle.flat_param._fqns` (relative to the instance's module, in flat order; the same
attributes in 2.5.1 and 2.15.0).

fsdp_wrap/enable_wrap: enable_wrap / wrap (enable_wrap_scenario); fsdp_wrap/scalar_parameter_rejected:
the constructor's error for a 0-dim parameter.

Class names in the case's parameters are joined by "+"; torch.nn's classes and the zoo
Transformer's (models.py: Attention, FeedForward, TransformerBlock) are known.

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import functools

from fsdp_conform_driver import ScenarioSkipped
from fsdp_conform_driver.pytorch import parity


def _classes(request, name):
    """The module classes the case's parameter `name` names ("ModuleList+ModuleDict"); raises
    ScenarioSkipped for a name that is neither a zoo model class nor in torch.nn."""
    import torch

    from fsdp_conform_driver.pytorch import models

    out = set()
    for n in request.param(name).split("+"):
        cls = getattr(models, n, None) or getattr(torch.nn, n, None)
        if not isinstance(cls, type):
            raise ScenarioSkipped(f"{name}: no module class '{n}' in torch.nn or models.py")
        out.add(cls)
    return out


def _policy(request):
    """The case's auto_wrap_policy: ModuleWrapPolicy where the scenario has module_classes,
    else size_based_auto_wrap_policy with the case's min_num_params, force_leaf_modules and
    exclude_wrap_modules."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

    if "module_classes" in request.params:
        return ModuleWrapPolicy(_classes(request, "module_classes"))
    return functools.partial(size_based_auto_wrap_policy,
                             min_num_params=request.int_param("min_num_params"),
                             force_leaf_modules=_classes(request, "force_leaf_modules"),
                             exclude_wrap_modules=_classes(request, "exclude_wrap_modules"))


def instances(root):
    """[[instance FQN, [parameter FQNs in flat order]], ...] in named_modules() order."""
    from fsdp_conform_driver.pytorch.fsdp1_api import instances as fsdp_instances

    out = []
    for fqn, module in fsdp_instances(root):
        handle = module._handle
        fqns = list(handle.flat_param._fqns) if handle is not None else []
        out.append([fqn, [f"{fqn}.{p}" if fqn else p for p in fqns]])
    return out


def run(kind: str):
    """The scenario function for zoo model `kind`: wrap, report the instances, train."""
    def run_kind(request):
        from fsdp_conform_driver.pytorch.fsdp1_api import wrap

        model, _ = parity._build(kind, request)
        fsdp_model = wrap(request, model, _policy(request))
        wrapped = instances(fsdp_model)
        obs, tensors = parity._train(request, fsdp_model, after_step=lambda *args: None)
        obs["fsdp1_instances"] = wrapped
        return obs, tensors
    return run_kind


def enable_wrap_scenario(request):
    """fsdp_wrap/enable_wrap (test_wrap.py's test_wrap, test_wrap_override_defaults,
    test_wrap_disabled_outside_context): wrap(Linear(5, 5)) inside
    enable_wrap(wrapper_cls=FSDP, device_id=cpu) plain, with sharding_strategy=SHARD_GRAD_OP,
    plain, plain after a nested enable_wrap, then after the scope; each result's
    `sharding_strategy` name, or "module" for the module itself."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import enable_wrap, wrap

    def describe(module):
        return module.sharding_strategy.name if isinstance(module, FSDP) else "module"

    def linear():
        return torch.nn.Linear(5, 5)

    kwargs = {"wrapper_cls": FSDP, "device_id": torch.device("cpu")}
    results = []
    nested_raises = False
    with enable_wrap(**kwargs):
        results.append(describe(wrap(linear())))
        results.append(describe(wrap(linear(), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)))
        results.append(describe(wrap(linear())))
        try:
            with enable_wrap(**kwargs):
                pass
        except NotImplementedError:
            nested_raises = True
        results.append(describe(wrap(linear())))
    results.append(describe(wrap(linear())))
    return {"wrap_results": results, "nested_enable_wrap_raises": nested_raises}, None


def scalar_parameter_rejected(request):
    """fsdp_wrap/scalar_parameter_rejected: FullyShardedDataParallel over a Linear(4, 4) with a
    0-dim parameter `scale`; the message of the error the constructor raises ("" when none)."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    module = torch.nn.Linear(4, 4)
    module.register_parameter("scale", torch.nn.Parameter(torch.ones(())))
    try:
        FSDP(module, device_id=torch.device("cpu"))
    except Exception as e:  # noqa: BLE001 - the message is the observation, whatever the type
        return {"error": str(e)}, None
    return {"error": ""}, None


SCENARIOS = {
    "fsdp_wrap/enable_wrap": enable_wrap_scenario,
    "fsdp_wrap/scalar_parameter_rejected": scalar_parameter_rejected,
    "fsdp_wrap/size_based_auto_wrap_policy": run("transformer"),
    "fsdp_wrap/size_based_auto_wrap_policy_mlp": run("mlp"),
    "fsdp_wrap/module_wrap_policy": run("transformer"),
}
