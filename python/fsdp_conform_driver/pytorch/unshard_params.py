"""fsdp_unshard_params/* in PyTorch (test_fsdp_unshard_params.py): the zoo Transformer with the
case's weights under FullyShardedDataParallel(use_orig_params=True), an instance around every
child the suite nests (parity._children_to_shard), with the case's sharding_strategy; every
rank reports the full parameters and gradients it sees inside
FullyShardedDataParallel.summon_full_params(with_grads=True) by clean FQN, as
docs/observations.md lists them:

  with_grads_core        after forward and backward (after_backward/...), then after a second
                         forward without backward (after_forward/...), each time doubling every
                         gradient inside the scope (the seed's WRITEBACK_FACTOR), with the case's
                         writeback
  with_grads_none_grads  none_grad_ranks=all: no backward (the seed); odd: every rank's forward
                         and backward, then zero_grad(set_to_none=True) on the odd ranks
  unshard_params_writeback
                         the case's use_orig_params; every full parameter read (in_scope/...)
                         and doubled inside summon_full_params(writeback, offload_to_cpu), then
                         read again inside summon_full_params(writeback=False) (after_scope/...)
  orig_param_data_writeback
                         every original parameter's data rebound outside forward
                         (param.data = 2 * param), then the full parameters read inside
                         summon_full_params(writeback=False) (after_scope/...)
  with_grads_rank0_only  after forward and backward, the parameters and gradients read inside
                         summon_full_params(rank0_only=True, with_grads=True, writeback=False)
                         (in_scope/...: rank 0 the full ones, another rank under sharding its
                         sharded views), then inside summon_full_params(with_grads=True)
                         (after_scope/...)
  clip_grad_norm_ignored_modules
                         ignored_modules=[norm]; after forward and backward,
                         clip_grad_norm_(max_norm, norm_type) (grad_norms), then the parameters
                         and gradients read inside summon_full_params(with_grads=True)
  backward_with_inputs   use_orig_params=False; after a full backward, the next loss
                         backpropagated with inputs=[the root's flat parameter]; whether each
                         instance's flat parameter (FSDP.fsdp_modules order) has a .grad
  unshard_params_errors  the `call` misuse of summon_full_params (error_message)
  unshard_params_respects_reshard
                         the case's mixed_precision; an empty summon_full_params(rank0_only,
                         writeback=not rank0_only, offload_to_cpu) between a forward and its
                         backward, another after it: the flat-parameter all-gathers of that
                         backward and of the next forward (all_gathers)

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import inputs

_KIND = "transformer"
_WRITEBACK_FACTOR = 2


def _wrapped(request, use_orig_params=True, ignored_modules=(), mixed_precision="None",
             sharding_strategy=None):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    from fsdp_conform_driver.pytorch import fsdp1_api
    from fsdp_conform_driver.pytorch.parity import _build, _children_to_shard

    model, _ = _build(_KIND, request)
    nested = {id(m) for m in _children_to_shard(model)}
    strategy = sharding_strategy or request.param("sharding_strategy")
    return FullyShardedDataParallel(
        model, sharding_strategy=ShardingStrategy[strategy],
        use_orig_params=use_orig_params,
        auto_wrap_policy=fsdp1_api.nest_where(lambda m: id(m) in nested),
        ignored_modules=[model.get_submodule(fqn) for fqn in ignored_modules] or None,
        mixed_precision=fsdp1_api.mixed_precision(mixed_precision),
        device_id=torch.device("cpu"))


def _loss(request, model, step):
    from fsdp_conform_driver.pytorch.parity import _loss

    return _loss(request, step, model(inputs.step_input(request, step)))


def _read_with_grads(model, writeback, scale, prefix, tensors, rank0_only=False):
    """Inside summon_full_params(writeback=..., rank0_only=..., with_grads=True):
    {prefix}param/{fqn} and {prefix}grad/{fqn} (absent when None); with `scale`, every gradient
    doubled there."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_conform_driver.pytorch.fsdp1_api import clean_fqn

    with FSDP.summon_full_params(model, writeback=writeback, rank0_only=rank0_only,
                                 with_grads=True):
        for name, p in model.named_parameters():
            name = clean_fqn(name)
            tensors[f"{prefix}param/{name}"] = p.detach().clone()
            if p.grad is None:
                continue
            tensors[f"{prefix}grad/{name}"] = p.grad.detach().clone()
            if scale:
                p.grad *= _WRITEBACK_FACTOR


def with_grads_core(request):
    model = _wrapped(request)
    writeback = request.param("writeback") == "True"
    tensors = {}
    _loss(request, model, 0).backward()
    _read_with_grads(model, writeback, True, "after_backward/", tensors)
    pending = _loss(request, model, 1)  # between forward and backward, as the seed
    _read_with_grads(model, writeback, True, "after_forward/", tensors)
    del pending
    return {}, tensors


def with_grads_none_grads(request):
    model = _wrapped(request)
    if request.param("none_grad_ranks") != "all":
        _loss(request, model, 0).backward()
        if request.rank % 2 == 1:
            model.zero_grad(set_to_none=True)
    tensors = {}
    _read_with_grads(model, True, False, "", tensors)
    return {}, tensors


def _check_cpu_offload_to_cpu():
    """summon_full_params(offload_to_cpu=True) on this CPU-only driver: older releases (2.5.1)
    have FlatParamHandle.to_cpu move the unsharded flat parameter to the CPU, a no-op on a CPU
    compute device that leaves it aliasing the storage to_cpu then frees (the unflattened views
    then fail, "setStorage ... out of bounds for storage of size 0"); newer ones skip the
    offload for a CPU flat parameter. Raises ScenarioSkipped on the former."""
    import inspect

    from torch.distributed.fsdp._flat_param import FlatParamHandle

    from fsdp_conform_driver import ScenarioSkipped

    if 'device.type == "cpu"' not in inspect.getsource(FlatParamHandle.to_cpu):
        raise ScenarioSkipped("this torch's FlatParamHandle.to_cpu frees the unsharded flat "
                              "parameter it aliases on a CPU compute device (flat_param_to(cpu) "
                              "is a no-op there), so summon_full_params(offload_to_cpu=True) "
                              "cannot run on the CPU")


def unshard_params_writeback(request):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_conform_driver.pytorch.fsdp1_api import clean_fqn

    if request.param("offload_to_cpu") == "True":
        _check_cpu_offload_to_cpu()
    model = _wrapped(request, request.param("use_orig_params") == "True")
    tensors = {}
    with FSDP.summon_full_params(model, writeback=request.param("writeback") == "True",
                                 offload_to_cpu=request.param("offload_to_cpu") == "True"):
        with torch.no_grad():
            for name, p in model.named_parameters():
                tensors[f"in_scope/param/{clean_fqn(name)}"] = p.detach().clone()
                p.mul_(_WRITEBACK_FACTOR)
    with FSDP.summon_full_params(model, writeback=False):
        for name, p in model.named_parameters():
            tensors[f"after_scope/param/{clean_fqn(name)}"] = p.detach().clone()
    return {}, tensors


def orig_param_data_writeback(request):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_conform_driver.pytorch.fsdp1_api import clean_fqn

    model = _wrapped(request)
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.detach() * _WRITEBACK_FACTOR
    tensors = {}
    with FSDP.summon_full_params(model, writeback=False):
        for name, p in model.named_parameters():
            tensors[f"after_scope/param/{clean_fqn(name)}"] = p.detach().clone()
    return {}, tensors


def with_grads_rank0_only(request):
    model = _wrapped(request)
    _loss(request, model, 0).backward()
    tensors = {}
    _read_with_grads(model, False, False, "in_scope/", tensors, rank0_only=True)
    _read_with_grads(model, False, False, "after_scope/", tensors)
    return {}, tensors


def clip_grad_norm_ignored_modules(request):
    model = _wrapped(request, ignored_modules=("norm",))
    _loss(request, model, 0).backward()
    norm_type = float(request.param("norm_type"))  # "inf" -> math.inf
    total = model.clip_grad_norm_(float(request.param("max_norm")), norm_type)
    tensors = {}
    _read_with_grads(model, False, False, "", tensors)
    return {"grad_norms": [total.item()]}, tensors


def backward_with_inputs(request):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = _wrapped(request, use_orig_params=False)
    _loss(request, model, 0).backward()
    loss = _loss(request, model, 1)
    torch.autograd.backward(loss, inputs=[model._handle.flat_param])
    defined = [int(m._handle is not None and m._handle.flat_param.grad is not None)
               for m in FSDP.fsdp_modules(model)]
    return {"flat_grad_defined": defined}, {}


def unshard_params_errors(request):
    """The case's misuse of summon_full_params; the message of what it raised."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    call = request.param("call")
    model = _wrapped(request, use_orig_params=call != "with_grads_flat_params",
                     sharding_strategy="NO_SHARD" if call == "offload_to_cpu_no_shard" else None)
    try:
        if call == "from_backward":
            # A hook on the model's output, registered after FSDP's pre-backward hook.
            from fsdp_conform_driver.pytorch.parity import _loss as loss_of

            out = model(inputs.step_input(request, 0))

            def summon_in_backward(grad):
                with FSDP.summon_full_params(model):
                    pass

            (out[0] if isinstance(out, tuple) else out).register_hook(summon_in_backward)
            loss_of(request, 0, out).backward()
        else:
            with FSDP.summon_full_params(
                    model, rank0_only=call == "rank0_only_writeback",
                    offload_to_cpu=call in ("offload_to_cpu_no_shard", "with_grads_offload_to_cpu"),
                    with_grads=call.startswith("with_grads")):
                pass
    except Exception as e:  # noqa: BLE001 - the message is the observation
        return {"error_message": str(e)}, {}
    return {"error_message": ""}, {}


def unshard_params_respects_reshard(request):
    """Warm-up forward and backward; a forward, an empty summon_full_params, the backward
    (counted); another empty summon_full_params, a forward (counted)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_conform_driver.recorders import CommCounts

    if request.param("offload_to_cpu") == "True":
        _check_cpu_offload_to_cpu()
    model = _wrapped(request, use_orig_params=request.param("use_orig_params") == "True",
                     mixed_precision=request.param("mixed_precision"))
    rank0_only = request.param("rank0_only") == "True"
    options = {"rank0_only": rank0_only, "writeback": not rank0_only,
               "offload_to_cpu": request.param("offload_to_cpu") == "True"}
    _loss(request, model, 0).backward()
    loss = _loss(request, model, 1)
    with FSDP.summon_full_params(model, **options):
        pass
    counts = CommCounts(track_modules=False)
    with counts.phase("backward"):
        loss.backward()
    with FSDP.summon_full_params(model, **options):
        pass
    with counts.phase("forward"):
        pending = _loss(request, model, 0)
    del pending
    all_gathers = {}
    for phase, ops in counts.by_phase("backward", "forward").items():
        all_gathers[phase] = sum(n for op, n in ops.items()
                                 if op in ("c10d._allgather_base_", "c10d.allgather_"))
    return {"all_gathers": all_gathers}, {}


SCENARIOS = {
    "fsdp_unshard_params/with_grads_core": with_grads_core,
    "fsdp_unshard_params/with_grads_none_grads": with_grads_none_grads,
    "fsdp_unshard_params/unshard_params_writeback": unshard_params_writeback,
    "fsdp_unshard_params/orig_param_data_writeback": orig_param_data_writeback,
    "fsdp_unshard_params/with_grads_rank0_only": with_grads_rank0_only,
    "fsdp_unshard_params/clip_grad_norm_ignored_modules": clip_grad_norm_ignored_modules,
    "fsdp_unshard_params/backward_with_inputs": backward_with_inputs,
    "fsdp_unshard_params/unshard_params_errors": unshard_params_errors,
    "fsdp_unshard_params/unshard_params_respects_reshard": unshard_params_respects_reshard,
}
