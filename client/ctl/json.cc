#include "client/ctl/json.h"

#include <cmath>
#include <cstdio>

namespace gradsync::ctl {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void indent(int depth, std::string* out) { out->append(static_cast<size_t>(depth) * 2, ' '); }

void quote(const std::string& text, std::string* out) {
  out->push_back('"');
  for (unsigned char c : text) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out->append(escaped);
        } else {
          out->push_back(static_cast<char>(c));  // UTF-8 passes through
        }
    }
  }
  out->push_back('"');
}

void number(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("\"NaN\"");
  } else if (value >= 1e300) {
    out->append("\"+Inf\"");
  } else if (value <= -1e300) {
    out->append("\"-Inf\"");
  } else {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", value);
    out->append(text);
  }
}

void message_to_json(const Message& message, int depth, std::string* out);

// One value of `field` (element `index` of a repeated one, else -1).
void value_to_json(const Message& message, const FieldDescriptor* field, int index, int depth, std::string* out) {
  const Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      out->append(std::to_string(repeated ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field)));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      out->append(std::to_string(repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field)));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      out->append(
          std::to_string(repeated ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field)));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      out->append(
          std::to_string(repeated ? r->GetRepeatedUInt64(message, field, index) : r->GetUInt64(message, field)));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      number(repeated ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field), out);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      number(repeated ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field), out);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out->append((repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field)) ? "true"
                                                                                                      : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      quote((repeated ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field))->name(), out);
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      quote(repeated ? r->GetRepeatedString(message, field, index) : r->GetString(message, field), out);
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      message_to_json(repeated ? r->GetRepeatedMessage(message, field, index) : r->GetMessage(message, field), depth,
                      out);
      break;
  }
}

void message_to_json(const Message& message, int depth, std::string* out) {
  const auto* descriptor = message.GetDescriptor();
  if (descriptor->field_count() == 0) {
    out->append("{}");
    return;
  }
  out->append("{\n");
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    indent(depth + 1, out);
    quote(field->json_name(), out);
    out->append(": ");
    if (field->is_repeated()) {
      const int size = message.GetReflection()->FieldSize(message, field);
      if (size == 0) {
        out->append("[]");
      } else {
        out->append("[\n");
        for (int k = 0; k < size; ++k) {
          indent(depth + 2, out);
          value_to_json(message, field, k, depth + 2, out);
          out->append(k + 1 < size ? ",\n" : "\n");
        }
        indent(depth + 1, out);
        out->push_back(']');
      }
    } else {
      value_to_json(message, field, -1, depth + 1, out);
    }
    out->append(i + 1 < descriptor->field_count() ? ",\n" : "\n");
  }
  indent(depth, out);
  out->push_back('}');
}

}  // namespace

std::string to_json(const Message& message) {
  std::string out;
  message_to_json(message, 0, &out);
  out.push_back('\n');
  return out;
}

}  // namespace gradsync::ctl
