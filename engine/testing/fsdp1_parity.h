// CheckFlatParamParity: FSDP1's counterpart of check_sharded_parity. For every FSDP1 instance
// of `fsdp_root`'s tree it rebuilds, from a replicated reference module, the unsharded flat
// parameter the instance must hold (its original parameters flattened in the handle's order,
// found in the reference by clean FQN: instance FQN + parameter FQN), takes this rank's
// torch.chunk shard of it and compares it with the instance's flat parameter, and the same for
// the gradients (a reference parameter without gradient must read as zeros; a frozen flat
// parameter's gradient is not compared). Alignment padding is skipped; the shard's end padding
// must be zero.
//
// Test-only (library fsdp_testing). Ownership: borrows its arguments. Thread-safety: the rank's
// thread (no collectives); call it outside forward/backward, after the end of backward (the
// flat gradient is then the sharded one).
#pragma once

#include <string>

#include "engine/nn/module.h"
#include "engine/testing/parity.h"

namespace fsdp::fsdp1 {

// "" on parity, else one line per mismatch (instance, parameter, what differs).
std::string CheckFlatParamParity(const nn::Module& fsdp_root, const nn::Module& reference,
                                 const fsdp2::ParityOptions& options = {});

}  // namespace fsdp::fsdp1
