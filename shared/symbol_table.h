// Entry points of a library loaded with dlopen (NCCL in the daemon, the CUDA driver in the
// client), resolved into typed slots by one helper, which names the first symbol missing:
// "lacks cuMemCreate" tells an operator which driver or NCCL is too old, where a bare "lacks an
// entry point" does not.
//
//   SymbolTable table(library);
//   table("cuInit", &d->init)("cuMemCreate", &d->mem_create);
//   if (!table.complete()) return ...(table.missing());
#pragma once

#include <string>

namespace gradsync {

class SymbolTable {
 public:
  // `library`: a handle from dlopen; it must outlive the slots' use (the callers keep theirs
  // loaded for the process's life).
  explicit SymbolTable(void* library) : library_(library) {}

  // Resolves `name` into `slot`, a pointer to function of the symbol's type. After the first
  // symbol that is missing, the rest are not looked up (their slots stay as they were).
  template <typename F>
  SymbolTable& operator()(const char* name, F* slot) {
    if (missing_.empty()) {
      *slot = reinterpret_cast<F>(lookup(name));
      if (*slot == nullptr) missing_ = name;
    }
    return *this;
  }

  bool complete() const { return missing_.empty(); }
  // The first symbol not found ("" when complete).
  const std::string& missing() const { return missing_; }

 private:
  void* lookup(const char* name) const;

  void* library_;
  std::string missing_;
};

}  // namespace gradsync
