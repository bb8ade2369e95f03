// HashStore: an in-memory Store (c10d's HashStore) for worlds whose ranks are threads of one
// process; every rank of the world shares one instance.
//
// Ownership: owns its map. Thread-safety: internally synchronised (mutex + condition variable).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

class HashStore final : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultTimeout) : Store(timeout) {}

  void set(const std::string& key, const std::string& value) override;
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  std::string describe() const override { return "hash store"; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace fsdp::distributed
