// The collectives pg-bench can run: the registered CollectiveDescriptors
// (tools/bench/collective_descriptor.h), in the order `-o all` runs them, and their lookup by
// name. The list itself is one line per collective in registry.cc.
// Ownership: returns pointers to descriptors with static storage duration.
// Thread-safety: the list is built once (a function-local static) and never changes.
#pragma once

#include <string>
#include <vector>

#include "tools/bench/collective_descriptor.h"

namespace fsdp::bench {

// Every registered collective, in the order `-o all` runs them.
const std::vector<const CollectiveDescriptor*>& AllCollectives();
// The collective named `name` (CollectiveDescriptor::name, compared by NormalizedName:
// "allreduce", "all-reduce" and "all_reduce" are the same). Throws InvalidArgument listing
// the choices.
const CollectiveDescriptor& FindCollective(const std::string& name);
// FindCollective's one collective, or every collective for "all".
std::vector<const CollectiveDescriptor*> ParseCollectives(const std::string& name);
// The names joined for messages: "all_gather, reduce_scatter, all_reduce, broadcast"
// (`last_separator` before the last: ", " or " or ").
std::string CollectiveNames(const std::string& last_separator = ", ");

}  // namespace fsdp::bench
