// What a driver must read and write for each scenario, rendered from the scenarios' own
// declarations (ScenarioInfo::inputs, ScenarioInfo::observations): as JSON for `fsdp-conform
// list --json` / `fsdp-conform schema`, and as the Markdown page docs/observations.md
// (`fsdp-conform schema --markdown`; a test keeps the committed page equal to it).
// Thread-safety: stateless functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conformance/scenario.h"

namespace fsdp::conformance {

// {"weights": "...", "rank_tensors": [{"pattern", "regex", "dtype", "shape", "meaning"}]}, or
// null when the scenario has no inputs.
nlohmann::json InputsJson(const InputsDoc& inputs);
// {"name", "inputs", "observations": JSON Schema or null} of one scenario.
nlohmann::json ScenarioSchemaJson(const Scenario& scenario);
// The whole page for `scenarios`, in their order.
std::string ObservationsMarkdown(const std::vector<const Scenario*>& scenarios);
// A compact rendering of a JSON Schema fragment's type: "integer", "[string, ...]",
// "{string: integer}", "[string, string, string]".
std::string SchemaTypeText(const nlohmann::json& schema);

}  // namespace fsdp::conformance
