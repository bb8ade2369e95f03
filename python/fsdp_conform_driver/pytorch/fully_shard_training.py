"""fully_shard_training/* (test_fully_shard_training.py) and fully_shard_frozen/*
(test_fully_shard_frozen.py) in PyTorch: each case decoded into a training plan
(fully_shard_plan.Plan) as conformance/fully_shard_training_scenarios.cc and
conformance/fully_shard_frozen_scenarios.cc decode it, then run by fully_shard_plan.run:

  gradient_accumulation     MLPStack, micro_batches per step; mode "all" / "root_only":
                            set_requires_gradient_sync(False, recurse=True / False) (and
                            set_reshard_after_backward(False, ...) with
                            reshard_after_backward=False) and set_is_last_backward(False) but
                            for the last micro-batch; "sync": every backward reduces (with
                            reshard_after_backward=False, set_reshard_after_backward(False)
                            but for the last micro-batch, without the sync switch)
  train_parity_hsdp         MLPStack on init_device_mesh("cpu", (replicate, shard)) (the
                            case's shard_size, e.g. the seed's (2, 1) at world 2);
                            set_requires_all_reduce(False) but for the last micro-batch
                            (defer_all_reduce), set_gradient_divide_factor(multiple * world),
                            set_force_sum_reduction_for_comms(True) (force_sum_reduction)
  train_parity_cpu_offload  MLPStack with CPUOffloadPolicy(pin_memory)
  ignored_params            MLPStack, fully_shard(ignored_params={the named parameters})
  multi_forward_module      the zoo's state_dict_model, outer(inner(x) + inner(x)),
                            fully_shard(inner) then the root
  train_parity_multi_group  Transformer, fully_shard per block ("block"), or layers[0], then
                            fully_shard([the other blocks]), fully_shard([tok_embeddings,
                            pos_embeddings]) with set_unshard_in_backward(False) and
                            fully_shard([norm, output]) ("mem_eff"), or
                            fully_shard([tok_embeddings, output]) then each block
                            ("mem_eff_weight_tied"); the case's reshard_after_forward
  train_mixed_requires_grad_per_group      MLPStack training its biases only (weights frozen
                                           before fully_shard, or after it on the sharded ones)
  train_mixed_requires_grad_across_groups  MLPStack with blocks 0 and 2 frozen, optionally all
                                           training again from the last step on

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver.pytorch import fully_shard_plan
from fsdp_conform_driver.pytorch.fully_shard_plan import Plan


def _mlp_stack(request) -> Plan:
    """The MLPStack plan of the family (fully_shard on blocks 0 and 1, then the root), with the
    case's micro_batches where it has that parameter (1 otherwise)."""
    plan = fully_shard_plan.plan_base(request, "mlp_stack")
    if "micro_batches" in request.params:
        plan.micro_batches = request.int_param("micro_batches")
    return plan


def _true(request, key: str) -> bool:
    return request.param(key) == "True"


def gradient_accumulation(request) -> Plan:
    plan = _mlp_stack(request)
    mode = request.param("mode")
    plan.accumulate_without_sync = mode != "sync"
    plan.recurse = mode != "root_only"
    plan.no_reshard_after_backward = not _true(request, "reshard_after_backward")
    plan.switches_on_change = _true(request, "switches_on_change")
    return plan


def train_parity_hsdp(request) -> Plan:
    plan = _mlp_stack(request)
    plan.hsdp = True
    plan.hsdp_shard_size = request.int_param("shard_size")
    plan.defer_all_reduce = _true(request, "defer_all_reduce")
    plan.force_sum_reduction = _true(request, "force_sum_reduction")
    plan.resume_all_reduce_with_gradient_sync = (
        request.param("resume_all_reduce") == "set_requires_gradient_sync")
    plan.switches_on_change = _true(request, "switches_on_change")
    multiple = float(request.param("divide_factor_multiple"))
    if multiple > 0:
        plan.divide_factor = multiple * request.world
    return plan


def train_parity_cpu_offload(request) -> Plan:
    plan = _mlp_stack(request)
    plan.cpu_offload_pin_memory = _true(request, "pin_memory")
    return plan


def ignored_params(request) -> Plan:
    plan = _mlp_stack(request)
    plan.ignored_params = [fqn for fqn in request.param("ignored").split(",") if fqn]
    return plan


def multi_forward_module(request) -> Plan:
    plan = fully_shard_plan.plan_base(request, "state_dict_model")
    plan.micro_batches = request.int_param("micro_batches")
    plan.groups = ["inner"]
    return plan


def _module_grouping(grouping: str, n_layers: int):
    """The fully_shard calls of `grouping` before the root's (ModuleGrouping)."""
    layers = [f"layers.{i}" for i in range(n_layers)]
    if grouping == "mem_eff":
        groups = [layers[0]]
        if n_layers > 1:
            groups.append(", ".join(layers[1:]))
        return groups + ["tok_embeddings, pos_embeddings", "norm, output"]
    return (["tok_embeddings, output"] if grouping == "mem_eff_weight_tied" else []) + layers


def train_parity_multi_group(request) -> Plan:
    plan = fully_shard_plan.plan_base(request, "transformer")
    plan.micro_batches = request.int_param("micro_batches")
    grouping = request.param("module_grouping")
    plan.groups = _module_grouping(grouping, request.int_param("n_layers"))
    plan.reshard_after_forward = _true(request, "reshard_after_forward")
    if grouping == "mem_eff":  # as the test: the embeddings' backward needs no weights
        plan.no_unshard_in_backward = {"tok_embeddings, pos_embeddings"}
    return plan


def _frozen_base(request) -> Plan:
    plan = _mlp_stack(request)
    plan.reshard_after_forward = _true(request, "reshard_after_forward")
    return plan


def train_mixed_requires_grad_per_group(request) -> Plan:
    plan = _frozen_base(request)
    plan.freeze_after_init = _true(request, "freeze_after_init")
    plan.frozen = lambda fqn: "bias" not in fqn
    return plan


def train_mixed_requires_grad_across_groups(request) -> Plan:
    plan = _frozen_base(request)
    plan.frozen = lambda fqn: fqn.startswith(("0.", "2."))
    if _true(request, "unfreeze_params"):
        plan.unfreeze_at_step = plan.steps - 1
    return plan


def _runner(decode):
    """The scenario function running the plan `decode(request)`."""
    return lambda request: fully_shard_plan.run(request, decode(request))


SCENARIOS = {
    "fully_shard_training/gradient_accumulation": _runner(gradient_accumulation),
    "fully_shard_training/train_parity_hsdp": _runner(train_parity_hsdp),
    "fully_shard_training/train_parity_cpu_offload": _runner(train_parity_cpu_offload),
    "fully_shard_training/ignored_params": _runner(ignored_params),
    "fully_shard_training/multi_forward_module": _runner(multi_forward_module),
    "fully_shard_training/train_parity_multi_group": _runner(train_parity_multi_group),
    "fully_shard_frozen/train_mixed_requires_grad_per_group":
        _runner(train_mixed_requires_grad_per_group),
    "fully_shard_frozen/train_mixed_requires_grad_across_groups":
        _runner(train_mixed_requires_grad_across_groups),
}
