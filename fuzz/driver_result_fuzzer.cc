// Fuzzes how the runner reads a driver's result file: the bounded JSON parse (depth limit) and
// the protocol check (ParseResult). Any input is accepted or refused with an fsdp::Error or a
// JSON parse error, never a crash or a stack overflow.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "conformance/driver_protocol.h"
#include "engine/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json result = fsdp::conformance::ParseBoundedJson(text);
    const fsdp::conformance::RankOutcome outcome =
        fsdp::conformance::ParseResult(result, "rank 0");
    if (outcome.message.size() > fsdp::conformance::kMaxResultMessageBytes + 64) {
      __builtin_trap();  // messages are cut to the limit
    }
    (void)fsdp::conformance::ResultJson(outcome).dump();
  } catch (const nlohmann::json::exception&) {
  } catch (const fsdp::Error&) {
  }
  return 0;
}
