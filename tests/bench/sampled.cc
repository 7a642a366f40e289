#include "tests/bench/sampled.h"

#include <cstdio>
#include <sstream>
#include <vector>

#include "client/tools/process.h"

namespace gradsync::bench {

Measurement sampled(const std::string& command) {
  std::string output;
  int status = -1;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
    status = ::pclose(pipe);
  }
  if (!exited_ok(status)) return missing("`" + command + "` " + describe_wait_status(status) + ": " + output.substr(0, 300));
  std::istringstream in(output);
  std::vector<double> samples;
  std::string word;
  while (in >> word) {
    double v;
    if (word == "sample" && in >> v) samples.push_back(v);
  }
  return samples.empty() ? missing("`" + command + "` printed no samples") : measured(std::move(samples));
}

}  // namespace gradsync::bench
