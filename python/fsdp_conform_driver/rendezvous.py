"""torch.distributed for one rank of a case: a FileStore in the case's store directory (a
fresh, empty directory the runner shares between the case's ranks) and the process group of
the backend the request names (gloo; nccl on GPU machines).

Ownership: init() creates the default process group; shutdown() destroys it (in a driver
session, after every case: the next case rendezvouses in its own store directory) but keeps
every process group object of the case alive for the rest of the process (_RETIRED; see
shutdown()). Thread-safety: call from the main thread, one init()/shutdown() pair per case.
"""

from __future__ import annotations

import datetime
import os


def init(request):
    """Initialises the default process group for `request` and returns it."""
    import torch.distributed as dist

    store = dist.FileStore(os.path.join(request.store_dir, "torch_filestore"), request.world)
    timeout = datetime.timedelta(seconds=max(1.0, min(request.timeout_s, 24 * 3600.0)))
    dist.init_process_group(backend=request.backend, store=store, rank=request.rank,
                            world_size=request.world, timeout=timeout)
    return dist.group.WORLD


# The process groups of finished cases. Freeing a ProcessGroupGloo runs its C++ destructor
# with the GIL held, and it joins worker threads that can be waiting for the GIL to release a
# Python reference (pytorch/pytorch: a Gloo group freed by the garbage collector now and then
# hung the rank for good, inside gc.collect() or, freed late, inside the next case). So no
# case's group is ever freed: the driver ends its process with os._exit and serves a bounded
# number of cases per process (Driver.max_cases_per_process).
_RETIRED = []


def shutdown() -> None:
    """Ends the case's distributed state on this rank: a barrier (every rank's collectives of
    the case have completed), every group of the case retired (kept alive, see _RETIRED) and
    the default group destroyed, then a garbage collection of the case's modules (FSDP's
    reference cycles keep them alive), now rather than inside the next case."""
    import gc

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        from torch.distributed import distributed_c10d

        world = getattr(distributed_c10d, "_world", None)
        groups = list(getattr(world, "pg_map", {}).keys()) if world is not None else []
        _RETIRED.extend(groups or [dist.group.WORLD])
        dist.destroy_process_group()
    gc.collect()
