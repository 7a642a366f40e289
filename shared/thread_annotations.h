// Clang's thread-safety annotations, as macros that vanish on other compilers. They turn the
// locking rules that used to be comments ("guarded by mutex_") into declarations the compiler
// checks: `clang++ -Wthread-safety` refuses a read of a GS_GUARDED_BY member without its mutex
// held, a call to a GS_REQUIRES function without it, and a lock taken twice. CI runs that check
// over daemon/ and client/ (tests/build/thread_safety.py).
//
// The names follow Clang's documentation (clang.llvm.org/docs/ThreadSafetyAnalysis.html) and
// abseil's thread_annotations.h, with a GS_ prefix so that they cannot collide with a
// dependency's. They only mean something on a capability type: std::mutex in libstdc++ is not
// one, so the project locks gradsync::Mutex (shared/mutex.h).
#pragma once

#if defined(__clang__)
#define GS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GS_THREAD_ANNOTATION(x)
#endif

// A type that is a lock ("mutex").
#define GS_CAPABILITY(name) GS_THREAD_ANNOTATION(capability(name))
// An RAII type that holds a capability for its lifetime.
#define GS_SCOPED_CAPABILITY GS_THREAD_ANNOTATION(scoped_lockable)
// A member read or written only with `mutex` held.
#define GS_GUARDED_BY(mutex) GS_THREAD_ANNOTATION(guarded_by(mutex))
// A pointer member whose pointee is read or written only with `mutex` held.
#define GS_PT_GUARDED_BY(mutex) GS_THREAD_ANNOTATION(pt_guarded_by(mutex))
// A function called only with the capabilities held (and still held when it returns).
#define GS_REQUIRES(...) GS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// A function called only without the capabilities held (it takes them itself).
#define GS_EXCLUDES(...) GS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// A function that takes, releases, or tries to take the capabilities.
#define GS_ACQUIRE(...) GS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define GS_RELEASE(...) GS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define GS_TRY_ACQUIRE(...) GS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// A function that returns a reference to the capability (an accessor).
#define GS_RETURN_CAPABILITY(x) GS_THREAD_ANNOTATION(lock_returned(x))
// The analysis is off for this function: its locking is correct for a reason the analysis
// cannot follow, which a comment beside it must give.
#define GS_NO_THREAD_SAFETY_ANALYSIS GS_THREAD_ANNOTATION(no_thread_safety_analysis)
