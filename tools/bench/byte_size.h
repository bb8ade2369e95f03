// Byte sizes on benchmark command lines, as nccl-tests writes them: "1024", "1K", "64M", "2G"
// (binary multiples: K = 1024). Also accepted: lower case, and a trailing "B" or "iB"
// ("64MB", "64MiB"; both mean 64 * 2^20).
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::bench {

// Parses a byte count; throws InvalidArgument naming `what` (e.g. "-b") and the text when it is
// not a non-negative integer with an optional K/M/G suffix, or when it overflows int64.
int64_t ParseByteSize(const std::string& text, const std::string& what = "size");

// The shortest exact spelling: 1024 -> "1K", 67108864 -> "64M", 1000 -> "1000".
std::string FormatByteSize(int64_t bytes);

}  // namespace fsdp::bench
