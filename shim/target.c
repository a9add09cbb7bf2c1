/* target: the strict check of SHIM_GATEWAY_TARGET (see target.h). */
#include "shim/target.h"

#include <arpa/inet.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Longest DNS name and label (RFC 1035). */
#define NAME_MAX_LEN 253
#define LABEL_MAX_LEN 63

static bool
is_alnum (char c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* A DNS name of `len` bytes: dot-separated labels of letters, digits and
 * inner hyphens. */
static bool
dns_name_valid (const char *s, size_t len)
{
  if (len == 0 || len > NAME_MAX_LEN)
    return false;
  size_t label = 0;
  for (size_t i = 0; i < len; i++)
    {
      char c = s[i];
      if (c == '.')
        {
          if (label == 0 || s[i - 1] == '-')
            return false;
          label = 0;
          continue;
        }
      if (!is_alnum (c) && !(c == '-' && label > 0))
        return false;
      if (++label > LABEL_MAX_LEN)
        return false;
    }
  return label > 0 && s[len - 1] != '-';
}

/* A decimal port 1..65535 of `len` bytes. */
static bool
port_valid (const char *s, size_t len)
{
  if (len == 0 || len > 5)
    return false;
  long v = 0;
  for (size_t i = 0; i < len; i++)
    {
      if (s[i] < '0' || s[i] > '9')
        return false;
      v = v * 10 + (s[i] - '0');
    }
  return v >= 1 && v <= 65535;
}

/* `len` bytes of an address as text, copied to check it with inet_pton. */
static bool
address_valid (int family, const char *s, size_t len)
{
  char buf[INET6_ADDRSTRLEN + 1];
  unsigned char out[sizeof (struct in6_addr)];
  if (len == 0 || len >= sizeof buf)
    return false;
  memcpy (buf, s, len);
  buf[len] = '\0';
  return inet_pton (family, buf, out) == 1;
}

/* host:port of `len` bytes; `names` allows DNS names as the host. */
static bool
host_port_valid (const char *s, size_t len, bool names)
{
  const char *colon = NULL;
  if (len > 0 && s[0] == '[')
    {
      const char *close = memchr (s, ']', len);
      if (close == NULL || close + 1 == s + len || close[1] != ':')
        return false;
      if (!address_valid (AF_INET6, s + 1, (size_t) (close - s - 1)))
        return false;
      colon = close + 1;
    }
  else
    {
      for (size_t i = len; i > 0 && colon == NULL; i--)
        if (s[i - 1] == ':')
          colon = s + i - 1;
      if (colon == NULL)
        return false;
      size_t hlen = (size_t) (colon - s);
      if (!address_valid (AF_INET, s, hlen) && !(names && dns_name_valid (s, hlen)))
        return false;
    }
  return port_valid (colon + 1, (size_t) (s + len - colon - 1));
}

/* A comma-separated list of host:port (the ipv4: and ipv6: schemes). */
static bool
address_list_valid (const char *s, int family)
{
  for (;;)
    {
      const char *comma = strchr (s, ',');
      size_t len = comma != NULL ? (size_t) (comma - s) : strlen (s);
      if ((family == AF_INET6) != (len > 0 && s[0] == '[') || !host_port_valid (s, len, false))
        return false;
      if (comma == NULL)
        return true;
      s = comma + 1;
    }
}

static bool
printable (const char *s)
{
  for (; *s != '\0'; s++)
    if ((unsigned char) *s <= ' ' || *s == 0x7f)
      return false;
  return true;
}

bool
shim_target_valid (const char *t)
{
  if (t == NULL || t[0] == '\0' || !printable (t))
    return false;
  if (strncmp (t, "unix:", 5) == 0)
    {
      const char *path = t + 5;
      if (strncmp (path, "//", 2) == 0)
        return path[2] == '/' && path[3] != '\0';
      return path[0] != '\0';
    }
  if (strncmp (t, "unix-abstract:", 14) == 0)
    return t[14] != '\0';
  if (strncmp (t, "ipv4:", 5) == 0)
    return address_list_valid (t + 5, AF_INET);
  if (strncmp (t, "ipv6:", 5) == 0)
    return address_list_valid (t + 5, AF_INET6);
  if (strncmp (t, "dns:", 4) == 0)
    {
      const char *rest = t + 4;
      if (strncmp (rest, "//", 2) == 0)
        {
          /* dns://[authority]/host:port: the authority is a host[:port]. */
          const char *slash = strchr (rest + 2, '/');
          if (slash == NULL)
            return false;
          size_t alen = (size_t) (slash - rest - 2);
          if (alen > 0 && !host_port_valid (rest + 2, alen, true) && !dns_name_valid (rest + 2, alen)
              && !address_valid (AF_INET, rest + 2, alen))
            return false;
          rest = slash + 1;
        }
      return host_port_valid (rest, strlen (rest), true);
    }
  return host_port_valid (t, strlen (t), true);
}
