/* config: settings from environment variables, described by one table.
 *
 * Each program declares a table of cfg_var_t (name, type, default, help,
 * bounds, destination). cfg_load() reads the environment once at start-up and
 * refuses a bad value with a message naming the variable; cfg_print_help()
 * prints the table for --help, so the list of variables can never drift from
 * what the program reads. Secret values are never printed.
 *
 * Thread safety: call at start-up, before any thread exists.
 */
#ifndef SBX_COMMON_CONFIG_H
#define SBX_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/err.h"

typedef enum cfg_type_e
{
  CFG_STRING, /* target: char ** (owned by the program for its lifetime) */
  CFG_INT,    /* target: long *, checked against [min, max] */
  CFG_BOOL,   /* target: bool *; true/false/1/0/yes/no/on/off */
} cfg_type_t;

typedef struct cfg_var_s
{
  const char *name; /* environment variable */
  cfg_type_t type;
  const char *def;  /* default as text; NULL = unset */
  const char *help; /* one line */
  long min, max;    /* CFG_INT bounds */
  void *target;
  const char *fallback; /* another variable whose value is the default, or NULL */
  bool secret;          /* never print the value */
} cfg_var_t;

/* Reads every variable of the table into its target. Empty values count as
 * unset. 0 ok; -1 with *err naming the variable and the reason. */
int cfg_load (const cfg_var_t *vars, size_t n, err_t *err);

/* Prints usage: the summary, then every variable with its default and help. */
void cfg_print_help (FILE *out, const char *usage, const cfg_var_t *vars, size_t n);

/* Parses a boolean as cfg_load does. 0 ok, -1 not a boolean. */
int cfg_parse_bool (const char *text, bool *out);

#endif
