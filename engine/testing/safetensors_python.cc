#include "engine/testing/safetensors_python.h"

#include <cstdlib>

namespace fsdp::testing {

std::optional<std::string> PythonWithSafetensors(std::string* why_not) {
  const char* env_python = std::getenv("FSDP_PYTHON");
  const std::string python = env_python != nullptr ? env_python : "python3";
  if (std::system((python + " -c 'import safetensors.numpy, numpy' >/dev/null 2>&1").c_str()) != 0) {
    if (why_not != nullptr) {
      *why_not = "the safetensors Python package is not importable by " + python +
                 " (pip install safetensors numpy, or set FSDP_PYTHON)";
    }
    return std::nullopt;
  }
  return python;
}

}  // namespace fsdp::testing
