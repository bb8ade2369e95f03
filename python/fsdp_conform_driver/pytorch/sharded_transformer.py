"""The `_init_transformer`-style model of the FSDP2 scenario families (fully_shard_comm;
conformance/sharded_transformer.h): common_dtensor.py's Transformer(ModelArgs(n_layers),
dropout 0) loaded with the case's weights, every TransformerBlock fully_shard-ed, then the root.

Thread-safety: one case at a time per process, on the main thread.
"""

from __future__ import annotations

from fsdp_conform_driver import inputs

CHECKPOINT_IMPLS = ("none", "utils", "composable")


def sharded_transformer(request, checkpoint_impl: str = "none", **fully_shard_kwargs):
    """The Transformer with every block and the root fully_shard-ed with `fully_shard_kwargs`;
    checkpoint_impl "utils": torch.utils.checkpoint of each block inside the Transformer
    (ModelArgs.checkpoint_activations), "composable": torch.distributed._composable's
    checkpoint(block) before fully_shard, as the seed's _init_transformer."""
    from fsdp_conform_driver.pytorch.fsdp_api import fully_shard
    from fsdp_conform_driver.pytorch.models import ModelArgs, Transformer

    if checkpoint_impl not in CHECKPOINT_IMPLS:
        from fsdp_conform_driver import ScenarioError
        raise ScenarioError("InvalidArgument", f"checkpoint_impl must be one of "
                            f"{', '.join(CHECKPOINT_IMPLS)}, got {checkpoint_impl}")
    model = Transformer(ModelArgs(n_layers=request.int_param("n_layers"), dropout_p=0.0,
                                  checkpoint_activations=checkpoint_impl == "utils"))
    model.load_state_dict(inputs.weights(request), strict=True)
    for layer in model.layers:
        if checkpoint_impl == "composable":
            from torch.distributed._composable import checkpoint
            checkpoint(layer)
        fully_shard(layer, **fully_shard_kwargs)
    fully_shard(model, **fully_shard_kwargs)
    return model
