"""A training plan under FSDP2's policies and runtime switches, run by PyTorch: the driver's side
of conformance/fully_shard_plan.h, which the families judged by a plan share
(fully_shard_training/*, fully_shard_frozen/*, fully_shard_mixed_precision/*,
fully_shard_comm/set_reduce_scatter_divide_factor; fully_shard_training.py,
fully_shard_mixed_precision.py and fully_shard_collective_ops.py decode their cases).

A plan trains zoo model `kind` (parity._build: the case's weights and dtype) for `steps`
optimizer steps of `micro_batches` micro-batches each, micro-batch i of step k reading the
rank's input step{j}/input, j = k * micro_batches + i, with the zoo's loss of step j
(parity._loss). Each rank applies fully_shard to the plan's `groups` in order (an entry of
several modules, "a, b", is one fully_shard([a, b]) call), then to the root, over the world or
HSDP's (replicate, shard) mesh, with the plan's reshard_after_forward, CPUOffloadPolicy,
ignored_params and MixedPrecisionPolicy (the group's own, if it has one); set_unshard_in_backward(False) on the groups that say so; requires_grad_(False)
on the frozen parameters before fully_shard or, with freeze_after_init, on the sharded ones
after it; set_gradient_divide_factor on every FSDP module (2.4 and 2.5, which have none:
set_reduce_scatter_divide_factor, a PREMUL_SUM(1 / factor) reduce-scatter op) and
set_force_sum_reduction_for_comms(True) where the plan says. Per micro-batch, as
test_fully_shard_training.py's test_gradient_accumulation, the root's
set_requires_gradient_sync / set_reshard_after_backward (recurse as the plan says) and
set_is_last_backward are False but for the last micro-batch of a step, and under HSDP
set_requires_all_reduce likewise with defer_all_reduce (the last micro-batch's turned back on
by set_requires_gradient_sync(True) with resume_all_reduce_with_gradient_sync). After the last
micro-batch of a step,
SGD(lr).step() and zero_grad(set_to_none=True).

Observations (PlanSchema): every micro-batch's loss and its collectives' counts and payload
bytes by phase (recorders.CommCounts: the model's forward, then loss.backward()), the reduce
ops of the backward's reduce-scatters and all-reduces (recorders.ReduceOps), the dtype of
the output, the Linear modules fed an input of another floating dtype than their weight
(forward pre-hooks registered after fully_shard; PyTorch's F.linear would raise, so none), per
step the device and dtype of every gradient after the last backward; tensors grad{k}/{fqn}
(local gradient shards, .grad None absent), step{k}/{fqn} (local parameter shards after the
step) and full/{fqn} (full_tensor() after the last step; ignored parameters as held).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Set

from fsdp_conform_driver import ScenarioSkipped, inputs
from fsdp_conform_driver.pytorch import parity
from fsdp_conform_driver.recorders import CommCounts, ReduceOps


@dataclasses.dataclass
class Plan:
    """What a plan does (FullyShardPlan's fields that the driver acts on; the rest, such as
    forward_calls, follow from the model)."""
    kind: str = "mlp_stack"
    groups: List[str] = dataclasses.field(default_factory=lambda: ["0", "1"])
    reshard_after_forward: bool = True
    no_unshard_in_backward: Set[str] = dataclasses.field(default_factory=set)
    steps: int = 2
    micro_batches: int = 1
    lr: float = 1e-2
    accumulate_without_sync: bool = False
    recurse: bool = True
    no_reshard_after_backward: bool = False
    divide_factor: Optional[float] = None
    # set_gradient_divide_factor on the root only (a non-recursive setter: the other groups
    # keep the data-parallel size) instead of on every FSDP module.
    divide_factor_root_only: bool = False
    force_sum_reduction: bool = False
    hsdp: bool = False
    hsdp_shard_size: int = 0  # > 0: the (world / it, it) mesh; 0: HybridMeshShapeFor's
    defer_all_reduce: bool = False
    # defer_all_reduce: the last micro-batch calls set_requires_gradient_sync(True) instead of
    # set_requires_all_reduce(True).
    resume_all_reduce_with_gradient_sync: bool = False
    # The switches of accumulate_without_sync / defer_all_reduce called only where their value
    # changes (before the first and the last micro-batch of a step), not before every one.
    switches_on_change: bool = False
    cpu_offload_pin_memory: Optional[bool] = None  # None: no CPUOffloadPolicy
    ignored_params: List[str] = dataclasses.field(default_factory=list)
    # Whether a parameter (by FQN) is frozen (FullyShardPlan::frozen_params as a predicate).
    frozen: Callable[[str], bool] = lambda fqn: False
    freeze_after_init: bool = False
    unfreeze_at_step: Optional[int] = None
    # MixedPrecisionPolicy keyword arguments (dtype names, "None" for None) of every
    # fully_shard call, and by group ("" the root) those of a group with its own policy.
    mp_policy: Dict[str, object] = dataclasses.field(default_factory=dict)
    group_mp_policies: Dict[str, Dict[str, object]] = dataclasses.field(default_factory=dict)

    def policy_of(self, group: str) -> Dict[str, object]:
        """The MixedPrecisionPolicy keyword arguments of `group` ("" the root)."""
        return self.group_mp_policies.get(group, self.mp_policy)


def plan_base(request, kind: str) -> Plan:
    """The parameters every plan family declares (PlanParams: steps, lr; the dtype is
    parity._build's)."""
    return Plan(kind=kind, steps=request.int_param("steps"), lr=float(request.param("lr")))


def group_modules(group: str) -> List[str]:
    """The module FQNs of one `groups` entry ("layers.1, layers.2" -> two FQNs)."""
    return group.split(", ")


def _mesh(request, plan: Plan):
    """fully_shard's mesh: HSDP's init_device_mesh("cpu", (replicate, shard)) of the plan's
    shard size, or of the suite's shape (HybridMeshShapeFor), else None (the default: the
    world)."""
    if not plan.hsdp:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    from fsdp_conform_driver.pytorch.fsdp1_api import hybrid_mesh_shape

    if plan.hsdp_shard_size > 0:
        shard = plan.hsdp_shard_size
        shape = (request.world // shard, shard) if request.world % shard == 0 else None
    else:
        shape = hybrid_mesh_shape(request.world)
    if shape is None:
        raise ScenarioSkipped(f"HSDP needs a (replicate, shard) mesh; world {request.world} has "
                              f"none")
    return init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))


def _offload_policy(plan: Plan):
    """CPUOffloadPolicy(pin_memory) where the plan offloads; skips pinned memory without an
    accelerator (pin_memory() of the CPU shard raises without one)."""
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import CPUOffloadPolicy

    if plan.cpu_offload_pin_memory is None:
        return None
    if plan.cpu_offload_pin_memory and not torch.cuda.is_available():
        raise ScenarioSkipped(
            "CPUOffloadPolicy(pin_memory=True) needs an accelerator, and none is visible: "
            "FSDPParam pins the CPU shard with pin_memory(), which raises without one "
            "(RuntimeError 'Cannot access accelerator device when none is available' in 2.5.1, "
            "'Found no NVIDIA driver on your system' in 2.15.0)")
    return CPUOffloadPolicy(pin_memory=plan.cpu_offload_pin_memory)


def _mp_policy(kwargs: Dict[str, object]):
    """MixedPrecisionPolicy from dtype names ("None": None) and booleans."""
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import MixedPrecisionPolicy

    return MixedPrecisionPolicy(**{
        key: (None if value == "None" else getattr(torch, value)) if isinstance(value, str)
        else value for key, value in kwargs.items()})


def _set_divide_factor(module, factor: float) -> None:
    """set_gradient_divide_factor (2.6 and later) or, before it, set_reduce_scatter_divide_factor
    (2.4, 2.5: a PREMUL_SUM(1 / factor) reduce-scatter op, which Gloo ignores)."""
    if hasattr(module, "set_gradient_divide_factor"):
        module.set_gradient_divide_factor(factor)
    else:
        module.set_reduce_scatter_divide_factor(factor)


def _require(obj, method: str, what: str) -> None:
    """Skips the case when this torch's FSDPModule has no `method` (a later API)."""
    if not hasattr(obj, method):
        import torch

        raise ScenarioSkipped(f"{what} needs FSDPModule.{method}, which torch "
                              f"{torch.__version__} does not have")


def _set_frozen_requires_grad(model, plan: Plan, requires_grad: bool) -> None:
    """requires_grad_(requires_grad) on the plan's frozen parameters (the sharded ones once
    fully_shard ran)."""
    for fqn, param in model.named_parameters():
        if plan.frozen(fqn):
            param.requires_grad_(requires_grad)


def shard(request, plan: Plan, model):
    """fully_shard on the plan's groups, then on the root, with the plan's options (module
    comment); returns the root."""
    import inspect

    from fsdp_conform_driver.pytorch.fsdp_api import FSDPModule, fully_shard

    # reshard_after_forward=False where the plan says so, else fully_shard's default, as the
    # suite's run passes it (PlanOptions): the root stays unsharded after forward either way
    # (2.4 / 2.5: lazy init; from 2.6 on: the default None means so, an explicit True not).
    kwargs = {} if plan.reshard_after_forward else {"reshard_after_forward": False}
    mesh = _mesh(request, plan)
    if mesh is not None:
        kwargs["mesh"] = mesh
    offload = _offload_policy(plan)
    if offload is not None:
        kwargs["offload_policy"] = offload
    if plan.ignored_params:
        if "ignored_params" not in inspect.signature(fully_shard).parameters:
            import torch

            raise ScenarioSkipped(f"fully_shard has no ignored_params argument in torch "
                                  f"{torch.__version__} (FSDP2 gained it with "
                                  f"pytorch/pytorch#146631, in 2025)")
        params = dict(model.named_parameters())
        missing = [fqn for fqn in plan.ignored_params if fqn not in params]
        if missing:
            raise KeyError(f"ignored parameters {missing} are not parameters of the model")
        kwargs["ignored_params"] = {params[fqn] for fqn in plan.ignored_params}
    if plan.no_unshard_in_backward:
        _require(FSDPModule, "set_unshard_in_backward", "set_unshard_in_backward(False)")
    if not plan.freeze_after_init:
        _set_frozen_requires_grad(model, plan, False)
    for group in plan.groups:
        modules = [model.get_submodule(fqn) for fqn in group_modules(group)]
        fully_shard(modules if len(modules) > 1 else modules[0],
                    **_with_policy(kwargs, plan.policy_of(group)))
        if group in plan.no_unshard_in_backward:
            modules[0].set_unshard_in_backward(False)
    fully_shard(model, **_with_policy(kwargs, plan.policy_of("")))
    if plan.freeze_after_init:
        _set_frozen_requires_grad(model, plan, False)
    if plan.force_sum_reduction:
        _require(FSDPModule, "set_force_sum_reduction_for_comms",
                 "set_force_sum_reduction_for_comms(True)")
    for module in model.modules():
        if isinstance(module, FSDPModule):
            if plan.divide_factor is not None and (
                    not plan.divide_factor_root_only or module is model):
                _set_divide_factor(module, plan.divide_factor)
            if plan.force_sum_reduction:
                module.set_force_sum_reduction_for_comms(True)
    return model


def _with_policy(kwargs, policy: Dict[str, object]):
    """fully_shard's keyword arguments plus mp_policy where the plan sets one."""
    return dict(kwargs, mp_policy=_mp_policy(policy)) if policy else kwargs


def _record_mixed_dtype_linears(model, names: Set[str], compute_weights: Dict[str, object]):
    """Forward pre-hooks on every nn.Linear adding its FQN to `names` when a floating input
    has another dtype than its weight (registered after fully_shard: they see what FSDP's
    pre-forward produced), and keeping in `compute_weights["compute/{fqn}.weight"]` the weight
    it first computes with when that is not in the parameters' dtype (param_dtype's cast)."""
    import torch

    param_dtype = next(model.parameters()).dtype

    def hook(fqn):
        def check(module, args):
            for a in args:
                if torch.is_tensor(a) and a.is_floating_point() and a.dtype != module.weight.dtype:
                    names.add(fqn)
            key = f"compute/{fqn}.weight"
            if module.weight.dtype != param_dtype and key not in compute_weights:
                compute_weights[key] = module.weight.detach().clone()
        return check

    for fqn, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(hook(fqn))


def _one(values: Set[str]) -> str:
    """The single value, "none" when empty, "mixed" when several (GradPlacement)."""
    return "none" if not values else next(iter(values)) if len(values) == 1 else "mixed"


def run(request, plan: Plan):
    """One rank's run of `plan` (module comment): (observations, tensors)."""
    import torch

    model, _ = parity._build(plan.kind, request)
    shard(request, plan, model)
    mixed_dtype_linears: Set[str] = set()
    tensors = {}
    _record_mixed_dtype_linears(model, mixed_dtype_linears, tensors)
    optimizer = torch.optim.SGD(model.parameters(), lr=plan.lr)
    rank_inputs = inputs.rank_tensors(request)
    obs: Dict[str, list] = {"losses": [], "micro_batch_comm_counts": [],
                            "micro_batch_comm_bytes": [], "micro_batch_reduce_ops": [],
                            "micro_batch_grad_dtypes": [], "grad_devices": [],
                            "grad_dtypes": []}
    output_dtype = None
    for k in range(plan.steps):
        if plan.unfreeze_at_step == k:
            _set_frozen_requires_grad(model, plan, True)
        for i in range(plan.micro_batches):
            last = i + 1 == plan.micro_batches
            set_switches = not plan.switches_on_change or i == 0 or last
            if plan.accumulate_without_sync and set_switches:
                model.set_requires_gradient_sync(last, recurse=plan.recurse)
                model.set_is_last_backward(last)
            if plan.no_reshard_after_backward and set_switches:
                model.set_reshard_after_backward(last, recurse=plan.recurse)
            if plan.defer_all_reduce and set_switches:
                if last and plan.resume_all_reduce_with_gradient_sync:
                    model.set_requires_gradient_sync(True)
                else:
                    model.set_requires_all_reduce(last)
            j = k * plan.micro_batches + i
            # Without CommDebugMode's module tracker, which fails on a module called twice in
            # one forward (multi_forward_module's inner; recorders._NoModuleTracker).
            counts = CommCounts(track_modules=False, with_bytes=True)
            with counts.phase("forward"):
                out = model(rank_inputs[f"step{j}/input"])
            output_dtype = parity._dtype_name(out[0] if isinstance(out, tuple) else out)
            loss = parity._loss(request, j, out)
            with counts.phase("backward"), ReduceOps() as reduce_ops:
                loss.backward()
            obs["losses"].append(loss.item())
            obs["micro_batch_comm_counts"].append(counts.by_phase("forward", "backward"))
            obs["micro_batch_comm_bytes"].append(counts.bytes_by_phase("forward", "backward"))
            obs["micro_batch_reduce_ops"].append(reduce_ops.counts)
            obs["micro_batch_grad_dtypes"].append(
                {name: "None" if p.grad is None else parity._dtype_name(p.grad)
                 for name, p in model.named_parameters() if name not in plan.ignored_params})
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        obs["grad_devices"].append(_one({str(parity._local(g).device) for g in grads}))
        obs["grad_dtypes"].append(_one({parity._dtype_name(g) for g in grads}))
        parity._record_grad_shards(model, k, tensors)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        parity._record_params(model, k, tensors)
    obs["output_dtype"] = output_dtype
    obs["mixed_dtype_linears"] = sorted(mixed_dtype_linears)
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        tensors[f"full/{name}"] = full.detach().clone()
    return obs, tensors
