"""fully_shard_mixed_precision's forward-cast scenarios in PyTorch
(TestFullyShardMixedPrecisionCasts; the suite's side: conformance/
fully_shard_mixed_precision_casts_scenarios.cc):

  forward_input_casts              test_float16_on_one_submodule's three subtests, and a root
                                   without parameters of its own that casts the input
  submodules_with_external_inputs  test_submodules_with_external_inputs, l2's second input
                                   passed positionally (the test) or by keyword

Each builds the test's model with Linear(dim, dim) layers, applies fully_shard as the subtest
does, runs model(zeros(2, dim)).sum().backward() and reports the dtype each module's forward
received (the test's forward_inputs, by the suite's keys) and the output's dtype.

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _run(model, policies, dim, forward_inputs):
    """fully_shard on every module of `policies` (FQN -> MixedPrecisionPolicy kwargs) but the
    root, then on the root ("" in `policies`); forward, backward; the observations."""
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, MixedPrecisionPolicy

    for fqn, policy in policies.items():
        if fqn:
            fully_shard(model.get_submodule(fqn), mp_policy=MixedPrecisionPolicy(**policy))
    fully_shard(model, mp_policy=MixedPrecisionPolicy(**policies.get("", {})))
    out = model(torch.zeros(2, dim))
    out.sum().backward()
    return {"forward_input_dtypes": {key: _dtype_name(t.dtype)
                                     for key, t in forward_inputs.items()},
            "output_dtype": _dtype_name(out.dtype)}, None


def forward_input_casts(request):
    import torch
    import torch.nn as nn

    dim = request.int_param("dim")
    low = getattr(torch, request.param("param_dtype"))
    subtest = request.param("subtest")

    class SaveForwardInputsModule(nn.Module):
        """common_distributed.py's, saving its input under `key`."""

        def __init__(self, forward_inputs, key, cast_forward_inputs):
            super().__init__()
            self.l = nn.Linear(dim, dim)
            self.forward_inputs, self.key = forward_inputs, key
            self.cast_forward_inputs = cast_forward_inputs

        def forward(self, x):
            self.forward_inputs[self.key] = x
            return self.l(x.to(self.l.weight.dtype) if self.cast_forward_inputs else x)

    class SaveForwardInputsModel(nn.Module):
        def __init__(self, forward_inputs, cast_forward_inputs):
            super().__init__()
            self.c1 = SaveForwardInputsModule(forward_inputs, "c1", cast_forward_inputs)
            self.c2 = SaveForwardInputsModule(forward_inputs, "c2", cast_forward_inputs)
            self.forward_inputs = forward_inputs

        def forward(self, x):
            self.forward_inputs[""] = x
            return self.c2(self.c1(x))

    policies = {
        "c2_param_dtype": {"c2": {"param_dtype": low}},
        "c2_param_dtype_module_casts": {"c2": {"param_dtype": low, "cast_forward_inputs": False}},
        "c1_param_dtype_output_float32": {
            "c1": {"param_dtype": low, "output_dtype": torch.float32}},
        # The suite's: the root has no parameter of its own (c1, c2 have their groups) and casts.
        "root_casts_without_own_params": {
            "c1": {"param_dtype": low, "cast_forward_inputs": False},
            "c2": {"param_dtype": low, "cast_forward_inputs": False},
            "": {"param_dtype": low}},
    }[subtest]
    forward_inputs = {}
    torch.manual_seed(0)
    model = SaveForwardInputsModel(forward_inputs,
                                   cast_forward_inputs=subtest == "c2_param_dtype_module_casts")
    return _run(model, policies, dim, forward_inputs)


def submodules_with_external_inputs(request):
    import torch
    import torch.nn as nn

    dim = request.int_param("dim")
    low = getattr(torch, request.param("param_dtype"))
    y_by_keyword = request.param("y_by_keyword") == "True"

    class ToyModule(nn.Module):
        def __init__(self, forward_inputs):
            super().__init__()
            self.l = nn.Linear(dim, dim)
            self.forward_inputs = forward_inputs

        def forward(self, x, y):
            self.forward_inputs["l2_input_x"] = x
            self.forward_inputs["l2_input_y"] = y
            return self.l(x)

    class ToyModel(nn.Module):
        def __init__(self, forward_inputs):
            super().__init__()
            self.l1 = nn.Linear(dim, dim)
            self.l2 = ToyModule(forward_inputs)
            self.forward_inputs = forward_inputs

        def forward(self, x):
            self.forward_inputs["model_input_x"] = x
            y = torch.ones(2, dim, dtype=torch.float32)  # the external input
            h = self.l1(x)
            return self.l2(h, y=y) if y_by_keyword else self.l2(h, y)

    forward_inputs = {}
    torch.manual_seed(0)
    policies = {
        "l2": {"param_dtype": low,
               "cast_forward_inputs": request.param("enable_submodule_cast") == "True"},
        "": {"param_dtype": low},
    }
    return _run(ToyModel(forward_inputs), policies, dim, forward_inputs)


SCENARIOS = {
    "fully_shard_mixed_precision/forward_input_casts": forward_input_casts,
    "fully_shard_mixed_precision/submodules_with_external_inputs":
        submodules_with_external_inputs,
}
