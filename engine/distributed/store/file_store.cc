#include "engine/distributed/store/file_store.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/core/error.h"

namespace fsdp::distributed {

namespace {

// File names stay well below NAME_MAX (255) with room for the temporary suffix.
constexpr size_t kMaxNameBytes = 160;

std::string EncodeKey(const std::string& key) {
  static const char* kHex = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '_' || c == '-' || (c == '.' && !name.empty());
    if (plain) {
      name.push_back(static_cast<char>(c));
    } else {
      name += {'%', kHex[c >> 4], kHex[c & 15]};
    }
  }
  if (name.empty()) name = "%";  // the empty key
  if (name.size() > kMaxNameBytes) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across processes and builds
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    std::ostringstream os;
    os << name.substr(0, kMaxNameBytes - 17) << '~' << std::hex << h;
    name = os.str();
  }
  return name;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace

FileStore::FileStore(std::string directory, std::chrono::milliseconds timeout)
    : Store(timeout), directory_(std::move(directory)) {
  FSDP_CHECK(!directory_.empty(), "FileStore: empty directory");
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, !ec && std::filesystem::is_directory(directory_),
                  "FileStore: cannot create the directory ", directory_, ": ",
                  ec ? ec.message() : std::string("not a directory"));
}

std::string FileStore::PathOf(const std::string& key) const {
  return directory_ + "/" + EncodeKey(key);
}

void FileStore::set(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathOf(key);
  const std::string tmp = directory_ + "/.tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1)) + "." + EncodeKey(key);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      FSDP_THROW(ErrorCode::kUnavailable, describe(), ": cannot write key '", key, "' to ", tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    FSDP_THROW(ErrorCode::kUnavailable, describe(), ": cannot rename ", tmp, " to ", path);
  }
}

bool FileStore::wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> paths;
  paths.reserve(keys.size());
  for (const auto& k : keys) paths.push_back(PathOf(k));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(1000);
  size_t next = 0;  // keys before `next` exist (files are never removed while a run is on)
  while (true) {
    while (next < paths.size() && Exists(paths[next])) ++next;
    if (next == paths.size()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

std::optional<std::string> FileStore::try_get(const std::string& key) {
  std::ifstream in(PathOf(key), std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace fsdp::distributed
