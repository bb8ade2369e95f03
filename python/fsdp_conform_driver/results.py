"""The result of one rank: the JSON object of --output ({"status": "ok" | "skipped" |
"error", ...}) and the observed tensors in the .safetensors file of --tensors-output. Both are
written to a temporary file and renamed, so the runner never reads half a file.

Ownership: the functions write the files the request names and nothing else. Thread-safety:
one writer per rank process.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

# The error codes the protocol knows (others read as Internal).
ERROR_CODES = ("InvalidArgument", "FailedPrecondition", "DeadlineExceeded", "DataLoss",
               "Unavailable", "NotFound", "Aborted", "Internal")


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _write_json(path: str, obj: dict) -> None:
    _write_atomically(path, (json.dumps(obj, allow_nan=False) + "\n").encode("utf-8"))


def write_tensors(path: str, tensors: Dict[str, "object"]) -> None:
    """The observed tensors (name -> torch.Tensor) as one .safetensors file (contiguous CPU
    copies; safetensors refuses shared or strided storage)."""
    from safetensors.torch import save

    plain = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}
    _write_atomically(path, save(plain, metadata={"format": "pt"}))


def _with_end_session(result: dict, end_session: Optional[str]) -> dict:
    """`end_session` (why), when given, asks the runner to end the driver session after this
    case: the rank could not return to a clean state (the case keeps its verdict)."""
    if end_session:
        result["end_session"] = end_session
    return result


def write_ok(request, observations: dict, tensors: Optional[Dict[str, "object"]] = None,
             end_session: Optional[str] = None) -> None:
    """status ok: the observations (JSON values) and, when any, the tensors file."""
    if tensors:
        write_tensors(request.tensors_output, tensors)
    _write_json(request.output, _with_end_session(
        {"status": "ok", "protocol": 2, "observations": observations}, end_session))


def write_skipped(request, reason: str, end_session: Optional[str] = None) -> None:
    _write_json(request.output,
                _with_end_session({"status": "skipped", "reason": reason}, end_session))


def write_error(request, code: str, message: str, end_session: Optional[str] = None) -> None:
    if code not in ERROR_CODES:
        code = "Internal"
    _write_json(request.output, _with_end_session(
        {"status": "error", "error": {"code": code, "message": message}}, end_session))
