// Fuzzes the safetensors reader (DecodeSafetensors): any byte string either decodes into a file
// whose entries tile its buffer, or is refused with an fsdp::Error, never a crash, a hang or an
// allocation of the size a forged header claims.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/error.h"
#include "engine/serialization/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const fsdp::serialization::SafetensorsFile file =
        fsdp::serialization::DecodeSafetensors(bytes, "fuzz.safetensors");
    size_t total = 0;
    for (const auto& entry : file.entries) total += entry.bytes.size();
    if (total > size) __builtin_trap();  // entries cannot hold more than the file
    for (const auto& entry : file.entries) {
      try {
        (void)entry.ToTensor();
      } catch (const fsdp::Error&) {
      }
    }
  } catch (const fsdp::Error&) {
  }
  return 0;
}
