// A peer the bench runs as a command (torch gloo, Open MPI under mpirun): its output read whole,
// its "sample <value>" lines as the measurement; missing, with the command and why, when it
// fails or prints none.
#pragma once

#include <string>

#include "tests/bench/report.h"

namespace gradsync::bench {

Measurement sampled(const std::string& command);

}  // namespace gradsync::bench
