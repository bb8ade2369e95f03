"""The tensor-parallel side of parity/tp/* in PyTorch: the case's device mesh and the zoo
models' plans (conformance/tp_plans.h), applied with parallelize_module:

  mlp_stack    every "<i>.in_proj" ColwiseParallel(), every "<i>.out_proj" RowwiseParallel()
  mlp_stack_seq_parallel
               MLPStack.parallelize's with_seq_parallel=True plan: as mlp_stack, but
               "2.out_proj" RowwiseParallel(output_layouts=Shard(1)) and "3" (the LayerNorm)
               SequenceParallel(sequence_dim=1); the LayerNorm stays in the root's
               fully_shard group (children_to_shard); the output is a Shard(1) DTensor
  transformer  "wq", "wk", "wv", "w1" ColwiseParallel(), "wo", "w2" RowwiseParallel() in every
               block; each Attention then holds n_heads / tp heads (as common_dtensor.py's
               Transformer.parallelize); embeddings, norms and the output stay plain.

Mesh: (dp, tp) = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp")), dp from the
case (0: world / tp); with replicate r > 1 (HSDP x TP) (r, dp / r, tp) named ("dp_replicate",
"dp_shard", "tp"), fully_shard then running over mesh[("dp_replicate", "dp_shard")].

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

_COLWISE = {"mlp_stack": {"in_proj"}, "mlp_stack_seq_parallel": {"in_proj"},
            "transformer": {"wq", "wk", "wv", "w1"}}
_ROWWISE = {"mlp_stack": {"out_proj"}, "mlp_stack_seq_parallel": {"out_proj"},
            "transformer": {"wo", "w2"}}


def parity_mesh(request):
    """(the whole mesh, the mesh fully_shard runs over) of the case."""
    from torch.distributed.device_mesh import init_device_mesh

    tp = request.int_param("tp")
    dp = request.int_param("dp") or request.world // tp
    replicate = request.int_param("replicate")
    if replicate > 1:
        mesh = init_device_mesh("cpu", (replicate, dp // replicate, tp),
                                mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
        return mesh, mesh["dp_replicate", "dp_shard"]
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    return mesh, mesh["dp"]


def plan(kind: str, model):
    """{module FQN: ParallelStyle} of zoo model `kind` (module comment)."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel)

    from fsdp_conform_driver.pytorch.dtensor_api import Shard

    if kind not in _COLWISE:
        raise ValueError(f"zoo model '{kind}' has no tensor-parallel plan "
                         f"(planned: {', '.join(sorted(_COLWISE))})")
    out = {}
    for fqn, _ in model.named_modules():
        leaf = fqn.rsplit(".", 1)[-1]
        if leaf in _COLWISE[kind]:
            out[fqn] = ColwiseParallel()
        elif leaf in _ROWWISE[kind]:
            out[fqn] = RowwiseParallel()
    if kind == "mlp_stack_seq_parallel":
        out["2.out_proj"] = RowwiseParallel(output_layouts=Shard(1))
        out["3"] = SequenceParallel(sequence_dim=1)
    return out


def children_to_shard(kind: str, model, children):
    """`children` less the norms plan(kind, model) runs SequenceParallel on (MLPStack.parallelize:
    `if isinstance(module, nn.LayerNorm): continue`), which stay in the root's group."""
    from torch.distributed.tensor.parallel import SequenceParallel

    norms = {id(model.get_submodule(fqn)) for fqn, style in plan(kind, model).items()
             if isinstance(style, SequenceParallel)}
    return [c for c in children if id(c) not in norms]


def zero_distributed_params_off_source(kind: str, model, tp_mesh):
    """On a rank off tp index 0, zero the parameters of plan(kind, model)'s ColwiseParallel and
    RowwiseParallel modules (parity/tp's tp_src_only): their styles distribute_tensor them with
    src_data_rank=0 (ParallelStyle.src_data_rank's default; 2.5 always scatters and broadcasts
    from group rank 0), so parallelize_module hands every rank tp index 0's pieces.
    SequenceParallel's norms keep their values (its _replicate_module_fn is from_local)."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if tp_mesh.get_local_rank() == 0:
        return
    with torch.no_grad():
        for fqn, style in plan(kind, model).items():
            if isinstance(style, (ColwiseParallel, RowwiseParallel)):
                for p in model.get_submodule(fqn).parameters():
                    p.zero_()


def parallelize(kind: str, model, tp_mesh):
    """parallelize_module(model, tp_mesh, plan(kind, model)), dividing every Attention's heads."""
    from torch.distributed.tensor.parallel import parallelize_module

    from fsdp_conform_driver.pytorch.models import Attention

    tp = tp_mesh.size()
    for fqn, module in model.named_modules():
        if isinstance(module, Attention):
            if module.n_heads % tp:
                raise ValueError(f"ColwiseParallel on {fqn}.wq/wk/wv: the TP size {tp} does not "
                                 f"divide n_heads {module.n_heads}")
            module.n_heads //= tp
    return parallelize_module(model, tp_mesh, plan(kind, model))
