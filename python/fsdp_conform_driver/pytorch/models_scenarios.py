"""models/* in PyTorch (conformance/models_scenarios.cc): on one rank, the zoo model of the case
(parity._build, in float64, with the case's weights) runs one forward + loss + backward on
step0/input (the loss of step 0: parity._loss), and reports its loss, outputs and gradients,
plus central finite differences of the float64 loss, computed with PyTorch's own forward, at
fd_entries evenly spaced entries of every parameter (step fd_step). The loss, outputs and
differences are read at the model's finite-difference point: the Transformer's float64 logits
(its `output` Linear's output, captured by a forward hook) before its final `.float()`; the
model's own outputs otherwise; whether any output of that forward, under torch.no_grad(), requires
grad (it must not). The buffers (BatchNorm's running statistics and counter) are
reported as they are after that one training-mode forward, as float64 copies (the differences'
forwards update them in place).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from typing import List

from fsdp_conform_driver import inputs
from fsdp_conform_driver.pytorch import parity

# The submodule whose output is the finite-difference point (ZooModel::fd_output_module).
_FD_OUTPUT_MODULE = {"transformer": "output"}

_KINDS = ("transformer", "mlp", "mlp_stack", "mlp_stack_seq_parallel", "double_linear",
          "nontensor_activations", "mlp_module", "mlp_rms_norm", "tp_simple_model",
          "state_dict_model", "gated_norms", "op_mix", "op_products", "padded_lm")


def sample_indices(numel: int, count: int) -> List[int]:
    """SampleIndices: `count` evenly spaced flat indices of `numel` elements, first and last
    included (all of them when numel <= count)."""
    if numel <= 0 or count <= 0:
        return []
    if numel <= count:
        return list(range(numel))
    if count == 1:
        return [0]
    out: List[int] = []
    for k in range(count):
        i = k * (numel - 1) // (count - 1)
        if not out or out[-1] != i:
            out.append(i)
    return out


def model(kind: str):
    """The scenario models/<kind>."""
    def run(request):
        import torch

        module, _ = parity._build(kind, request, "float64")
        x = inputs.step_input(request, 0)
        loss = parity._loss(request, 0, module(x))
        loss.backward()
        # FQNs without checkpoint_wrapper's prefix (FSDP's clean_tensor_name).
        named = [(name.replace("_checkpoint_wrapped_module.", ""), p)
                 for name, p in module.named_parameters()]
        obs = {"param_names": [name for name, _ in named],
               "grad_none": [name for name, p in named if p.grad is None],
               "loss_dtype": str(loss.dtype).replace("torch.", "")}
        tensors = {f"grad/{name}": p.grad.detach().clone()
                   for name, p in named if p.grad is not None}
        tensors.update({f"buffer/{name}": b.detach().to(torch.float64, copy=True)
                        for name, b in module.named_buffers()})

        captured = {}
        fd_module = _FD_OUTPUT_MODULE.get(kind)
        if fd_module is not None:
            module.get_submodule(fd_module).register_forward_hook(
                lambda _m, _args, out: captured.__setitem__("out", out))

        def outputs():
            out = module(x)
            return captured["out"] if fd_module is not None else out

        def loss_of(out):
            return parity._loss(request, 0, out).item()

        h = float(request.param("fd_step"))
        fd = {}
        with torch.no_grad():
            out = outputs()
            losses = [loss_of(out)]
            outs = out if isinstance(out, tuple) else (out,)
            obs["no_grad_outputs_require_grad"] = any(
                t.requires_grad or t.grad_fn is not None for t in outs)
            for k, t in enumerate(outs):
                tensors[f"output{k}"] = t.detach().clone()
            for name, p in named:
                flat = p.data.view(-1)
                index = sample_indices(flat.numel(), request.int_param("fd_entries"))
                value = []
                for i in index:
                    original = flat[i].item()
                    flat[i] = original + h
                    plus = loss_of(outputs())
                    flat[i] = original - h
                    minus = loss_of(outputs())
                    flat[i] = original
                    value.append((plus - minus) / (2 * h))
                fd[name] = {"index": index, "value": value}
        obs.update({"losses": losses, "fd": fd})
        return obs, tensors
    return run


def _checkpointed_call(module, checkpoint: str):
    """The training-mode call of models/dropout_training's axis `checkpoint` (non-reentrant,
    preserve_rng_state=True): "none" calls `module`; "utils"
    torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False); "wrapper"
    checkpoint_wrapper(module) (CheckpointImpl.NO_REENTRANT, the default); "composable"
    torch.distributed._composable.checkpoint(module), applied here once."""
    import torch

    if checkpoint == "none":
        return module
    if checkpoint == "utils":
        return lambda x: torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False)
    if checkpoint == "wrapper":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper)
        return checkpoint_wrapper(module)
    if checkpoint == "composable":
        from torch.distributed._composable import checkpoint as composable_checkpoint
        composable_checkpoint(module)
        return module
    from fsdp_conform_driver import ScenarioError
    raise ScenarioError("InvalidArgument", f"unknown checkpoint {checkpoint!r}")


def dropout_training(request):
    """models/dropout_training: nn.Dropout(p) on x[i] = 0.5 + (i % 13) / 8 (float64, requiring
    grad) in training mode after torch.manual_seed(1), twice (output, output_again), then
    output.backward(g) with g[i] = 1 + (i % 7) / 4, then once more in training mode
    (output_after_backward) and once in eval mode on x, counting the calls of a forward pre-hook
    on the dropout (a recompute calls it again); the training-mode calls under the
    activation checkpointing of axis `checkpoint` (_checkpointed_call). The judge checks the
    values by rule (PyTorch's mask comes from its own RNG)."""
    import torch

    n = request.int_param("numel")
    i = torch.arange(n, dtype=torch.float64)
    x = (0.5 + torch.remainder(i, 13) / 8).requires_grad_()
    torch.manual_seed(1)
    dropout = torch.nn.Dropout(float(request.param("p")))
    pre_hook_calls = []
    dropout.register_forward_pre_hook(lambda _module, _args: pre_hook_calls.append(1))
    train_call = _checkpointed_call(dropout, request.param("checkpoint"))
    dropout.train()
    out = train_call(x)
    out_again = train_call(x)
    out.backward(1 + torch.remainder(i, 7) / 4)
    out_after = train_call(x)
    dropout.eval()
    eval_out = dropout(x)
    return {"forward_pre_hook_calls": len(pre_hook_calls)}, {
                "output": out.detach().clone(), "input_grad": x.grad.detach().clone(),
                "output_again": out_again.detach().clone(),
                "output_after_backward": out_after.detach().clone(),
                "eval_output": eval_out.detach().clone()}


def linear_init(request):
    """models/linear_init: a freshly constructed nn.Linear(in_features, out_features) after
    torch.manual_seed(1) (its default reset_parameters): the weight and bias as float64. The
    judge checks them by rule (PyTorch's draws come from its own RNG)."""
    import torch

    torch.manual_seed(1)
    out_features = request.int_param("out_features")
    linear = torch.nn.Linear(request.int_param("in_features"), out_features)
    tensors = {"weight": linear.weight.detach().to(torch.float64),
               "bias": linear.bias.detach().to(torch.float64)}
    # A fresh nn.LayerNorm's and nn.BatchNorm1d's constant defaults.
    norms = torch.nn.ModuleDict({"layer_norm": torch.nn.LayerNorm(out_features),
                                 "batch_norm": torch.nn.BatchNorm1d(out_features)})
    for name in ("layer_norm.weight", "layer_norm.bias", "batch_norm.weight", "batch_norm.bias",
                 "batch_norm.running_mean", "batch_norm.running_var"):
        tensors[name] = norms.state_dict()[name].detach().to(torch.float64)
    return {}, tensors


def shared_buffer(request):
    """models/shared_buffer: Sequential(Linear(2, 2), Linear(2, 2)) with one tensor registered as
    a buffer of both Linears (0.stat, 1.stat_alias) and one of the second only (1.own): the FQNs
    of named_buffers() (deduplicated by tensor identity), of named_buffers(remove_duplicate=False)
    and the keys of state_dict() (every path)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    shared = torch.tensor([1.0, 2.0])
    model[0].register_buffer("stat", shared)
    model[1].register_buffer("stat_alias", shared)
    model[1].register_buffer("own", torch.tensor([3.0, 4.0]))
    return {"buffer_names": [name for name, _ in model.named_buffers()],
            "buffer_names_all": [name for name, _ in model.named_buffers(remove_duplicate=False)],
            "state_dict_keys": list(model.state_dict())}, None


SCENARIOS = {f"models/{kind}": model(kind) for kind in _KINDS}
SCENARIOS["models/dropout_training"] = dropout_training
SCENARIOS["models/linear_init"] = linear_init
SCENARIOS["models/shared_buffer"] = shared_buffer
