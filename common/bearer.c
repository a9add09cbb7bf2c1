/* bearer: constant-time bearer-token check (see bearer.h). */
#include "common/bearer.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <string.h>
#include <strings.h>

bool
bearer_matches (const char *header, const char *secret)
{
  if (secret == NULL || secret[0] == '\0' || header == NULL)
    return false;
  if (strncasecmp (header, "Bearer ", 7) != 0)
    return false;
  const char *token = header + 7;
  while (*token == ' ')
    token++;
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256 ((const unsigned char *) token, strlen (token), a);
  SHA256 ((const unsigned char *) secret, strlen (secret), b);
  return CRYPTO_memcmp (a, b, sizeof a) == 0;
}
