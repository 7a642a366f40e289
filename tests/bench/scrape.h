// Reading one counter off a gradsyncd's Prometheus endpoint (--metrics): how the bench gets the
// daemon's own count of the bytes it carried across nodes, rather than computing it.
#pragma once

#include <optional>
#include <string>

namespace gradsync::bench {

// The value of the sample named `name` (no labels) at http://127.0.0.1:port/metrics, or
// nullopt when the endpoint does not answer within 5 s or has no such sample.
std::optional<double> scrape_counter(int port, const std::string& name);

}  // namespace gradsync::bench
