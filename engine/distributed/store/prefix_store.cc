#include "engine/distributed/store/prefix_store.h"

#include "engine/core/error.h"

namespace fsdp::distributed {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : Store(inner != nullptr ? inner->timeout() : kDefaultTimeout),
      prefix_(std::move(prefix)),
      inner_(std::move(inner)) {
  FSDP_CHECK(inner_ != nullptr, "PrefixStore('", prefix_, "'): null inner store");
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  inner_->set(Key(key), value);
}

bool PrefixStore::wait_for(const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& k : keys) prefixed.push_back(Key(k));
  return inner_->wait_for(prefixed, timeout);
}

std::optional<std::string> PrefixStore::try_get(const std::string& key) {
  return inner_->try_get(Key(key));
}

std::string PrefixStore::describe() const {
  return inner_->describe() + " under prefix '" + prefix_ + "/'";
}

}  // namespace fsdp::distributed
