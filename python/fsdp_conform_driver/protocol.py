"""The driver protocol's request: the flags one rank's process is started with, parsed
strictly (conformance/driver_protocol.h, DriverRequest::FromArgs: every required flag exactly
once, in pairs, no unknown flag), and the request file (rankR.request.json) beside them.

Ownership: a Request is a plain value; it owns nothing on disk. Thread-safety: immutable after
parse_args().
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, List

PROTOCOL_VERSION = 2

# The flags every request carries, exactly once each (values never empty).
_REQUIRED = ("--protocol", "--scenario", "--rank", "--world", "--backend", "--store-dir",
             "--output", "--request", "--timeout-s", "--tensors-output")
# The flags that repeat (ROLE=FILE / KEY=VALUE).
_REPEATED = ("--input", "--param")


class UsageError(ValueError):
    """The flags do not follow the protocol; the driver exits 2 without writing a result."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One rank of one case, as the runner asked for it."""
    protocol: int
    scenario: str
    rank: int
    world: int
    backend: str
    store_dir: str
    output: str
    request_file: str
    timeout_s: float
    tensors_output: str
    inputs: Dict[str, str]
    params: Dict[str, str]

    @property
    def family(self) -> str:
        return self.scenario.split("/", 1)[0]

    def param(self, key: str) -> str:
        """The case's value of `key` (the runner resolves every parameter: no defaults here)."""
        if key not in self.params:
            raise UsageError(f"scenario {self.scenario}: the request has no parameter '{key}'; "
                             f"parameters: {', '.join(sorted(self.params)) or '(none)'}")
        return self.params[key]

    def int_param(self, key: str) -> int:
        return int(self.param(key))

    def request_json(self) -> dict:
        """The request file: the flags as JSON plus the scenario's description, seed test,
        input description and observation schema."""
        with open(self.request_file, encoding="utf-8") as f:
            return json.load(f)


def _split_pair(flag: str, value: str) -> tuple:
    key, sep, rest = value.partition("=")
    if not sep or not key:
        raise UsageError(f"{flag} '{value}' is not KEY=VALUE")
    return key, rest


def parse_args(args: List[str]) -> Request:
    """The Request of `args` (without the program name). Raises UsageError naming the flag."""
    if len(args) % 2:
        raise UsageError(f"flags come in pairs; '{args[-1]}' has no value")
    single: Dict[str, str] = {}
    repeated: Dict[str, Dict[str, str]] = {flag: {} for flag in _REPEATED}
    for flag, value in zip(args[0::2], args[1::2]):
        if flag in _REPEATED:
            key, rest = _split_pair(flag, value)
            if key in repeated[flag]:
                raise UsageError(f"{flag} {key}= given twice")
            repeated[flag][key] = rest
        elif flag in _REQUIRED:
            if flag in single:
                raise UsageError(f"{flag} given twice")
            if not value:
                raise UsageError(f"{flag} has an empty value")
            single[flag] = value
        else:
            raise UsageError(f"unknown flag '{flag}'; flags: {', '.join(_REQUIRED + _REPEATED)}")
    missing = [flag for flag in _REQUIRED if flag not in single]
    if missing:
        raise UsageError(f"missing flag(s): {', '.join(missing)}")
    protocol = int(single["--protocol"])
    if protocol != PROTOCOL_VERSION:
        raise UsageError(f"--protocol {protocol}: this kit speaks protocol {PROTOCOL_VERSION}")
    return Request(protocol=protocol, scenario=single["--scenario"],
                   rank=int(single["--rank"]), world=int(single["--world"]),
                   backend=single["--backend"], store_dir=single["--store-dir"],
                   output=single["--output"], request_file=single["--request"],
                   timeout_s=float(single["--timeout-s"]),
                   tensors_output=single["--tensors-output"],
                   inputs=repeated["--input"], params=repeated["--param"])
