"""fully_shard_mixed_precision's forward-cast scenarios in PyTorch
(TestFullyShardMixedPrecisionCasts; the suite's side: conformance/
fully_shard_mixed_precision_casts_scenarios.cc), and the tests' models, which FSDP1's
(fsdp_mp_casts.py) share:

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


def observations(forward_inputs, out):
    """forward_input_dtypes and output_dtype of a forward that saved `forward_inputs`."""
    return {"forward_input_dtypes": {key: _dtype_name(t.dtype)
                                     for key, t in forward_inputs.items()},
            "output_dtype": _dtype_name(out.dtype)}


def save_forward_inputs_model(dim, forward_inputs, cast_forward_inputs):
    """common_distributed.py's SaveForwardInputsModel (c1, c2), saving each module's input under
    the suite's keys ("", "c1", "c2"), with Linear(dim, dim) layers."""
    import torch.nn as nn

    class SaveForwardInputsModule(nn.Module):
        def __init__(self, key):
            super().__init__()
            self.l = nn.Linear(dim, dim)
            self.key = key

        def forward(self, x):
            forward_inputs[self.key] = x
            return self.l(x.to(self.l.weight.dtype) if cast_forward_inputs else x)

    class SaveForwardInputsModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = SaveForwardInputsModule("c1")
            self.c2 = SaveForwardInputsModule("c2")

        def forward(self, x):
            forward_inputs[""] = x
            return self.c2(self.c1(x))

    return SaveForwardInputsModel()


def toy_model(dim, forward_inputs, y_by_keyword):
    """test_submodules_with_external_inputs' ToyModel: l2(l1(x), y) with y = ones(2, dim) in
    float32 made in forward, passed positionally or (`y_by_keyword`) as y=y."""
    import torch
    import torch.nn as nn

    class ToyModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(dim, dim)

        def forward(self, x, y):
            forward_inputs["l2_input_x"] = x
            forward_inputs["l2_input_y"] = y
            return self.l(x)

    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(dim, dim)
            self.l2 = ToyModule()

        def forward(self, x):
            forward_inputs["model_input_x"] = x
            y = torch.ones(2, dim, dtype=torch.float32)  # the external input
            h = self.l1(x)
            return self.l2(h, y=y) if y_by_keyword else self.l2(h, y)

    return ToyModel()


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
    return observations(forward_inputs, out), None


def forward_input_casts(request):
    import torch

    dim = request.int_param("dim")
    low = getattr(torch, request.param("param_dtype"))
    subtest = request.param("subtest")
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
    model = save_forward_inputs_model(
        dim, forward_inputs, cast_forward_inputs=subtest == "c2_param_dtype_module_casts")
    return _run(model, policies, dim, forward_inputs)


def submodules_with_external_inputs(request):
    import torch

    dim = request.int_param("dim")
    low = getattr(torch, request.param("param_dtype"))
    forward_inputs = {}
    torch.manual_seed(0)
    policies = {
        "l2": {"param_dtype": low,
               "cast_forward_inputs": request.param("enable_submodule_cast") == "True"},
        "": {"param_dtype": low},
    }
    model = toy_model(dim, forward_inputs, request.param("y_by_keyword") == "True")
    return _run(model, policies, dim, forward_inputs)


SCENARIOS = {
    "fully_shard_mixed_precision/forward_input_casts": forward_input_casts,
    "fully_shard_mixed_precision/submodules_with_external_inputs":
        submodules_with_external_inputs,
}
