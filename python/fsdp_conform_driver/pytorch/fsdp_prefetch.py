"""fsdp_prefetch/backward_prefetch and fsdp_prefetch/forward_prefetch in PyTorch: the zoo's
Transformer wrapped by FullyShardedDataParallel as parity/fsdp1 wraps it (an instance around
every child the suite nests), with the case's sharding_strategy, backward_prefetch and
forward_prefetch, trained `steps` steps. Every step's events are recorded in order, as
test_fsdp_backward_prefetch.py patches FSDP's runtime to see them:

* ["unshard", FQN, HandleTrainingState]: `_runtime_utils._unshard` of a flat parameter that
  is not unsharded (`FlatParamHandle.needs_unshard()`, so an all-gather follows);
* ["reshard", FQN, HandleTrainingState]: `_runtime_utils._reshard` freeing the unsharded flat
  parameter;
* ["all_gather"], ["reduce_scatter"], ["all_reduce"]: the torch.distributed collectives FSDP
  calls through the module (_COLLECTIVES).

FQN is the instance's module path without `_fsdp_wrapped_module` (the root's is "").

`frozen_blocks` ("none" or block indices "1,2"): those blocks' parameters get
requires_grad=False before wrapping, as test_fsdp_fine_tune.py freezes modules, so their flat
parameters are resharded by `_post_backward_reshard_only_hook` (its `_reshard` is recorded like
any other).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import contextlib

from fsdp_conform_driver.pytorch import parity

# torch.distributed function -> the event naming the collective. FSDP1 all-gathers a flat
# parameter with all_gather_into_tensor, or on a CPU with all_gather into chunks (2.5), or with
# all_gather_single (2.15); it reduce-scatters with reduce_scatter_tensor (2.5) or
# reduce_scatter_single (2.15).
_COLLECTIVES = {
    "all_gather_into_tensor": "all_gather",
    "all_gather": "all_gather",
    "all_gather_single": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_reduce": "all_reduce",
}


def _instance_fqns(root):
    """id(FlatParamHandle) -> the FQN of the FullyShardedDataParallel instance holding it."""
    from fsdp_conform_driver.pytorch.fsdp1_api import instances

    return {id(module._handle): fqn for fqn, module in instances(root)
            if module._handle is not None}


@contextlib.contextmanager
def _recording(root, events):
    """Appends to `events` every unshard, reshard and collective (module docstring) while
    active; restores what it patched on exit."""
    import torch.distributed as dist
    from torch.distributed.fsdp import _runtime_utils

    fqns = _instance_fqns(root)
    saved_runtime = {"_unshard": _runtime_utils._unshard, "_reshard": _runtime_utils._reshard}
    saved_dist = {name: getattr(dist, name) for name in _COLLECTIVES if hasattr(dist, name)}

    def unshard(state, handle, *args, **kwargs):
        if handle is not None and handle.needs_unshard():
            events.append(["unshard", fqns[id(handle)], handle._training_state.name])
        return saved_runtime["_unshard"](state, handle, *args, **kwargs)

    def reshard(state, handle, free_unsharded_flat_param, *args, **kwargs):
        if handle is not None and free_unsharded_flat_param:
            events.append(["reshard", fqns[id(handle)], handle._training_state.name])
        return saved_runtime["_reshard"](state, handle, free_unsharded_flat_param, *args,
                                         **kwargs)

    def collective(name, original):
        def call(*args, **kwargs):
            events.append([_COLLECTIVES[name]])
            return original(*args, **kwargs)
        return call

    _runtime_utils._unshard = unshard
    _runtime_utils._reshard = reshard
    for name, original in saved_dist.items():
        setattr(dist, name, collective(name, original))
    try:
        yield
    finally:
        for name, original in saved_runtime.items():
            setattr(_runtime_utils, name, original)
        for name, original in saved_dist.items():
            setattr(dist, name, original)


def _freeze_blocks(model, frozen_blocks: str) -> None:
    """requires_grad_(False) on the parameters of the blocks `frozen_blocks` names."""
    if frozen_blocks == "none":
        return
    for index in frozen_blocks.split(","):
        model.layers[int(index)].requires_grad_(False)


def run(request):
    from fsdp_conform_driver.pytorch.fsdp1_api import nest_where, wrap

    model, _ = parity._build("transformer", request)
    _freeze_blocks(model, request.params.get("frozen_blocks", "none"))
    nested = {id(m) for m in parity._children_to_shard(model)}
    fsdp_model = wrap(request, model, nest_where(lambda m: id(m) in nested))
    events, steps = [], []

    def after_step(model, k, tensors):
        # The optimizer step communicates nothing: the step's events end here.
        steps.append(list(events))
        events.clear()

    with _recording(fsdp_model, events):
        obs, tensors = parity._train(request, fsdp_model, after_step=after_step)
    obs["fsdp1_events"] = steps
    return obs, tensors


_REUSED_DIM = 4


def run_reused_module(request):
    """fsdp_prefetch/forward_prefetch_reused_module: a root without parameters of its own
    holding a and b (each a Linear(4, 4) in its own instance) whose forward calls a, b, then a
    again on a clone of b's output; `steps` iterations of forward and out.sum().backward(), each
    forward's all-gathers counted (the collectives `_recording` sees), and the backward's up to
    the gradient of that clone (its tensor hook runs after a's pre-backward, before b's).
    `_get_handle_to_prefetch` skips b at a's second pre-forward: b's
    `_needs_pre_forward_unshard` is already False."""
    import torch
    from fsdp_conform_driver.pytorch.fsdp1_api import nest_where, wrap

    events, counts, at_b_output = [], [], []

    def count_backward_all_gathers(grad):
        # The events were cleared after the forward: these are the backward's so far.
        at_b_output.append(sum(1 for event in events if event == ["all_gather"]))

    class ReusedChildModel(torch.nn.Module):
        """forward(x) = a(b(a(x))), b's output cloned and hooked before a's second call."""

        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(_REUSED_DIM, _REUSED_DIM)
            self.b = torch.nn.Linear(_REUSED_DIM, _REUSED_DIM)

        def forward(self, x):
            b_output = self.b(self.a(x)).clone()
            if b_output.requires_grad:
                b_output.register_hook(count_backward_all_gathers)
            return self.a(b_output)

    model = ReusedChildModel()
    children = {id(model.a), id(model.b)}
    fsdp_model = wrap(request, model, nest_where(lambda m: id(m) in children))
    with _recording(fsdp_model, events):
        for _ in range(int(request.param("steps"))):
            events.clear()
            out = fsdp_model(torch.ones(2, _REUSED_DIM))
            counts.append(sum(1 for event in events if event == ["all_gather"]))
            events.clear()
            out.sum().backward()
    return {"forward_all_gathers": counts, "backward_all_gathers_at_b_output": at_b_output}, {}


SCENARIOS = {
    "fsdp_prefetch/backward_prefetch": run,
    "fsdp_prefetch/forward_prefetch": run,
    "fsdp_prefetch/forward_prefetch_reused_module": run_reused_module,
}
