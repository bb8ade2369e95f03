// Test-only: the Python interpreter the interop tests run the reference `safetensors` package
// with ($FSDP_PYTHON, else python3 on PATH), and whether it can import the package and numpy.
// Test-only (library fsdp_testing, engine/testing/; never part of fsdp_engine).
// Thread-safety: stateless functions (they run a subprocess).
#pragma once

#include <optional>
#include <string>

namespace fsdp::testing {

// The interpreter's command, or nullopt with `why_not` set to a skip reason naming it and how
// to install the package.
std::optional<std::string> PythonWithSafetensors(std::string* why_not);

}  // namespace fsdp::testing
