"""parity/single/* and parity/fsdp/* in PyTorch: the zoo model the case names trained for
`steps` steps on the case's inputs (step{k}/input), loss out.sum() or (out * out).sum(), SGD
with momentum or Adam, reporting every step's loss and parameters (and, sharded, gradient
shards and the final full parameters), as docs/observations.md lists them.

Thread-safety: one case per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import ScenarioSkipped, inputs

_DTYPES = {"float32": "float32", "float64": "float64"}


def _build(kind: str, request):
    import torch

    from fsdp_conform_driver.pytorch.models import MLP, ModelArgs, Transformer

    dtype = getattr(torch, _DTYPES[request.param("dtype")])
    if kind == "mlp":
        model = MLP(request.int_param("dim"),
                    with_buffer=request.param("with_buffer").lower() == "true",
                    dim_multiplier=request.int_param("dim_multiplier"))
    elif kind == "transformer":
        model = Transformer(ModelArgs(
            n_layers=request.int_param("n_layers"), vocab_size=request.int_param("vocab_size"),
            max_seq_len=request.int_param("max_seq_len"), dim=request.int_param("dim"),
            n_heads=request.int_param("n_heads"), dropout_p=0.0,
            weight_tying=request.param("weight_tying").lower() == "true"))
    else:
        raise ScenarioSkipped(f"no PyTorch model for zoo kind '{kind}' in this driver")
    model.to(dtype)
    model.load_state_dict(inputs.weights(request), strict=True)
    return model, dtype


def _children_to_shard(root):
    """The modules the suite's sharded parity runs fully_shard before the root
    (conformance/sharded_parity.cc, ChildrenToShard): every element of a ModuleList child, and
    every other child that has parameters and shares none with another child (a tied
    embedding and output stay with the root)."""
    import torch

    children = list(root.children())
    ids = [{id(p) for p in c.parameters()} for c in children]
    out = []
    for i, child in enumerate(children):
        if isinstance(child, torch.nn.ModuleList):
            out.extend(child)
        elif ids[i] and not any(ids[i] & ids[j] for j in range(len(children)) if j != i):
            out.append(child)
    return out


def _optimizer(request, params):
    import torch

    if request.param("optim") == "sgd":
        return torch.optim.SGD(params, lr=float(request.param("sgd_lr")),
                               momentum=float(request.param("momentum")))
    return torch.optim.Adam(params, lr=float(request.param("adam_lr")))


def _loss(request, out):
    return (out * out).sum() if request.param("loss") == "squares" else out.sum()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _train(request, model, sharded: bool):
    opt = _optimizer(request, model.parameters())
    rank_inputs = inputs.rank_tensors(request)
    losses, tensors, loss_dtype = [], {}, None
    for k in range(request.int_param("steps")):
        loss = _loss(request, model(rank_inputs[f"step{k}/input"]))
        loss_dtype = str(loss.dtype).replace("torch.", "")
        losses.append(loss.item())
        loss.backward()
        if sharded:
            for name, p in model.named_parameters():
                if p.grad is not None:
                    tensors[f"grad{k}/{name}"] = _local(p.grad).detach().clone()
        opt.step()
        opt.zero_grad()
        for name, p in model.named_parameters():
            tensors[f"step{k}/{name}"] = _local(p).detach().clone()
    return {"losses": losses, "loss_dtype": loss_dtype}, tensors


def single(kind: str):
    def run(request):
        model, _ = _build(kind, request)
        obs, tensors = _train(request, model, sharded=False)
        obs["param_names"] = [name for name, _ in model.named_parameters()]
        return obs, tensors
    return run


def fsdp(kind: str):
    def run(request):
        from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, reshard_after_forward_of

        model, _ = _build(kind, request)
        raf = reshard_after_forward_of(request)
        for child in _children_to_shard(model):
            fully_shard(child, reshard_after_forward=raf)
        fully_shard(model, reshard_after_forward=raf)
        obs, tensors = _train(request, model, sharded=True)
        for name, p in model.named_parameters():
            tensors[f"full/{name}"] = p.full_tensor().detach().clone()
        return obs, tensors
    return run
