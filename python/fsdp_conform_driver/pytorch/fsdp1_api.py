"""FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel) as a case's parameters spell it:
sharding_strategy, backward_prefetch, use_orig_params, cpu_offload and mixed_precision
(conformance/fsdp1_params.h), and the (replicate, shard) mesh of the hybrid strategies.

On a CPU the driver passes device_id=torch.device("cpu"): without it FullyShardedDataParallel
looks for an accelerator ("FSDP needs a non-CPU accelerator device, but no accelerator device
is detected", 2.5) and cannot be built at all. With it FSDP1 runs on the CPU as released,
except in two places, whose cases are skipped without an accelerator, saying so:
CPUOffload(offload_params=True), whose lazy init pins the CPU shard (pin_memory), which needs an
accelerator ("RuntimeError: CPU device type not an accelerator." in 2.5, "Found no NVIDIA
driver on your system" in 2.15); and sync_module_states=True, which refuses CPU parameters and
buffers (check_sync_module_states).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import functools

from fsdp_conform_driver import ScenarioSkipped

_HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


def hybrid_mesh_shape(world: int):
    """(replicate, shard) for a hybrid strategy at `world` ranks: replicate the smallest prime
    factor, shard the rest; None when either would be 1 (HybridMeshShapeFor)."""
    p = 2
    while p * 2 <= world:
        if world % p == 0:
            return p, world // p
        p += 1
    return None


def mixed_precision(name: str):
    """The case's MixedPrecision: None, all-bfloat16, all-float16, reduce_dtype=bfloat16,
    param_dtype=bfloat16 (param_bfloat16) or all-bfloat16 with keep_low_precision_grads
    (bfloat16_keep_low)."""
    import torch
    from torch.distributed.fsdp import MixedPrecision

    if name == "None":
        return None
    if name == "bfloat16_keep_low":
        return MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                              buffer_dtype=torch.bfloat16, keep_low_precision_grads=True)
    if name == "reduce_bfloat16":
        return MixedPrecision(reduce_dtype=torch.bfloat16)
    if name == "param_bfloat16":
        return MixedPrecision(param_dtype=torch.bfloat16)
    dtype = getattr(torch, name)
    return MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)


def clean_fqn(name: str) -> str:
    """A module or parameter name without FSDP1's wrapper names: `_fsdp_wrapped_module.`
    dropped everywhere, an instance's own trailing `_fsdp_wrapped_module` too (the suite's clean
    FQNs; the root instance's is "")."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_fsdp_wrapped_module", "")


def instances(root):
    """(clean FQN, instance) of every FullyShardedDataParallel instance in root's
    named_modules() order, the root first ("")."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [(clean_fqn(name), module) for name, module in root.named_modules()
            if isinstance(module, FSDP)]


def nest_where(should_nest):
    """The auto_wrap_policy nesting an instance around every submodule for which
    should_nest(module) is true (lambda_auto_wrap_policy)."""
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    return functools.partial(lambda_auto_wrap_policy, lambda_fn=should_nest)


def nest_module_types(type_names):
    """The seeds' ModuleWrapPolicy: an instance around every submodule whose class is named in
    `type_names` (e.g. TransformerEncoderLayer, TransformerDecoderLayer)."""
    import torch
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return ModuleWrapPolicy({getattr(torch.nn, name) for name in type_names})


def cpu_offload(request):
    """The case's CPUOffload (offload_params False when the scenario has no cpu_offload
    parameter); raises ScenarioSkipped for offload_params=True without an accelerator."""
    return cpu_offload_of(request.params.get("cpu_offload", "False") == "True")


def cpu_offload_of(offload: bool):
    """CPUOffload(offload_params=offload); raises ScenarioSkipped for True without an
    accelerator."""
    import torch
    from torch.distributed.fsdp import CPUOffload

    if offload and not torch.cuda.is_available():
        raise ScenarioSkipped("CPUOffload(offload_params=True) needs an accelerator: "
                              "FullyShardedDataParallel pins the offloaded shard (pin_memory), "
                              "which raises without one")
    return CPUOffload(offload_params=offload)


def check_sync_module_states():
    """Raises ScenarioSkipped without an accelerator: FullyShardedDataParallel(
    sync_module_states=True) refuses CPU parameters and buffers whatever device_id says
    (_check_module_states_for_sync_module_states: "The module has CPU parameters or buffers when
    `sync_module_states=True`, which requires them to be on GPU", 2.5 and 2.15)."""
    import torch

    if not torch.cuda.is_available():
        raise ScenarioSkipped("FullyShardedDataParallel(sync_module_states=True) refuses CPU "
                              "parameters and buffers (\"The module has CPU parameters or buffers "
                              "when `sync_module_states=True`, which requires them to be on GPU\")")


def wrap(request, model, auto_wrap_policy, sync_module_states=False, sharding_strategy=None):
    """FullyShardedDataParallel(model) with the case's options (mixed_precision and
    forward_prefetch where the scenario has those parameters, else none and False; an
    ignored_module parameter other than "none" as ignored_modules=[that submodule]),
    `auto_wrap_policy` and `sync_module_states`; `sharding_strategy` (a ShardingStrategy name)
    instead of the case's when given."""
    import torch
    from torch.distributed.fsdp import (BackwardPrefetch, FullyShardedDataParallel,
                                        ShardingStrategy)

    strategy = sharding_strategy or request.param("sharding_strategy")
    kwargs = {}
    if strategy in _HYBRID:
        shape = hybrid_mesh_shape(request.world)
        if shape is None:
            raise ScenarioSkipped(f"{strategy} needs a (replicate, shard) mesh; world "
                                  f"{request.world} has none")
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["device_mesh"] = init_device_mesh("cpu", shape,
                                                 mesh_dim_names=("replicate", "shard"))
    ignored = request.params.get("ignored_module", "none")
    if ignored != "none":
        kwargs["ignored_modules"] = [model.get_submodule(ignored)]
    prefetch = request.param("backward_prefetch")
    precision = (request.param("mixed_precision") if "mixed_precision" in request.params
                 else "None")
    return FullyShardedDataParallel(
        model,
        sharding_strategy=ShardingStrategy[strategy],
        backward_prefetch=None if prefetch == "None" else BackwardPrefetch[prefetch],
        forward_prefetch=request.params.get("forward_prefetch", "False") == "True",
        use_orig_params=request.param("use_orig_params") == "True",
        cpu_offload=cpu_offload(request),
        mixed_precision=mixed_precision(precision),
        auto_wrap_policy=auto_wrap_policy,
        device_id=torch.device("cpu"),
        sync_module_states=sync_module_states,
        **kwargs)
