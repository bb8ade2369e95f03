"""The scenarios the PyTorch FSDP2 driver implements, each as its seed test runs it, reporting
the observations docs/observations.md lists for it. Every function takes the Request and
returns (observations, tensors); the process group is initialised by the driver's setup.
This module imports torch only when a scenario runs, so that the cases the driver does not
implement are answered `skipped` without loading torch; checkpoint/* is answered `skipped`
with the reason _CHECKPOINT_LAYOUT gives.

Thread-safety: one case per process, on the main thread.
"""

from __future__ import annotations

import contextlib

from fsdp_conform_driver import ScenarioSkipped, inputs
from fsdp_conform_driver.pytorch import (collectives, dtensor_scenarios, fsdp_mp_casts,
                                        fsdp_prefetch,
                                        fsdp_state_dict, fsdp_wrap, fully_shard_autograd,
                                        fully_shard_collective_ops,
                                        fully_shard_events, fully_shard_mixed_precision,
                                        fully_shard_init, fully_shard_mp_casts,
                                        fully_shard_mp_frozen,
                                        fully_shard_registered_params, fully_shard_state_dict,
                                        fully_shard_training, grad_acc, models_scenarios, parity,
                                        tp_integration, unshard_params)
from fsdp_conform_driver.pytorch.sharded_transformer import sharded_transformer
from fsdp_conform_driver.recorders import CommCounts, ModuleCommCounts


def _forward_backward_counts(model, tokens, after_forward=lambda: None,
                             module_counts: bool = False) -> dict:
    """comm_counts of one forward and `loss.sum().backward()`, one CommDebugMode per phase;
    with `module_counts`, also comm_module_counts of a mode over both, for the FSDP modules."""
    counts = CommCounts()
    modules = ModuleCommCounts() if module_counts else None
    with modules if modules is not None else contextlib.nullcontext():
        with counts.phase("forward"):
            loss = model(tokens)
        after_forward()
        with counts.phase("backward"):
            loss.sum().backward()
    obs = {"comm_counts": counts.by_phase("forward", "backward")}
    if modules is not None:
        from fsdp_conform_driver.pytorch.fsdp_api import FSDPModule

        obs["comm_module_counts"] = modules.by_module(
            [fqn for fqn, m in model.named_modules() if isinstance(m, FSDPModule)])
    return obs


def communication_count(request):
    from fsdp_conform_driver.pytorch.fsdp_api import reshard_after_forward_of

    model = sharded_transformer(request, reshard_after_forward=reshard_after_forward_of(request))
    return _forward_backward_counts(model, inputs.step_input(request, 0), module_counts=True), None


def set_reshard_after_forward(request):
    """TestFullyShardCommunication.test_set_reshard_after_forward: every module fully_shard-ed
    with the opposite of the value set (initial=not_value) or fully_shard's default
    (initial=default), then the root's set_reshard_after_forward(value, recurse)."""
    from fsdp_conform_driver.pytorch.fsdp_api import FSDPModule

    value = request.param("set_reshard_after_forward")
    value = None if value == "None" else value == "True"
    if value is not None and not hasattr(FSDPModule, "set_reshard_after_forward"):
        import torch

        from fsdp_conform_driver.driver import ScenarioSkipped
        raise ScenarioSkipped(f"torch {torch.__version__}'s FSDPModule has no "
                              f"set_reshard_after_forward")
    kwargs = {}
    if value is not None and request.param("initial") == "not_value":
        kwargs["reshard_after_forward"] = not value
    model = sharded_transformer(request, **kwargs)
    if value is not None:
        model.set_reshard_after_forward(value, recurse=request.param("recurse") == "True")
    return _forward_backward_counts(model, inputs.step_input(request, 0)), None


def manual_reshard_with_reshard_after_forward_false(request):
    model = sharded_transformer(request, reshard_after_forward=False)

    def reshard_all():
        for module in model.modules():
            if hasattr(module, "reshard") and hasattr(module, "_get_fsdp_state"):
                module.reshard()

    return _forward_backward_counts(model, inputs.step_input(request, 0), reshard_all), None


def unshard_no_param_group(request):
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    for lin in model:
        fully_shard(lin)
    fully_shard(model)
    model.unshard(async_op=True).wait()
    state = model._get_fsdp_state()
    return {"root_has_param_group": state._fsdp_param_group is not None,
            "unshard_completed": True}, None


def unshard_without_lazy_init(request):
    import torch.distributed as dist

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.models import MLP

    model = MLP(request.int_param("dim"))
    for param in model.parameters():
        dist.broadcast(param.data, src=0)
    tensors = {
        f"reference/{name}": param.detach().clone() for name, param in model.named_parameters()}
    fully_shard(model)
    if request.param("replace_param") == "True":
        fully_shard_state_dict.replace_in_proj_weight(model)
    if request.param("unshard_in_backward") == "False":
        if not hasattr(model, "set_unshard_in_backward"):
            import torch

            raise ScenarioSkipped(f"torch {torch.__version__}'s FSDPModule has no "
                                  f"set_unshard_in_backward")
        model.set_unshard_in_backward(False)
    if request.param("async_op") == "True":
        model.unshard(async_op=True).wait()
    else:
        model.unshard()
    for name, param in model.named_parameters():
        tensors[f"unsharded/{name}"] = param.detach().clone()
    return {}, tensors


def post_acc_grad_hook_runs(request):
    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.models import MLP

    model = MLP(request.int_param("dim"))
    model.load_state_dict(inputs.weights(request), strict=True)
    for module in (model.in_proj, model.out_proj, model):
        fully_shard(module)
    calls = []
    for name, param in model.named_parameters():
        param.register_post_accumulate_grad_hook(lambda _p, name=name: calls.append(name))
    for _ in range(request.int_param("backwards")):  # no optimizer step in between
        model(inputs.step_input(request, 0)).sum().backward()
    return {"hook_calls": calls}, None


# Why checkpoint/* is no case for PyTorch (docs/pytorch.md).
_CHECKPOINT_LAYOUT = (
    "checkpoint/* judges this project's checkpoint files (per-rank model-*.safetensors files "
    "and model.safetensors.index.json, docs/checkpoint.md) and its load error codes (DataLoss, "
    "NotFound, InvalidArgument); PyTorch saves with torch.distributed.checkpoint (.distcp files "
    "and a pickled .metadata) and raises its own exceptions, so a driver could only produce "
    "those files and codes by reimplementing this project's writer and taxonomy in Python, "
    "which would judge that code, not PyTorch")


def checkpoint_layout(request):
    raise ScenarioSkipped(_CHECKPOINT_LAYOUT)


SCENARIOS = {
    "fully_shard_comm/communication_count": communication_count,
    "fully_shard_comm/set_reshard_after_forward": set_reshard_after_forward,
    "fully_shard_comm/manual_reshard_with_reshard_after_forward_false":
        manual_reshard_with_reshard_after_forward_false,
    "fully_shard_comm/unshard_no_param_group": unshard_no_param_group,
    "fully_shard_comm/unshard_without_lazy_init": unshard_without_lazy_init,
    "fully_shard_autograd/post_acc_grad_hook_runs": post_acc_grad_hook_runs,
    **{f"parity/single/{kind}": parity.single(kind)
       for kind in ("double_linear", "gated_norms", "mlp", "mlp_module", "mlp_rms_norm",
                    "mlp_stack", "mlp_stack_seq_parallel", "nontensor_activations", "op_mix",
                    "op_products", "padded_lm", "state_dict_model", "tp_simple_model",
                    "transformer")},
    **{f"parity/fsdp/{kind}": parity.fsdp(kind) for kind in ("double_linear", "mlp", "transformer")},
    "parity/fsdp1/mlp": parity.fsdp1("mlp"),
    "parity/fsdp1/transformer": parity.fsdp1("transformer"),
    "parity/fsdp1/double_linear": parity.fsdp1("double_linear"),
    "parity/tp/mlp_stack": parity.tp("mlp_stack"),
    "parity/tp/mlp_stack_seq_parallel": parity.tp("mlp_stack_seq_parallel"),
    "parity/tp/transformer": parity.tp("transformer"),
    "fsdp_tp_integration/fsdp_tp_integration": tp_integration.integration,
    "fsdp_tp_integration/fsdp_tp_extension_grad": tp_integration.extension_grad,
    "fsdp_tp_integration/fsdp_tp_sync_module_state": tp_integration.sync_module_state,
    "fully_shard_state_dict/sharded_state_dict": fully_shard_state_dict.sharded_state_dict,
    "fully_shard_state_dict/load_and_continue": fully_shard_state_dict.load_and_continue,
    "fully_shard_state_dict/full_state_dict": fully_shard_state_dict.full_state_dict,
    "fully_shard_state_dict/strict_load": fully_shard_state_dict.strict_load,
    "fully_shard_state_dict/optimizer_state_dict": fully_shard_state_dict.optimizer_state_dict,
    "fully_shard_state_dict/optimizer_state_dict_shared_weight":
        fully_shard_state_dict.optimizer_state_dict_shared_weight,
    **fsdp_state_dict.SCENARIOS,
    "checkpoint/round_trip": checkpoint_layout,
    "checkpoint/faults": checkpoint_layout,
    "fsdp_grad_acc/grad_acc": grad_acc.run,
    "fsdp_grad_acc/grad_acc_cpu_offload": grad_acc.run,
    "fsdp_grad_acc/grad_acc_fully_shard": grad_acc.run,
    **unshard_params.SCENARIOS,
    **fsdp_prefetch.SCENARIOS,
    **fsdp_wrap.SCENARIOS,
    **fsdp_mp_casts.SCENARIOS,
    **fully_shard_training.SCENARIOS,
    **fully_shard_collective_ops.SCENARIOS,
    **fully_shard_mixed_precision.SCENARIOS,
    **fully_shard_mp_casts.SCENARIOS,
    **fully_shard_mp_frozen.SCENARIOS,
    **fully_shard_init.SCENARIOS,
    **fully_shard_events.SCENARIOS,
    **fully_shard_autograd.SCENARIOS,
    **fully_shard_registered_params.SCENARIOS,
    **collectives.SCENARIOS,
    **dtensor_scenarios.SCENARIOS,
    **models_scenarios.SCENARIOS,
}
