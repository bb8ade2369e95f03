"""The runner-owned inputs of a case (--input weights=FILE, --input rank=FILE): safetensors
files the runner writes, loaded as torch tensors. The weights file holds every key of the
model's state_dict() (tied parameters under each key, buffers included); the rank file holds
this rank's tensors, e.g. step0/input, step1/input.

Ownership: returns fresh tensors; the files belong to the runner. Thread-safety: stateless.
"""

from __future__ import annotations

from typing import Dict


def _load(request, role: str) -> Dict[str, "object"]:
    from safetensors.torch import load_file

    if role not in request.inputs:
        raise FileNotFoundError(
            f"scenario {request.scenario}: the request has no --input {role}=FILE; inputs: "
            f"{', '.join(sorted(request.inputs)) or '(none)'}")
    return load_file(request.inputs[role])


def weights(request) -> Dict[str, "object"]:
    """The model's initial state_dict() (load it with load_state_dict(strict=True))."""
    return _load(request, "weights")


def rank_tensors(request) -> Dict[str, "object"]:
    """This rank's own tensors by name (step{k}/input, ...)."""
    return _load(request, "rank")


def step_input(request, step: int):
    """The rank's model input of step `step` (its slice of the step's global batch)."""
    tensors = rank_tensors(request)
    name = f"step{step}/input"
    if name not in tensors:
        raise KeyError(f"rank input file {request.inputs['rank']} has no tensor '{name}'; "
                       f"tensors: {', '.join(sorted(tensors))}")
    return tensors[name]
