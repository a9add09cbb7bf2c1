/* sbx_report: the messages sandbox-helper sends back to the gateway.
 *
 * The gateway spawns the helper with a SOCK_SEQPACKET socket as fd 3; each
 * report is one fixed-size datagram, so a message is never split or merged.
 * The helper is single-threaded; the gateway reads reports on the thread
 * that spawned it.
 */
#ifndef SBX_GATEWAY_REPORT_H
#define SBX_GATEWAY_REPORT_H

#include <stdint.h>

#define SBX_REPORT_FD 3

typedef enum sbx_report_type_e
{
  SBX_REPORT_READY = 1, /* launch: the sandbox is up; a = holder pid */
  SBX_REPORT_ERROR = 2, /* status = errno, text = what failed */
  SBX_REPORT_EXIT = 3,  /* exec: the command ended; a = exit code or -1, b = signal */
} sbx_report_type_t;

typedef struct sbx_report_s
{
  int32_t type;
  int32_t status;
  int32_t a;
  int32_t b;
  char text[496];
} sbx_report_t;

#endif
