"""The suite's FSDP2 training plans (conformance/fully_shard_plan.h) in PyTorch, for the plan
scenarios on the zoo's MLPStack: fully_shard on blocks "0" and "1" (each with its
MixedPrecisionPolicy), then on the root; `steps` optimizer steps of `micro_batches` backwards
each (micro-batch i of step k reads the rank's input step{k * micro_batches + i}/input, loss
out.sum()), optionally without gradient sync but for the last micro-batch of a step
(set_requires_gradient_sync / set_is_last_backward on the root, as
test_grad_acc_with_reduce_dtype), optionally set_gradient_divide_factor on every FSDP module;
plain SGD(lr) after the last micro-batch, then zero_grad(set_to_none=True).

Reports what RunPlanRank reports: every micro-batch's loss and its collectives' counts and
payload bytes by phase (CommCounts(with_bytes=True)), the output's dtype, the Linear modules
fed another dtype than their weight's, per step the gradients' device and dtype, the local
gradient shards (grad{k}/FQN) and parameter shards (step{k}/FQN), and the full parameters
after the last step (full/FQN).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from fsdp_conform_driver import ScenarioSkipped, inputs
from fsdp_conform_driver.recorders import CommCounts


@dataclasses.dataclass
class Plan:
    """What one plan case does (the fields of FullyShardPlan this driver runs)."""

    groups: List[str] = dataclasses.field(default_factory=lambda: ["0", "1"])
    micro_batches: int = 1
    accumulate_without_sync: bool = False
    divide_factor: Optional[float] = None
    # MixedPrecisionPolicy keyword arguments (dtype names) of every fully_shard call, and per
    # module FQN ("" the root) those of a group with its own policy.
    mp_policy: Dict[str, object] = dataclasses.field(default_factory=dict)
    group_mp_policies: Dict[str, Dict[str, object]] = dataclasses.field(default_factory=dict)

    def policy_of(self, fqn: str) -> Dict[str, object]:
        return self.group_mp_policies.get(fqn, self.mp_policy)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _mp_policy(kwargs: Dict[str, object]):
    """MixedPrecisionPolicy from dtype names ("None" or absent: None) and booleans."""
    import torch

    try:  # torch >= 2.6
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except ImportError:  # torch 2.4 / 2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    resolved = {}
    for key, value in kwargs.items():
        if isinstance(value, str):
            value = None if value == "None" else getattr(torch, value)
        resolved[key] = value
    return MixedPrecisionPolicy(**resolved)


def _set_divide_factor(module, factor: float) -> None:
    """set_gradient_divide_factor (2.6 and later) or, before it, set_reduce_scatter_divide_factor
    (2.4, 2.5: a PREMUL_SUM(1 / factor) reduce-scatter op) on an FSDP module."""
    if hasattr(module, "set_gradient_divide_factor"):
        module.set_gradient_divide_factor(factor)
    else:
        module.set_reduce_scatter_divide_factor(factor)


def _skip_reduce_dtype_unset_since_2_15(plan: Plan, dtype_name: str) -> None:
    """Skips a plan with a group whose policy sets param_dtype (another dtype than the
    parameters') but leaves reduce_dtype None, on torch 2.15 and later: the suite's profiles
    (torch-2.4, torch-2.8) expect such a group to reduce in param_dtype, which 2.15 changed."""
    import torch

    if torch.__version__ < "2.15":
        return
    for fqn in plan.groups + [""]:
        policy = plan.policy_of(fqn)
        param_dtype = policy.get("param_dtype", "None")
        if param_dtype not in ("None", dtype_name) and policy.get("reduce_dtype", "None") == "None":
            raise ScenarioSkipped(
                f"group '{fqn}' has MixedPrecisionPolicy(param_dtype={param_dtype}, "
                f"reduce_dtype=None), which the suite's semantics profiles (torch-2.4, "
                f"torch-2.8) reduce in param_dtype; torch {torch.__version__} reduces it in "
                f"the parameters' grad_dtype ({dtype_name}) instead (MixedPrecisionPolicy "
                f"docstring, 'versionchanged:: 2.15': 'With reduce_dtype=None, gradients were "
                f"previously reduced in param_dtype when it was set'), so the reduce-scatter "
                f"bytes differ by a release change no profile models yet")


def run(request, plan: Plan):
    """One rank's run of `plan` on MLPStack(mlp_dim) in the case's dtype: (observations,
    tensors) as RunPlanRank reports them."""
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.models import MLPStack

    _skip_reduce_dtype_unset_since_2_15(plan, request.param("dtype"))
    dtype = getattr(torch, request.param("dtype"))
    model = MLPStack(request.int_param("mlp_dim")).to(dtype)
    model.load_state_dict(inputs.weights(request), strict=True)
    for fqn in plan.groups:
        fully_shard(model.get_submodule(fqn), mp_policy=_mp_policy(plan.policy_of(fqn)))
    fully_shard(model, mp_policy=_mp_policy(plan.policy_of("")))
    if plan.divide_factor is not None:
        for module in model.modules():
            if hasattr(module, "_get_fsdp_state"):
                _set_divide_factor(module, plan.divide_factor)
    # F.linear raises on an input of another dtype than its weight's; recorded after FSDP's
    # pre-forward casts (hooks registered after fully_shard's).
    mixed_dtype_linears = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def check(linear, args, name=name):
                for a in args:
                    if (isinstance(a, torch.Tensor) and a.is_floating_point()
                            and a.dtype != linear.weight.dtype):
                        mixed_dtype_linears.add(name)
            module.register_forward_pre_hook(check)
    opt = torch.optim.SGD(model.parameters(), lr=float(request.param("lr")))
    rank_inputs = inputs.rank_tensors(request)
    obs = {"losses": [], "micro_batch_comm_counts": [], "micro_batch_comm_bytes": [],
           "grad_devices": [], "grad_dtypes": []}
    tensors = {}
    output_dtype = None
    for k in range(request.int_param("steps")):
        for i in range(plan.micro_batches):
            if plan.accumulate_without_sync:
                last = i + 1 == plan.micro_batches
                model.set_requires_gradient_sync(last)
                model.set_is_last_backward(last)
            counts = CommCounts(with_bytes=True)
            with counts.phase("forward"):
                out = model(rank_inputs[f"step{k * plan.micro_batches + i}/input"])
            output_dtype = _dtype_name(out.dtype)
            loss = out.sum()
            with counts.phase("backward"):
                loss.backward()
            obs["losses"].append(loss.item())
            obs["micro_batch_comm_counts"].append(counts.by_phase("forward", "backward"))
            obs["micro_batch_comm_bytes"].append(counts.bytes_by_phase("forward", "backward"))
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        obs["grad_devices"].append(_one({str(g.device) for g in grads}))
        obs["grad_dtypes"].append(_one({_dtype_name(g.dtype) for g in grads}))
        for name, p in model.named_parameters():
            if p.grad is not None:
                tensors[f"grad{k}/{name}"] = p.grad.to_local().detach().clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for name, p in model.named_parameters():
            tensors[f"step{k}/{name}"] = p.to_local().detach().clone()
    for name, p in model.named_parameters():
        tensors[f"full/{name}"] = p.full_tensor().detach().clone()
    obs["output_dtype"] = output_dtype
    obs["mixed_dtype_linears"] = sorted(mixed_dtype_linears)
    return obs, tensors


def _one(values) -> str:
    """The one value of a set: "none" when empty, "mixed" when several (RunPlanRank's)."""
    if not values:
        return "none"
    return next(iter(values)) if len(values) == 1 else "mixed"
