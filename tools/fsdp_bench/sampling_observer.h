// SamplingObserver: the base of fsdp-bench's memory meters (ParamGradMeter, FlatParamMeter). It
// turns every FSDP observer event (unshard, reshard, pre/post backward, of FSDP2 and FSDP1
// alike) into one call of Sample(label), labelled "<event> <fqn or <root>> <training state>",
// so a meter only says what one sample measures.
//
// Ownership: none. Thread-safety: as the observer it is installed as (one rank's thread).
#pragma once

#include <string>

#include "engine/fsdp/observer.h"

namespace fsdp::bench {

class SamplingObserver : public fsdp2::Observer {
 public:
  // Takes one sample labelled `where`.
  virtual void Sample(const std::string& where) = 0;

  void unshard(const std::string& fqn, fsdp2::TrainingState state) override {
    Sample(Label("unshard", fqn, state));
  }
  void reshard(const std::string& fqn, fsdp2::TrainingState state) override {
    Sample(Label("reshard", fqn, state));
  }
  void pre_backward(const std::string& fqn, fsdp2::TrainingState state) override {
    Sample(Label("pre_backward", fqn, state));
  }
  void post_backward(const std::string& fqn, fsdp2::TrainingState state) override {
    Sample(Label("post_backward", fqn, state));
  }

 private:
  static std::string Label(const char* event, const std::string& fqn,
                           fsdp2::TrainingState state) {
    return std::string(event) + " " + (fqn.empty() ? "<root>" : fqn) + " " +
           fsdp2::TrainingStateName(state);
  }
};

}  // namespace fsdp::bench
