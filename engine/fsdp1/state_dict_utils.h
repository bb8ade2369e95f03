// The FSDP1 state-dict hooks (PyTorch's _state_dict_utils.py; docs/fsdp1.md, "State dicts"):
// every FullyShardedDataParallel registers a state_dict pre-hook and post-hook and a
// load_state_dict pre-hook and post-hook on itself, which dispatch on the instance's
// state_dict_type (state_dict_type.h):
//
//  * FULL_STATE_DICT: the pre-hook unshards this instance (summon_full_params without
//    recursion, full precision, no writeback; rank0_only and offload_to_cpu from the config);
//    the post-hook strips "_fsdp_wrapped_module." from the keys, clones the managed
//    parameters (shared registrations too), drops every managed entry on non-zero ranks with
//    rank0_only, moves buffers to the CPU with offload_to_cpu, casts buffers back to their
//    original dtype under buffer mixed precision (ignored buffers excepted), and reshards.
//    Load: unshard with writeback, re-add the wrapper prefix, normal loading, reshard.
//  * SHARDED_STATE_DICT: as FULL, then each managed parameter is replaced by this rank's
//    torch.chunk dim-0 piece (cloned) marked in StateDict::sharded with its global shape and
//    offsets. Load: each piece is zero-padded to the chunk and all-gathered over the
//    instance's group into the full parameter, then loaded as FULL.
//  * LOCAL_STATE_DICT: `<prefix>_flat_param` is this rank's unpadded flat shard (a view, no
//    copy), marked as the piece at offset `padded shard numel * rank` of the unpadded flat
//    parameter. Load: the piece is zero-padded back to the shard and loaded into `_flat_param`.
//    Not supported with use_orig_params=True (InvalidArgument).
//  * NO_SHARD instances (and every instance at a world size of 1) use FULL_STATE_DICT with the
//    default config whatever the type, as PyTorch does.
//  * An instance built with a device mesh sets ShardedStateDictConfig::use_dtensor and refuses
//    LOCAL_STATE_DICT (`_set_use_dtensor`).
// Every load post-hook removes the wrapper prefixes from the reported missing and unexpected
// keys.
//
// Ownership: the hooks capture nothing; they find the instance through the module they are
// called on. The open unshard scope lives in FsdpState::unshard_params_ctx between a pre- and
// its post-hook. Thread-safety: the rank's thread; saving and loading are collective over the
// instance's process group for FULL and SHARDED (every rank must call them).
#pragma once

namespace fsdp::fsdp1 {

class FullyShardedDataParallel;

// `_register_all_state_dict_hooks`: called once by the FullyShardedDataParallel constructor.
void RegisterAllStateDictHooks(FullyShardedDataParallel& state);

}  // namespace fsdp::fsdp1
