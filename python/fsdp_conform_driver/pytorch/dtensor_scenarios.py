"""dtensor/* in PyTorch: DTensor redistribution and distribute_tensor without a model
(conformance/dtensor_scenarios.cc; test_redistribute.py's RedistributeTest and test_dtensor.py's
distribute_tensor tests). Data: B[i][j] = i * cols + j - 17 in float64, rank r's own tensor
X_r = (r + 1) * B.

Skipped here: Partial(avg) on torch before 2.6 (Gloo has no ReduceOp.AVG: the all-reduce raises
"Cannot use ReduceOp.AVG with Gloo" and the reduce-scatter ignores the op), and a
src_data_rank other than 0 where distribute_tensor has no such keyword (before 2.6; it always
scatters and broadcasts from group rank 0).

Thread-safety: one case per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import ScenarioSkipped


def _placements(request):
    """(the Partial placement of the case, distribute_tensor's extra kwargs), or skip."""
    import inspect

    import torch
    from torch.distributed.tensor import Partial, distribute_tensor

    reduce_op = request.param("partial_reduce")
    src = request.param("src_data_rank")
    has_src = "src_data_rank" in inspect.signature(distribute_tensor).parameters
    if reduce_op == "avg" and not has_src:
        raise ScenarioSkipped(f"Partial(avg) on Gloo in torch {torch.__version__}: Gloo has no "
                              "ReduceOp.AVG (all_reduce raises \"Cannot use ReduceOp.AVG with "
                              "Gloo\"; reduce_scatter_tensor ignores the op and sums)")
    if src != "0" and not has_src:
        raise ScenarioSkipped(f"distribute_tensor in torch {torch.__version__} has no "
                              "src_data_rank (2.6 and later): it always distributes group rank "
                              "0's tensor")
    kwargs = {"src_data_rank": None if src == "None" else int(src)} if has_src else {}
    return Partial(reduce_op), kwargs


def _chunk(t, n, dim, i):
    """torch.chunk(t, n, dim)[i], or the empty piece of a trailing rank past torch.chunk's last
    chunk (5 rows over 4 ranks: 2, 2, 1, 0), as DTensor's Shard pieces are."""
    size = t.shape[dim]
    c = -(-size // n)
    start = min(i * c, size)
    return t.narrow(dim, start, min(start + c, size) - start).contiguous()


def redistribute(request):
    """Every rank's local tensor after each transform of the C++ scenario's schema."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import (DTensor, Replicate, Shard, distribute_module,
                                          distribute_tensor)

    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    partial, kwargs = _placements(request)
    rows, cols = request.int_param("rows"), request.int_param("cols")
    rank, world = request.rank, request.world
    base = (torch.arange(rows * cols, dtype=torch.float64) - 17).reshape(rows, cols)
    mine = base * (rank + 1)
    mesh = init_device_mesh("cpu", (world,))

    def from_partial():
        return DTensor.from_local(mine, mesh, [partial])

    t = {
        "partial_to_shard0": from_partial().redistribute(mesh, [Shard(0)]).to_local(),
        "partial_to_shard1": from_partial().redistribute(mesh, [Shard(1)]).to_local(),
        "partial_to_replicate": from_partial().full_tensor(),
        "shard0_to_shard1": DTensor.from_local(
            _chunk(base, world, 0, rank), mesh, [Shard(0)], shape=base.shape,
            stride=base.stride()).redistribute(mesh, [Shard(1)]).to_local(),
        "shard1_to_replicate": DTensor.from_local(
            _chunk(base, world, 1, rank), mesh, [Shard(1)], shape=base.shape,
            stride=base.stride()).full_tensor(),
        "replicate_to_shard1": DTensor.from_local(base, mesh, [Replicate()]).redistribute(
            mesh, [Shard(1)]).to_local(),
        # A copy each time: distribute_tensor's Replicate broadcasts into its input's storage.
        "distribute_shard0": distribute_tensor(mine.clone(), mesh, [Shard(0)],
                                               **kwargs).to_local(),
        "distribute_replicate": distribute_tensor(mine.clone(), mesh, [Replicate()],
                                                  **kwargs).to_local(),
    }
    # distribute_tensor keeps its source's requires_grad.
    obs = {"distribute_requires_grad": {
        "frozen": distribute_tensor(mine.clone(), mesh, [Shard(0)]).requires_grad,
        "trainable": distribute_tensor(mine.clone().requires_grad_(True), mesh,
                                       [Shard(0)]).requires_grad}}
    # distribute_module's default partition (replicate_module_params_buffers) on a
    # Linear(cols, rows, bias=False) whose weight and buffer "buf" are the rank's X_r.
    linear = torch.nn.Linear(cols, rows, bias=False, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(mine)
    linear.register_buffer("buf", mine.clone())
    # A parameterless child holding X_r as its non-persistent buffer "buf" too: the default
    # partition runs on every module of named_modules() and keeps the buffer out of the state dict.
    linear.add_module("stats", torch.nn.Module())
    linear.stats.register_buffer("buf", mine.clone(), persistent=False)
    distribute_module(linear, mesh)
    obs["distribute_module_state_dict_keys"] = sorted(linear.state_dict().keys())
    t["distribute_module_weight"] = linear.weight.to_local()
    for key, buf in (("distribute_module_buffer", linear.buf),
                     ("distribute_module_child_buffer", linear.stats.buf)):
        t[key] = buf.to_local() if isinstance(buf, DTensor) else buf
    # ColwiseParallel(output_layouts=Replicate()) on a Linear(cols, rows) with weight B, fed B:
    # its uneven Shard(-1) output pieces all-gathered into B @ B.T.
    colwise = torch.nn.Linear(cols, rows, bias=False, dtype=torch.float64)
    with torch.no_grad():
        colwise.weight.copy_(base)
    parallelize_module(colwise, mesh, ColwiseParallel(output_layouts=Replicate()))
    t["colwise_replicate_output"] = colwise(base)
    # RowwiseParallel(input_layouts=Shard(0)) on a Linear(cols, rows) with weight B, fed the
    # rank's two rows of A (2 x world rows, numbered like B): the input redistributed from
    # Shard(0) to Shard(-1), the Partial output all-reduced into A @ B.T.
    rowwise = torch.nn.Linear(cols, rows, bias=False, dtype=torch.float64)
    with torch.no_grad():
        rowwise.weight.copy_(base)
    parallelize_module(rowwise, mesh, RowwiseParallel(input_layouts=Shard(0)))
    batch = (torch.arange(2 * world * cols, dtype=torch.float64) - 17).reshape(2 * world, cols)
    t["rowwise_shard0_input"] = rowwise(_chunk(batch, world, 0, rank))
    # distribute_module with an input_fn taking the rank's rows as Shard(0) and an output_fn
    # gathering the output (test_distribute_module_input_fn_output_fn): A @ B.T on every rank.
    gathered = torch.nn.Linear(cols, rows, bias=False, dtype=torch.float64)
    with torch.no_grad():
        gathered.weight.copy_(base)
    distribute_module(
        gathered, mesh,
        input_fn=lambda mod, inputs, m: DTensor.from_local(inputs[0], m, [Shard(0)]),
        output_fn=lambda mod, outputs, m: outputs.full_tensor())
    t["distribute_module_gathered_output"] = gathered(_chunk(batch, world, 0, rank))
    # SequenceParallel replicates a norm's parameters from each rank's own values
    # (DTensor.from_local(param, [Replicate()]), no broadcast): row 0 of X_r as the weight, its
    # negation as the bias.
    norm = torch.nn.LayerNorm(cols, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(mine[0])
        norm.bias.copy_(-mine[0])
    parallelize_module(norm, mesh, SequenceParallel())
    t["sequence_parallel_weight"] = norm.weight.to_local()
    t["sequence_parallel_bias"] = norm.bias.to_local()
    if world >= 4 and world % 2 == 0 and rows >= world // 2:
        mesh_2d = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("a", "b"))
        i, j = divmod(rank, world // 2)
        piece = _chunk(_chunk(base, 2, 0, i), world // 2, 1, j)
        both = DTensor.from_local(piece, mesh_2d, [Shard(0), Shard(1)], shape=base.shape,
                                  stride=base.stride())
        t["mesh2d_shard0_shard1_to_replicate"] = both.full_tensor()
        t["mesh2d_shard0_shard1_to_shard1_replicate"] = both.redistribute(
            mesh_2d, [Shard(1), Replicate()]).to_local()
        t["mesh2d_distribute_shard1_shard0"] = distribute_tensor(
            mine.clone(), mesh_2d, [Shard(1), Shard(0)], **kwargs).to_local()
        # No shape: from_local infers dim 0 as 1 row x mesh dim 1's size.
        t["mesh2d_inferred_shape_to_replicate"] = DTensor.from_local(
            base[j:j + 1].contiguous(), mesh_2d, [Replicate(), Shard(0)]).full_tensor()
    return obs, {name: value.detach().contiguous().clone() for name, value in t.items()}


SCENARIOS = {"dtensor/redistribute": redistribute}
