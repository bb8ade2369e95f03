"""fully_shard_autograd/* in PyTorch (seed 002, test_fully_shard_autograd.py), beyond
post_acc_grad_hook_runs (scenarios.py):

  unused_forward_output            DoubleLinear(use_second_linear=True), lin1 and the root
                                   fully_shard-ed, trained as sharded parity
                                   (parity.train_sharded; the loss switches to one output at
                                   loss_switch_step)
  unused_forward_module            DoubleLinear(use_second_linear=False), lin1, lin2 and the
                                   root fully_shard-ed (lin2 never runs forward)
  nontensor_activations            Sequential(ToContainerType, Module(dim) x3,
                                   FromContainerType), every element and the root
  post_acc_grad_hook_optim_parity  Transformer(dropout 0) twice, blocks and root sharded: one
                                   trained by AdamW(foreach=False) + StepLR after backward, the
                                   other by one AdamW + StepLR per parameter stepped inside its
                                   post-accumulate-grad hook (and the reference AdamW's
                                   default betas, eps and weight_decay)

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import inputs
from fsdp_conform_driver.pytorch import parity


def _sharded_training(kind, plan):
    def run(request):
        return parity.train_sharded(request, kind, plan)
    return run


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def post_acc_grad_hook_optim_parity(request):
    """The seed's loop: per iteration ref_model(inp).sum().backward(), ref_optim.step(),
    zero_grad(), ref_scheduler.step(); then model(inp).sum().backward(), whose hooks step each
    parameter's own AdamW, zero its gradient and step its StepLR. Reports both models' losses,
    learning rates and local parameter shards after every iteration."""
    import copy

    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.models import ModelArgs, Transformer

    model = Transformer(ModelArgs(n_layers=request.int_param("n_layers"), dropout_p=0.0))
    model.load_state_dict(inputs.weights(request), strict=True)
    ref_model = copy.deepcopy(model)
    for module in (*ref_model.layers, ref_model):
        fully_shard(module)
    optim_kwargs = {"lr": float(request.param("lr")), "foreach": False}
    step_size = request.int_param("step_size")
    ref_optim = torch.optim.AdamW(ref_model.parameters(), **optim_kwargs)
    ref_scheduler = torch.optim.lr_scheduler.StepLR(ref_optim, step_size=step_size)
    for module in (*model.layers, model):
        fully_shard(module)
    optims, schedulers = {}, {}
    for param in model.parameters():
        optims[param] = torch.optim.AdamW([param], **optim_kwargs)
        schedulers[param] = torch.optim.lr_scheduler.StepLR(optims[param], step_size=step_size)

    def optim_hook(param) -> None:
        optims[param].step()
        optims[param].zero_grad()
        schedulers[param].step()

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(optim_hook)
    first_optim = optims[next(iter(model.parameters()))]
    inp = inputs.step_input(request, 0)
    obs = {"ref_losses": [], "losses": [], "ref_lrs": [], "lrs": [], "ref_grads_after_zero_grad": []}
    tensors = {}
    for k in range(request.int_param("iterations")):
        ref_loss = ref_model(inp).sum()
        ref_loss.backward()
        ref_optim.step()
        ref_optim.zero_grad()
        obs["ref_grads_after_zero_grad"].append(
            sum(p.grad is not None for p in ref_model.parameters()))
        ref_scheduler.step()
        loss = model(inp).sum()
        loss.backward()
        obs["ref_losses"].append(ref_loss.item())
        obs["losses"].append(loss.item())
        obs["ref_lrs"].append(ref_optim.param_groups[0]["lr"])
        obs["lrs"].append(first_optim.param_groups[0]["lr"])
        for prefix, m in (("ref/", ref_model), ("", model)):
            for name, p in m.named_parameters():
                tensors[f"{prefix}iter{k}/{name}"] = _local(p).detach().clone()
    group = ref_optim.param_groups[0]
    obs["ref_defaults"] = [*group["betas"], group["eps"], group["weight_decay"]]
    return obs, tensors


SCENARIOS = {
    "fully_shard_autograd/unused_forward_output":
        _sharded_training("double_linear", parity.shard_submodules_then_root("lin1")),
    "fully_shard_autograd/unused_forward_module":
        _sharded_training("double_linear", parity.shard_submodules_then_root("lin1", "lin2")),
    "fully_shard_autograd/nontensor_activations":
        _sharded_training("nontensor_activations", parity.shard_every_child_then_root),
    "fully_shard_autograd/post_acc_grad_hook_optim_parity": post_acc_grad_hook_optim_parity,
}
