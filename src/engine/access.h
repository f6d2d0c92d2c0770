// The library's own way to the state behind the public handles: include/ultra declares detail::Access a
// friend of Context, Model and Tokenizer and gives users no accessor. Internal code, the tests and the
// benchmarks include this header (src/ is not installed); the types it returns are defined in
// engine/model_impl.h (Model, Tokenizer) and engine/context.cpp (Context).
#pragma once

#include "ultra/context.h"
#include "ultra/model.h"

namespace ultra::detail {

struct Access {
  static Context::Impl& impl(Context& c) { return *c.impl_; }
  static const Model::Impl& impl(const Model& m) { return *m.impl_; }
  static const Tokenizer::Impl& impl(const Tokenizer& t) { return *t.impl_; }
};

inline Context::Impl& impl(Context& c) {
  return Access::impl(c);
}
inline const Model::Impl& impl(const Model& m) {
  return Access::impl(m);
}
inline const Tokenizer::Impl& impl(const Tokenizer& t) {
  return Access::impl(t);
}

}  // namespace ultra::detail
