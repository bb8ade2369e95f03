// Fuzzes the driver protocol's flag parser (DriverRequest::FromArgs), what a driver built on the
// engine reads from its command line: the input is split at NUL bytes into arguments. Any
// argument list is parsed or refused with an fsdp::Error; a parsed request round-trips.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "conformance/driver_protocol.h"
#include "engine/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.emplace_back();
    } else {
      args.back().push_back(static_cast<char>(data[i]));
    }
  }
  try {
    const fsdp::conformance::DriverRequest request =
        fsdp::conformance::DriverRequest::FromArgs(args);
    const fsdp::conformance::DriverRequest again =
        fsdp::conformance::DriverRequest::FromArgs(request.ToArgs());
    if (again.ToArgs() != request.ToArgs()) __builtin_trap();
  } catch (const fsdp::Error&) {
  }
  return 0;
}
