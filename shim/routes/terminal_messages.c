/* routes/terminal_messages: the terminal WebSocket's JSON messages (see
 * terminal_messages.h). */
#include "shim/routes/terminal_messages.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "shim/routes/routes.h"
#include "shim/validate.h"

/* A signal given as a name ("SIGINT", "int": shim_signal_number's, as the
 * REST signal route takes them) or a number 1..SHIM_SIGNAL_MAX; 0 when
 * neither. */
static int
signal_of (json_t *v)
{
  if (json_is_integer (v))
    {
      json_int_t n = json_integer_value (v);
      return n >= 1 && n <= SHIM_SIGNAL_MAX ? (int) n : 0;
    }
  if (!json_is_string (v))
    return 0;
  int n = shim_signal_number (json_string_value (v));
  return n > 0 ? n : 0;
}

/* A terminal dimension (1..65535), or 0. */
static uint32_t
dimension_of (json_t *v)
{
  json_int_t n = json_is_integer (v) ? json_integer_value (v) : 0;
  return n >= 1 && n <= 65535 ? (uint32_t) n : 0;
}

const char *
terminal_control_of (const uint8_t *data, size_t len, Sandbox__V1__ProcessInput *in, Sandbox__V1__PtySize *size,
                     json_t **doc)
{
  json_error_t jerr;
  *doc = json_loadb ((const char *) data, len, JSON_REJECT_DUPLICATES, &jerr);
  json_t *type = json_object_get (*doc, "type");
  if (!json_is_string (type))
    return "a control message is a JSON object with a string \"type\"";
  const char *k = json_string_value (type);
  if (strcmp (k, "resize") == 0)
    {
      size->rows = dimension_of (json_object_get (*doc, "rows"));
      size->cols = dimension_of (json_object_get (*doc, "cols"));
      if (size->rows == 0 || size->cols == 0)
        return "resize needs integer \"rows\" and \"cols\" from 1 to 65535";
      in->input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_RESIZE;
      in->resize = size;
      return NULL;
    }
  if (strcmp (k, "signal") == 0)
    {
      in->signal = signal_of (json_object_get (*doc, "signal"));
      if (in->signal == 0)
        return "signal needs \"signal\": a name such as \"SIGINT\" or a number from 1 to 64";
      in->input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_SIGNAL;
      return NULL;
    }
  if (strcmp (k, "close_stdin") == 0)
    {
      in->input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_CLOSE_STDIN;
      in->close_stdin = true;
      return NULL;
    }
  return "unknown \"type\" (expected resize, signal or close_stdin)";
}

char *
terminal_exit_text (const Sandbox__V1__ExitStatus *x)
{
  json_t *j = json_pack ("{s:s, s:o, s:o, s:b}", "type", "exit", "exit_code", route_exit_code_json (x), "signal",
                         route_exit_signal_json (x), "timed_out", x->timed_out);
  char *text = j != NULL ? json_dumps (j, JSON_COMPACT) : NULL;
  json_decref (j);
  return text;
}

char *
terminal_error_text (const char *why)
{
  json_t *e = json_pack ("{s:s, s:s}", "type", "error", "detail", why);
  char *text = e != NULL ? json_dumps (e, JSON_COMPACT) : NULL;
  json_decref (e);
  return text;
}
