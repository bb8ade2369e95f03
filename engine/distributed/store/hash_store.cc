#include "engine/distributed/store/hash_store.h"

namespace fsdp::distributed {

void HashStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

bool HashStore::wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    for (const auto& k : keys) {
      if (data_.count(k) == 0) return false;
    }
    return true;
  });
}

std::optional<std::string> HashStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

}  // namespace fsdp::distributed
