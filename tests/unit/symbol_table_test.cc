// shared/symbol_table.h: entry points resolved into typed slots, and the first missing one
// named (what tells an operator which CUDA driver or NCCL is too old).
#include "shared/symbol_table.h"

#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <cstring>

namespace gradsync {
namespace {

TEST_CASE("symbol table: resolves typed entry points and names the first one missing", "[symbol_table]") {
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(libc != nullptr);
  decltype(&std::strlen) length = nullptr;
  decltype(&std::strcmp) compare = nullptr;
  decltype(&std::strlen) absent = nullptr;
  decltype(&std::strcmp) after = nullptr;

  SymbolTable all(libc);
  all("strlen", &length)("strcmp", &compare);
  CHECK(all.complete());
  CHECK(all.missing().empty());
  REQUIRE(length != nullptr);
  CHECK(length("four") == 4);
  CHECK(compare("a", "a") == 0);

  SymbolTable some(libc);
  some("strlen", &length)("gradsync_no_such_symbol", &absent)("strcmp", &after);
  CHECK_FALSE(some.complete());
  CHECK(some.missing() == "gradsync_no_such_symbol");
  CHECK(absent == nullptr);
  CHECK(after == nullptr);  // not looked up after the first one missing
  ::dlclose(libc);
}

}  // namespace
}  // namespace gradsync
