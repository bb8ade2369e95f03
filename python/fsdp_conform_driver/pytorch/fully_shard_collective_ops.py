"""fully_shard_comm's FSDP2 data paths in PyTorch (conformance/fully_shard_collective_ops_scenarios.cc,
test_fully_shard_comm.py TestFullyShardCollectiveOps), and set_reduce_scatter_divide_factor:

  all_gather_fp32       the seed's _init_fsdp_param_group (an nn.ParameterList of clones of
                        the case's weights "0".."7", one FSDPParamGroup over the default mesh),
                        then foreach_all_gather + foreach_all_gather_copy_out +
                        init_unsharded_param + _to_unsharded, on the current stream or the
                        comm context's pair; with an int reshard_after_forward again over the
                        post-forward group after _to_sharded_post_forward
  reduce_scatter_fp32 / _bf16 / _fp16
                        foreach_reduce of the suite's exact per-rank gradients (ReduceInput of
                        conformance/collective_data.h, collective_data.py) in the reduce dtype, with
                        the divide op and the pre/post divide factors PyTorch applied, observed
                        on its calls (the reduce-scatter's op, _div_if_needed's factors)
  set_reduce_scatter_divide_factor
                        the training plan (fully_shard_plan) with set_gradient_divide_factor
                        (divide_factor_multiple * world) on every FSDP module

FSDP2's private collectives moved (torch.distributed._composable.fsdp._fsdp_collectives in 2.4
and 2.5, torch.distributed.fsdp._fully_shard._fsdp_collectives from 2.6 on) and their
signatures changed (2.15.0 adds all_gather_comm / reduce_scatter_comm and
force_sum_reduction_for_comms, drops orig_dtype and reduce_scatter_reduce_op): they are
called by keyword from the arguments this driver knows (_call), and a case needing an
argument the release lacks is skipped, naming it.

Full tensors are reported as strided samples ([Note: sampled full tensors]):
t.flatten()[rank % s::s] with s = min(world, t.numel()).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import contextlib
import inspect
from fsdp_conform_driver import ScenarioSkipped, inputs
from fsdp_conform_driver.pytorch.collective_data import reduce_inputs
from fsdp_conform_driver.recorders import ReduceOps, reduce_op_name


def _fsdp_modules():
    """(FSDP2's _fsdp_collectives, _fsdp_init, _fsdp_common, FSDPParamGroup,
    MixedPrecisionPolicy, OffloadPolicy) of this torch."""
    try:  # torch >= 2.6
        from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy
        from torch.distributed.fsdp._fully_shard import (_fsdp_collectives, _fsdp_common,
                                                         _fsdp_init)
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # torch 2.4 / 2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, OffloadPolicy
        from torch.distributed._composable.fsdp import (_fsdp_collectives, _fsdp_common,
                                                        _fsdp_init)
        from torch.distributed._composable.fsdp._fsdp_param_group import FSDPParamGroup
    return (_fsdp_collectives, _fsdp_init, _fsdp_common, FSDPParamGroup, MixedPrecisionPolicy,
            OffloadPolicy)


def _call(fn, known: dict):
    """fn(**the entries of `known` its signature names); ScenarioSkipped when it requires an
    argument `known` lacks."""
    import torch

    signature = inspect.signature(fn)
    kwargs = {}
    for name, param in signature.parameters.items():
        if name in known:
            kwargs[name] = known[name]
        elif param.default is inspect.Parameter.empty and param.kind not in (
                param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ScenarioSkipped(
                f"torch {torch.__version__}'s {fn.__module__}.{fn.__name__}{signature} takes "
                f"'{name}', which this driver does not know how to pass")
    return fn(**kwargs)


class _SeedGroup:
    """The seed's `_init_params` (the case's weights) + `_init_fsdp_param_group`."""

    def __init__(self, request, reshard_after_forward) -> None:
        import torch
        import torch.nn as nn

        (_, fsdp_init, fsdp_common, FSDPParamGroup, MixedPrecisionPolicy,
         OffloadPolicy) = _fsdp_modules()
        # The seed's device: the accelerator where there is one (NCCL), else the CPU (Gloo).
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if torch.cuda.is_available() else torch.device("cpu"))
        weights = inputs.weights(request)
        self.orig_params = [weights[str(i)].to(self.device) for i in range(len(weights))]
        self.module = nn.ParameterList([p.detach().clone() for p in self.orig_params])
        mesh_info = fsdp_common.FSDPMeshInfo(fsdp_init._init_default_fully_shard_mesh(),
                                             shard_mesh_dim=0)
        post_forward_mesh_info = fsdp_init._get_post_forward_mesh_info(
            reshard_after_forward, mesh_info)
        self.group = _call(FSDPParamGroup, {
            "params": list(self.module.parameters()), "modules": (self.module,),
            "mesh_info": mesh_info, "post_forward_mesh_info": post_forward_mesh_info,
            "device": self.device, "shard_placement_fn": None,
            "mp_policy": MixedPrecisionPolicy(), "offload_policy": OffloadPolicy()})
        self.group.lazy_init()
        comm_ctx = self.group.comm_ctx
        if "device" in inspect.signature(comm_ctx.lazy_init).parameters:
            comm_ctx.lazy_init(self.device)
        else:
            comm_ctx.lazy_init()
        self.comm_ctx = comm_ctx

    def registered(self, i: int):
        """The parameter the module registers under "i" (sharded or unsharded)."""
        return self.module._parameters[str(i)]

    def current_stream(self):
        """The current stream as this release's FSDP2 reaches it: torch.cuda's in 2.4 / 2.5
        (whose FSDP2, under torch.distributed._composable, calls torch.cuda directly; the CPU
        shim stands in for it without a GPU), the device module's from 2.6 on."""
        import torch

        if "_composable" in _fsdp_modules()[0].__name__:
            return torch.cuda.current_stream()
        return torch.get_device_module(self.device.type).current_stream()


def _sample(t, rank: int, world: int):
    """[Note: sampled full tensors]: t.flatten()[rank % s::s], s = min(world, t.numel())."""
    flat = t.detach().flatten().cpu()
    if flat.numel() == 0:
        return flat.clone()
    s = min(world, flat.numel())
    return flat[rank % s::s].clone()


def _int_reshard_after_forward(request) -> bool:
    return request.param("reshard_after_forward") == "int"


def all_gather_fp32(request):
    """test_all_gather_fp32's _test_all_gather for one (async_op, streams,
    reshard_after_forward)."""
    collectives = _fsdp_modules()[0]
    rank, world = request.rank, request.world
    reshard_after_forward = True
    if _int_reshard_after_forward(request):
        reshard_after_forward = request.int_param("post_forward_size")
        if reshard_after_forward == world:
            raise ScenarioSkipped(
                f"reshard_after_forward={world} is the shard mesh's size, which PyTorch's "
                f"_get_post_forward_mesh_info turns into True (the post-forward mesh info is "
                f"the FSDPMeshInfo of the shard mesh itself), so "
                f"FSDPParamGroup._to_sharded_post_forward fails its assertion that the "
                f"post-forward mesh info is an HSDPMeshInfo; the seed runs the int 8 at world "
                f"128 only")
    g = _SeedGroup(request, reshard_after_forward)
    fsdp_params = g.group.fsdp_params
    obs, tensors = {}, {}
    obs["sharded_param_registered"] = [
        g.registered(i) is p.sharded_param for i, p in enumerate(fsdp_params)]
    for i, p in enumerate(fsdp_params):
        tensors[f"sharded/{i}"] = p.sharded_param.to_local().detach().cpu().clone()
        tensors[f"full_tensor/{i}"] = _sample(p.sharded_param.full_tensor(), rank, world)
    if request.param("streams") == "separate":
        streams = (g.comm_ctx.all_gather_copy_in_stream, g.comm_ctx.all_gather_stream)
    else:
        streams = (g.current_stream(), g.current_stream())

    def all_gather(pg):
        known = {"fsdp_params": fsdp_params, "group": pg,
                 "async_op": request.param("async_op") == "True",
                 "all_gather_copy_in_stream": streams[0], "all_gather_stream": streams[1],
                 "device": g.device}
        if hasattr(collectives, "DefaultAllGather"):
            known["all_gather_comm"] = collectives.DefaultAllGather()
        result = _call(collectives.foreach_all_gather, known)
        collectives.foreach_all_gather_copy_out(result, fsdp_params, pg)
        for p in fsdp_params:
            p.init_unsharded_param()
        g.group._to_unsharded()

    def report(prefix):
        for i in range(len(fsdp_params)):
            tensors[f"{prefix}/{i}"] = _sample(g.registered(i), rank, world)

    all_gather(g.group.mesh_info.shard_process_group)
    report("unsharded")
    if _int_reshard_after_forward(request):
        g.group._to_sharded_post_forward()
        post = g.group.post_forward_mesh_info
        obs["post_forward_group_size"] = post.shard_process_group.size()
        all_gather(post.shard_process_group)
        report("post_forward")
    return obs, tensors


def _grad_chunk_size(shape, world: int) -> int:
    """GradLayout's chunk: one rank's padded shard numel of a parameter of `shape`."""
    rows = -(-shape[0] // world)
    row_numel = 1
    for d in shape[1:]:
        row_numel *= d
    return max(1, rows * row_numel)


@contextlib.contextmanager
def _recording_divide(collectives, record: dict):
    """Records the factor of every _div_if_needed call foreach_reduce makes (the pre-divide on
    the reduce-scatter input, then the post-divide on its output), for the case's duration; and
    the reduce-scatter op _get_gradient_divide_factors chose where it returns one (2.6 and
    later, whose foreach_reduce issues no reduce-scatter at world size 1). The op of the
    reduce-scatter issued is recorders.ReduceOps'."""
    saved_div = collectives._div_if_needed
    saved_factors = collectives._get_gradient_divide_factors

    def div(tensor, div_factor):
        record["factors"].append(div_factor)
        return saved_div(tensor, div_factor)

    def factors(*args, **kwargs):
        result = saved_factors(*args, **kwargs)
        if len(result) == 4:  # (pre, post, reduce_scatter_op, all_reduce_op)
            record["chosen_ops"].append(result[2])
        return result

    collectives._div_if_needed = div
    collectives._get_gradient_divide_factors = factors
    try:
        yield
    finally:
        collectives._div_if_needed = saved_div
        collectives._get_gradient_divide_factors = saved_factors


def reduce_scatter(reduce_dtype_name: str):
    """test_reduce_scatter_fp32 / fp16's _test_reduce_scatter in `reduce_dtype_name`, with the
    case's reduce_scatter_stream and force_sum_reduction."""
    def run(request):
        import torch

        collectives = _fsdp_modules()[0]
        rank, world = request.rank, request.world
        force_sum = request.param("force_sum_reduction") == "True"
        signature = inspect.signature(collectives.foreach_reduce).parameters
        if force_sum and "force_sum_reduction_for_comms" not in signature:
            raise ScenarioSkipped(
                f"torch {torch.__version__}'s foreach_reduce has no "
                f"force_sum_reduction_for_comms (nor FSDPModule "
                f"set_force_sum_reduction_for_comms): it reduces with AVG / SUM by its own rule")
        g = _SeedGroup(request, True)
        g.group.unshard()
        g.group.wait_for_unshard()
        g.group.reshard()
        unsharded_grads = [
            torch.tensor(reduce_inputs(world, _grad_chunk_size(p.shape, world), rank,
                                       p.numel()), dtype=p.dtype, device=g.device).view(p.shape)
            for p in g.orig_params]
        reduce_dtype = getattr(torch, reduce_dtype_name)
        stream = (g.comm_ctx.reduce_scatter_stream
                  if request.param("reduce_scatter_stream") == "separate"
                  else g.current_stream())
        known = {
            "fsdp_params": g.group.fsdp_params, "unsharded_grads": unsharded_grads,
            "reduce_scatter_group": g.group.mesh_info.shard_process_group,
            "reduce_scatter_stream": stream, "orig_dtype": g.orig_params[0].dtype,
            "reduce_dtype": reduce_dtype, "device": g.device,
            "reduce_scatter_reduce_op": None, "gradient_divide_factor": None,
            "all_reduce_group": None, "all_reduce_stream": g.comm_ctx.all_reduce_stream,
            "all_reduce_grads": True, "partial_reduce_output": None, "all_reduce_hook": None,
            "force_sum_reduction_for_comms": force_sum}
        if hasattr(collectives, "DefaultReduceScatter"):
            known["reduce_scatter_comm"] = collectives.DefaultReduceScatter()
        record = {"factors": [], "chosen_ops": []}
        with _recording_divide(collectives, record), ReduceOps() as reduce_ops:
            _call(collectives.foreach_reduce, known)
        factors = [1.0 if f is None else float(f) for f in record["factors"]]
        ops = (list(reduce_ops.counts.get("c10d._reduce_scatter_base_", {}))
               or [reduce_op_name(op) for op in record["chosen_ops"]])
        obs = {"divide_op": ops[0] if ops else "none",
               "pre_divide": factors[0] if factors else 1.0,
               "post_divide": factors[-1] if len(factors) > 1 else 1.0}
        tensors = {}
        for i, p in enumerate(g.group.fsdp_params):
            grad = p.sharded_param.grad
            if grad is None:
                raise RuntimeError(f"parameter {i} has no sharded gradient after foreach_reduce")
            tensors[f"grad/{i}"] = grad.to_local().detach().cpu().clone()
            tensors[f"full_grad/{i}"] = _sample(grad.full_tensor(), rank, world)
        return obs, tensors
    return run


def set_reduce_scatter_divide_factor(request):
    """TestFullyShardCommunication.test_set_reduce_scatter_divide_factor as the suite's plan:
    set_gradient_divide_factor(divide_factor_multiple * world) on every FSDP module, or on the
    root only (set_on=root: FSDPModule's setter sets its own group)."""
    from fsdp_conform_driver.pytorch import fully_shard_plan

    plan = fully_shard_plan.plan_base(request, "mlp_stack")
    plan.micro_batches = request.int_param("micro_batches")
    plan.divide_factor = float(request.param("divide_factor_multiple")) * request.world
    plan.divide_factor_root_only = request.param("set_on") == "root"
    return fully_shard_plan.run(request, plan)


SCENARIOS = {
    "fully_shard_comm/all_gather_fp32": all_gather_fp32,
    "fully_shard_comm/reduce_scatter_fp32": reduce_scatter("float32"),
    "fully_shard_comm/reduce_scatter_bf16": reduce_scatter("bfloat16"),
    "fully_shard_comm/reduce_scatter_fp16": reduce_scatter("float16"),
    "fully_shard_comm/set_reduce_scatter_divide_factor": set_reduce_scatter_divide_factor,
}
