/* err: construction, wrapping and release of err_t (see err.h).
 * No global state; safe from any thread. */
#include "common/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *
vformat (const char *fmt, va_list ap)
{
  char *s = NULL;
  if (vasprintf (&s, fmt, ap) < 0)
    return NULL;
  return s;
}

static int
fill (err_t *err, int status, char *msg)
{
  if (err == NULL)
    {
      free (msg);
      return -1;
    }
  err_release (err);
  err->status = status != 0 ? status : EIO;
  err->msg = msg != NULL ? msg : strdup ("out of memory formatting an error");
  return -1;
}

int
err_make (err_t *err, int status, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *msg = vformat (fmt, ap);
  va_end (ap);
  return fill (err, status, msg);
}

int
err_make_reason (err_t *err, int status, const char *reason, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *msg = vformat (fmt, ap);
  va_end (ap);
  int rc = fill (err, status, msg);
  if (err != NULL)
    err->reason = reason;
  return rc;
}

int
err_make_sys (err_t *err, int status, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *prefix = vformat (fmt, ap);
  va_end (ap);
  char *msg = NULL;
  if (prefix != NULL && asprintf (&msg, "%s: %s", prefix, strerror (status)) < 0)
    msg = NULL;
  free (prefix);
  return fill (err, status, msg);
}

int
err_wrap (err_t *err, const char *fmt, ...)
{
  if (err == NULL)
    return -1;
  va_list ap;
  va_start (ap, fmt);
  char *prefix = vformat (fmt, ap);
  va_end (ap);
  char *msg = NULL;
  if (prefix != NULL && asprintf (&msg, "%s: %s", prefix, err_msg (err)) < 0)
    msg = NULL;
  free (prefix);
  if (msg != NULL)
    {
      free (err->msg);
      err->msg = msg;
    }
  if (err->status == 0)
    err->status = EIO;
  return -1;
}

void
err_release (err_t *err)
{
  if (err == NULL)
    return;
  free (err->msg);
  err->msg = NULL;
  err->status = 0;
  err->reason = NULL;
}

const char *
err_msg (const err_t *err)
{
  return err != NULL && err->msg != NULL ? err->msg : "";
}
