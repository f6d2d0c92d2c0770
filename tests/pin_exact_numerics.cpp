// Linked into every test program: pins the CPU kernels to their f32-exact numerics before main() runs, so
// that the fixtures (HF logits, greedy tokens, CUDA-vs-CPU agreement) see the same arithmetic on every CPU.
// On CPUs with AVX512-VNNI, Q8_0 otherwise multiplies int8-quantised activations (cpu_internal.h's
// q8_int8_enabled()); the tests of that path turn it on themselves (detail::set_q8_int8_override). The
// variable is only set when unset, so `ULTRA_Q8_INT8=1 ctest` still runs the whole suite on the int8 path.
// Programs the tests start (the `ultra` command) inherit it.
#include <cstdlib>

namespace {
const int kPinned = setenv("ULTRA_Q8_INT8", "0", /*overwrite=*/0);
}  // namespace
