#include "conformance/observations.h"

#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

std::string KeysOf(const nlohmann::json& j) {
  if (!j.is_object() || j.empty()) return "(none)";
  std::string out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!out.empty()) out += ", ";
    out += it.key();
  }
  return out;
}

const nlohmann::json& TensorEntry(const std::vector<nlohmann::json>& per_rank, int rank,
                                  const std::string& name) {
  const nlohmann::json& tensors = RankObservation(per_rank, rank, kTensors);
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, tensors.is_object() && tensors.contains(name), "rank ",
                  rank, " reported no tensor '", name, "' (tensors: ", KeysOf(tensors), ")");
  return tensors.at(name);
}

// One entry of `tensors`: {shape, dtype, data} with a known dtype and as many data values as the
// shape has elements.
void ValidateTensorEntry(const std::string& name, const nlohmann::json& v, const std::string& who) {
  FSDP_CHECK_CODE(ErrorCode::kDataLoss,
                  v.is_object() && v.contains("shape") && v["shape"].is_array() &&
                      v.contains("dtype") && v["dtype"].is_string() && v.contains("data") &&
                      v["data"].is_array(),
                  who, ": tensors.", name, " must be {shape: [..], dtype: str, data: [..]}");
  bool known_dtype = true;
  try {
    ParseDType(v["dtype"].get<std::string>());
  } catch (const Error&) {
    known_dtype = false;
  }
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, known_dtype, who, ": tensors.", name, ".dtype ",
                  v["dtype"].dump(), " is not float32, float64, float16, bfloat16 or int64");
  int64_t numel = 1;
  for (const auto& d : v["shape"]) {
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, d.is_number_integer() && d.get<int64_t>() >= 0, who,
                    ": tensors.", name, ".shape must hold non-negative integers");
    const int64_t dim = d.get<int64_t>();
    // No element count above the data's length can be right; refuse it before it overflows.
    FSDP_CHECK_CODE(ErrorCode::kDataLoss,
                    dim == 0 || numel <= static_cast<int64_t>(v["data"].size()) / dim, who,
                    ": tensors.", name, " has shape ", v["shape"].dump(), " but ", v["data"].size(),
                    " data values");
    numel *= dim;
  }
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, numel == static_cast<int64_t>(v["data"].size()), who,
                  ": tensors.", name, " has shape ", v["shape"].dump(), " (", numel,
                  " elements) but ", v["data"].size(), " data values");
}

}  // namespace

nlohmann::json TensorToJson(const Tensor& tensor) {
  FSDP_CHECK(tensor.defined(), "TensorToJson: undefined tensor");
  nlohmann::json j;
  j["shape"] = tensor.sizes();
  j["dtype"] = DTypeName(tensor.dtype());
  if (tensor.dtype() == DType::kInt64) {
    j["data"] = tensor.to_int64s();
  } else {
    j["data"] = tensor.to_doubles();
  }
  return j;
}

nlohmann::json TensorJson(const std::vector<int64_t>& shape, const std::string& dtype,
                          const std::vector<double>& data) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  FSDP_CHECK(numel == static_cast<int64_t>(data.size()), "TensorJson: shape holds ", numel,
             " elements but ", data.size(), " values were given");
  return {{"shape", shape}, {"dtype", dtype}, {"data", data}};
}

NamedTensors TakeTensors(nlohmann::json& observations, const std::string& who) {
  NamedTensors out;
  if (!observations.is_object() || !observations.contains(kTensors)) return out;
  ValidateObservations(nlohmann::json{{kTensors, observations[kTensors]}}, who);
  for (auto it = observations[kTensors].begin(); it != observations[kTensors].end(); ++it) {
    const auto& v = *it;
    const DType dtype = ParseDType(v["dtype"].get<std::string>());
    const auto shape = v["shape"].get<std::vector<int64_t>>();
    if (dtype == DType::kInt64) {
      out.emplace_back(it.key(), Tensor::from_int64s(v["data"].get<std::vector<int64_t>>(), shape));
    } else {
      out.emplace_back(it.key(),
                       Tensor::from_doubles(v["data"].get<std::vector<double>>(), shape, dtype));
    }
  }
  observations.erase(kTensors);
  return out;
}

void MergeTensors(nlohmann::json& observations, const NamedTensors& tensors, const std::string& who) {
  if (tensors.empty()) return;
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, observations.is_object(), who,
                  ": observations must be a JSON object");
  nlohmann::json& into = observations[kTensors];
  if (into.is_null()) into = nlohmann::json::object();
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, into.is_object(), who,
                  ": tensors must be an object {name: {shape, dtype, data}}");
  for (const auto& [name, tensor] : tensors) {
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, !into.contains(name), who, ": tensor '", name,
                    "' is both in the observations JSON and in the tensors file");
    into[name] = TensorToJson(tensor);
  }
}

nlohmann::json PhaseCommCountsJson(const std::map<std::string, int64_t>& forward,
                                   const std::map<std::string, int64_t>& backward) {
  nlohmann::json out = {{"forward", nlohmann::json::object()}, {"backward", nlohmann::json::object()}};
  for (const auto& [op, n] : forward) out["forward"][op] = n;
  for (const auto& [op, n] : backward) out["backward"][op] = n;
  return out;
}

nlohmann::json EventJson(const std::string& kind, const std::string& fqn,
                         const std::string& training_state) {
  return nlohmann::json::array({kind, fqn, training_state});
}

void ValidateObservations(const nlohmann::json& obs, const std::string& who) {
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, obs.is_object(), who,
                  ": observations must be a JSON object, got ", obs.type_name());
  if (obs.contains(kCommCounts)) {
    const auto& cc = obs[kCommCounts];
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, cc.is_object(), who,
                    ": comm_counts must be an object {phase: {op: count}}");
    for (auto phase = cc.begin(); phase != cc.end(); ++phase) {
      FSDP_CHECK_CODE(ErrorCode::kDataLoss, phase->is_object(), who, ": comm_counts.", phase.key(),
                      " must be an object {op: count}");
      for (auto op = phase->begin(); op != phase->end(); ++op) {
        FSDP_CHECK_CODE(ErrorCode::kDataLoss, op->is_number_integer(), who, ": comm_counts.",
                        phase.key(), ".", op.key(), " must be an integer");
      }
    }
  }
  if (obs.contains(kEvents)) {
    const auto& ev = obs[kEvents];
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, ev.is_array(), who,
                    ": events must be an array of [kind, fqn, training_state]");
    for (size_t i = 0; i < ev.size(); ++i) {
      const auto& e = ev[i];
      FSDP_CHECK_CODE(
          ErrorCode::kDataLoss,
          e.is_array() && e.size() == 3 && e[0].is_string() && e[1].is_string() && e[2].is_string(),
          who, ": events[", i, "] must be [kind, fqn, training_state] strings, got ", e.dump());
    }
  }
  if (obs.contains(kLosses)) {
    const auto& l = obs[kLosses];
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, l.is_array(), who, ": losses must be an array");
    for (size_t i = 0; i < l.size(); ++i) {
      FSDP_CHECK_CODE(ErrorCode::kDataLoss, l[i].is_number(), who, ": losses[", i,
                      "] must be a number, got ", l[i].dump());
    }
  }
  if (obs.contains(kTensors)) {
    const auto& t = obs[kTensors];
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, t.is_object(), who,
                    ": tensors must be an object {name: {shape, dtype, data}}");
    for (auto it = t.begin(); it != t.end(); ++it) ValidateTensorEntry(it.key(), *it, who);
  }
}

const nlohmann::json& RankObservation(const std::vector<nlohmann::json>& per_rank, int rank,
                                      const std::string& key) {
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, rank >= 0 && rank < static_cast<int>(per_rank.size()),
                  "no observations for rank ", rank, " (", per_rank.size(), " ranks reported)");
  const auto& obs = per_rank[rank];
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, obs.is_object() && obs.contains(key), "rank ", rank,
                  " reported no '", key, "' (keys: ", KeysOf(obs), ")");
  return obs.at(key);
}

std::vector<double> TensorData(const std::vector<nlohmann::json>& per_rank, int rank,
                               const std::string& name) {
  const auto& entry = TensorEntry(per_rank, rank, name);
  ValidateTensorEntry(name, entry, "rank " + std::to_string(rank));
  return entry["data"].get<std::vector<double>>();
}

std::vector<int64_t> TensorShape(const std::vector<nlohmann::json>& per_rank, int rank,
                                 const std::string& name) {
  const auto& entry = TensorEntry(per_rank, rank, name);
  ValidateTensorEntry(name, entry, "rank " + std::to_string(rank));
  return entry["shape"].get<std::vector<int64_t>>();
}

int64_t CommCount(const std::vector<nlohmann::json>& per_rank, int rank, const std::string& phase,
                  const std::string& op) {
  const auto& cc = RankObservation(per_rank, rank, kCommCounts);
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, cc.is_object() && cc.contains(phase), "rank ", rank,
                  " reported no comm_counts phase '", phase, "' (phases: ", KeysOf(cc), ")");
  const auto& p = cc.at(phase);
  if (!p.is_object() || !p.contains(op)) return 0;
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, p.at(op).is_number_integer(), "rank ", rank,
                  ": comm_counts.", phase, ".", op, " is not an integer");
  return p.at(op).get<int64_t>();
}

std::vector<double> Losses(const std::vector<nlohmann::json>& per_rank, int rank) {
  const auto& l = RankObservation(per_rank, rank, kLosses);
  ValidateObservations(nlohmann::json{{kLosses, l}}, "rank " + std::to_string(rank));
  return l.get<std::vector<double>>();
}

nlohmann::json ReportedObservations(const nlohmann::json& observations) {
  nlohmann::json out = nlohmann::json::object();
  if (!observations.is_object()) return nullptr;
  for (const char* key : {kCommCounts, kEvents, kLosses}) {
    if (observations.contains(key)) out[key] = observations[key];
  }
  return out.empty() ? nlohmann::json(nullptr) : out;
}

namespace {

void FindDifference(const nlohmann::json& a, const nlohmann::json& b, const std::string& path,
                    std::string& out) {
  if (!out.empty() || a == b) return;
  const std::string here = path.empty() ? "(top)" : path;
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items()) {
      const std::string sub = path.empty() ? key : path + "." + key;
      if (!b.contains(key)) {
        out = sub + ": missing in the second";
        return;
      }
      FindDifference(value, b.at(key), sub, out);
      if (!out.empty()) return;
    }
    for (const auto& [key, value] : b.items()) {
      if (!a.contains(key)) {
        out = (path.empty() ? key : path + "." + key) + ": only in the second";
        return;
      }
    }
  } else if (a.is_array() && b.is_array() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size() && out.empty(); ++i) {
      FindDifference(a[i], b[i], here + "[" + std::to_string(i) + "]", out);
    }
  } else {
    auto cut = [](const nlohmann::json& v) {
      std::string text = v.dump();
      return text.size() > 80 ? text.substr(0, 77) + "..." : text;
    };
    out = here + ": " + cut(a) + " vs " + cut(b);
  }
}

}  // namespace

std::string FirstDifference(const nlohmann::json& expected, const nlohmann::json& actual) {
  std::string out;
  FindDifference(expected, actual, "", out);
  return out;
}

}  // namespace fsdp::conformance
