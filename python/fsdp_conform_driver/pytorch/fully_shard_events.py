"""The fully_shard_comm scenarios judged by FSDP2's event order (seed 000,
test_fully_shard_comm.py's TestFullyShardPrefetch), in PyTorch:

  backward_prefetch_forward_backward   Transformer(n_layers), blocks and root sharded (with the
                                       case's checkpoint_impl), `iterations` x (forward,
                                       loss.sum().backward(), SGD(lr 1e-2) step): the unshard
                                       and post_backward events of each forward and backward,
                                       and the reshard events of each backward
  backward_prefetch_multi_forward      two forwards, one backward of the summed losses
  backward_prefetch_unused_in_backward Sequential(Linear, DoubleLinear), 0, 1.lin1, 1.lin2 and
                                       the root sharded: a backward through lin2's output after
                                       set_is_last_backward(False), then one through lin1's
  backward_prefetch_reused_module      Sequential(a, b, a, out) of Linear(dim, dim), a, b, out
                                       and the parameter-less root sharded: a runs twice in one
                                       forward; per iteration the unshard and post_backward
                                       events of forward and of out.sum().backward()
  set_modules_to_forward_prefetch,     the zoo Transformer trained as sharded parity
  set_modules_to_backward_prefetch     (parity.train_sharded), block i prefetching the next /
                                       previous num_to_prefetch blocks, prefetch_stride apart;
                                       the unshard and reshard events of every step
  backward_misprefetch                 MLP, in_proj, out_proj and the root sharded,
                                       in_proj.set_modules_to_backward_prefetch([out_proj]),
                                       trained as sharded parity; the same events

Events are recorded as the seed's patches record them (recorders.FsdpEvents).

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import inputs
from fsdp_conform_driver.pytorch import parity
from fsdp_conform_driver.pytorch.sharded_transformer import sharded_transformer
from fsdp_conform_driver.recorders import FsdpEvents

_UNSHARD_POST_BACKWARD = ("unshard", "post_backward")


def _prefetch_transformer(request):
    from fsdp_conform_driver.pytorch.fsdp_api import reshard_after_forward_of

    return sharded_transformer(request, request.param("checkpoint_impl"),
                               reshard_after_forward=reshard_after_forward_of(request))


def _of_kinds(events, kinds):
    """The events of `kinds`, in order."""
    return [e for e in events if e[0] in kinds]


def forward_backward(request):
    """_test_backward_prefetch_forward_backward: per iteration the events of the forward and of
    loss.sum().backward(), then SGD(lr 1e-2).step() and zero_grad(set_to_none=(it % 2 == 0))."""
    import torch

    model = _prefetch_transformer(request)
    optim = torch.optim.SGD(model.parameters(), lr=1e-2)
    tokens = inputs.step_input(request, 0)
    forward, backward, backward_reshards, every = [], [], [], []
    with FsdpEvents(_UNSHARD_POST_BACKWARD + ("reshard",)) as events:
        for it in range(request.int_param("iterations")):
            loss = model(tokens)
            forward.append(_of_kinds(events.take(), _UNSHARD_POST_BACKWARD))
            loss.sum().backward()
            taken = events.take()
            backward.append(_of_kinds(taken, _UNSHARD_POST_BACKWARD))
            backward_reshards.append(_of_kinds(taken, ("reshard",)))
            every.extend(forward[-1] + backward[-1])
            optim.step()
            optim.zero_grad(set_to_none=it % 2 == 0)
    return {"forward_events": forward, "backward_events": backward,
            "backward_reshard_events": backward_reshards, "events": every}, None


def multi_forward(request):
    """_test_backward_prefetch_multi_forward: two forwards, then (loss1 + loss2).sum()
    .backward()."""
    model = _prefetch_transformer(request)
    tokens = inputs.step_input(request, 0)
    with FsdpEvents(_UNSHARD_POST_BACKWARD) as events:
        loss1 = model(tokens)
        loss2 = model(tokens)
        forward = events.take()
        (loss1 + loss2).sum().backward()
        backward = events.take()
    return {"forward_events": forward, "backward_events": backward,
            "events": forward + backward}, None


def _skip_sweep_of_post_forward_prefetch(raf, world) -> None:
    """Skips a case PyTorch 2.7 and later cannot run: with an int reshard_after_forward k
    (1 < k < world), lin2's pre-backward prefetches lin1 from its post-forward shards; the
    end-of-backward callback (every group not in POST_BACKWARD since pytorch/pytorch#144781)
    runs lin1's post_backward, whose reshard() switches lin1 to SHARDED under that pending
    all-gather, and the second backward's copy-out fails."""
    import torch

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if isinstance(raf, bool) or not isinstance(raf, int) or not 1 < raf < world:
        return
    if (major, minor) >= (2, 7):
        from fsdp_conform_driver import ScenarioSkipped
        raise ScenarioSkipped(
            f"torch {torch.__version__} fails this case (a PyTorch defect): the end-of-backward "
            f"callback runs post_backward() on 1.lin1, whose all-gather (a mistargeted prefetch "
            f"from its reshard_after_forward={raf} post-forward shards) is still pending, and "
            f"its reshard() switches 1.lin1 to SHARDED under it; the second backward's "
            f"foreach_all_gather_copy_out then views the output over the {world}-rank shard "
            f"group with the post-forward shards' split sizes and raises \"split_with_sizes "
            f"expects split_sizes to sum exactly to ...\"")


def unused_in_backward(request):
    """_test_backward_prefetch_unused_in_backward: out = model(inp); set_is_last_backward(False);
    out[1].sum().backward(retain_graph=True); set_is_last_backward(True); out[0].sum()
    .backward()."""
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, reshard_after_forward_of
    from fsdp_conform_driver.pytorch.models import DoubleLinear

    raf = reshard_after_forward_of(request)
    _skip_sweep_of_post_forward_prefetch(raf, request.world)
    dim = request.int_param("dim")
    model = torch.nn.Sequential(torch.nn.Linear(dim, dim), DoubleLinear(dim))
    model.load_state_dict(inputs.weights(request), strict=True)
    for module in (model[0], model[1].lin1, model[1].lin2, model):
        fully_shard(module, reshard_after_forward=raf)
    inp = inputs.step_input(request, 0)
    obs = {}
    with FsdpEvents(_UNSHARD_POST_BACKWARD) as events:
        out = model(inp)
        obs["forward_events"] = events.take()
        model.set_is_last_backward(False)
        out[1].sum().backward(retain_graph=True)
        obs["backward1_events"] = events.take()
        model.set_is_last_backward(True)
        out[0].sum().backward()
        obs["backward2_events"] = events.take()
    obs["events"] = obs["forward_events"] + obs["backward1_events"] + obs["backward2_events"]
    return obs, None


def reused_module(request):
    """A module used twice in one forward (test_multi_forward_module's reuse, in sequence):
    Sequential(a, b, a, out); fully_shard on a, b, out, then the parameter-less root;
    `iterations` x (forward, out.sum().backward()): the events of each forward and backward."""
    import torch

    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard, reshard_after_forward_of

    raf = reshard_after_forward_of(request)
    dim = request.int_param("dim")
    a, b, out = (torch.nn.Linear(dim, dim) for _ in range(3))
    model = torch.nn.Sequential(a, b, a, out)
    model.load_state_dict(inputs.weights(request), strict=True)
    for module in (a, b, out, model):
        fully_shard(module, reshard_after_forward=raf)
    inp = inputs.step_input(request, 0)
    forward, backward = [], []
    with FsdpEvents(_UNSHARD_POST_BACKWARD) as events:
        for _ in range(request.int_param("iterations")):
            loss = model(inp).sum()
            forward.append(events.take())
            loss.backward()
            backward.append(events.take())
    every = [e for f, b_ in zip(forward, backward) for e in f + b_]
    return {"forward_events": forward, "backward_events": backward, "events": every}, None


def _prefetch_plan(direction: str, num: int, stride: int):
    """A sharded-parity plan: every block, then the root, fully_shard-ed; block i's
    set_modules_to_{direction}_prefetch targets are the next (forward) or previous (backward)
    `num` blocks, `stride` apart, that exist (an empty list keeps the implicit backward
    prefetch)."""
    def plan(model, **kwargs):
        from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

        blocks = list(model.layers)
        for block in blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        sign = 1 if direction == "forward" else -1
        for i, block in enumerate(blocks):
            targets = [blocks[i + sign * stride * k] for k in range(1, num + 1)
                       if 0 <= i + sign * stride * k < len(blocks)]
            getattr(block, f"set_modules_to_{direction}_prefetch")(targets)
    return plan


def explicit_prefetch(direction: str):
    """set_modules_to_{direction}_prefetch: sharded parity training of the zoo Transformer under
    _prefetch_plan, every step's unshard and reshard events as fsdp_events."""
    def run(request):
        plan = _prefetch_plan(direction, request.int_param("num_to_prefetch"),
                              request.int_param("prefetch_stride"))
        recorder = FsdpEvents(("unshard", "reshard"))
        obs, tensors = parity.train_sharded(request, "transformer", plan,
                                            train_context=lambda: recorder)
        obs["fsdp_events"] = recorder.take()
        return obs, tensors
    return run


def _misprefetch_plan(model, **kwargs):
    """test_backward_misprefetch's plan: fully_shard on in_proj, out_proj, then the root, and
    in_proj.set_modules_to_backward_prefetch([out_proj])."""
    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

    fully_shard(model.in_proj, **kwargs)
    fully_shard(model.out_proj, **kwargs)
    fully_shard(model, **kwargs)
    model.in_proj.set_modules_to_backward_prefetch([model.out_proj])


def backward_misprefetch(request):
    """TestFullyShardCommunication.test_backward_misprefetch: sharded parity training of MLP
    under _misprefetch_plan, every step's unshard and reshard events as fsdp_events."""
    recorder = FsdpEvents(("unshard", "reshard"))
    obs, tensors = parity.train_sharded(request, "mlp", _misprefetch_plan,
                                        train_context=lambda: recorder)
    obs["fsdp_events"] = recorder.take()
    return obs, tensors


SCENARIOS = {
    "fully_shard_comm/backward_prefetch_forward_backward": forward_backward,
    "fully_shard_comm/backward_prefetch_multi_forward": multi_forward,
    "fully_shard_comm/backward_prefetch_unused_in_backward": unused_in_backward,
    "fully_shard_comm/backward_prefetch_reused_module": reused_module,
    "fully_shard_comm/set_modules_to_forward_prefetch": explicit_prefetch("forward"),
    "fully_shard_comm/set_modules_to_backward_prefetch": explicit_prefetch("backward"),
    "fully_shard_comm/backward_misprefetch": backward_misprefetch,
}
