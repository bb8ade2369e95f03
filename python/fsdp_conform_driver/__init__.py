"""The Python driver kit of fsdp-conformance: what a Python driver needs to serve the suite's
driver protocol (docs/scenarios.md, "The driver protocol"; docs/drivers.md).

  protocol    the flags and the request file of one rank of one case (Request)
  results     the result JSON and the tensors file the runner reads back
  inputs      the runner-owned inputs (weights, the rank's tensors), as torch tensors
  rendezvous  torch.distributed initialised from the case's store directory
  recorders   PyTorch's CommDebugMode keys and FSDP2's hooks mapped to the suite's events
  driver      the entry point: a table of scenario functions, dispatch, skips and errors,
              and driver sessions (--capabilities, --serve)

Thread-safety: a driver process serves one rank of one case at a time (one case, or a
session's cases one after another) on its main thread.
"""

from fsdp_conform_driver.driver import Driver, ScenarioSkipped, ScenarioError  # noqa: F401
from fsdp_conform_driver.protocol import PROTOCOL_VERSION, Request  # noqa: F401
