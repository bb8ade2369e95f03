// FileStore: a Store kept as files in a directory that every rank sees (a local temporary
// directory for one host, a shared filesystem across hosts). Each key is one file, named by
// the key with every byte outside [A-Za-z0-9._-] written as %XX (long names end in a hash);
// set() writes a hidden temporary file and renames it into place, so a reader sees either no
// file or the whole value. Waits poll the directory (1 ms, backing off to 10 ms).
//
// The directory must be fresh for each run: keys left by an earlier run would satisfy waits.
//
// Ownership: the directory belongs to whoever made it (a launcher removes it after the run).
// Thread-safety: safe from several threads and processes at once.
#pragma once

#include <string>

#include "engine/distributed/store/store.h"

namespace fsdp::distributed {

class FileStore final : public Store {
 public:
  // Creates `directory` if missing; kUnavailable when it cannot be made.
  explicit FileStore(std::string directory, std::chrono::milliseconds timeout = kDefaultTimeout);

  void set(const std::string& key, const std::string& value) override;
  bool wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  std::string describe() const override { return "file store " + directory_; }

  const std::string& directory() const { return directory_; }
  // The file that holds `key` (for tests and debugging).
  std::string PathOf(const std::string& key) const;

 private:
  std::string directory_;
};

}  // namespace fsdp::distributed
