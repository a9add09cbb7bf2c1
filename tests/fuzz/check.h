/* check: the fuzz targets' invariant check. A failed CHECK names the
 * target (FUZZ_TARGET, defined before this header is included), what it
 * was checking (CHECK_IN's `what`, e.g. a message type), the condition and
 * its line, then aborts, so that libFuzzer (or the replay test) stops at
 * the input that broke it. */
#ifndef SBX_TESTS_FUZZ_CHECK_H
#define SBX_TESTS_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#ifndef FUZZ_TARGET
#error "define FUZZ_TARGET (the fuzz target's name) before including tests/fuzz/check.h"
#endif

#define CHECK_IN(what, cond)                                                                                         \
  do                                                                                                                 \
    {                                                                                                                \
      if (!(cond))                                                                                                   \
        {                                                                                                            \
          const char *what_ = (what);                                                                                \
          fprintf (stderr, "%s: %s%scheck failed: %s (line %d)\n", FUZZ_TARGET, what_, what_[0] ? ": " : "", #cond,  \
                   __LINE__);                                                                                        \
          abort ();                                                                                                  \
        }                                                                                                            \
    }                                                                                                                \
  while (0)

#define CHECK(cond) CHECK_IN ("", cond)

#endif
