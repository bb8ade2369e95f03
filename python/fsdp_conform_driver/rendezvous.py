"""torch.distributed for one rank of a case: a FileStore in the case's store directory (a
fresh, empty directory the runner shares between the case's ranks) and the process group of
the backend the request names (gloo; nccl on GPU machines).

Ownership: init() creates the default process group; shutdown() destroys it (in a driver
session, after every case: the next case rendezvouses in its own store directory).
Thread-safety: call from the main thread, one init()/shutdown() pair per case.
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


def shutdown() -> None:
    """Ends the case's distributed state on this rank: a barrier (every rank's collectives of
    the case have completed), the default group destroyed, and a garbage collection, so that
    the case's modules and process groups (FSDP's reference cycles keep them alive) are freed
    now, while every peer is still connected, and not inside the next case (in a session, a
    Gloo group freed late blocked that rank's next rendezvous)."""
    import gc

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    gc.collect()
