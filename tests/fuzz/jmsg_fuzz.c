/* Fuzz target: the gateway's check and parse of a message a kernel sends
 * (gateway/code/jmsg.h, jmsg_parse) — frames written by code inside a
 * sandbox.
 *
 * Input: byte 0 selects (mod 2); the rest is a list of frames, each a
 * 2-byte little-endian length then that many bytes (a length past the end
 * takes what is left), at most JMSG_FRAMES_MAX frames.
 *
 *   0 the frames as given, signature and all (a kernel that does not know
 *     the key)
 *   1 the same, but the frame after the first "<IDS|MSG>" is replaced by
 *     the right signature of the four frames after it under the fuzzer's
 *     key, so the JSON parsing behind the signature check is reached; the
 *     message is then also parsed with one signature digit changed, which
 *     must be refused
 *
 * Besides memory errors, checks what the kernel code relies on: an
 * accepted message has a signature that verifies, four JSON objects and a
 * msg_type string, and a non-NULL parent_id; a refused one hands nothing
 * out.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/code/jmsg.h"

#define FUZZ_TARGET "jmsg_fuzz"
#include "tests/fuzz/check.h"

static const char KEY[] = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
static const char DELIM[] = "<IDS|MSG>";

/* Splits `data` into frames; their count. */
static size_t
split (const uint8_t *data, size_t size, const void *frames[JMSG_FRAMES_MAX], size_t lens[JMSG_FRAMES_MAX])
{
  size_t n = 0, at = 0;
  while (at < size && n < JMSG_FRAMES_MAX)
    {
      size_t len = data[at];
      if (at + 1 < size)
        len |= (size_t) data[at + 1] << 8;
      at += 2;
      if (at > size)
        at = size;
      if (len > size - at)
        len = size - at;
      frames[n] = data + at;
      lens[n] = len;
      n++;
      at += len;
    }
  return n;
}

/* Parses; checks an accepted message's shape, and returns whether it was. */
static int
parse_checked (const void *const *frames, const size_t *lens, size_t n)
{
  jmsg_t m;
  memset (&m, 0xa5, sizeof m);
  err_t err = {0};
  int rc = jmsg_parse (KEY, frames, lens, n, &m, &err);
  if (rc < 0)
    {
      CHECK (err.msg != NULL);
      err_release (&err);
      return 0;
    }
  CHECK (rc == 0);
  CHECK (json_is_object (m.header) && json_is_object (m.parent));
  CHECK (json_is_object (m.metadata) && json_is_object (m.content));
  CHECK (m.msg_type != NULL && m.parent_id != NULL);
  jmsg_clear (&m);
  return 1;
}

/* Index of the first delimiter frame, or n. */
static size_t
delimiter (const void *const *frames, const size_t *lens, size_t n)
{
  for (size_t d = 0; d < n; d++)
    if (lens[d] == strlen (DELIM) && memcmp (frames[d], DELIM, lens[d]) == 0)
      return d;
  return n;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  const void *frames[JMSG_FRAMES_MAX];
  size_t lens[JMSG_FRAMES_MAX];
  size_t n = split (data + 1, size - 1, frames, lens);
  if (data[0] % 2 == 0)
    {
      parse_checked (frames, lens, n);
      return 0;
    }
  size_t d = delimiter (frames, lens, n);
  if (d == n || n - d < 6)
    {
      CHECK (!parse_checked (frames, lens, n));
      return 0;
    }
  char sig[65];
  jmsg_sign (KEY, frames + d + 2, lens + d + 2, sig);
  frames[d + 1] = sig;
  lens[d + 1] = 64;
  parse_checked (frames, lens, n);
  sig[0] = sig[0] == '0' ? '1' : '0';
  CHECK (!parse_checked (frames, lens, n));
  return 0;
}
