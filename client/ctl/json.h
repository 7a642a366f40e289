// gradsyncctl's --json: a reply as JSON, by protobuf reflection. Unlike protobuf's own JSON
// printer, 64-bit integers are numbers (not strings), so jq and scripts compare them as such;
// an unbounded histogram edge (a bound of 1e300 or more, or infinity) is the string "+Inf", as
// Prometheus writes it. Field names are protobuf's JSON names (lowerCamelCase); every field is
// printed, defaults included, so that a script finds each key in every reply.
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace gradsync::ctl {

std::string to_json(const google::protobuf::Message& message);

}  // namespace gradsync::ctl
