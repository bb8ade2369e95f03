"""fsdp_grad_acc/* in PyTorch (seed 004, test_fsdp_grad_acc.py): gradient accumulation of
common_fsdp.py's TransformerWithSharedParams (eval mode, the seed's deterministic=True) with
FSDP1's no_sync(), or with FSDP2's set_requires_gradient_sync(False) (grad_acc_fully_shard).

  grad_acc, grad_acc_cpu_offload   FullyShardedDataParallel with the seed's ModuleWrapPolicy
                                   ({TransformerEncoderLayer, TransformerDecoderLayer}) and the
                                   case's sharding_strategy, backward_prefetch, use_orig_params,
                                   cpu_offload (fsdp1_api.wrap)
  grad_acc_fully_shard             fully_shard on every encoder and decoder layer, then the root

Every optimizer step runs the configs' micro-batches ("no_sync:3+sync:3+no_sync:3", the seed's
_GradAccConfigs) in order, each inside no_sync() (FSDP2: without gradient sync) or not, the
last micro-batch of a step always synced, as the seed's loop; then SGD(lr).step() and
zero_grad(set_to_none=(step % 2 == 0)). It reports every micro-batch's loss
(cross_entropy(..., reduction="sum"), get_loss) and the collectives of its forward and of its
backward (CommDebugMode, without its module tracker, which fails on embed_tokens' two calls
per forward: recorders.CommCounts), and the full parameters after every optimizer step by clean FQN
(FSDP1: summon_full_params(writeback=False); FSDP2: full_tensor()), as docs/observations.md
lists them.

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

import contextlib

from fsdp_conform_driver import ScenarioError, inputs
from fsdp_conform_driver.recorders import CommCounts

# The seed's ModuleWrapPolicy (FSDP1) and the modules fully_shard-ed before the root (FSDP2).
_LAYER_TYPES = ("TransformerEncoderLayer", "TransformerDecoderLayer")


def no_sync_pattern(configs: str):
    """Per micro-batch of one optimizer step, whether it runs inside no_sync(): the configs'
    micro-batches in order ("no_sync:3+sync:3"), the last one always synced (the seed's loop
    over _GradAccConfigs; the engine's NoSyncPattern)."""
    runs = []
    for item in configs.split("+"):
        kind, sep, count = item.partition(":")
        if not sep or kind not in ("no_sync", "sync") or not count.isdigit() or int(count) < 1:
            raise ScenarioError("InvalidArgument",
                                f"configs '{configs}': '{item}' is not no_sync:N or sync:N")
        runs.extend([kind == "no_sync"] * int(count))
    return runs[:-1] + [False]


def _build(request):
    import torch

    from fsdp_conform_driver.pytorch.models import TransformerWithSharedParams

    dtype = request.param("dtype")
    if dtype not in ("float32", "float64"):
        raise ScenarioError("InvalidArgument", f"dtype must be float32 or float64, got {dtype}")
    model = TransformerWithSharedParams(add_bn=True, deterministic=True)
    model.to(getattr(torch, dtype))
    model.load_state_dict(inputs.weights(request), strict=True)
    return model


def _layers(model):
    return [m for m in model.modules() if type(m).__name__ in _LAYER_TYPES]


def _record_full_tensors(model, k, tensors):
    for name, p in model.named_parameters():
        tensors[f"step{k}/{name}"] = p.full_tensor().detach().clone()


def run(request):
    import torch

    from fsdp_conform_driver.pytorch.models import TransformerWithSharedParams

    model = _build(request)
    if request.param("api") == "fully_shard":
        from fsdp_conform_driver.pytorch.fsdp_api import fully_shard

        for layer in _layers(model):
            fully_shard(layer)
        fully_shard(model)

        def sync_context(sync):
            model.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()

        record = _record_full_tensors
    else:
        from fsdp_conform_driver.pytorch.fsdp1_api import nest_module_types, wrap
        from fsdp_conform_driver.pytorch.parity import record_full_params

        model = wrap(request, model, nest_module_types(_LAYER_TYPES))

        def sync_context(sync):
            return contextlib.nullcontext() if sync else model.no_sync()

        record = record_full_params
    pattern = no_sync_pattern(request.param("configs"))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(request.param("lr")))
    rank_inputs = inputs.rank_tensors(request)
    losses, counts, tensors = [], [], {}
    for k in range(request.int_param("steps")):
        for i, no_sync in enumerate(pattern):
            batch = (rank_inputs[f"step{k}/micro{i}/src"], rank_inputs[f"step{k}/micro{i}/tgt"])
            micro = CommCounts(track_modules=False)
            with sync_context(not no_sync):
                with micro.phase("forward"):
                    out = model(*batch)
                loss = TransformerWithSharedParams.get_loss(batch, out)
                with micro.phase("backward"):
                    loss.backward()
            losses.append(loss.item())
            counts.append(micro.by_phase("forward", "backward"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=k % 2 == 0)
        record(model, k, tensors)
    return {"losses": losses, "micro_batch_comm_counts": counts}, tensors

