#include "shared/symbol_table.h"

#include <dlfcn.h>

namespace gradsync {

void* SymbolTable::lookup(const char* name) const { return ::dlsym(library_, name); }

}  // namespace gradsync
