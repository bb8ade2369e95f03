"""fully_shard_mixed_precision/reduce_dtype_after_frozen_first_forward in PyTorch
(test_fully_shard_mixed_precision.py's test_reduce_dtype_after_frozen_first_forward; the
suite's side: conformance/fully_shard_mixed_precision_frozen_scenarios.cc).

The test's Model (layers: two Linear(dim, dim); non_float: a frozen ones(dim) parameter of
`frozen_dtype`, unused by forward), one fully_shard on the root with
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype); with `frozen_first_forward` the whole
model is frozen for a first forward under no_grad, then `layers` is unfrozen. Reports the error
of the whole sequence ("" when none), the backward's collectives and their payload bytes, and
each parameter's gradient dtype ("None" without one).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reduce_dtype_after_frozen_first_forward(request):
    import torch
    import torch.nn as nn

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, MixedPrecisionPolicy
    from fsdp_conform_driver.recorders import CommCounts

    dim = request.int_param("dim")
    frozen_dtype = getattr(torch, request.param("frozen_dtype"))
    reduce_name = request.param("reduce_dtype")
    reduce_dtype = None if reduce_name == "None" else getattr(torch, reduce_name)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(dim, dim), nn.Linear(dim, dim))
            self.non_float = nn.Parameter(torch.ones(dim, dtype=frozen_dtype),
                                          requires_grad=False)

        def forward(self, inp):
            return self.layers(inp)

    obs = {"error": "", "backward_comm_counts": {}, "backward_comm_bytes": {},
           "grad_dtypes": {}}
    try:
        torch.manual_seed(0)
        model = Model()
        fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                          reduce_dtype=reduce_dtype))
        inp = torch.zeros(4, dim)
        if request.param("frozen_first_forward") == "True":
            model.requires_grad_(False)
            with torch.no_grad():
                model(inp)
            model.layers.requires_grad_(True)
        loss = model(inp).sum()
        counts = CommCounts(track_modules=False, with_bytes=True)
        with counts.phase("backward"):
            loss.backward()
        obs["backward_comm_counts"] = counts.by_phase("backward")["backward"]
        obs["backward_comm_bytes"] = counts.bytes_by_phase("backward")["backward"]
        obs["grad_dtypes"] = {name: "None" if p.grad is None else _dtype_name(p.grad.dtype)
                              for name, p in model.named_parameters()}
    except Exception as e:  # noqa: BLE001 - the message is the observation, whatever the type
        obs["error"] = str(e)
    return obs, None


SCENARIOS = {
    "fully_shard_mixed_precision/reduce_dtype_after_frozen_first_forward":
        reduce_dtype_after_frozen_first_forward,
}
