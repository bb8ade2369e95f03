"""The entry point of a driver built on the kit: a table {scenario name: function(request)}
whose function returns (observations, tensors) or raises ScenarioSkipped / ScenarioError.
Driver.main() parses the flags, runs the function and writes the result: ok (exit 0),
skipped (exit 0; every scenario absent from the table is skipped naming the driver), error
(exit 1; exceptions become Internal, or the code of a ScenarioError), or exit 2 without a
result when the flags do not follow the protocol.

The protocol runs one process per rank per case (docs/drivers.md, "Persistent mode"), so a
Driver serves exactly one request per process.

Ownership: Driver owns its table. Thread-safety: main() runs on the process's main thread.
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable, Dict, Optional, Tuple

from fsdp_conform_driver import protocol, results


class ScenarioSkipped(Exception):
    """The driver cannot run this case (the reason goes to the table as SKIP)."""


class ScenarioError(Exception):
    """The case failed with one of the protocol's error codes (results.ERROR_CODES)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


ScenarioFn = Callable[[protocol.Request], Tuple[dict, Optional[dict]]]


class Driver:
    def __init__(self, name: str, scenarios: Dict[str, ScenarioFn],
                 setup: Optional[Callable[[protocol.Request], None]] = None) -> None:
        self.name = name
        self.scenarios = dict(scenarios)
        self.setup = setup

    def run(self, request: protocol.Request) -> int:
        fn = self.scenarios.get(request.scenario)
        if fn is None:
            results.write_skipped(request, f"{self.name} does not implement {request.scenario}")
            return 0
        try:
            if self.setup is not None:
                self.setup(request)
            observations, tensors = fn(request)
        except ScenarioSkipped as skipped:
            results.write_skipped(request, f"{self.name}: {skipped}")
            return 0
        except ScenarioError as error:
            results.write_error(request, error.code, str(error))
            return 1
        except Exception as error:  # noqa: BLE001 - every failure is reported to the runner
            traceback.print_exc()
            results.write_error(request, "Internal", f"{type(error).__name__}: {error}")
            return 1
        results.write_ok(request, observations, tensors)
        return 0

    def main(self, argv=None) -> int:
        args = sys.argv[1:] if argv is None else list(argv)
        try:
            request = protocol.parse_args(args)
        except (protocol.UsageError, ValueError) as error:
            print(f"{self.name}: error: {error}", file=sys.stderr)
            return 2
        return self.run(request)
