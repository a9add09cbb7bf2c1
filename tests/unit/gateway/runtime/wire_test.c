/* wire_test: the messages between the gateway, sandbox-helper and the
 * holder (gateway/runtime/wire.c): exec requests encoded and decoded (and
 * malformed ones refused), and descriptors passed over a SOCK_SEQPACKET
 * socket pair: received CLOEXEC and usable, EOF, and descriptors beyond
 * what the receiver takes closed rather than leaked (counted in
 * /proc/self/fd).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "gateway/runtime/wire.h"

/* ---- exec requests -------------------------------------------------------- */

/* A request buffer of the largest size, on the heap (256 KiB). */
static char *
request_buffer (void)
{
  char *buf = malloc (SBX_EXEC_MAX);
  assert_non_null (buf);
  return buf;
}

static void
test_exec_request_round_trips_cwd_argv_and_env (void **state)
{
  char *buf = request_buffer ();
  char *const argv[] = {"/bin/sh", "-c", "echo \"$A\" > /tmp/out", "", NULL};
  char *const env[] = {"A=1", "EMPTY=", "PATH=/usr/bin:/bin", NULL};
  ssize_t len = sbx_exec_encode (buf, SBX_EXEC_MAX, "/root/work dir", argv, env);
  assert_true (len > (ssize_t) sizeof (sbx_exec_hdr_t));

  sbx_exec_hdr_t h;
  memcpy (&h, buf, sizeof h);
  assert_int_equal (h.magic, SBX_EXEC_MAGIC);
  assert_int_equal (h.argc, 4);
  assert_int_equal (h.envc, 3);
  assert_int_equal (h.len, (size_t) len - sizeof h);

  const char *cwd = NULL;
  char *out_argv[5], *out_env[4];
  assert_int_equal (sbx_exec_decode (buf, (size_t) len, &cwd, out_argv, 5, out_env, 4), 0);
  assert_string_equal (cwd, "/root/work dir");
  for (size_t i = 0; i < 4; i++)
    assert_string_equal (out_argv[i], argv[i]);
  assert_null (out_argv[4]);
  for (size_t i = 0; i < 3; i++)
    assert_string_equal (out_env[i], env[i]);
  assert_null (out_env[3]);
  /* Decoded in place: the strings point into the buffer. */
  assert_true (out_argv[0] > buf && out_argv[0] < buf + len);
  free (buf);
}

static void
test_exec_request_without_env_decodes_an_empty_env (void **state)
{
  char *buf = request_buffer ();
  char *const argv[] = {"true", NULL};
  ssize_t len = sbx_exec_encode (buf, SBX_EXEC_MAX, "", argv, NULL);
  assert_int_equal (len, (ssize_t) (sizeof (sbx_exec_hdr_t) + 1 + 5));

  const char *cwd = NULL;
  char *out_argv[2], *out_env[1] = {(char *) "poison"};
  assert_int_equal (sbx_exec_decode (buf, (size_t) len, &cwd, out_argv, 2, out_env, 1), 0);
  assert_string_equal (cwd, "");
  assert_string_equal (out_argv[0], "true");
  assert_null (out_argv[1]);
  assert_null (out_env[0]);
  free (buf);
}

static void
test_exec_request_that_does_not_fit_is_refused (void **state)
{
  char *buf = request_buffer ();
  /* One argument as large as the whole buffer. */
  char *big = malloc (SBX_EXEC_MAX);
  assert_non_null (big);
  memset (big, 'a', SBX_EXEC_MAX - 1);
  big[SBX_EXEC_MAX - 1] = '\0';
  char *const argv[] = {"echo", big, NULL};
  assert_int_equal (sbx_exec_encode (buf, SBX_EXEC_MAX, "/", argv, NULL), -1);

  /* The env counts too. */
  char *const small_argv[] = {"env", NULL};
  char *const env[] = {big, NULL};
  assert_int_equal (sbx_exec_encode (buf, SBX_EXEC_MAX, "/", small_argv, env), -1);

  /* Exactly the encoded size fits; one byte less does not. */
  ssize_t len = sbx_exec_encode (buf, SBX_EXEC_MAX, "/", small_argv, NULL);
  assert_true (len > 0);
  assert_int_equal (sbx_exec_encode (buf, (size_t) len, "/", small_argv, NULL), len);
  assert_int_equal (sbx_exec_encode (buf, (size_t) len - 1, "/", small_argv, NULL), -1);
  /* Smaller than the header. */
  assert_int_equal (sbx_exec_encode (buf, sizeof (sbx_exec_hdr_t) - 1, "/", small_argv, NULL), -1);
  free (big);
  free (buf);
}

/* Encodes cwd "/w", argv {"a", "bb"}, env {"E=1"} into buf; returns the length. */
static size_t
encode_sample (char *buf)
{
  char *const argv[] = {"a", "bb", NULL};
  char *const env[] = {"E=1", NULL};
  ssize_t len = sbx_exec_encode (buf, SBX_EXEC_MAX, "/w", argv, env);
  assert_true (len > 0);
  return (size_t) len;
}

/* Decodes with room for 8 argv and 8 env entries. */
static int
decode (char *buf, size_t len)
{
  const char *cwd = NULL;
  char *argv[8], *env[8];
  return sbx_exec_decode (buf, len, &cwd, argv, 8, env, 8);
}

static void
patch_hdr (char *buf, size_t field, uint32_t value)
{
  memcpy (buf + field, &value, sizeof value);
}

static void
test_malformed_exec_requests_are_refused (void **state)
{
  char *buf = request_buffer ();
  size_t len = encode_sample (buf);
  assert_int_equal (decode (buf, len), 0);

  /* Shorter than a header, and truncated anywhere after it. */
  for (size_t cut = 0; cut < len; cut++)
    {
      len = encode_sample (buf);
      if (decode (buf, cut) != -1)
        fail_msg ("a request cut to %zu of %zu bytes was accepted", cut, len);
    }
  /* Bytes after the strings. */
  len = encode_sample (buf);
  buf[len] = '\0';
  assert_int_equal (decode (buf, len + 1), -1);

  /* An extra string beyond the counts, the length field agreeing. */
  len = encode_sample (buf);
  buf[len] = '\0';
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, len), (uint32_t) (len + 1 - sizeof (sbx_exec_hdr_t)));
  assert_int_equal (decode (buf, len + 1), -1);

  /* Bad magic. */
  len = encode_sample (buf);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, magic), SBX_EXEC_MAGIC ^ 1);
  assert_int_equal (decode (buf, len), -1);

  /* A length field that disagrees with the buffer. */
  len = encode_sample (buf);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, len), (uint32_t) (len - sizeof (sbx_exec_hdr_t) + 1));
  assert_int_equal (decode (buf, len), -1);

  /* Counts larger than the strings present. */
  len = encode_sample (buf);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, argc), 3);
  assert_int_equal (decode (buf, len), -1);
  len = encode_sample (buf);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, envc), 2);
  assert_int_equal (decode (buf, len), -1);
  len = encode_sample (buf);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, argc), 7);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, envc), 7);
  assert_int_equal (decode (buf, len), -1);

  /* Counts smaller than the strings present. */
  len = encode_sample (buf);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, envc), 0);
  assert_int_equal (decode (buf, len), -1);

  /* No command. */
  len = encode_sample (buf);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, argc), 0);
  patch_hdr (buf, offsetof (sbx_exec_hdr_t, envc), 3);
  assert_int_equal (decode (buf, len), -1);

  /* The last string without its NUL. */
  len = encode_sample (buf);
  buf[len - 1] = 'x';
  assert_int_equal (decode (buf, len), -1);
  free (buf);
}

static void
test_exec_request_larger_than_the_callers_arrays_is_refused (void **state)
{
  char *buf = request_buffer ();
  size_t len = encode_sample (buf); /* argc 2, envc 1 */
  const char *cwd = NULL;
  char *argv[3], *env[2];
  assert_int_equal (sbx_exec_decode (buf, len, &cwd, argv, 2, env, 2), -1); /* argv needs 3 slots */
  assert_int_equal (sbx_exec_decode (buf, len, &cwd, argv, 3, env, 1), -1); /* env needs 2 */
  assert_int_equal (sbx_exec_decode (buf, len, &cwd, argv, 3, env, 2), 0);
  assert_string_equal (argv[1], "bb");
  assert_null (argv[2]);
  free (buf);
}

/* Counts near UINT32_MAX must not wrap around the caps' checks (a 16-byte
 * request once made the decoder write at argv[0xFFFFFFFF]). */
static void
test_exec_request_with_huge_counts_is_refused (void **state)
{
  const uint32_t huge[] = {0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++)
    for (int which = 0; which < 2; which++)
      {
        char buf[sizeof (sbx_exec_hdr_t) + 4] = {0};
        sbx_exec_hdr_t h
            = {.magic = SBX_EXEC_MAGIC, .argc = which == 0 ? huge[i] : 1, .envc = which == 1 ? huge[i] : 0, .len = 4};
        memcpy (buf, &h, sizeof h);
        memcpy (buf + sizeof h, "/\0a\0", 4);
        const char *cwd = NULL;
        char *argv[8], *env[8];
        assert_int_equal (sbx_exec_decode (buf, sizeof buf, &cwd, argv, 8, env, 8), -1);
      }
}

/* ---- descriptor passing --------------------------------------------------- */

static size_t
open_fd_count (void)
{
  DIR *d = opendir ("/proc/self/fd");
  assert_non_null (d);
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir (d)) != NULL)
    if (de->d_name[0] != '.')
      n++;
  closedir (d);
  return n - 1; /* the directory's own descriptor */
}

typedef struct fixture_s
{
  int sock[2];
  int pipe[2];
} fixture_t;

static int
socket_setup (void **state)
{
  fixture_t *f = calloc (1, sizeof *f);
  if (f == NULL)
    return -1;
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, f->sock) < 0 || pipe2 (f->pipe, O_CLOEXEC) < 0)
    return -1;
  *state = f;
  return 0;
}

static int
socket_teardown (void **state)
{
  fixture_t *f = *state;
  for (int i = 0; i < 2; i++)
    {
      if (f->sock[i] >= 0)
        close (f->sock[i]);
      close (f->pipe[i]);
    }
  free (f);
  return 0;
}

static void
test_passed_descriptors_arrive_cloexec_and_usable (void **state)
{
  fixture_t *f = *state;
  /* Sent without CLOEXEC: the flag on arrival is the receiver's doing. */
  int plain = dup (f->pipe[1]);
  assert_true (plain >= 0);
  int fds[] = {plain, f->pipe[1]};
  assert_int_equal (sbx_send_fds (f->sock[0], "hello", 5, fds, 2), 0);

  char buf[16];
  int got[SBX_EXEC_FDS];
  size_t n_fds = 99;
  assert_int_equal (sbx_recv_fds (f->sock[1], buf, sizeof buf, got, &n_fds, SBX_EXEC_FDS), 5);
  assert_memory_equal (buf, "hello", 5);
  assert_int_equal (n_fds, 2);
  for (size_t i = 0; i < n_fds; i++)
    {
      assert_true (got[i] != fds[0] && got[i] != fds[1]);
      int flags = fcntl (got[i], F_GETFD);
      assert_true (flags >= 0);
      assert_true (flags & FD_CLOEXEC);
      /* Each is the pipe's write end. */
      char c = (char) ('0' + i), back = 0;
      assert_int_equal (write (got[i], &c, 1), 1);
      assert_int_equal (read (f->pipe[0], &back, 1), 1);
      assert_int_equal (back, c);
      close (got[i]);
    }
  close (plain);
}

static void
test_datagrams_keep_their_boundaries_with_and_without_descriptors (void **state)
{
  fixture_t *f = *state;
  assert_int_equal (sbx_report_exit (f->sock[0], 3, 0), 0);
  assert_int_equal (sbx_send_fds (f->sock[0], "x", 1, &f->pipe[1], 1), 0);

  sbx_report_t got;
  int fds[1] = {-1};
  size_t n_fds = 99;
  assert_int_equal (sbx_recv_fds (f->sock[1], &got, sizeof got, fds, &n_fds, 1), (ssize_t) sizeof got);
  assert_int_equal (n_fds, 0);
  assert_int_equal (got.type, SBX_REPORT_EXIT);
  assert_int_equal (got.u.exit.code, 3);
  assert_int_equal (got.u.exit.signal, 0);
  assert_string_equal (got.text, "");

  char c = 0;
  assert_int_equal (sbx_recv_fds (f->sock[1], &c, sizeof c, fds, &n_fds, 1), 1);
  assert_int_equal (c, 'x');
  assert_int_equal (n_fds, 1);
  close (fds[0]);
}

static void
test_peer_closed_reads_as_eof (void **state)
{
  fixture_t *f = *state;
  close (f->sock[0]);
  f->sock[0] = -1;
  char buf[8];
  int fds[1];
  size_t n_fds = 99;
  assert_int_equal (sbx_recv_fds (f->sock[1], buf, sizeof buf, fds, &n_fds, 1), 0);
  assert_int_equal (n_fds, 0);
}

static void
test_descriptors_beyond_max_fds_are_closed (void **state)
{
  fixture_t *f = *state;
  size_t before = open_fd_count ();
  int fds[] = {f->pipe[0], f->pipe[1], f->pipe[1], f->pipe[0]};
  assert_int_equal (sbx_send_fds (f->sock[0], "m", 1, fds, 4), 0);

  char c;
  int got[1] = {-1};
  size_t n_fds = 0;
  assert_int_equal (sbx_recv_fds (f->sock[1], &c, 1, got, &n_fds, 1), 1);
  assert_int_equal (n_fds, 1);
  /* Only the one taken is open: the other three were closed. */
  assert_int_equal (open_fd_count (), before + 1);
  close (got[0]);
  assert_int_equal (open_fd_count (), before);

  /* max_fds 0: every descriptor closed, the bytes still delivered. */
  assert_int_equal (sbx_send_fds (f->sock[0], "n", 1, fds, 4), 0);
  assert_int_equal (sbx_recv_fds (f->sock[1], &c, 1, got, &n_fds, 0), 1);
  assert_int_equal (c, 'n');
  assert_int_equal (n_fds, 0);
  assert_int_equal (open_fd_count (), before);
}

static void
test_descriptors_of_a_truncated_datagram_are_closed (void **state)
{
  fixture_t *f = *state;
  size_t before = open_fd_count ();
  char big[64];
  memset (big, 'b', sizeof big);
  int fds[] = {f->pipe[0], f->pipe[1]};
  assert_int_equal (sbx_send_fds (f->sock[0], big, sizeof big, fds, 2), 0);

  char small[8];
  int got[2] = {-1, -1};
  size_t n_fds = 99;
  errno = 0;
  assert_int_equal (sbx_recv_fds (f->sock[1], small, sizeof small, got, &n_fds, 2), -1);
  assert_int_equal (errno, EMSGSIZE);
  assert_int_equal (n_fds, 0);
  assert_int_equal (open_fd_count (), before);
}

static void
test_more_than_the_cap_of_descriptors_are_not_sent (void **state)
{
  fixture_t *f = *state;
  int fds[SBX_WIRE_MAX_FDS + 1];
  for (size_t i = 0; i < SBX_WIRE_MAX_FDS + 1; i++)
    fds[i] = f->pipe[1];
  errno = 0;
  assert_int_equal (sbx_send_fds (f->sock[0], "z", 1, fds, SBX_WIRE_MAX_FDS + 1), -1);
  assert_int_equal (errno, EINVAL);
  /* The cap itself is the most. */
  assert_int_equal (sbx_send_fds (f->sock[0], "z", 1, fds, SBX_WIRE_MAX_FDS), 0);
  size_t before = open_fd_count ();
  char c;
  int got[SBX_WIRE_MAX_FDS];
  size_t n_fds = 0;
  assert_int_equal (sbx_recv_fds (f->sock[1], &c, 1, got, &n_fds, SBX_WIRE_MAX_FDS), 1);
  assert_int_equal (n_fds, SBX_WIRE_MAX_FDS);
  assert_int_equal (open_fd_count (), before + SBX_WIRE_MAX_FDS);
  for (size_t i = 0; i < n_fds; i++)
    close (got[i]);
}

static void
test_send_on_a_closed_peer_fails (void **state)
{
  fixture_t *f = *state;
  close (f->sock[1]);
  f->sock[1] = -1;
  /* MSG_NOSIGNAL: an error, not SIGPIPE. */
  assert_int_equal (sbx_send_fds (f->sock[0], "p", 1, &f->pipe[1], 1), -1);
  assert_int_equal (errno, EPIPE);
}

/* ---- reports ------------------------------------------------------------ */

static void
test_each_report_type_reads_back_with_its_own_fields (void **state)
{
  fixture_t *f = *state;
  sbx_report_t r;
  int got[SBX_REPORT_MAX_FDS];

  assert_int_equal (sbx_report_ready (f->sock[0], 4242, f->pipe[1]), 0);
  assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, SBX_REPORT_MAX_FDS), 1);
  assert_int_equal (r.type, SBX_REPORT_READY);
  assert_int_equal (r.status, 0);
  assert_int_equal (r.u.ready.holder_pid, 4242);
  assert_true (got[0] >= 0);
  assert_int_equal (got[1], -1);
  close (got[0]);

  assert_int_equal (sbx_report_exit (f->sock[0], -1, 9), 0);
  assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, SBX_REPORT_MAX_FDS), 1);
  assert_int_equal (r.type, SBX_REPORT_EXIT);
  assert_int_equal (r.u.exit.code, -1);
  assert_int_equal (r.u.exit.signal, 9);
  assert_int_equal (got[0], -1);

  assert_int_equal (sbx_report_error (f->sock[0], ENOENT, "exec `nope`: No such file or directory"), 0);
  assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, SBX_REPORT_MAX_FDS), 1);
  assert_int_equal (r.type, SBX_REPORT_ERROR);
  assert_int_equal (r.status, ENOENT);
  assert_string_equal (r.text, "exec `nope`: No such file or directory");
}

static void
test_started_report_says_which_descriptors_came (void **state)
{
  fixture_t *f = *state;
  const struct
  {
    bool pidfd, master;
  } cases[] = {{false, false}, {true, false}, {false, true}, {true, true}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    {
      /* The read end stands for a pidfd, the write end for a master. */
      assert_int_equal (
          sbx_report_started (f->sock[0], 77, cases[i].pidfd ? f->pipe[0] : -1, cases[i].master ? f->pipe[1] : -1),
          0);
      sbx_report_t r;
      int got[SBX_REPORT_MAX_FDS];
      assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, SBX_REPORT_MAX_FDS), 1);
      assert_int_equal (r.type, SBX_REPORT_STARTED);
      assert_int_equal (r.u.started.pid, 77);
      assert_int_equal ((r.u.started.flags & SBX_STARTED_F_PIDFD) != 0, cases[i].pidfd);
      assert_int_equal ((r.u.started.flags & SBX_STARTED_F_MASTER) != 0, cases[i].master);
      int pidfd, master;
      sbx_report_started_fds (&r, got, &pidfd, &master);
      assert_int_equal (pidfd >= 0, cases[i].pidfd);
      assert_int_equal (master >= 0, cases[i].master);
      if (master >= 0)
        {
          /* The master slot is the write end whatever came before it. */
          char c = 'm', back = 0;
          assert_int_equal (write (master, &c, 1), 1);
          assert_int_equal (read (f->pipe[0], &back, 1), 1);
          assert_int_equal (back, 'm');
          close (master);
        }
      if (pidfd >= 0)
        close (pidfd);
    }
}

static void
test_error_report_text_is_cut_to_fit_and_terminated (void **state)
{
  fixture_t *f = *state;
  char long_text[2 * sizeof ((sbx_report_t *) 0)->text];
  memset (long_text, 'e', sizeof long_text - 1);
  long_text[sizeof long_text - 1] = '\0';
  assert_int_equal (sbx_report_error (f->sock[0], E2BIG, long_text), 0);
  sbx_report_t r;
  int got[1];
  assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, 0), 1);
  assert_int_equal (strlen (r.text), sizeof r.text - 1);
  assert_int_equal (r.status, E2BIG);
  assert_int_equal (sbx_report_error (f->sock[0], EIO, NULL), 0);
  assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, 0), 1);
  assert_string_equal (r.text, "");
}

static void
test_a_report_that_is_not_a_report_is_refused (void **state)
{
  fixture_t *f = *state;
  sbx_report_t r;
  int got[SBX_REPORT_MAX_FDS];
  size_t before = open_fd_count ();
  /* Too short, with a descriptor attached: refused and the descriptor closed. */
  assert_int_equal (sbx_send_fds (f->sock[0], "short", 5, &f->pipe[1], 1), 0);
  assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, SBX_REPORT_MAX_FDS), -1);
  assert_int_equal (got[0], -1);
  assert_int_equal (open_fd_count (), before);
  /* Nothing comes: the wait ends at its deadline. */
  assert_int_equal (sbx_read_report (f->sock[1], &r, 10, got, SBX_REPORT_MAX_FDS), -1);
  /* The peer closed without a word. */
  close (f->sock[0]);
  f->sock[0] = -1;
  assert_int_equal (sbx_read_report (f->sock[1], &r, 1000, got, SBX_REPORT_MAX_FDS), 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test (test_exec_request_round_trips_cwd_argv_and_env),
      cmocka_unit_test (test_exec_request_without_env_decodes_an_empty_env),
      cmocka_unit_test (test_exec_request_that_does_not_fit_is_refused),
      cmocka_unit_test (test_malformed_exec_requests_are_refused),
      cmocka_unit_test (test_exec_request_larger_than_the_callers_arrays_is_refused),
      cmocka_unit_test (test_exec_request_with_huge_counts_is_refused),
      cmocka_unit_test_setup_teardown (test_passed_descriptors_arrive_cloexec_and_usable, socket_setup,
                                       socket_teardown),
      cmocka_unit_test_setup_teardown (test_datagrams_keep_their_boundaries_with_and_without_descriptors,
                                       socket_setup, socket_teardown),
      cmocka_unit_test_setup_teardown (test_peer_closed_reads_as_eof, socket_setup, socket_teardown),
      cmocka_unit_test_setup_teardown (test_descriptors_beyond_max_fds_are_closed, socket_setup, socket_teardown),
      cmocka_unit_test_setup_teardown (test_descriptors_of_a_truncated_datagram_are_closed, socket_setup,
                                       socket_teardown),
      cmocka_unit_test_setup_teardown (test_more_than_the_cap_of_descriptors_are_not_sent, socket_setup,
                                       socket_teardown),
      cmocka_unit_test_setup_teardown (test_send_on_a_closed_peer_fails, socket_setup, socket_teardown),
      cmocka_unit_test_setup_teardown (test_each_report_type_reads_back_with_its_own_fields, socket_setup,
                                       socket_teardown),
      cmocka_unit_test_setup_teardown (test_started_report_says_which_descriptors_came, socket_setup,
                                       socket_teardown),
      cmocka_unit_test_setup_teardown (test_error_report_text_is_cut_to_fit_and_terminated, socket_setup,
                                       socket_teardown),
      cmocka_unit_test_setup_teardown (test_a_report_that_is_not_a_report_is_refused, socket_setup, socket_teardown),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
