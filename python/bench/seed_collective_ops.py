"""PyTorch's own threaded run of TestFullyShardCollectiveOps against fsdp-conform, timed in one run.

PyTorch's test_fully_shard_comm.py runs its data-path tests (test_all_gather_fp32,
test_reduce_scatter_fp32, test_reduce_scatter_fp16) with 128 ranks as threads of one process
(FSDPTestMultiThread: the "threaded" process group of torch.testing._internal). This program runs
the same test bodies the same way on the CPU (PyTorch's FSDP2 internals: FSDPParamGroup,
foreach_all_gather, foreach_all_gather_copy_out, foreach_reduce; CUDA streams replaced by the
driver's no-op CPU streams, which on a CPU only order what already runs in program order), then
runs the matching fsdp-conform scenarios (fully_shard_comm/all_gather_fp32, reduce_scatter_fp32,
reduce_scatter_fp16) at the same world, and prints each test's wall time on both sides and their
ratio. Each side's time covers the whole test: starting the ranks, the test body with its checks,
and ending the ranks (for fsdp-conform, the whole process: its start, every case and the judge).

Usage (the venv's python; the driver package on PYTHONPATH):
  make bench-pytorch-seeds   (torch 2.5.1's venv from `make validate-pytorch`), or
  PYTHONPATH=python .venv-torch-2.5.1/bin/python python/bench/seed_collective_ops.py \
      --fsdp-conform build/default/tools/fsdp-conform [--world 128] [--rounds 3] [--json FILE]

The test bodies follow PyTorch's test/distributed/_composable/fsdp/test_fully_shard_comm.py
(BSD-3-Clause), with the device the CPU and streams the driver's CPU streams.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import distributed_c10d as c10d
from torch.testing._internal.distributed.multi_threaded_pg import (
    ProcessLocalGroup,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)

from fsdp_conform_driver.pytorch import cpu_streams

PARAM_SIZES = [
    torch.Size([17, 257]),
    torch.Size([17]),
    torch.Size([64, 312]),
    torch.Size([64]),
    torch.Size([64, 64]),
    torch.Size([512, 64]),
    torch.Size([256]),
    torch.Size([64, 297]),
]
DEVICE = torch.device("cpu")


def _fsdp():
    """PyTorch's FSDP2 internals the tests call, as the 2.4 and 2.5 releases lay them out (later
    releases moved them and changed foreach_reduce's parameters)."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) not in ((2, 4), (2, 5)):
        raise SystemExit(f"seed_collective_ops: torch {torch.__version__} is not supported: the "
                         "test bodies call FSDP2 internals as torch 2.4 and 2.5 define them")
    from torch.distributed._composable.fsdp import (
        MixedPrecisionPolicy,
        OffloadPolicy,
        _fsdp_collectives as coll,
        _fsdp_common as common,
        _fsdp_init as init,
        _fsdp_param_group as group,
    )

    return coll, common, init, group, MixedPrecisionPolicy, OffloadPolicy


def _init_params():
    torch.manual_seed(42)
    params = [nn.Parameter(torch.randn(size, device=DEVICE)) for size in PARAM_SIZES]
    # The seed is per process, not per thread: broadcast so that every rank has rank 0's.
    for p in params:
        dist.broadcast(p, src=0)
    return params


def _init_fsdp_param_group(params, reshard_after_forward):
    _, common, init, group, MixedPrecisionPolicy, OffloadPolicy = _fsdp()
    module = nn.ParameterList([p.detach().clone() for p in params])
    mesh_info = common.FSDPMeshInfo(init._init_default_fully_shard_mesh(), shard_mesh_dim=0)
    post_forward_mesh_info = init._get_post_forward_mesh_info(reshard_after_forward, mesh_info)
    fsdp_param_group = group.FSDPParamGroup(
        list(module.parameters()), (module,), mesh_info, post_forward_mesh_info, DEVICE,
        MixedPrecisionPolicy(), OffloadPolicy())
    fsdp_param_group.lazy_init()
    return fsdp_param_group


def _check_equal(actual, expected, what):
    if not torch.equal(actual, expected):
        raise AssertionError(f"{what}: differs from the original")


def test_all_gather_fp32(rank):
    coll = _fsdp()[0]
    default_stream = torch.cuda.current_stream()
    stream1, stream2 = cpu_streams.CpuStream(), cpu_streams.CpuStream()
    for async_op, streams, reshard_after_forward in itertools.product(
            (False, True), ((default_stream, default_stream), (stream1, stream2)),
            (True, 8 if dist.get_world_size() % 8 == 0 else 2)):
        copy_in_stream, all_gather_stream = streams
        if type(reshard_after_forward) is int and (async_op or
                                                   all_gather_stream is default_stream):
            continue
        orig_params = _init_params()
        fsdp_param_group = _init_fsdp_param_group(orig_params, reshard_after_forward)
        fsdp_params = fsdp_param_group.fsdp_params
        module = fsdp_param_group.modules[0]
        for orig, param in zip(orig_params, module.parameters()):
            _check_equal(param.full_tensor(), orig, "full_tensor()")

        def all_gather(group):
            result = coll.foreach_all_gather(fsdp_params, group, async_op=async_op,
                                             all_gather_copy_in_stream=copy_in_stream,
                                             all_gather_stream=all_gather_stream, device=DEVICE)
            coll.foreach_all_gather_copy_out(result, fsdp_params, group)
            for fsdp_param in fsdp_params:
                fsdp_param.init_unsharded_param()
            fsdp_param_group._to_unsharded()

        all_gather(fsdp_param_group.mesh_info.shard_process_group)
        for orig, param in zip(orig_params, module.parameters()):
            _check_equal(param, orig.to(param.dtype), "all-gathered parameter")
        if type(reshard_after_forward) is not int:
            continue
        fsdp_param_group._to_sharded_post_forward()
        all_gather(fsdp_param_group.post_forward_mesh_info.shard_process_group)
        for orig, param in zip(orig_params, module.parameters()):
            _check_equal(param, orig.to(param.dtype), "post-forward all-gathered parameter")


def _test_reduce_scatter(rank, reduce_scatter_dtype):
    coll = _fsdp()[0]
    default_stream = torch.cuda.current_stream()
    for reduce_scatter_stream in (default_stream, cpu_streams.CpuStream()):
        orig_params = _init_params()
        fsdp_param_group = _init_fsdp_param_group(orig_params, True)
        fsdp_params = fsdp_param_group.fsdp_params
        fsdp_param_group.comm_ctx.lazy_init()
        fsdp_param_group.unshard()
        fsdp_param_group.wait_for_unshard()
        fsdp_param_group.reshard()
        torch.manual_seed(42)
        unsharded_grads = [torch.ones_like(p) * rank for p in orig_params]
        group = fsdp_param_group.mesh_info.shard_process_group
        kwargs = dict(orig_dtype=orig_params[0].dtype, reduce_dtype=reduce_scatter_dtype,
                      device=DEVICE, all_reduce_group=None,
                      all_reduce_stream=cpu_streams.CpuStream(), all_reduce_grads=True,
                      partial_reduce_output=None)
        if "reduce_scatter_reduce_op" in inspect.signature(coll.foreach_reduce).parameters:
            kwargs["reduce_scatter_reduce_op"] = None  # 2.5 (2.4 has no such parameter)
        _, _, post_reduce_event, _ = coll.foreach_reduce(fsdp_params, unsharded_grads, group,
                                                         reduce_scatter_stream, **kwargs)
        torch.cuda.current_stream().wait_event(post_reduce_event)
        predivide, postdivide = coll._get_gradient_divide_factors(group, None,
                                                                  reduce_scatter_dtype)
        for fsdp_param, grad in zip(fsdp_params, unsharded_grads):
            reduced = grad.detach().clone()
            coll._div_if_needed(reduced, predivide)
            dist.all_reduce(reduced, group=group,
                            op=dist.ReduceOp.AVG if predivide is None else dist.ReduceOp.SUM)
            coll._div_if_needed(reduced, postdivide)
            _check_equal(fsdp_param.sharded_param.grad.full_tensor(), reduced, "reduced gradient")


TESTS = {
    "test_all_gather_fp32": ("fully_shard_comm/all_gather_fp32", test_all_gather_fp32),
    "test_reduce_scatter_fp32": ("fully_shard_comm/reduce_scatter_fp32",
                                 lambda rank: _test_reduce_scatter(rank, torch.float32)),
    "test_reduce_scatter_fp16": ("fully_shard_comm/reduce_scatter_fp16",
                                 lambda rank: _test_reduce_scatter(rank, torch.float16)),
}


def run_threaded(world, body) -> float:
    """Runs body(rank) on `world` threads over PyTorch's threaded process group, as
    MultiThreadedTestCase's set-up, run and join do; returns the wall seconds; raises the first
    rank's error."""
    start = time.perf_counter()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    errors = []

    def worker(rank):
        c10d.init_process_group(backend="threaded", rank=rank, world_size=world, store=store)
        try:
            body(rank)
        except BaseException as ex:  # noqa: BLE001 - reported below with its rank
            errors.append((rank, ex))
            ProcessLocalGroup.exception_handle(ex)
        finally:
            c10d.destroy_process_group()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ProcessLocalGroup.reset()
    _uninstall_threaded_pg()
    torch._C._distributed_c10d._set_thread_isolation_mode(False)
    seconds = time.perf_counter() - start
    if errors:
        rank, ex = min(errors, key=lambda e: e[0])
        raise RuntimeError(f"PyTorch threaded run, rank {rank}: {ex!r}") from ex
    return seconds


def run_fsdp_conform(binary, scenario, world) -> float:
    start = time.perf_counter()
    proc = subprocess.run([binary, "run", scenario, "--world", str(world)], capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{scenario}: fsdp-conform exited {proc.returncode}:\n{proc.stdout}"
                           f"{proc.stderr}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fsdp-conform", required=True, help="the fsdp-conform binary")
    ap.add_argument("--world", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per test")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    _fsdp()  # refuses an unsupported torch before any thread starts
    cpu_streams.install()
    rows = []
    print(f"# world {args.world}, torch {torch.__version__}, {args.rounds} alternating rounds")
    print(f"{'test':28} {'pytorch_s':>10} {'fsdp_conform_s':>15} {'ratio':>7}")
    for test, (scenario, body) in TESTS.items():
        pytorch_s, ours_s = [], []
        for _ in range(args.rounds):
            pytorch_s.append(run_threaded(args.world, body))
            ours_s.append(run_fsdp_conform(args.fsdp_conform, scenario, args.world))
        p, o = statistics.median(pytorch_s), statistics.median(ours_s)
        rows.append({"test": test, "scenario": scenario, "world": args.world,
                     "pytorch_seconds": pytorch_s, "fsdp_conform_seconds": ours_s,
                     "ratio_of_medians": p / o})
        print(f"{test:28} {p:10.2f} {o:15.2f} {p / o:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
