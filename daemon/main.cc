// gradsyncd: everything is in daemon_main.cc, in the daemon library.
#include "daemon/daemon_main.h"

int main(int argc, char** argv) { return gradsync::daemon_main(argc, argv); }
