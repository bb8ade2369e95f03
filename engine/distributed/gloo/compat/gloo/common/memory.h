// Stand-in for gloo/common/memory.h, which Debian's libgloo-dev (0.0~git20220518) includes from
// gloo/transport/tcp/{context,pair,unbound_buffer}.h but does not ship. Those headers name its
// two class templates only as template arguments and pointees, so declarations suffice for
// code that reaches a TCP context without touching those members (gloo_abort.cc, the only
// user: its include path alone has this folder). Used nowhere else.
#pragma once

namespace gloo {

template <typename T>
class NonOwningPtr;
template <typename T>
class WeakNonOwningPtr;

}  // namespace gloo
