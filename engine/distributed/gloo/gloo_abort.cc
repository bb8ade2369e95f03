#include "engine/distributed/gloo/gloo_abort.h"

#include <gloo/transport/context.h>
#include <gloo/transport/tcp/context.h>

#include <memory>

namespace fsdp::distributed {

namespace {

// Reaches gloo::Context's protected transport context: a pointer to member formed through a
// derived class is a pointer to the base's member ([class.protected]); nothing is constructed.
struct TransportContextOf : ::gloo::Context {
  static std::shared_ptr<::gloo::transport::Context>& Of(::gloo::Context& context) {
    return context.*(&TransportContextOf::transportContext_);
  }
};

// Reaches transport::tcp::Context's protected signalException, the same way.
struct TcpContextAbort : ::gloo::transport::tcp::Context {
  static void Abort(::gloo::transport::tcp::Context& context, const std::string& why) {
    (context.*(&TcpContextAbort::signalException))(why);
  }
};

}  // namespace

bool AbortGlooContext(::gloo::Context& context, const std::string& why) {
  auto tcp = std::dynamic_pointer_cast<::gloo::transport::tcp::Context>(
      TransportContextOf::Of(context));
  if (tcp == nullptr) return false;
  TcpContextAbort::Abort(*tcp, why);
  return true;
}

}  // namespace fsdp::distributed
