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
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
