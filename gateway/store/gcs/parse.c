/* gcs parse: status lines, Location/Range/x-goog-hash headers, CRC32C and
 * base64 (see parse.h). Length-bounded, allocation-free except
 * gcs_base64url; the CRC32C tables are built once under pthread_once. */
#include "gateway/store/gcs/parse.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

#include "common/cleanup.h"

/* ---- HTTP ---------------------------------------------------------------- */

static int
is_blank (char c)
{
  return c == ' ' || c == '\t';
}

static int
is_digit (char c)
{
  return c >= '0' && c <= '9';
}

int
gcs_parse_status_line (const char *line, size_t len, long *code)
{
  if (line == NULL || len < 5 || memcmp (line, "HTTP/", 5) != 0)
    return 0;
  size_t i = 5;
  /* The version: "1.1", "1.0", "2", "3". */
  size_t vstart = i;
  while (i < len && (is_digit (line[i]) || line[i] == '.') && i - vstart < 8)
    i++;
  if (i == vstart || i >= len || line[i] != ' ')
    return -1;
  while (i < len && line[i] == ' ')
    i++;
  if (len - i < 3 || !is_digit (line[i]) || !is_digit (line[i + 1]) || !is_digit (line[i + 2]))
    return -1;
  long c = (line[i] - '0') * 100 + (line[i + 1] - '0') * 10 + (line[i + 2] - '0');
  i += 3;
  if (i < len && line[i] != ' ' && line[i] != '\r' && line[i] != '\n')
    return -1;
  if (c < 100 || c > 599)
    return -1;
  *code = c;
  return 1;
}

int
gcs_header_value (const char *line, size_t len, const char *name, const char **value, size_t *vlen)
{
  size_t nlen = strlen (name);
  if (line == NULL || len <= nlen || line[nlen] != ':' || strncasecmp (line, name, nlen) != 0)
    return 0;
  size_t start = nlen + 1;
  size_t end = len;
  while (start < end && is_blank (line[start]))
    start++;
  while (end > start && (is_blank (line[end - 1]) || line[end - 1] == '\r' || line[end - 1] == '\n'))
    end--;
  *value = line + start;
  *vlen = end - start;
  return 1;
}

/* Parses 1..20 decimal digits at text[*i..len) into *out; -1 on none or
 * overflow. */
static int
parse_u64 (const char *text, size_t len, size_t *i, uint64_t *out)
{
  size_t start = *i;
  uint64_t v = 0;
  while (*i < len && is_digit (text[*i]))
    {
      uint64_t d = (uint64_t) (text[*i] - '0');
      if (v > (UINT64_MAX - d) / 10)
        return -1;
      v = v * 10 + d;
      (*i)++;
    }
  if (*i == start)
    return -1;
  *out = v;
  return 0;
}

int
gcs_parse_range (const char *value, size_t len, uint64_t *committed)
{
  if (value == NULL || len < 9 || strncasecmp (value, "bytes=", 6) != 0)
    return -1;
  size_t i = 6;
  uint64_t first = 0, last = 0;
  if (parse_u64 (value, len, &i, &first) < 0 || first != 0)
    return -1;
  if (i >= len || value[i] != '-')
    return -1;
  i++;
  if (parse_u64 (value, len, &i, &last) < 0 || i != len || last == UINT64_MAX)
    return -1;
  *committed = last + 1;
  return 0;
}

static int
b64_value (char c)
{
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

/* "XXXXXX==" (the base64 of exactly 4 bytes) into a big-endian uint32. */
static int
decode_crc_b64 (const char *t, size_t len, uint32_t *crc)
{
  if (len != 8 || t[6] != '=' || t[7] != '=')
    return -1;
  uint64_t bits = 0;
  for (size_t i = 0; i < 6; i++)
    {
      int v = b64_value (t[i]);
      if (v < 0)
        return -1;
      bits = (bits << 6) | (uint64_t) v;
    }
  if ((bits & 0xf) != 0) /* 36 bits carry 32: the last 4 must be zero */
    return -1;
  *crc = (uint32_t) (bits >> 4);
  return 0;
}

int
gcs_parse_goog_hash_crc32c (const char *value, size_t len, uint32_t *crc)
{
  if (value == NULL)
    return 0;
  int found = 0;
  uint32_t seen = 0;
  size_t i = 0;
  while (i < len)
    {
      size_t start = i;
      while (i < len && value[i] != ',')
        i++;
      size_t end = i;
      if (i < len)
        i++; /* the comma */
      while (start < end && is_blank (value[start]))
        start++;
      while (end > start && is_blank (value[end - 1]))
        end--;
      if (end - start < 7 || strncasecmp (value + start, "crc32c=", 7) != 0)
        continue;
      uint32_t c = 0;
      if (decode_crc_b64 (value + start + 7, end - start - 7, &c) < 0)
        return -1;
      if (found && c != seen)
        return -1;
      found = 1;
      seen = c;
    }
  if (found)
    *crc = seen;
  return found;
}

/* ---- CRC32C -------------------------------------------------------------- */

/* Slicing-by-8 tables for the reflected Castagnoli polynomial; the SSE4.2
 * crc32 instruction computes the same function where the CPU has it. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_have_hw;

static void
crc_init (void)
{
  for (uint32_t n = 0; n < 256; n++)
    {
      uint32_t c = n;
      for (int k = 0; k < 8; k++)
        c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      crc_table[0][n] = c;
    }
  for (uint32_t n = 0; n < 256; n++)
    for (int k = 1; k < 8; k++)
      crc_table[k][n] = (crc_table[k - 1][n] >> 8) ^ crc_table[0][crc_table[k - 1][n] & 0xff];
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init ();
  crc_have_hw = __builtin_cpu_supports ("sse4.2");
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__ ((target ("sse4.2"))) static uint32_t
crc_hw (uint32_t c, const uint8_t *p, size_t len)
{
  uint64_t c64 = c;
  while (len >= 8)
    {
      uint64_t w;
      memcpy (&w, p, 8);
      c64 = __builtin_ia32_crc32di (c64, w);
      p += 8;
      len -= 8;
    }
  uint32_t c32 = (uint32_t) c64;
  while (len-- > 0)
    c32 = __builtin_ia32_crc32qi (c32, *p++);
  return c32;
}
#endif

static uint32_t
crc_sw (uint32_t c, const uint8_t *p, size_t len)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  while (len >= 8)
    {
      uint64_t w;
      memcpy (&w, p, 8);
      w ^= c;
      c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff]
          ^ crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff]
          ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
      p += 8;
      len -= 8;
    }
#endif
  while (len-- > 0)
    c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
  return c;
}

/* For tests: 1 forces the table path even where SSE4.2 exists. */
int gcs_crc32c_force_sw;

uint32_t
gcs_crc32c (uint32_t crc, const uint8_t *data, size_t len)
{
  pthread_once (&crc_once, crc_init);
  uint32_t c = ~crc;
  if (len == 0)
    return crc;
#if defined(__x86_64__) && defined(__GNUC__)
  if (crc_have_hw && !gcs_crc32c_force_sw)
    return ~crc_hw (c, data, len);
#endif
  return ~crc_sw (c, data, len);
}

/* ---- base64 -------------------------------------------------------------- */

void
gcs_crc32c_base64 (uint32_t crc, char out[9])
{
  unsigned char be[4]
      = {(unsigned char) (crc >> 24), (unsigned char) (crc >> 16), (unsigned char) (crc >> 8), (unsigned char) crc};
  unsigned char tmp[16];
  EVP_EncodeBlock (tmp, be, 4); /* 8 characters and a NUL */
  memcpy (out, tmp, 9);
}

char *
gcs_base64url (const uint8_t *data, size_t len)
{
  if (len > (size_t) INT_MAX / 2)
    return NULL;
  size_t cap = 4 * ((len + 2) / 3) + 1;
  cleanup_free unsigned char *out = malloc (cap);
  if (out == NULL)
    return NULL;
  int n = EVP_EncodeBlock (out, data, (int) len);
  if (n < 0)
    return NULL;
  while (n > 0 && out[n - 1] == '=')
    n--;
  out[n] = '\0';
  for (int i = 0; i < n; i++)
    {
      if (out[i] == '+')
        out[i] = '-';
      else if (out[i] == '/')
        out[i] = '_';
    }
  return take_ptr (&out);
}
