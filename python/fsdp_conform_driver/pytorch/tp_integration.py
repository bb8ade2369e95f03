"""fsdp_tp_integration/* (seed 003, test_fsdp_tp_integration.py::TestTPFSDPIntegration) in
PyTorch: FullyShardedDataParallel (FSDP1) over tensor-parallel models on the (dp, tp) mesh
init_device_mesh("cpu", (world / tp, tp), mesh_dim_names=("dp", "tp")), as the seed runs them:

  fsdp_tp_integration       SimpleModel with parallelize_module(net1 ColwiseParallel(
                            input_layouts=Shard(0)), net2 RowwiseParallel(output_layouts=
                            Shard(0))) under FSDP(device_mesh=mesh_2d["dp"]) beside the same model
                            under FSDP alone on the whole world; the seed's _sync_tp_grads on the
                            TP model's flat gradient, one SGD step each, a second batch. Reported:
                            both models' outputs of both batches and full gradients.
  fsdp_tp_extension_grad    the seed's TestModel (distribute_rmsnorm, MLPModule colwise/rowwise)
                            under FSDP1 on mesh_2d["dp"]: CommDebugMode's counts of one forward
                            and one backward, whether every gradient is finite, the full
                            gradients.
  fsdp_tp_sync_module_state a Replicate() DTensor parameter and a DTensor buffer, the rank's own
                            values, under FSDP(sync_module_states=True) on mesh_2d["dp"]: their
                            local tensors before wrapping and inside summon_full_params.

A full gradient is read from FSDP1's flat parameter as the seed's _get_grads_as_flattened does:
the sharded flat gradient all-gathered over the FSDP group, split by the flat parameter's
per-parameter numels (padding dropped), and a TP parameter's local piece gathered over tp
(DTensor.from_local(...).full_tensor()).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import inputs
from fsdp_conform_driver.recorders import CommCounts


def _mesh_2d(request):
    from torch.distributed.device_mesh import init_device_mesh

    tp = request.int_param("tp")
    return init_device_mesh("cpu", (request.world // tp, tp), mesh_dim_names=("dp", "tp"))


def _load(model, request):
    import torch

    model.to(getattr(torch, request.param("dtype")))
    model.load_state_dict(inputs.weights(request), strict=True)
    return model


def _seed_tp_plan():
    """The seed's plan for net1 / net2 (SimpleModel's, and MLPModule's under mlp.)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from fsdp_conform_driver.pytorch.dtensor_api import Shard

    return ColwiseParallel(input_layouts=Shard(0)), RowwiseParallel(output_layouts=Shard(0))


def _dtensor_specs(model):
    """{FQN: (mesh, placements)} of the model's DTensor parameters (before FSDP flattens
    them into local pieces)."""
    return {name: (p.device_mesh, tuple(p.placements)) for name, p in model.named_parameters()
            if hasattr(p, "device_mesh")}


def _flat_params(fsdp_model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle.flat_param for m in FSDP.fsdp_modules(fsdp_model)
            if m._handle is not None]


def full_gradients(fsdp_model, dtensor_specs):
    """{clean FQN: full gradient} of every flattened parameter (module comment)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_conform_driver.pytorch.dtensor_api import DTensor

    out = {}
    for module in FSDP.fsdp_modules(fsdp_model):
        handle = module._handle
        if handle is None:
            continue
        flat = handle.flat_param
        shard = handle.sharded_grad
        if shard is None:
            raise RuntimeError(f"the flat parameter of {type(module.module).__name__} has no "
                               "gradient after backward")
        group = module.process_group
        size = dist.get_world_size(group)
        gathered = torch.empty(shard.numel() * size, dtype=shard.dtype)
        dist.all_gather_into_tensor(gathered, shard.detach().contiguous(), group=group)
        offset, idx = 0, 0
        for numel, is_padding in zip(flat._numels_with_padding, flat._is_padding_mask):
            if not is_padding:
                fqn, shape = flat._fqns[idx], flat._shapes[idx]
                grad = gathered[offset:offset + numel].view(shape).clone()
                if fqn in dtensor_specs:
                    mesh, placements = dtensor_specs[fqn]
                    grad = DTensor.from_local(grad, mesh, placements,
                                              run_check=False).full_tensor()
                out[fqn] = grad
                idx += 1
            offset += numel
    return out


def _sync_tp_grads(tp_fsdp_model, tp_group, dtensor_specs):
    """The seed's _sync_tp_grads: the elements of the plain (non-TP) parameters of the sharded
    flat gradient become their sum over the TP group, then every element is divided by tp."""
    import torch
    import torch.distributed as dist

    for flat in _flat_params(tp_fsdp_model):
        grad = flat.grad
        summed = grad.detach().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=tp_group)
        mask = torch.zeros(grad.numel(), dtype=torch.bool)
        for info, fqn in zip(flat._shard_param_infos, flat._fqns):
            if info.in_shard and fqn not in dtensor_specs:
                mask[info.offset_in_shard:info.offset_in_shard + info.numel_in_shard] = True
        with torch.no_grad():
            grad[mask] = summed[mask]
            grad /= dist.get_world_size(tp_group)


def _fsdp1(request, model, device_mesh, **kwargs):
    """FullyShardedDataParallel(model) on `device_mesh` with the case's cpu_offload, on the
    CPU (fsdp1_api.py says why device_id)."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    from fsdp_conform_driver.pytorch.fsdp1_api import cpu_offload

    return FullyShardedDataParallel(model, device_mesh=device_mesh,
                                    cpu_offload=cpu_offload(request),
                                    device_id=torch.device("cpu"), **kwargs)


def _prefixed(grads, prefix):
    return {f"{prefix}{fqn}": g.detach().clone() for fqn, g in grads.items()}


def integration(request):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.tensor.parallel import parallelize_module

    from fsdp_conform_driver.pytorch.models import SimpleModel

    mesh_2d = _mesh_2d(request)
    tp_mesh = mesh_2d["tp"]
    mesh_1d = init_device_mesh("cpu", (request.world,))
    fsdp_model = _fsdp1(request, _load(SimpleModel(), request), mesh_1d)
    colwise, rowwise = _seed_tp_plan()
    tp_model = parallelize_module(_load(SimpleModel(), request), tp_mesh,
                                  {"net1": colwise, "net2": rowwise})
    specs = _dtensor_specs(tp_model)
    tp_fsdp_model = _fsdp1(request, tp_model, mesh_2d["dp"],
                           sharding_strategy=ShardingStrategy[request.param("sharding_strategy")],
                           use_orig_params=request.param("use_orig_params") == "True")
    rank_inputs = inputs.rank_tensors(request)
    tensors = {}

    def forward(model, k, who):
        out = model(rank_inputs[f"step{k}/input"])
        tensors[f"{who}/step{k}/output"] = out.detach().clone()
        return out

    fsdp_out = forward(fsdp_model, 0, "fsdp")
    tp_fsdp_out = forward(tp_fsdp_model, 0, "tp_fsdp")
    fsdp_out.sum().backward()
    tp_fsdp_out.sum().backward()
    _sync_tp_grads(tp_fsdp_model, tp_mesh.get_group(), specs)
    tensors.update(_prefixed(full_gradients(fsdp_model, {}), "fsdp/grad/"))
    tensors.update(_prefixed(full_gradients(tp_fsdp_model, specs), "tp_fsdp/grad/"))
    lr = float(request.param("lr"))
    fsdp_optim = torch.optim.SGD(fsdp_model.parameters(), lr=lr)
    tp_fsdp_optim = torch.optim.SGD(tp_fsdp_model.parameters(), lr=lr)
    fsdp_optim.step()
    tp_fsdp_optim.step()
    forward(fsdp_model, 1, "fsdp")
    forward(tp_fsdp_model, 1, "tp_fsdp")
    return {}, tensors


def _distribute_rmsnorm(module, device_mesh):
    """The seed's distribute_rmsnorm: the input as Shard(0) rows, the output back to local."""
    from fsdp_conform_driver.pytorch.dtensor_api import DTensor, Shard, distribute_module

    def prepare_input_fn(mod, inputs, device_mesh):
        return DTensor.from_local(inputs[0], device_mesh, [Shard(0)])

    def prepare_output_fn(mod, outputs, device_mesh):
        return outputs.to_local()

    return distribute_module(module, device_mesh, input_fn=prepare_input_fn,
                             output_fn=prepare_output_fn)


def extension_grad(request):
    import torch
    from torch.distributed.tensor.parallel import parallelize_module

    from fsdp_conform_driver.pytorch.models import TpExtensionModel

    mesh_2d = _mesh_2d(request)
    tp_mesh = mesh_2d["tp"]
    colwise, rowwise = _seed_tp_plan()
    tp_model = parallelize_module(_load(TpExtensionModel(), request), tp_mesh,
                                  {"mlp.net1": colwise, "mlp.net2": rowwise})
    _distribute_rmsnorm(tp_model.mlp_norm, tp_mesh)
    specs = _dtensor_specs(tp_model)
    fsdp_2d_model = _fsdp1(request, tp_model, mesh_2d["dp"])
    counts = CommCounts()
    with counts.phase("forward"):
        out = fsdp_2d_model(inputs.step_input(request, 0))
    with counts.phase("backward"):
        out.sum().backward()
    grads = [p.grad for p in fsdp_2d_model.parameters() if p.grad is not None]
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    return ({"comm_counts": counts.by_phase("forward", "backward"), "grads_finite": finite},
            _prefixed(full_gradients(fsdp_2d_model, specs), "grad/"))


def sync_module_state(request):
    import torch

    from fsdp_conform_driver.pytorch.dtensor_api import DTensor, Replicate
    from fsdp_conform_driver.pytorch.fsdp1_api import check_sync_module_states

    check_sync_module_states()
    mesh_2d = _mesh_2d(request)
    tp_mesh = mesh_2d["tp"]
    mine = inputs.rank_tensors(request)

    class TestModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.param = torch.nn.Parameter(DTensor.from_local(
                mine["param"].clone(), tp_mesh, [Replicate()], run_check=False))
            self.register_buffer("buf", DTensor.from_local(
                mine["buf"].clone(), tp_mesh, [Replicate()], run_check=False))

    model = TestModel()
    tensors = {"before/param": model.param.to_local().detach().clone(),
               "before/buf": model.buf.to_local().detach().clone()}
    fsdp_mod = _fsdp1(request, model, mesh_2d["dp"], sync_module_states=True)
    with fsdp_mod.summon_full_params(fsdp_mod):
        tensors["after/param"] = fsdp_mod.param.to_local().detach().clone()
        tensors["after/buf"] = fsdp_mod.buf.to_local().detach().clone()
    return {}, tensors
