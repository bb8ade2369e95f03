"""python -m fsdp_conform_driver.pytorch <protocol flags>: one rank of one case of the suite,
run by PyTorch FSDP2 (the driver of `make validate-pytorch`, docs/pytorch.md).

Setup per case, when no GPU is visible: the CPU stream shim when this torch's FSDP2 needs CUDA
streams (cpu_streams.py) and the copy-out's version counters (cpu_copy_out.py), each saying
exactly what it changes; then torch.distributed over the
request's backend from its store directory; after each case the process group is destroyed
(a session's next case rendezvouses afresh in its own store directory). Scenarios absent
from scenarios.SCENARIOS report `skipped`. `--capabilities` / `--serve`: driver sessions
(docs/drivers.md, "Persistent mode").
"""

import os
import sys

# One OpenMP thread per rank, as torchrun sets for several processes per machine: a case's
# ranks share the machine's cores, and PyTorch's intra-op threads spinning against each other
# made CPU cases several times slower (set OMP_NUM_THREADS to override). Before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from fsdp_conform_driver import Driver, ScenarioSkipped, rendezvous  # noqa: E402


def _setup(request) -> None:
    import torch

    if request.backend not in ("gloo", "nccl"):
        raise ScenarioSkipped(f"torch.distributed has no backend '{request.backend}'")
    if request.backend == "nccl" and not torch.cuda.is_available():
        raise ScenarioSkipped("backend nccl needs CUDA and none is visible")
    if not torch.cuda.is_available():
        from fsdp_conform_driver.pytorch import cpu_copy_out, cpu_streams

        cpu_streams.install()
        cpu_copy_out.install()
    torch.manual_seed(0)
    rendezvous.init(request)


def main() -> int:
    from fsdp_conform_driver.pytorch.scenarios import SCENARIOS

    driver = Driver("PyTorch FSDP2 driver", SCENARIOS, setup=_setup, teardown=rendezvous.shutdown)
    # Every case's process groups stay alive (rendezvous._RETIRED): a few threads and sockets
    # each, bounded by serving at most this many cases per process.
    driver.max_cases_per_process = 32
    return driver.main()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's finalization, which would free the retired process groups.
    os._exit(code)
