#include "tools/bench/byte_size.h"

#include <cctype>
#include <limits>

#include "engine/core/error.h"

namespace fsdp::bench {

int64_t ParseByteSize(const std::string& text, const std::string& what) {
  size_t i = 0;
  int64_t value = 0;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const int digit = text[i] - '0';
    FSDP_CHECK(value <= (kMax - digit) / 10, what, ": byte size '", text, "' is too large");
    value = value * 10 + digit;
    ++i;
  }
  FSDP_CHECK(i > 0, what, ": '", text,
             "' is not a byte size (expected an integer with an optional K, M or G suffix, "
             "e.g. 1K, 64M)");
  std::string suffix;
  for (; i < text.size(); ++i)
    suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  int shift = -1;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else {
    const std::string rest = suffix.substr(1);
    if (rest.empty() || rest == "B" || rest == "IB") {
      if (suffix[0] == 'K') shift = 10;
      if (suffix[0] == 'M') shift = 20;
      if (suffix[0] == 'G') shift = 30;
    }
  }
  FSDP_CHECK(shift >= 0, what, ": '", text, "' has an unknown suffix '",
             text.substr(text.size() - suffix.size()),
             "' (use K, M or G, optionally followed by B or iB)");
  FSDP_CHECK(value <= (kMax >> shift), what, ": byte size '", text, "' is too large");
  return value << shift;
}

std::string FormatByteSize(int64_t bytes) {
  static const char* kSuffixes[] = {"", "K", "M", "G"};
  int unit = 0;
  while (unit < 3 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kSuffixes[unit];
}

}  // namespace fsdp::bench
