"""collectives/* in PyTorch: c10d's collectives on their own over the case's default process
group (conformance/collectives_scenarios.cc, which mirrors test_multi_threaded_pg.py,
test_c10d_nccl.py and distributed_test.py), on the suite's exact per-rank data
(collective_data.py):

  all_gather_into_tensor  dist.all_gather_into_tensor(output, input); in place: input is
                          output's chunk `rank`
  reduce_scatter_tensor   dist.reduce_scatter_tensor(output, input, op); in place: output is
                          input's chunk `rank`
  all_reduce              dist.all_reduce(tensor, op) (api=c10d), or
                          torch.distributed._functional_collectives.all_reduce(input, op, group)
                          (api=functional), which returns a new tensor
  broadcast               dist.broadcast(tensor, src=root)
  broadcast_group         dist.new_group(ranks) over every rank but 0, listed from the last
                          down: get_rank / get_world_size, the group's ranks, an all-gather
                          and a broadcast from every member over it
  all_gather              dist.all_gather(outputs, input) into a list (equal or uneven counts;
                          in place: outputs[rank] is the input itself)
  barrier                 dist.barrier() in rounds, one rank entering delay_ms late, under a
                          CommDebugMode with one all_reduce after them (comm_counts)
  device_mesh             init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dim0", ...)), or
                          DeviceMesh("cpu", mesh_ranks reshaped) over a subset of the world:
                          coordinate, local ranks, each dim's group (its ranks, an all-gather
                          of the global rank over it), sub-meshes of single and adjacent dims

each with the case's dtype and async_op (a Work waited on). PREMUL_SUM is
dist._make_nccl_premul_sum(factor) with the rank's factor. AVG and PREMUL_SUM on int64 must
raise on every rank (the suite's rule); the rank then reports what it raised and all-reduces
(SUM) a fresh copy of its input as "after_rejection". A case the backend cannot run, whatever
the dtype (Gloo has no PREMUL_SUM, 2.4 / 2.5's Gloo no AVG, no all_gather of uneven sizes), is
skipped with the exception the backend raised, which every rank raises alike before any data
moves; so is funcol.all_reduce with PREMUL_SUM, which has no way to take the factor.

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import time

from fsdp_conform_driver import ScenarioSkipped
from fsdp_conform_driver.pytorch.collective_data import (gather_values, premul_factor,
                                                         reduce_inputs)

_SENTINEL = -200.0  # initial output contents; never a valid result


def _dtype(request):
    import torch

    return getattr(torch, request.param("dtype"))


def _chunked_case(request):
    """(dtype, count, rank, world, in_place) of an all-gather or reduce-scatter case: `count`
    elements per rank, in place in the rank's chunk of the world-sized buffer or not."""
    return (_dtype(request), request.int_param("count"), request.rank, request.world,
            request.param("in_place") == "True")


def _tensor(values, dtype):
    import torch

    return torch.tensor(values, dtype=torch.float64).to(dtype)


def _async(request) -> bool:
    return request.param("async_op") == "True"


def _finish(work, async_op: bool):
    """The "work" observation: for async_op=True, waits on the Work the call returned;
    None for async_op=False (torch returns None)."""
    if not async_op:
        return None
    if work is not None:
        work.wait()
    return {"returned": work is not None, "waited": work is not None}


def _rejected(request, dtype) -> bool:
    """The suite's rule (ReductionIsRejected): AVG and PREMUL_SUM on a dtype that is not
    floating point must raise."""
    return request.param("op") in ("avg", "premul_sum") and not dtype.is_floating_point


def _reduce_op(request):
    """The case's ReduceOp; PREMUL_SUM with the rank's factor (2 even, 4 odd)."""
    import torch.distributed as dist

    name = request.param("op")
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(premul_factor(request.rank))
    return getattr(dist.ReduceOp, name.upper())


def _unsupported(request, error: Exception):
    """ScenarioSkipped for a reduction the backend refuses whatever the dtype: Gloo has no
    PREMUL_SUM, and 2.4 / 2.5's no AVG either (2.15.0's has; ProcessGroupGloo raises "Cannot use
    ReduceOp.PREMUL_SUM with Gloo" / "Cannot use ReduceOp.AVG with Gloo"); any other error is
    the case's."""
    op = request.param("op")
    if request.backend == "gloo" and op in ("avg", "premul_sum") and "Gloo" in str(error):
        return ScenarioSkipped(f"Gloo has no ReduceOp.{op.upper()}, whatever the dtype (so an "
                               f"int64 case cannot show the dtype rejected): "
                               f"{type(error).__name__}: {str(error).splitlines()[0]}")
    return None


def _reduction(request, dtype, values, call):
    """Runs `call()` (returning the observations of a reduction that returned); where the suite
    rules the reduction rejected, an exception becomes the rejection's observations (the error
    and "after_rejection"); where the backend cannot run the op at all, the case is skipped."""
    import torch.distributed as dist

    try:
        obs, tensors = call()
    except ScenarioSkipped:
        raise
    except Exception as e:  # noqa: BLE001 -- any exception is the rejection the suite asks for
        # The backend's refusal of the op for every dtype is no rejection of int64: skipped.
        skipped = _unsupported(request, e)
        if skipped is not None:
            raise skipped from e
        if _rejected(request, dtype):
            again = _tensor(values, dtype)
            dist.all_reduce(again, op=dist.ReduceOp.SUM)
            return ({"error": {"code": type(e).__name__, "message": str(e)}, "work": None},
                    {"after_rejection": again})
        raise
    obs["error"] = None
    return obs, tensors


def all_gather_into_tensor(request):
    """test_allgather_base_basics: output = the rank-major concat of every rank's input."""
    import torch
    import torch.distributed as dist

    dtype, count, rank, world, in_place = _chunked_case(request)
    output = torch.full((world * count,), _SENTINEL, dtype=dtype)
    mine = _tensor(gather_values(rank, count), dtype)
    if in_place:
        input_ = output.narrow(0, rank * count, count)
        input_.copy_(mine)
    else:
        input_ = mine
    work = dist.all_gather_into_tensor(output, input_, async_op=_async(request))
    obs = {"work": _finish(work, _async(request))}
    tensors = {"output": output}
    if not in_place:
        tensors["input"] = input_
    return obs, tensors


def reduce_scatter_tensor(request):
    """test_reduce_scatter_base_basics: output = chunk `rank` of the reduction."""
    import torch
    import torch.distributed as dist

    dtype, count, rank, world, in_place = _chunked_case(request)
    values = reduce_inputs(world, count, rank, world * count)

    def call():
        input_ = _tensor(values, dtype)
        output = (input_.narrow(0, rank * count, count) if in_place
                  else torch.full((count,), _SENTINEL, dtype=dtype))
        work = dist.reduce_scatter_tensor(output, input_, op=_reduce_op(request),
                                          async_op=_async(request))
        obs = {"work": _finish(work, _async(request))}
        tensors = {"output": output.clone()}
        if not in_place:
            tensors["input"] = input_
        return obs, tensors

    return _reduction(request, dtype, values, call)


def _functional_all_reduce(request, tensor):
    """funcol.all_reduce(tensor, op, group) waited on; PREMUL_SUM has no string form with a
    factor, so such a case is skipped."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    op = request.param("op")
    if op == "premul_sum":
        raise ScenarioSkipped(
            "torch.distributed._functional_collectives.all_reduce takes the reduce op as a "
            "string (reduceOp: str) and has no way to pass PREMUL_SUM's per-rank factor")
    reduced = funcol.all_reduce(tensor, op, dist.group.WORLD)
    return funcol.wait_tensor(reduced) if hasattr(funcol, "wait_tensor") else reduced


def all_reduce(request):
    """test_all_reduce: the tensor becomes the reduction (api=functional: a new tensor)."""
    import torch.distributed as dist

    dtype, count = _dtype(request), request.int_param("count")
    values = reduce_inputs(request.world, count, request.rank, count)
    functional = request.param("api") == "functional"

    def call():
        tensor = _tensor(values, dtype)
        if functional:
            reduced = _functional_all_reduce(request, tensor)
            return {"work": None}, {"tensor": reduced.clone(), "input": tensor}
        work = dist.all_reduce(tensor, op=_reduce_op(request), async_op=_async(request))
        return {"work": _finish(work, _async(request))}, {"tensor": tensor}

    return _reduction(request, dtype, values, call)


def broadcast(request):
    """test_broadcast: every rank's tensor becomes the root's (root < 0 counts from the end)."""
    import torch.distributed as dist

    root = request.int_param("root")
    root = root + request.world if root < 0 else root
    tensor = _tensor(gather_values(request.rank, request.int_param("count")), _dtype(request))
    work = dist.broadcast(tensor, src=root, async_op=_async(request))
    return {"work": _finish(work, _async(request))}, {"tensor": tensor}


def broadcast_group(request):
    """test_broadcast_group (with test_get_rank_size_group) on a group of every rank but 0,
    its ranks listed from the last down: get_rank / get_world_size (-1 outside it), and on the
    members the group's ranks, an all-gather of the global rank over it and a broadcast from
    every member, in the listed order, of int64 [100 src, 100 src + 1, 100 src + 2]."""
    import torch
    import torch.distributed as dist

    listed = list(range(request.world - 1, 0, -1))
    group = dist.new_group(listed)
    obs = {"group_rank": dist.get_rank(group), "group_size": dist.get_world_size(group),
           "group_ranks": None, "gathered": None, "broadcasts": None}
    if request.rank not in listed:
        return obs, None
    obs["group_ranks"] = dist.get_process_group_ranks(group)
    gathered = torch.empty(dist.get_world_size(group), dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, torch.tensor([request.rank]), group=group)
    obs["gathered"] = gathered.tolist()
    obs["broadcasts"] = []
    for src in listed:
        tensor = torch.tensor([100 * request.rank + i for i in range(3)], dtype=torch.int64)
        dist.broadcast(tensor, src=src, group=group)
        obs["broadcasts"].append(tensor.tolist())
    return obs, None


def all_gather(request):
    """test_allgather: outputs[q] = rank q's input (count, + q mod 3 for counts=uneven)."""
    import torch
    import torch.distributed as dist

    dtype, count, rank, world, in_place = _chunked_case(request)

    def count_of(q):
        return count + q % 3 if request.param("counts") == "uneven" else count

    input_ = _tensor(gather_values(rank, count_of(rank)), dtype)
    outputs = [input_ if in_place and q == rank
               else torch.full((count_of(q),), _SENTINEL, dtype=dtype) for q in range(world)]
    try:
        work = dist.all_gather(outputs, input_, async_op=_async(request))
    except RuntimeError as e:
        # ProcessGroupGloo::allgather checks every output against the input's size before any
        # data moves, on every rank alike (NCCL gathers uneven lists with grouped broadcasts).
        if request.backend == "gloo" and "invalid tensor size" in str(e):
            raise ScenarioSkipped(
                f"Gloo's allgather requires every rank's tensor to have the same size (uneven "
                f"lists need NCCL's grouped-broadcast path): {str(e).splitlines()[0]}") from e
        raise
    obs = {"work": _finish(work, _async(request)),
           "output_numels": [out.numel() for out in outputs]}
    tensors = {"outputs": torch.cat(outputs)}
    if not in_place:
        tensors["input"] = input_
    return obs, tensors


def barrier(request):
    """test_barrier: in round k rank (world - 1 + k) mod world enters delay_ms late; the
    steady clock (time.monotonic_ns: CLOCK_MONOTONIC, as the judge's) before and after. A
    CommDebugMode is active over the rounds and one all_reduce (SUM, 1-element int64) after
    them: comm_counts {"barrier": its counts}."""
    import torch
    import torch.distributed as dist

    from fsdp_conform_driver.recorders import CommCounts

    delay_s = request.int_param("delay_ms") / 1000.0
    enter, leave = [], []
    counts = CommCounts(track_modules=False)
    with counts.phase("barrier"):
        for k in range(request.int_param("rounds")):
            if request.rank == (request.world - 1 + k) % request.world:
                time.sleep(delay_s)
            enter.append(time.monotonic_ns())
            dist.barrier()
            leave.append(time.monotonic_ns())
        dist.all_reduce(torch.ones(1, dtype=torch.int64))
    return {"enter_ns": enter, "leave_ns": leave,
            "comm_counts": counts.by_phase("barrier")}, None


def device_mesh(request):
    """test_device_mesh.py's TestDeviceMeshGetItem.test_get_item_3d (with test_get_local_rank_3d
    and test_get_group_and_get_all_groups): one mesh, init_device_mesh over the world
    (mesh_ranks=all) or DeviceMesh("cpu", tensor(mesh_ranks).reshape(mesh_shape)) over a subset
    of it (test_dtensor.py's test_redistribute_sub_mesh), everything a rank can read of it, and
    one all-gather over each dim's group when its ranks are the mesh's line through the rank. A
    rank outside the mesh reports every key null."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    shape = tuple(int(s) for s in request.param("mesh_shape").split(","))
    names = tuple(f"dim{d}" for d in range(len(shape)))
    spec = request.param("mesh_ranks")
    if spec == "all":
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    else:
        ranks = torch.tensor([int(r) for r in spec.split(",")]).reshape(shape)
        mesh = DeviceMesh("cpu", ranks, mesh_dim_names=names)
    if mesh.get_coordinate() is None:
        return {key: None for key in
                ("coordinate", "local_ranks", "group_ranks", "gathered", "sub_meshes")}, None
    obs = {"coordinate": list(mesh.get_coordinate()), "local_ranks": [], "group_ranks": [],
           "gathered": [], "sub_meshes": {}}
    for name in names:
        obs["local_ranks"].append(mesh.get_local_rank(name))
        group = mesh.get_group(name)
        group_ranks = dist.get_process_group_ranks(group)
        obs["group_ranks"].append(group_ranks)
        if group_ranks != sorted(mesh[name].mesh.flatten().tolist()):
            obs["gathered"].append(None)
            continue
        gathered = torch.empty(dist.get_world_size(group), dtype=torch.int64)
        dist.all_gather_into_tensor(gathered, torch.tensor([dist.get_rank()]), group=group)
        obs["gathered"].append(gathered.tolist())
    subs = [(d,) for d in range(len(names))] + [(d, d + 1) for d in range(len(names) - 1)]
    for dims in subs:
        sub = mesh[names[dims[0]]] if len(dims) == 1 else mesh[tuple(names[d] for d in dims)]
        obs["sub_meshes"][",".join(names[d] for d in dims)] = {
            "ranks": sub.mesh.flatten().tolist(), "coordinate": list(sub.get_coordinate())}
    return obs, None


SCENARIOS = {
    "collectives/all_gather_into_tensor": all_gather_into_tensor,
    "collectives/reduce_scatter_tensor": reduce_scatter_tensor,
    "collectives/all_reduce": all_reduce,
    "collectives/broadcast": broadcast,
    "collectives/broadcast_group": broadcast_group,
    "collectives/all_gather": all_gather,
    "collectives/barrier": barrier,
    "collectives/device_mesh": device_mesh,
}
