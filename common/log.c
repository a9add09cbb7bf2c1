/* log: JSON-lines logging to stderr (see log.h). State: the level and the
 * program name, set at start-up; a mutex serialises writes. */
#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static const char *log_program = "sandbox";
static log_level_t log_level = SEV_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};

void
log_set_program (const char *program)
{
  log_program = program;
}

void
log_set_level (log_level_t level)
{
  log_level = level;
}

int
log_parse_level (const char *text, log_level_t *level)
{
  for (size_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++)
    if (strcasecmp (text, level_names[i]) == 0)
      {
        *level = (log_level_t) i;
        return 0;
      }
  if (strcasecmp (text, "warn") == 0)
    {
      *level = SEV_WARNING;
      return 0;
    }
  return -1;
}

int
log_enabled (log_level_t level)
{
  return level >= log_level;
}

static void
log_write (log_level_t level, json_t *fields, const char *fmt, va_list ap)
{
  char *message = NULL;
  if (vasprintf (&message, fmt, ap) < 0)
    message = NULL;

  json_t *line = json_object ();
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r (&ts.tv_sec, &tm);
  char when[40];
  size_t n = strftime (when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf (when + n, sizeof when - n, ".%06ldZ", ts.tv_nsec / 1000);

  json_object_set_new (line, "severity", json_string (level_names[level]));
  json_object_set_new (line, "time", json_string (when));
  json_object_set_new (line, "program", json_string (log_program));
  json_t *msg = message != NULL ? json_string (message) : NULL;
  json_object_set_new (line, "message", msg != NULL ? msg : json_string ("(message not valid UTF-8)"));
  if (fields != NULL)
    json_object_update (line, fields);

  char *text = json_dumps (line, JSON_COMPACT | JSON_ENSURE_ASCII);
  if (text != NULL)
    {
      size_t len = strlen (text);
      pthread_mutex_lock (&log_lock);
      /* One write per line: lines from different threads never interleave. */
      char *buf = malloc (len + 1);
      if (buf != NULL)
        {
          memcpy (buf, text, len);
          buf[len] = '\n';
          size_t off = 0;
          while (off < len + 1)
            {
              ssize_t w = write (STDERR_FILENO, buf + off, len + 1 - off);
              if (w <= 0)
                break;
              off += (size_t) w;
            }
          free (buf);
        }
      pthread_mutex_unlock (&log_lock);
      free (text);
    }
  json_decref (line);
  json_decref (fields);
  free (message);
}

void
log_msg (log_level_t level, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  if (log_enabled (level))
    log_write (level, NULL, fmt, ap);
  va_end (ap);
}

void
log_fields (log_level_t level, json_t *fields, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  if (log_enabled (level))
    log_write (level, fields, fmt, ap);
  else
    json_decref (fields);
  va_end (ap);
}

void
err_warn_release (err_t *err, const char *fmt, ...)
{
  char context[512] = "";
  va_list ap;
  va_start (ap, fmt);
  vsnprintf (context, sizeof context, fmt, ap);
  va_end (ap);
  if (err->status != 0)
    log_msg (SEV_WARNING, "%s: %s", context, err_msg (err));
  err_release (err);
}
