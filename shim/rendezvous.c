/* rendezvous: the pure half of members.c — which member owns an id
 * (highest random weight over the listed members, skipping those down),
 * and what a probe's answer makes of a member. No state, no I/O; the unit
 * tests call these directly. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shim/members.h"

/* MurmurHash3's 64-bit finaliser: every input bit affects every output bit. */
static uint64_t
mix64 (uint64_t k)
{
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

/* FNV-1a over the text, then mixed. */
uint64_t
members_hash_text (const char *s)
{
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *s != '\0'; s++)
    h = (h ^ (unsigned char) *s) * 0x100000001b3ULL;
  return mix64 (h);
}

uint64_t
members_weight_of (uint64_t m, uint64_t id)
{
  return mix64 (m ^ mix64 (id + 0x9e3779b97f4a7c15ULL));
}

uint64_t
members_weight (const char *member, const char *id)
{
  return members_weight_of (members_hash_text (member), members_hash_text (id != NULL ? id : ""));
}

int
members_choose (const uint64_t *weights, const bool *listed, const member_state_t *states, size_t n, bool *failover)
{
  int best = -1, live = -1;
  for (size_t i = 0; i < n; i++)
    {
      if (!listed[i])
        continue;
      if (best < 0 || weights[i] > weights[best])
        best = (int) i;
      if (states[i] != MEMBER_DOWN && (live < 0 || weights[i] > weights[live]))
        live = (int) i;
    }
  if (live < 0)
    live = best;
  *failover = live != best;
  return live;
}

member_state_t
members_state_of_probe (bool answered, bool serving, bool refused_by_handler)
{
  if (!answered)
    return MEMBER_DOWN;
  if (serving)
    return MEMBER_UP;
  return refused_by_handler ? MEMBER_DRAINING : MEMBER_DOWN;
}
