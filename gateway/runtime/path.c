/* runtime/path: checked path formatting (see path.h). No state. */
#include "gateway/runtime/path.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

int
sbx_path_fmt (char *buf, size_t cap, err_t *err, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  int n = cap > 0 ? vsnprintf (buf, cap, fmt, ap) : -1;
  va_end (ap);
  if (n >= 0 && (size_t) n < cap)
    return n;
  int e = n < 0 && cap > 0 ? EINVAL : ENAMETOOLONG;
  if (n >= 0 && err != NULL)
    err_make (err, e, "path `%.64s...` is %d bytes, longer than the %zu this place allows", buf, n, cap - 1);
  else if (err != NULL)
    err_make (err, e, "a path could not be formatted (`%s`)", fmt);
  if (cap > 0)
    buf[0] = '\0';
  errno = e;
  return -1;
}
