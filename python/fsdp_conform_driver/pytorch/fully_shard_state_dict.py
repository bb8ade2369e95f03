"""fully_shard_state_dict/* (test_fully_shard_state_dict.py) in PyTorch: the state dicts of
MLP(dim, with_buffer=True) in float32 with fully_shard(model.in_proj) and then fully_shard(model)
over the whole world (conformance/state_dict_model.h):

  sharded_state_dict  model.state_dict(): its keys, every DTensor value's global shape and
                      offsets (compute_local_shape_and_global_offset, as torch.distributed.
                      checkpoint plans them; null for a plain tensor), CommDebugMode's count
                      of its collectives, every value's local tensor. With after_forward=True
                      (both fully_shard calls with reshard_after_forward=False, as the seed's
                      model2): the state dict negated is loaded after a forward, and the state
                      dict reported is taken after another forward (each time with every
                      parameter unsharded, so the state dict hooks must reshard). With
                      replace_param=True, first in_proj.weight = nn.Parameter(DTensor.from_local(
                      -its local piece)) and a no_grad forward (lazy init adopts it:
                      test_reset_sharded_param_in_lazy_init)
  load_and_continue   the state dict after one SGD(lr=0.1) step on out.sum() loads with
                      load_state_dict(strict=True, assign=...) into the same model built with
                      zero parameters, after a no_grad forward of it (lazy init done: with
                      assign=True the load's post-hook must adopt the new parameters); both then
                      take the same second step
  full_state_dict     get_model_state_dict(full_state_dict=True) on every rank;
                      get_model_state_dict(cpu_offload=True) alone (sharded, every rank: its
                      size and local tensors); with full_state_dict and cpu_offload (rank 0
                      only) its size; set_model_state_dict(
                      broadcast_from_rank0=True) of that dict into a zero model, and of that
                      dict in float64 divided by 3 into another; with replicate > 1 every
                      model is fully_shard-ed over a (replicate, shard) mesh (HSDP)
  strict_load         set_model_state_dict of the state dict plus "abc" (strict: its error),
                      without its first parameter's key into a zero model (strict=False: the
                      returned keys and the loaded values), and without both (strict: its error);
                      then set_model_state_dict(full_state_dict, broadcast_from_rank0,
                      strict=False) into the model of rank 0's full dict (cpu_offload) negated
                      and without the first parameter's key: the returned missing_keys and the
                      values (_broadcast_state_dict keeps the model's own value for that key);
                      the same with full_state_dict=True alone (every rank passes the dict, plus
                      "abc"): the returned keys and the values;
                      the error of set_model_state_dict(full_state_dict, strict=False) of a
                      full dict whose first parameter has one extra row
  optimizer_state_dict  the zoo's MLP sharded as parity/fsdp shards it, trained `steps` steps
                      (parity.py's model, optimizer and loss): get_optimizer_state_dict(
                      full_state_dict=...) observed under flattened keys ("state.<fqn>.<name>",
                      "param_groups.<fqn>.lr") and, after a model and optimizer that took one
                      step of their own at twice the lr load both dicts, the loader's param
                      group lrs, one more step of each and the dtypes of the loader's optimizer
                      state dict then; the model dict's DTensor sharding per key. With
                      param_groups=True the second half of the parameters form a second group
                      of twice the lr (test_multi_param_groups); with frozen=True the last
                      parameter has requires_grad=False
  optimizer_state_dict_shared_weight  the same on the zoo's Transformer, whose output.weight
                      is tok_embeddings.weight (test_state_dict.py's test_shared_weight)

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import inputs
from fsdp_conform_driver.recorders import CommCounts


def _model(request, zero_weights=False, reshard_after_forward=True):
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, shard_placement_kwargs
    from fsdp_conform_driver.pytorch.models import MLP

    model = MLP(request.int_param("dim"), with_buffer=True)
    model.load_state_dict(inputs.weights(request), strict=True)
    if zero_weights:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    kwargs = shard_placement_kwargs(request, request.world)
    replicate = int(request.params.get("replicate", "1"))
    if replicate > 1:  # HSDP: a (replicate, shard) mesh (state_dict_model.h)
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["mesh"] = init_device_mesh("cpu", (replicate, request.world // replicate),
                                          mesh_dim_names=("replicate", "shard"))
    if not reshard_after_forward:
        kwargs["reshard_after_forward"] = False
    fully_shard(model.in_proj, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _local(value):
    return value.to_local() if hasattr(value, "to_local") else value


def _pieces(state_dict, prefix):
    return {f"{prefix}{key}": _local(value).detach().clone() for key, value in state_dict.items()}


def dtensor_sharding(value):
    """{"global_shape", "offsets"} of a DTensor value, None for a plain tensor."""
    if not hasattr(value, "device_mesh"):
        return None
    from fsdp_conform_driver.pytorch.dtensor_api import compute_local_shape_and_global_offset

    _, offsets = compute_local_shape_and_global_offset(value.shape, value.device_mesh,
                                                       value.placements)
    return {"global_shape": list(value.shape), "offsets": [int(o) for o in offsets]}


def _sgd_step_on_sum(model, x):
    """SGD(lr=0.1) on model(x).sum() (SgdStepOnSum)."""
    import torch

    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).sum().backward()
    optim.step()
    optim.zero_grad()


def _forward_without_grad(model, request):
    """A forward on the step-0 input under no_grad: with reshard_after_forward=False every
    parameter stays unsharded (registered as the unsharded tensor) afterwards."""
    import torch

    with torch.no_grad():
        model(inputs.step_input(request, 0))


def replace_in_proj_weight(model):
    """model.in_proj.weight replaced by a new sharded parameter, its local piece negated."""
    import torch

    from fsdp_conform_driver.pytorch.dtensor_api import DTensor

    old = model.in_proj.weight
    new = DTensor.from_local(-old.to_local().detach(), old.device_mesh, old.placements,
                             run_check=False, shape=old.shape, stride=old.stride())
    model.in_proj.weight = torch.nn.Parameter(new)


def sharded_state_dict(request):
    after_forward = request.param("after_forward") == "True"
    model = _model(request, reshard_after_forward=not after_forward)
    if request.param("replace_param") == "True":
        replace_in_proj_weight(model)
        _forward_without_grad(model, request)  # lazy init
    if after_forward:
        # test_dp_state_dict_save_load's "Check that state dict hooks reshard", for the load
        # pre-hook too: load the negated state dict while unsharded, then save while unsharded.
        negated = {k: -v.detach() for k, v in model.state_dict().items()}
        _forward_without_grad(model, request)
        model.load_state_dict(negated, strict=True)
        _forward_without_grad(model, request)
    counts = CommCounts()
    with counts.phase("state_dict"):
        sd = model.state_dict()
    return ({"keys": list(sd), "sharding": {k: dtensor_sharding(v) for k, v in sd.items()},
             "state_dict_collectives": counts.by_phase("state_dict")["state_dict"]},
            _pieces(sd, "shard/"))


def load_and_continue(request):
    model = _model(request)
    _sgd_step_on_sum(model, inputs.step_input(request, 0))
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    other = _model(request, zero_weights=True)
    _forward_without_grad(other, request)  # lazy init first: the load's post-hook must adopt
    other.load_state_dict(saved, strict=True, assign=request.param("assign") == "True")
    x = inputs.step_input(request, 1)
    _sgd_step_on_sum(model, x)
    _sgd_step_on_sum(other, x)
    tensors = _pieces(model.state_dict(), "continued/")
    tensors.update(_pieces(other.state_dict(), "loaded/"))
    return {"keys": list(saved)}, tensors


def full_state_dict(request):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict)

    model = _model(request)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    tensors = _pieces(full, "full/")
    offloaded = get_model_state_dict(model, options=StateDictOptions(cpu_offload=True))
    tensors.update(_pieces(offloaded, "offloaded/"))
    on_rank0 = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # Rank 0's dict in float64, each value / 3 (made before the load below, which updates the
    # dict it is given in place with the model's own values).
    on_rank0_f64 = {k: v.double() / 3 for k, v in on_rank0.items()}
    other = _model(request, zero_weights=True)
    set_model_state_dict(other, on_rank0, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True))
    tensors.update(_pieces(other.state_dict(), "loaded/"))
    # The load keeps the model's float32.
    other_f64 = _model(request, zero_weights=True)
    set_model_state_dict(other_f64, on_rank0_f64,
                         options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                  broadcast_from_rank0=True))
    tensors.update(_pieces(other_f64.state_dict(), "loaded_from_float64/"))
    return {"rank0_only_size": len(on_rank0), "offloaded_size": len(offloaded)}, tensors


def _error_of(load):
    """The message of the error `load()` raises, or "" when it returns."""
    try:
        load()
    except Exception as e:  # noqa: BLE001 - any error is the observation
        return str(e)
    return ""


def strict_load(request):
    import torch
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict)

    model = _model(request)
    sd = {k: v.detach().clone() for k, v in get_model_state_dict(model).items()}
    first = next(k for k, v in sd.items() if hasattr(v, "device_mesh"))
    with_unexpected = dict(sd)
    with_unexpected["abc"] = torch.zeros(10)
    obs = {"unexpected_error": _error_of(
        lambda: set_model_state_dict(model, dict(with_unexpected)))}
    without_first = {k: v for k, v in with_unexpected.items() if k != first}
    other = _model(request, zero_weights=True)
    keys = set_model_state_dict(other, dict(without_first),
                                options=StateDictOptions(strict=False))
    obs["missing_keys"] = list(keys.missing_keys)
    obs["unexpected_keys"] = list(keys.unexpected_keys)
    tensors = _pieces(other.state_dict(), "loaded/")
    missing_only = {k: v for k, v in without_first.items() if k != "abc"}
    obs["missing_error"] = _error_of(lambda: set_model_state_dict(model, dict(missing_only)))
    full_options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    on_rank0 = {k: -v for k, v in get_model_state_dict(model, options=full_options).items()
                if k != first}
    keys = set_model_state_dict(model, on_rank0, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True, strict=False))
    obs["broadcast_missing_keys"] = list(keys.missing_keys)
    tensors.update(_pieces(model.state_dict(), "broadcast_loaded/"))
    # The model's full dict negated, without the first parameter's key and with "abc", every
    # rank: the missing key keeps the model's value, "abc" is unexpected.
    non_strict_full = StateDictOptions(full_state_dict=True, strict=False)
    full_without_first = {k: -v for k, v in
                          get_model_state_dict(model, options=non_strict_full).items()
                          if k != first}
    full_without_first["abc"] = torch.zeros(10)
    keys = set_model_state_dict(model, full_without_first, options=non_strict_full)
    obs["full_missing_keys"] = list(keys.missing_keys)
    obs["full_unexpected_keys"] = list(keys.unexpected_keys)
    tensors.update(_pieces(model.state_dict(), "full_loaded/"))
    # A full dict whose first parameter has one extra row: strict=False still raises.
    extra_rows = {k: torch.cat([v, torch.ones_like(v[:1])]) if k == first else v.clone()
                  for k, v in get_model_state_dict(other, options=non_strict_full).items()}
    obs["extra_rows_error"] = _error_of(
        lambda: set_model_state_dict(other, extra_rows, options=non_strict_full))
    return obs, tensors


def optimizer_state_dict(request, kind="mlp"):
    import torch
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.parity import _build, _children_to_shard, _loss, _optimizer

    names = [name for name, _ in _build(kind, request)[0].named_parameters()]
    # param_groups=True (test_multi_param_groups): the second half of the parameters in a second
    # group with twice the lr; frozen=True: the last parameter requires_grad=False.
    second = set(names[len(names) // 2:]) if request.params.get("param_groups") == "True" else set()
    frozen = {names[-1]} if request.params.get("frozen") == "True" else set()

    def build():
        model, _ = _build(kind, request)
        for name, p in model.named_parameters():
            if name in frozen:
                p.requires_grad_(False)
        for child in _children_to_shard(model):
            fully_shard(child)
        fully_shard(model)
        named = list(model.named_parameters())
        optim = _optimizer(request, [p for name, p in named if name not in second])
        if second:
            optim.add_param_group({"params": [p for name, p in named if name in second],
                                   "lr": 2 * optim.param_groups[0]["lr"]})
        return model, optim

    rank_inputs = inputs.rank_tensors(request)

    def step(model, optim, k):
        _loss(request, k, model(rank_inputs[f"step{k}/input"])).backward()
        optim.step()
        optim.zero_grad(set_to_none=k % 2 == 0)

    steps = request.int_param("steps")
    # The nested form ({"state": {fqn: {...}}, "param_groups": [...]}): with
    # full_state_dict=True, set_optimizer_state_dict of a flattened dict raises KeyError
    # 'param_groups.0.params.0' in 2.5.1 and 2.15.0 alike. It is flattened here only to be
    # observed under the suite's keys.
    options = StateDictOptions(full_state_dict=request.param("full_state_dict") == "True")
    saver, saver_optim = build()
    for k in range(steps):
        step(saver, saver_optim, k)

    def cloned(sd):
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), sd)

    model_sd = cloned(get_model_state_dict(saver, options=options))
    optim_sd = cloned(get_optimizer_state_dict(saver, saver_optim, options=options))
    # Observed before the load: load_state_dict may keep these very tensors as the loader's
    # state, which its next step then updates in place.
    flat = {f"state.{fqn}.{name}": value
            for fqn, state in optim_sd["state"].items() for name, value in state.items()}
    obs = {"model_sharding": {k: dtensor_sharding(v) for k, v in model_sd.items()},
           "optim_sharding": {k: dtensor_sharding(v) for k, v in flat.items()}}
    tensors = {f"optim/{k}": _local(v).detach().clone() for k, v in flat.items()}
    for group in optim_sd["param_groups"]:
        for fqn in group["params"]:
            tensors[f"optim/param_groups.{fqn}.lr"] = torch.tensor(float(group["lr"]),
                                                                   dtype=torch.float64)
    loader, loader_optim = build()
    for group in loader_optim.param_groups:
        group["lr"] *= 2  # another lr than the saver's: only the loaded param_groups restore it
    step(loader, loader_optim, 0)  # its own state first: the load replaces it
    set_model_state_dict(loader, model_sd, options=options)
    set_optimizer_state_dict(loader, loader_optim, optim_sd, options=options)
    obs["loaded_lrs"] = [float(group["lr"]) for group in loader_optim.param_groups]
    step(saver, saver_optim, steps)
    step(loader, loader_optim, steps)
    # The dtypes the loaded optimizer keeps (its load keeps Adam's step a float32 tensor).
    loaded_sd = get_optimizer_state_dict(loader, loader_optim, options=options)
    obs["loaded_state_dtypes"] = {
        f"state.{fqn}.{name}": str(value.dtype).removeprefix("torch.")
        for fqn, state in loaded_sd["state"].items() for name, value in state.items()}
    for group in loaded_sd["param_groups"]:
        for fqn in group["params"]:
            obs["loaded_state_dtypes"][f"param_groups.{fqn}.lr"] = "float64"
    for prefix, model in (("continued/", saver), ("loaded/", loader)):
        for name, p in model.named_parameters():
            tensors[f"{prefix}{name}"] = _local(p).detach().clone()
    return obs, tensors


def optimizer_state_dict_shared_weight(request):
    """optimizer_state_dict on the zoo's Transformer (weight_tying: output.weight is
    tok_embeddings.weight), as test_state_dict.py's test_shared_weight."""
    return optimizer_state_dict(request, kind="transformer")
