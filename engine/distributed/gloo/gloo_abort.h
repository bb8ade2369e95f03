// AbortGlooContext: fails every transfer in flight on a Gloo context, from any thread, so that a
// rank blocked inside a collective returns with an error instead of waiting out the
// collective's timeout (the CollectiveWatchdog's abort for Gloo groups; c10d's
// ProcessGroupNCCL::abort() is the model).
//
// Gloo 0.5 has no public abort: its TCP transport does it itself when an unbound buffer's wait
// times out (transport::tcp::Context::signalException: every pair takes the exception, wakes
// the buffers waiting on it and closes its socket, so peers see their connection closed). This
// calls that same function, reaching the protected member through a derived class.
//
// Afterwards the context is unusable (every pair is closed); the group that owns it must be
// marked broken. Contexts of other transports than TCP are left alone (false).
//
// Thread-safety: safe while another thread is blocked in a collective on `context` (the pairs
// lock themselves, as for Gloo's own timeout); the context must outlive the call.
#pragma once

#include <gloo/context.h>

#include <string>

namespace fsdp::distributed {

// Fails every pending and future transfer of `context` with `why` (a Gloo IoException in the
// threads using it). True when the context was a TCP one and was aborted.
bool AbortGlooContext(::gloo::Context& context, const std::string& why);

}  // namespace fsdp::distributed
