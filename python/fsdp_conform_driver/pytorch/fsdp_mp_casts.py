"""fsdp_mixed_precision's scenarios in PyTorch's FSDP1 (test_fsdp_mixed_precision.py,
TestFSDPDifferentSubmodulePrecision; the suite's side: conformance/
fsdp_mixed_precision_scenarios.cc):

  different_submodule_precision    test_float16_on_one_submodule, its _skip_inputs variant,
                                   test_submodules_with_different_precisions and a root with
                                   cast_root_forward_inputs=False
  submodules_with_external_inputs  test_submodules_with_external_inputs, l2's second input
                                   passed positionally (the test) or by keyword, l2's
                                   cast_forward_inputs off (the test) or on, the root in
                                   param_dtype (the test) or without mixed precision

Each builds the test's model (fully_shard_mp_casts.py's), wraps the configured submodule in its
own FullyShardedDataParallel, then the model, runs model(zeros(2, dim)).sum().backward() and
reports the dtype each module's forward received and the output's dtype.

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver.pytorch.fully_shard_mp_casts import (observations,
                                                               save_forward_inputs_model,
                                                               toy_model)


def _run(model, configs, dim, forward_inputs):
    """`model.<fqn> = FSDP(model.<fqn>, mixed_precision=MixedPrecision(**kwargs))` for every
    submodule of `configs` (FQN -> kwargs), then FSDP(model) with configs[""] (None when
    empty); forward, backward; the observations."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision

    cpu = torch.device("cpu")
    for fqn, kwargs in configs.items():
        if fqn:
            setattr(model, fqn, FSDP(getattr(model, fqn), device_id=cpu,
                                     mixed_precision=MixedPrecision(**kwargs)))
    root = configs.get("", {})
    fsdp = FSDP(model, device_id=cpu, mixed_precision=MixedPrecision(**root) if root else None)
    out = fsdp(torch.zeros(2, dim))
    out.sum().backward()
    return observations(forward_inputs, out), None


def different_submodule_precision(request):
    import torch

    dim = request.int_param("dim")
    low = getattr(torch, request.param("param_dtype"))
    subtest = request.param("subtest")
    configs = {
        "float16_on_one_submodule": {"c2": {"param_dtype": low, "cast_forward_inputs": True}},
        "float16_on_one_submodule_skip_inputs": {
            "c2": {"param_dtype": low, "cast_forward_inputs": False}},
        "submodules_with_different_precisions": {
            "c2": {"param_dtype": low, "cast_forward_inputs": True},
            "": {"param_dtype": torch.float32, "cast_forward_inputs": True}},
        # The suite's: the root leaves the input alone, the modules cast it themselves.
        "root_without_cast_root_forward_inputs": {
            "": {"param_dtype": low, "cast_root_forward_inputs": False}},
    }[subtest]
    forward_inputs = {}
    torch.manual_seed(0)
    model = save_forward_inputs_model(
        dim, forward_inputs,
        cast_forward_inputs=subtest in ("float16_on_one_submodule_skip_inputs",
                                        "root_without_cast_root_forward_inputs"))
    return _run(model, configs, dim, forward_inputs)


def submodules_with_external_inputs(request):
    import torch

    dim = request.int_param("dim")
    low = getattr(torch, request.param("param_dtype"))
    configs = {"l2": {"param_dtype": low,
                      "cast_forward_inputs": request.param("enable_submodule_cast") == "True"}}
    if request.param("root_mixed_precision") == "param_dtype":
        configs[""] = {"param_dtype": low}
    forward_inputs = {}
    torch.manual_seed(0)
    model = toy_model(dim, forward_inputs, request.param("y_by_keyword") == "True")
    return _run(model, configs, dim, forward_inputs)


SCENARIOS = {
    "fsdp_mixed_precision/different_submodule_precision": different_submodule_precision,
    "fsdp_mixed_precision/submodules_with_external_inputs": submodules_with_external_inputs,
}
