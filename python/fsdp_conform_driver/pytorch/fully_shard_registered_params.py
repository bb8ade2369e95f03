"""fully_shard_registered_params/* in PyTorch (test_fully_shard_training.py,
TestFullyShardRegisteredParams): the seed's MLP(dim) with only the root fully_shard-ed
(groups=single), or Sequential(MLP(dim), MLP(dim)) with 0.in_proj, 0.out_proj and the root
(groups=multiple), with the case's reshard_after_forward and weights;

  param_registration_after_forward   forward, report ("after_forward"), reshard() of every FSDP
                                     module, report ("after_reshard")
  param_registration_after_backward  forward, out.sum().backward(), report ("after_backward")

A report lists, for every FSDPParam of every FSDP module's FSDPParamGroup, what its module has
registered under the parameter's name: the FSDPParam's sharded_param (form "sharded", mesh ranks
those of its shard process group), its unsharded_param ("unsharded", no ranks) or, with the
group SHARDED_POST_FORWARD, the post-forward shard ("sharded_post_forward", the ranks of its
post_forward_mesh_info's shard process group); with its local shape and values (to_local())
and whether it requires grad.

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import inputs


def _sharded_model(request):
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, reshard_after_forward_of
    from fsdp_conform_driver.pytorch.models import MLP

    dim = request.int_param("dim")
    multiple = request.param("groups") == "multiple"
    model = torch.nn.Sequential(MLP(dim), MLP(dim)) if multiple else MLP(dim)
    model.load_state_dict(inputs.weights(request), strict=True)
    raf = reshard_after_forward_of(request)
    if multiple:
        fully_shard(model[0].in_proj, reshard_after_forward=raf)
        fully_shard(model[0].out_proj, reshard_after_forward=raf)
    fully_shard(model, reshard_after_forward=raf)
    return model


def _ranks(mesh_info):
    import torch.distributed as dist

    return list(dist.get_process_group_ranks(mesh_info.shard_process_group))


def _report(model, point, obs, tensors) -> None:
    """Adds `point`'s registered form of every FSDP-managed parameter to obs["registered"] and
    its local values to tensors["{point}/{fqn}"]."""
    from fsdp_conform_driver.pytorch.fsdp_api import FSDPModule

    prefixes = {id(m): (name + "." if name else "") for name, m in model.named_modules()}
    registered = obs.setdefault("registered", {}).setdefault(point, {})
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        for p in group.fsdp_params:
            info = p._module_info
            fqn = prefixes[id(info.module)] + info.param_name
            current = getattr(info.module, info.param_name)
            form, ranks = "unknown", []
            if current is p.sharded_param:
                form, ranks = "sharded", _ranks(p.mesh_info)
            elif getattr(p, "_unsharded_param", None) is not None and current is p._unsharded_param:
                form = "unsharded"
            elif p.sharded_state.name == "SHARDED_POST_FORWARD" and p.post_forward_mesh_info:
                form, ranks = "sharded_post_forward", _ranks(p.post_forward_mesh_info)
            local = current.to_local() if hasattr(current, "to_local") else current
            registered[fqn] = {"module": group._module_fqn or "", "form": form,
                               "shape": list(local.shape), "mesh_ranks": ranks,
                               "requires_grad": bool(current.requires_grad)}
            tensors[f"{point}/{fqn}"] = local.detach().clone()


def _reshard_every_fsdp_module(model) -> None:
    from fsdp_conform_driver.pytorch.fsdp_api import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def after_forward(request):
    model = _sharded_model(request)
    obs, tensors = {}, {}
    model(inputs.step_input(request, 0))
    _report(model, "after_forward", obs, tensors)
    _reshard_every_fsdp_module(model)
    _report(model, "after_reshard", obs, tensors)
    return obs, tensors


def after_backward(request):
    model = _sharded_model(request)
    obs, tensors = {}, {}
    model(inputs.step_input(request, 0)).sum().backward()
    _report(model, "after_backward", obs, tensors)
    return obs, tensors


SCENARIOS = {
    "fully_shard_registered_params/param_registration_after_forward": after_forward,
    "fully_shard_registered_params/param_registration_after_backward": after_backward,
}
