// The list of pg-bench's collectives (registry.h): one line per collective.
// Ownership: the descriptors are defined, with static storage duration, in their own files.
// Thread-safety: AllCollectives() builds its list once (a function-local static).
#include "tools/bench/collectives/registry.h"

#include "engine/core/error.h"

namespace fsdp::bench {

namespace collectives {

// The registered collectives, in the order `-o all` runs them: X(descriptor), one line each;
// descriptor `k<Name>` is defined in tools/bench/collectives/<name>.cc.
#define FSDP_PG_BENCH_COLLECTIVES(X) \
  X(kAllGather)                      \
  X(kReduceScatter)                  \
  X(kAllReduce)                      \
  X(kBroadcast)

#define FSDP_DECLARE_COLLECTIVE(descriptor) extern const CollectiveDescriptor descriptor;
FSDP_PG_BENCH_COLLECTIVES(FSDP_DECLARE_COLLECTIVE)
#undef FSDP_DECLARE_COLLECTIVE

}  // namespace collectives

const std::vector<const CollectiveDescriptor*>& AllCollectives() {
#define FSDP_LIST_COLLECTIVE(descriptor) &collectives::descriptor,
  static const std::vector<const CollectiveDescriptor*> kAll = {
      FSDP_PG_BENCH_COLLECTIVES(FSDP_LIST_COLLECTIVE)};
#undef FSDP_LIST_COLLECTIVE
  return kAll;
}

std::string CollectiveNames(const std::string& last_separator) {
  const auto& all = AllCollectives();
  std::string out;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) out += i + 1 == all.size() ? last_separator : ", ";
    out += all[i]->name;
  }
  return out;
}

const CollectiveDescriptor& FindCollective(const std::string& name) {
  const std::string n = NormalizedName(name);
  for (const CollectiveDescriptor* c : AllCollectives()) {
    if (n == NormalizedName(c->name)) return *c;
  }
  FSDP_THROW(ErrorCode::kInvalidArgument, "unknown collective '", name, "' (choose ",
             CollectiveNames(), " or all)");
}

std::vector<const CollectiveDescriptor*> ParseCollectives(const std::string& name) {
  if (NormalizedName(name) == "all") return AllCollectives();
  return {&FindCollective(name)};
}

}  // namespace fsdp::bench
