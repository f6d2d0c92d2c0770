#include "dist/communicator.h"

#include "core/error.h"

namespace ultra::dist {

#ifndef ULTRA_HAVE_MPI
bool have_mpi() {
  return false;
}
std::unique_ptr<Communicator> make_mpi_communicator(const DistOptions&) {
  fail("this build of ultra has no MPI (install libopenmpi-dev and configure again: ULTRA_MPI)");
}
#endif

}  // namespace ultra::dist
