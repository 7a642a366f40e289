// A probe of the daemon's layering (daemon/CMakeLists.txt), compiled in job/'s include view by
// two CTest entries: without GRADSYNC_PROBE_WRONG_WAY it includes only what job/ may use, and
// must build; with it, it also includes a header of control/, a folder above job/, and the
// build must fail on that include ("No such file or directory"), not on anything else.
#include "daemon/job/worker.h"
#include "daemon/model/tensor_set.h"
#include "daemon/util/log.h"
#ifdef GRADSYNC_PROBE_WRONG_WAY
#include "daemon/control/server.h"
#endif

namespace gradsync {

// Something to compile, so that the probe is a real translation unit of job/'s view.
size_t layering_probe(const Worker& worker) { return worker.pending_ops(); }

}  // namespace gradsync
