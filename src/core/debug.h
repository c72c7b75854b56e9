/* Invariants, checked in debug builds (SQLite's assert discipline): KVS_ASSERT(cond) states
 * something that holds whatever the input, so a failure is a bug in kvslim, never a user error
 * (those get a kvs_status and a message). Active unless NDEBUG is defined: Release builds define
 * it (CMakeLists.txt), the Debug + sanitizer build of CI and the allocation-failure test do not.
 * A failed assertion prints the condition and its place to stderr and aborts. */
#ifndef KVS_DEBUG_H
#define KVS_DEBUG_H

#ifdef NDEBUG
#define KVS_ASSERT(cond) ((void)0)
/* For code that exists only to state an invariant (a loop over slots, say). */
#define KVS_DEBUG_ONLY(...)
#else
#define KVS_ASSERT(cond) ((cond) ? (void)0 : kvs_assert_fail(#cond, __FILE__, __LINE__, __func__))
#define KVS_DEBUG_ONLY(...) __VA_ARGS__
#endif

_Noreturn void kvs_assert_fail(const char *cond, const char *file, int line, const char *func);

#endif
