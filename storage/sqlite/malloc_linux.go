package sqlite

/*
#include <malloc.h>
*/
import "C"

// SQLite allocates with malloc from whichever thread runs it, and glibc
// gives busy threads arenas of their own (up to eight per core) that keep
// their freed memory. Opening and closing many namespace files, each with
// its connections and caches, then leaves most of that memory stranded in
// arenas: ledgerd's resident size after 2,000 namespaces were used in
// turn was 259 MiB with the default and 160 MiB with one arena
// (BENCHMARKS.md; two arenas: 226 MiB). SQLite's per-connection
// lookaside buffers serve most small allocations without malloc, so one
// arena's lock is rarely contended.
func init() { C.mallopt(C.M_ARENA_MAX, 1) }
