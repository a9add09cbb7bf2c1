/* rpc_test: the call layer (common/rpc*) end to end, server and client in one
 * process over loopback, against the echo service of echo.proto: the four
 * call shapes, metadata, deadlines, cancellation, large messages, 100
 * concurrent calls, graceful shutdown with a call in flight, TLS.
 *
 * No test depends on timing for its verdict: concurrency is proven with a
 * barrier that only opens when all parties are inside the server at once,
 * and waits are bounded by generous timeouts that only fail a broken build.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/rpc/rpc.h"
#include "echo.pb-c.h"

/* ---- the echo service ---------------------------------------------------- */

static atomic_int cancels_seen;     /* Wait handlers that saw cancellation */
static atomic_int send_failures;    /* Expand handlers whose send failed */
static atomic_int handlers_started; /* Wait handlers that have begun */
static pthread_mutex_t barrier_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t barrier_cv = PTHREAD_COND_INITIALIZER;
static unsigned barrier_arrived;

static void
sleep_ms (long ms)
{
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep (&ts, NULL);
}

static int
echo_unary (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  int rc = rpc_call_recv (call, &echo__v1__echo_request__descriptor, &m, err);
  if (rc <= 0)
    return rc < 0 ? -1 : err_make (err, EINVAL, "no request");
  Echo__V1__EchoRequest *req = (Echo__V1__EchoRequest *) m;
  if (req->fail_with != 0)
    {
      rc = err_make (err, req->fail_with, "asked to fail with %d", req->fail_with);
      protobuf_c_message_free_unpacked (m, NULL);
      return rc;
    }
  Echo__V1__EchoReply reply = ECHO__V1__ECHO_REPLY__INIT;
  reply.payload = req->payload;
  char *md = rpc_call_metadata (call, "x-echo");
  reply.metadata_value = md != NULL ? md : "";
  int64_t left = rpc_call_deadline_ms_left (call);
  reply.deadline_ms_left = left == INT64_MAX ? -1 : left;
  rc = rpc_call_reply (call, &reply.base, err);
  free (md);
  protobuf_c_message_free_unpacked (m, NULL);
  return rc;
}

/* An Expand request, and a buffer for its replies' payload. 1, or 0/-1
 * as the handler returns. */
static int
expand_request (rpc_call_t *call, Echo__V1__ExpandRequest **req, uint8_t **payload, err_t *err)
{
  ProtobufCMessage *m = NULL;
  int rc = rpc_call_recv (call, &echo__v1__expand_request__descriptor, &m, err);
  if (rc <= 0)
    return rc < 0 ? -1 : err_make (err, EINVAL, "no request");
  *req = (Echo__V1__ExpandRequest *) m;
  *payload = malloc ((*req)->size ? (*req)->size : 1);
  return 1;
}

/* Reply number i of an Expand: `size` bytes of i's low byte. */
static Echo__V1__EchoReply
expand_reply (const Echo__V1__ExpandRequest *req, uint8_t *payload, uint32_t i)
{
  memset (payload, (int) (i & 0xff), req->size);
  Echo__V1__EchoReply reply = ECHO__V1__ECHO_REPLY__INIT;
  reply.payload.data = payload;
  reply.payload.len = req->size;
  reply.seq = i;
  return reply;
}

static int
echo_expand (rpc_call_t *call, void *user, err_t *err)
{
  Echo__V1__ExpandRequest *req = NULL;
  uint8_t *buf = NULL;
  int rc = expand_request (call, &req, &buf, err);
  if (rc <= 0)
    return rc;
  for (uint32_t i = 0; i < req->count && rc >= 0; i++)
    {
      Echo__V1__EchoReply reply = expand_reply (req, buf, i);
      rc = rpc_call_send (call, &reply.base, err);
    }
  if (rc < 0)
    atomic_fetch_add (&send_failures, 1);
  free (buf);
  protobuf_c_message_free_unpacked (&req->base, NULL);
  return rc < 0 ? -1 : 0;
}

/* Buffers lent to gRPC by echo_expand_started and given back. */
static atomic_int lent_buffers;

static void
give_back (void *p)
{
  free (p);
  atomic_fetch_sub (&lent_buffers, 1);
}

/* Expand, each reply packed by hand into a buffer lent to gRPC and sent
 * with rpc_call_send_raw_start: the next one is made while the last one
 * is under way. */
static int
echo_expand_started (rpc_call_t *call, void *user, err_t *err)
{
  Echo__V1__ExpandRequest *req = NULL;
  uint8_t *payload = NULL;
  int rc = expand_request (call, &req, &payload, err);
  if (rc <= 0)
    return rc;
  for (uint32_t i = 0; i < req->count && rc >= 0; i++)
    {
      Echo__V1__EchoReply reply = expand_reply (req, payload, i);
      size_t len = protobuf_c_message_get_packed_size (&reply.base);
      uint8_t *buf = malloc (len);
      protobuf_c_message_pack (&reply.base, buf);
      atomic_fetch_add (&lent_buffers, 1);
      grpc_slice slice = grpc_slice_new (buf, len, give_back);
      rc = rpc_call_send_raw_start (call, &slice, 1, err);
    }
  if (rc >= 0)
    rc = rpc_call_send_wait (call, err);
  free (payload);
  protobuf_c_message_free_unpacked (&req->base, NULL);
  return rc < 0 ? -1 : 0;
}

static int
echo_sum (rpc_call_t *call, void *user, err_t *err)
{
  Echo__V1__SumReply reply = ECHO__V1__SUM_REPLY__INIT;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_call_recv (call, &echo__v1__echo_request__descriptor, &m, err);
      if (rc < 0)
        return -1;
      if (rc == 0)
        break;
      reply.messages++;
      reply.bytes += ((Echo__V1__EchoRequest *) m)->payload.len;
      protobuf_c_message_free_unpacked (m, NULL);
    }
  return rpc_call_reply (call, &reply.base, err);
}

static int
echo_chat (rpc_call_t *call, void *user, err_t *err)
{
  for (uint32_t seq = 0;; seq++)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_call_recv (call, &echo__v1__echo_request__descriptor, &m, err);
      if (rc <= 0)
        return rc;
      Echo__V1__EchoReply reply = ECHO__V1__ECHO_REPLY__INIT;
      reply.payload = ((Echo__V1__EchoRequest *) m)->payload;
      reply.seq = seq;
      rc = rpc_call_send (call, &reply.base, err);
      protobuf_c_message_free_unpacked (m, NULL);
      if (rc < 0)
        return -1;
    }
}

static int
echo_wait (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  int rc = rpc_call_recv (call, &echo__v1__wait_request__descriptor, &m, err);
  if (rc <= 0)
    return rc < 0 ? -1 : err_make (err, EINVAL, "no request");
  uint32_t delay = ((Echo__V1__WaitRequest *) m)->delay_ms;
  protobuf_c_message_free_unpacked (m, NULL);
  atomic_fetch_add (&handlers_started, 1);
  for (uint32_t waited = 0; waited < delay; waited += 10)
    {
      if (rpc_call_cancelled (call))
        {
          atomic_fetch_add (&cancels_seen, 1);
          return err_make (err, ECANCELED, "cancelled");
        }
      sleep_ms (10);
    }
  Echo__V1__WaitReply reply = ECHO__V1__WAIT_REPLY__INIT;
  reply.completed = true;
  return rpc_call_reply (call, &reply.base, err);
}

static int
echo_barrier (rpc_call_t *call, void *user, err_t *err)
{
  ProtobufCMessage *m = NULL;
  int rc = rpc_call_recv (call, &echo__v1__wait_request__descriptor, &m, err);
  if (rc <= 0)
    return rc < 0 ? -1 : err_make (err, EINVAL, "no request");
  Echo__V1__WaitRequest *req = (Echo__V1__WaitRequest *) m;
  struct timespec until;
  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += req->delay_ms / 1000;
  pthread_mutex_lock (&barrier_mu);
  barrier_arrived++;
  pthread_cond_broadcast (&barrier_cv);
  while (barrier_arrived < req->parties)
    if (pthread_cond_timedwait (&barrier_cv, &barrier_mu, &until) == ETIMEDOUT)
      break;
  bool met = barrier_arrived >= req->parties;
  pthread_mutex_unlock (&barrier_mu);
  protobuf_c_message_free_unpacked (m, NULL);
  Echo__V1__WaitReply reply = ECHO__V1__WAIT_REPLY__INIT;
  reply.completed = met;
  return rpc_call_reply (call, &reply.base, err);
}

/* ---- fixture ------------------------------------------------------------- */

typedef struct fixture_s
{
  rpc_server_t *server;
  rpc_channel_t *channel;
  char target[64];
} fixture_t;

static rpc_server_t *
start_echo_server (const rpc_opts_t *opts, int *port)
{
  err_t err = ERR_INIT;
  rpc_server_t *s = NULL;
  assert_int_equal (rpc_server_new (opts, &s, &err), 0);
  static const struct
  {
    const char *path;
    rpc_handler_fn fn;
  } methods[] = {
      {"/echo.v1.Echo/Unary", echo_unary},
      {"/echo.v1.Echo/Expand", echo_expand},
      {"/echo.v1.Echo/Sum", echo_sum},
      {"/echo.v1.Echo/Chat", echo_chat},
      {"/echo.v1.Echo/Wait", echo_wait},
      {"/echo.v1.Echo/Barrier", echo_barrier},
      /* Not in echo.proto: Expand's shape, sent another way. */
      {"/echo.v1.Echo/ExpandStarted", echo_expand_started},
  };
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
    assert_int_equal (rpc_server_add_method (s, methods[i].path, methods[i].fn, NULL, &err), 0);
  if (rpc_server_start (s, "127.0.0.1:0", port, &err) < 0)
    fail_msg ("start: %s", err_msg (&err));
  return s;
}

static int
setup (void **state)
{
  fixture_t *f = calloc (1, sizeof *f);
  int port = 0;
  /* The echo methods are open (no admission): room for the 100-call test. */
  rpc_opts_t opts = {.max_open_calls = 256};
  f->server = start_echo_server (&opts, &port);
  snprintf (f->target, sizeof f->target, "127.0.0.1:%d", port);
  err_t err = ERR_INIT;
  assert_int_equal (rpc_channel_new (f->target, NULL, &f->channel, &err), 0);
  atomic_store (&cancels_seen, 0);
  atomic_store (&send_failures, 0);
  atomic_store (&handlers_started, 0);
  barrier_arrived = 0;
  *state = f;
  return 0;
}

static int
teardown (void **state)
{
  fixture_t *f = *state;
  rpc_channel_destroy (f->channel);
  rpc_server_destroy (f->server);
  free (f);
  return 0;
}

/* Waits up to 10 s for *counter to reach `want`. */
static bool
eventually (atomic_int *counter, int want)
{
  for (int i = 0; i < 1000; i++)
    {
      if (atomic_load (counter) >= want)
        return true;
      sleep_ms (10);
    }
  return false;
}

/* Waits up to 10 s for *counter to fall to 0. */
static bool
eventually_none (atomic_int *counter)
{
  for (int i = 0; i < 1000; i++)
    {
      if (atomic_load (counter) == 0)
        return true;
      sleep_ms (10);
    }
  return false;
}

static int
unary_echo (rpc_channel_t *ch, const uint8_t *data, size_t len, int64_t timeout_ms, Echo__V1__EchoReply **out,
            rpc_status_t *st)
{
  err_t err = ERR_INIT;
  Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
  req.payload.data = (uint8_t *) data;
  req.payload.len = len;
  rpc_metadata_t md[] = {{"x-echo", "hello metadata"}};
  ProtobufCMessage *resp = NULL;
  int rc = rpc_client_unary (ch, "/echo.v1.Echo/Unary", timeout_ms, md, 1, &req.base,
                             &echo__v1__echo_reply__descriptor, &resp, st, &err);
  *out = (Echo__V1__EchoReply *) resp;
  err_release (&err);
  return rc;
}

/* ---- tests --------------------------------------------------------------- */

static void
test_unary_echoes_payload_metadata_and_deadline (void **state)
{
  fixture_t *f = *state;
  Echo__V1__EchoReply *reply = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (unary_echo (f->channel, (const uint8_t *) "ping", 4, 5000, &reply, &st), 0);
  assert_int_equal (st.code, GRPC_STATUS_OK);
  assert_int_equal (reply->payload.len, 4);
  assert_memory_equal (reply->payload.data, "ping", 4);
  assert_string_equal (reply->metadata_value, "hello metadata");
  /* The deadline travels as a rounded-up grpc-timeout header: allow that. */
  assert_true (reply->deadline_ms_left > 0 && reply->deadline_ms_left <= 6000);
  protobuf_c_message_free_unpacked (&reply->base, NULL);
  rpc_status_release (&st);

  /* No deadline: the server sees none. */
  assert_int_equal (unary_echo (f->channel, (const uint8_t *) "x", 1, 0, &reply, &st), 0);
  assert_int_equal (reply->deadline_ms_left, -1);
  protobuf_c_message_free_unpacked (&reply->base, NULL);
  rpc_status_release (&st);
}

static void
test_handler_errors_map_to_grpc_status (void **state)
{
  fixture_t *f = *state;
  static const struct
  {
    int errnum;
    grpc_status_code code;
  } cases[] = {
      {ENOENT, GRPC_STATUS_NOT_FOUND},        {EEXIST, GRPC_STATUS_ALREADY_EXISTS},
      {EINVAL, GRPC_STATUS_INVALID_ARGUMENT}, {ENOSPC, GRPC_STATUS_RESOURCE_EXHAUSTED},
      {ENOSYS, GRPC_STATUS_UNIMPLEMENTED},    {EIO, GRPC_STATUS_INTERNAL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    {
      err_t err = ERR_INIT;
      Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
      req.fail_with = cases[i].errnum;
      ProtobufCMessage *resp = NULL;
      rpc_status_t st = RPC_STATUS_INIT;
      assert_int_equal (rpc_client_unary (f->channel, "/echo.v1.Echo/Unary", 5000, NULL, 0, &req.base,
                                          &echo__v1__echo_reply__descriptor, &resp, &st, &err),
                        -1);
      assert_null (resp);
      assert_int_equal (st.code, cases[i].code);
      char want[64];
      snprintf (want, sizeof want, "asked to fail with %d", cases[i].errnum);
      assert_string_equal (st.details, want);
      assert_non_null (strstr (err_msg (&err), want));
      rpc_status_release (&st);
      err_release (&err);
    }
}

static void
test_unregistered_method_is_unimplemented (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (rpc_client_unary (f->channel, "/echo.v1.Echo/Nope", 5000, NULL, 0, &req.base,
                                      &echo__v1__echo_reply__descriptor, &resp, &st, &err),
                    -1);
  assert_int_equal (st.code, GRPC_STATUS_UNIMPLEMENTED);
  rpc_status_release (&st);
  err_release (&err);
}

static void
test_server_streaming_delivers_every_message_in_order (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/Expand", 30000, NULL, 0, &c, &err), 0);
  Echo__V1__ExpandRequest req = ECHO__V1__EXPAND_REQUEST__INIT;
  req.count = 500;
  req.size = 3000;
  assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
  assert_int_equal (rpc_client_close_send (c, &err), 0);
  uint32_t n = 0;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (c, &echo__v1__echo_reply__descriptor, &m, &err);
      assert_true (rc >= 0);
      if (rc == 0)
        break;
      Echo__V1__EchoReply *r = (Echo__V1__EchoReply *) m;
      assert_int_equal (r->seq, n);
      assert_int_equal (r->payload.len, 3000);
      assert_int_equal (r->payload.data[0], n & 0xff);
      assert_int_equal (r->payload.data[2999], n & 0xff);
      protobuf_c_message_free_unpacked (m, NULL);
      n++;
    }
  assert_int_equal (n, 500);
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (rpc_client_finish (c, &st), GRPC_STATUS_OK);
  rpc_status_release (&st);
  rpc_client_destroy (c);
}

static void
test_sends_started_without_waiting_arrive_in_order_and_give_their_buffers_back (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  atomic_store (&lent_buffers, 0);
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/ExpandStarted", 30000, NULL, 0, &c, &err), 0);
  Echo__V1__ExpandRequest req = ECHO__V1__EXPAND_REQUEST__INIT;
  req.count = 300;
  req.size = 100000;
  assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
  assert_int_equal (rpc_client_close_send (c, &err), 0);
  uint32_t n = 0;
  for (;;)
    {
      /* Received as bytes, decoded here. */
      grpc_byte_buffer *bb = NULL;
      int rc = rpc_client_recv_raw (c, &bb, &err);
      assert_true (rc >= 0);
      if (rc == 0)
        break;
      ProtobufCMessage *m = NULL;
      assert_int_equal (rpc_unpack (bb, &echo__v1__echo_reply__descriptor, SIZE_MAX, &m, &err), 0);
      grpc_byte_buffer_destroy (bb);
      Echo__V1__EchoReply *r = (Echo__V1__EchoReply *) m;
      assert_int_equal (r->seq, n);
      assert_int_equal (r->payload.len, 100000);
      assert_int_equal (r->payload.data[0], n & 0xff);
      assert_int_equal (r->payload.data[99999], n & 0xff);
      protobuf_c_message_free_unpacked (m, NULL);
      n++;
    }
  assert_int_equal (n, 300);
  assert_int_equal (rpc_client_finish (c, NULL), GRPC_STATUS_OK);
  rpc_client_destroy (c);
  assert_true (eventually_none (&lent_buffers));
}

static void
test_a_client_that_cancels_fails_a_started_send_and_its_buffers_come_back (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  atomic_store (&lent_buffers, 0);
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/ExpandStarted", 30000, NULL, 0, &c, &err), 0);
  Echo__V1__ExpandRequest req = ECHO__V1__EXPAND_REQUEST__INIT;
  req.count = 100000; /* far more than flow control lets through unread */
  req.size = 100000;
  assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
  grpc_byte_buffer *bb = NULL;
  assert_int_equal (rpc_client_recv_raw (c, &bb, &err), 1);
  grpc_byte_buffer_destroy (bb);
  rpc_client_cancel (c);
  rpc_client_destroy (c);
  /* The handler's send fails, it returns, and gRPC lets go of every buffer. */
  assert_true (eventually_none (&lent_buffers));
}

static void
test_client_streaming_counts_every_message (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/Sum", 30000, NULL, 0, &c, &err), 0);
  uint8_t buf[10000];
  memset (buf, 7, sizeof buf);
  for (int i = 0; i < 100; i++)
    {
      Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
      req.payload.data = buf;
      req.payload.len = sizeof buf;
      assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
    }
  assert_int_equal (rpc_client_close_send (c, &err), 0);
  ProtobufCMessage *m = NULL;
  assert_int_equal (rpc_client_recv (c, &echo__v1__sum_reply__descriptor, &m, &err), 1);
  Echo__V1__SumReply *r = (Echo__V1__SumReply *) m;
  assert_int_equal (r->messages, 100);
  assert_int_equal (r->bytes, 100 * sizeof buf);
  protobuf_c_message_free_unpacked (m, NULL);
  assert_int_equal (rpc_client_recv (c, &echo__v1__sum_reply__descriptor, &m, &err), 0);
  assert_int_equal (rpc_client_finish (c, NULL), GRPC_STATUS_OK);
  rpc_client_destroy (c);
}

static void
test_bidi_streaming_echoes_each_message_before_the_next (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/Chat", 30000, NULL, 0, &c, &err), 0);
  for (uint32_t i = 0; i < 50; i++)
    {
      char text[32];
      int len = snprintf (text, sizeof text, "message %u", i);
      Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
      req.payload.data = (uint8_t *) text;
      req.payload.len = (size_t) len;
      assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
      /* The reply arrives while the stream is still open: true interleaving. */
      ProtobufCMessage *m = NULL;
      assert_int_equal (rpc_client_recv (c, &echo__v1__echo_reply__descriptor, &m, &err), 1);
      Echo__V1__EchoReply *r = (Echo__V1__EchoReply *) m;
      assert_int_equal (r->seq, i);
      assert_int_equal (r->payload.len, (size_t) len);
      assert_memory_equal (r->payload.data, text, (size_t) len);
      protobuf_c_message_free_unpacked (m, NULL);
    }
  assert_int_equal (rpc_client_close_send (c, &err), 0);
  ProtobufCMessage *m = NULL;
  assert_int_equal (rpc_client_recv (c, &echo__v1__echo_reply__descriptor, &m, &err), 0);
  assert_int_equal (rpc_client_finish (c, NULL), GRPC_STATUS_OK);
  rpc_client_destroy (c);
}

/* The receiving half of a split bidirectional call: counts the replies
 * until the end of the stream. */
typedef struct split_recv_s
{
  rpc_client_call_t *call;
  uint32_t received;
  bool in_order;
} split_recv_t;

static void *
split_receiver (void *arg)
{
  split_recv_t *s = arg;
  s->in_order = true;
  for (;;)
    {
      err_t err = ERR_INIT;
      ProtobufCMessage *m = NULL;
      int rc = rpc_client_recv (s->call, &echo__v1__echo_reply__descriptor, &m, &err);
      err_release (&err);
      if (rc <= 0)
        return NULL;
      if (((Echo__V1__EchoReply *) m)->seq != s->received + 1)
        s->in_order = false;
      s->received++;
      protobuf_c_message_free_unpacked (m, NULL);
    }
}

static void
test_a_split_call_sends_on_one_thread_while_another_receives (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/Chat", 30000, NULL, 0, &c, &err), 0);
  /* The first exchange on one thread (metadata both ways)... */
  Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
  req.payload.data = (uint8_t *) "first";
  req.payload.len = 5;
  assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
  ProtobufCMessage *m = NULL;
  assert_int_equal (rpc_client_recv (c, &echo__v1__echo_reply__descriptor, &m, &err), 1);
  protobuf_c_message_free_unpacked (m, NULL);
  /* ...then a receiver blocks in rpc_client_recv while this thread sends:
   * each reply only exists once its send went through. */
  split_recv_t s = {.call = c};
  pthread_t th;
  assert_int_equal (pthread_create (&th, NULL, split_receiver, &s), 0);
  for (uint32_t i = 0; i < 300; i++)
    {
      if (i % 50 == 0)
        sleep_ms (5); /* let the receiver wait with nothing to read */
      assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
    }
  assert_int_equal (rpc_client_close_send (c, &err), 0);
  pthread_join (th, NULL);
  assert_int_equal (s.received, 300);
  assert_true (s.in_order);
  assert_int_equal (rpc_client_finish (c, NULL), GRPC_STATUS_OK);
  rpc_client_destroy (c);
}

static void
test_cancel_ends_a_receiver_blocked_while_the_sender_waits (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/Chat", 30000, NULL, 0, &c, &err), 0);
  Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
  assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
  ProtobufCMessage *m = NULL;
  assert_int_equal (rpc_client_recv (c, &echo__v1__echo_reply__descriptor, &m, &err), 1);
  protobuf_c_message_free_unpacked (m, NULL);
  split_recv_t s = {.call = c};
  pthread_t th;
  assert_int_equal (pthread_create (&th, NULL, split_receiver, &s), 0);
  sleep_ms (20);
  rpc_client_cancel (c);
  pthread_join (th, NULL);
  assert_int_equal (s.received, 0);
  assert_int_equal (rpc_client_send (c, &req.base, &err), -1);
  err_release (&err);
  assert_int_equal (rpc_client_finish (c, NULL), GRPC_STATUS_CANCELLED);
  rpc_client_destroy (c);
}

static void
test_eight_mib_messages_round_trip_and_oversize_is_refused (void **state)
{
  fixture_t *f = *state;
  size_t len = 8u * 1024 * 1024;
  uint8_t *big = malloc (len);
  for (size_t i = 0; i < len; i++)
    big[i] = (uint8_t) (i * 31 + 7);
  Echo__V1__EchoReply *reply = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (unary_echo (f->channel, big, len, 30000, &reply, &st), 0);
  assert_int_equal (reply->payload.len, len);
  assert_memory_equal (reply->payload.data, big, len);
  protobuf_c_message_free_unpacked (&reply->base, NULL);
  rpc_status_release (&st);
  free (big);

  /* Above the 16 MiB default the client refuses to send it. */
  size_t huge_len = RPC_DEFAULT_MAX_MESSAGE_BYTES + 1;
  uint8_t *huge = calloc (1, huge_len);
  err_t err = ERR_INIT;
  Echo__V1__EchoRequest req = ECHO__V1__ECHO_REQUEST__INIT;
  req.payload.data = huge;
  req.payload.len = huge_len;
  ProtobufCMessage *resp = NULL;
  assert_int_equal (rpc_client_unary (f->channel, "/echo.v1.Echo/Unary", 30000, NULL, 0, &req.base,
                                      &echo__v1__echo_reply__descriptor, &resp, &st, &err),
                    -1);
  assert_int_equal (err.status, EMSGSIZE);
  err_release (&err);
  free (huge);
}

static void
test_oversize_message_from_a_peer_is_refused_by_the_server (void **state)
{
  fixture_t *f = *state;
  /* A client with a larger limit sends 17 MiB; the server's 16 MiB limit
   * refuses it with RESOURCE_EXHAUSTED. */
  rpc_opts_t big = {.max_message_bytes = 64u * 1024 * 1024};
  rpc_channel_t *ch = NULL;
  err_t err = ERR_INIT;
  assert_int_equal (rpc_channel_new (f->target, &big, &ch, &err), 0);
  size_t len = RPC_DEFAULT_MAX_MESSAGE_BYTES + 1024 * 1024;
  uint8_t *data = calloc (1, len);
  Echo__V1__EchoReply *reply = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (unary_echo (ch, data, len, 30000, &reply, &st), -1);
  assert_int_equal (st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  rpc_status_release (&st);
  free (data);
  rpc_channel_destroy (ch);
}

static void
test_deadline_cancels_the_handler (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  Echo__V1__WaitRequest req = ECHO__V1__WAIT_REQUEST__INIT;
  req.delay_ms = 20000;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (rpc_client_unary (f->channel, "/echo.v1.Echo/Wait", 300, NULL, 0, &req.base,
                                      &echo__v1__wait_reply__descriptor, &resp, &st, &err),
                    -1);
  assert_int_equal (st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
  assert_true (eventually (&cancels_seen, 1));
  rpc_status_release (&st);
  err_release (&err);
}

static void
test_client_cancellation_reaches_the_handler (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/Wait", 60000, NULL, 0, &c, &err), 0);
  Echo__V1__WaitRequest req = ECHO__V1__WAIT_REQUEST__INIT;
  req.delay_ms = 30000;
  assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
  assert_int_equal (rpc_client_close_send (c, &err), 0);
  assert_true (eventually (&handlers_started, 1));
  rpc_client_cancel (c);
  assert_int_equal (rpc_client_finish (c, NULL), GRPC_STATUS_CANCELLED);
  rpc_client_destroy (c);
  assert_true (eventually (&cancels_seen, 1));
}

static void
test_client_that_stops_reading_makes_server_sends_fail (void **state)
{
  fixture_t *f = *state;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (f->channel, "/echo.v1.Echo/Expand", 60000, NULL, 0, &c, &err), 0);
  Echo__V1__ExpandRequest req = ECHO__V1__EXPAND_REQUEST__INIT;
  req.count = 1000000; /* ~64 GB if it were all sent */
  req.size = 65536;
  assert_int_equal (rpc_client_send (c, &req.base, &err), 0);
  ProtobufCMessage *m = NULL;
  assert_int_equal (rpc_client_recv (c, &echo__v1__echo_reply__descriptor, &m, &err), 1);
  protobuf_c_message_free_unpacked (m, NULL);
  rpc_client_destroy (c); /* cancels */
  assert_true (eventually (&send_failures, 1));
}

typedef struct barrier_arg_s
{
  rpc_channel_t *ch;
  unsigned parties;
  bool met;
  grpc_status_code code;
} barrier_arg_t;

static void *
barrier_client (void *p)
{
  barrier_arg_t *a = p;
  err_t err = ERR_INIT;
  Echo__V1__WaitRequest req = ECHO__V1__WAIT_REQUEST__INIT;
  req.delay_ms = 30000;
  req.parties = a->parties;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  rpc_client_unary (a->ch, "/echo.v1.Echo/Barrier", 60000, NULL, 0, &req.base, &echo__v1__wait_reply__descriptor,
                    &resp, &st, &err);
  a->code = st.code;
  a->met = resp != NULL && ((Echo__V1__WaitReply *) resp)->completed;
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  err_release (&err);
  return NULL;
}

static void
test_hundred_concurrent_calls_are_all_in_the_server_at_once (void **state)
{
  fixture_t *f = *state;
  enum
  {
    N = 100
  };
  pthread_t th[N];
  barrier_arg_t args[N];
  for (int i = 0; i < N; i++)
    {
      args[i] = (barrier_arg_t){.ch = f->channel, .parties = N};
      assert_int_equal (pthread_create (&th[i], NULL, barrier_client, &args[i]), 0);
    }
  for (int i = 0; i < N; i++)
    pthread_join (th[i], NULL);
  for (int i = 0; i < N; i++)
    {
      assert_int_equal (args[i].code, GRPC_STATUS_OK);
      assert_true (args[i].met);
    }
}

typedef struct wait_arg_s
{
  rpc_channel_t *ch;
  uint32_t delay_ms;
  grpc_status_code code;
  bool completed;
} wait_arg_t;

static void *
wait_client (void *p)
{
  wait_arg_t *a = p;
  err_t err = ERR_INIT;
  Echo__V1__WaitRequest req = ECHO__V1__WAIT_REQUEST__INIT;
  req.delay_ms = a->delay_ms;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  rpc_client_unary (a->ch, "/echo.v1.Echo/Wait", 60000, NULL, 0, &req.base, &echo__v1__wait_reply__descriptor, &resp,
                    &st, &err);
  a->code = st.code;
  a->completed = resp != NULL && ((Echo__V1__WaitReply *) resp)->completed;
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  err_release (&err);
  return NULL;
}

/* ---- admission: refusals and caps before a call gets a thread ---------------- */

/* A plaintext channel to the server on 127.0.0.1:port. */
static rpc_channel_t *
channel_to (int port)
{
  char target[64];
  snprintf (target, sizeof target, "127.0.0.1:%d", port);
  err_t err = ERR_INIT;
  rpc_channel_t *ch = NULL;
  assert_int_equal (rpc_channel_new (target, NULL, &ch, &err), 0);
  return ch;
}

static atomic_int guarded_runs;

static grpc_status_code
refuse_all (rpc_call_t *call, void *user, const char **message)
{
  *message = "not you";
  return GRPC_STATUS_UNAUTHENTICATED;
}

static int
guarded_handler (rpc_call_t *call, void *user, err_t *err)
{
  atomic_fetch_add (&guarded_runs, 1);
  return echo_unary (call, user, err);
}

static void
test_admission_refuses_before_the_handler_runs (void **state)
{
  err_t err = ERR_INIT;
  rpc_server_t *s = NULL;
  assert_int_equal (rpc_server_new (NULL, &s, &err), 0);
  assert_int_equal (
      rpc_server_add_admitted_method (s, "/echo.v1.Echo/Unary", refuse_all, guarded_handler, NULL, &err), 0);
  int port = 0;
  assert_int_equal (rpc_server_start (s, "127.0.0.1:0", &port, &err), 0);
  rpc_channel_t *ch = channel_to (port);
  Echo__V1__EchoReply *reply = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (unary_echo (ch, (const uint8_t *) "x", 1, 5000, &reply, &st), -1);
  assert_int_equal (st.code, GRPC_STATUS_UNAUTHENTICATED);
  assert_string_equal (st.details, "not you");
  assert_true (st.from_handler); /* the server said so, not the transport */
  assert_int_equal (atomic_load (&guarded_runs), 0);
  rpc_status_release (&st);
  rpc_channel_destroy (ch);
  rpc_server_destroy (s);
}

static void
test_open_calls_beyond_their_cap_are_refused_without_a_thread (void **state)
{
  rpc_opts_t opts = {.max_open_calls = 4};
  int port = 0;
  rpc_server_t *s = start_echo_server (&opts, &port);
  rpc_channel_t *ch = channel_to (port);
  atomic_store (&handlers_started, 0);
  pthread_t th[4];
  wait_arg_t args[4];
  for (int i = 0; i < 4; i++)
    {
      args[i] = (wait_arg_t){.ch = ch, .delay_ms = 2000};
      assert_int_equal (pthread_create (&th[i], NULL, wait_client, &args[i]), 0);
    }
  assert_true (eventually (&handlers_started, 4));
  Echo__V1__EchoReply *reply = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (unary_echo (ch, (const uint8_t *) "x", 1, 5000, &reply, &st), -1);
  assert_int_equal (st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  rpc_status_release (&st);
  for (int i = 0; i < 4; i++)
    {
      pthread_join (th[i], NULL);
      assert_int_equal (args[i].code, GRPC_STATUS_OK);
    }
  /* Slots are given back: a call fits again. */
  assert_int_equal (unary_echo (ch, (const uint8_t *) "x", 1, 5000, &reply, &st), 0);
  protobuf_c_message_free_unpacked (&reply->base, NULL);
  rpc_status_release (&st);
  rpc_channel_destroy (ch);
  rpc_server_destroy (s);
}

static void
test_a_call_whose_request_never_comes_is_cancelled (void **state)
{
  err_t err = ERR_INIT;
  rpc_opts_t opts = {.first_message_ms = 300};
  int port = 0;
  rpc_server_t *s = start_echo_server (&opts, &port);
  rpc_channel_t *ch = channel_to (port);
  rpc_client_call_t *c = NULL;
  assert_int_equal (rpc_client_start (ch, "/echo.v1.Echo/Sum", 30000, NULL, 0, &c, &err), 0);
  /* Waiting for the answer opens the call (metadata only, no message). */
  ProtobufCMessage *m = NULL;
  assert_true (rpc_client_recv (c, &echo__v1__sum_reply__descriptor, &m, &err) <= 0);
  err_release (&err);
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (rpc_client_finish (c, &st), GRPC_STATUS_DEADLINE_EXCEEDED); /* long before the 30 s */
  assert_non_null (strstr (st.details, "no request message"));
  rpc_status_release (&st);
  rpc_client_destroy (c);
  rpc_channel_destroy (ch);
  rpc_server_destroy (s);
}

static void
test_graceful_shutdown_lets_a_call_in_flight_finish (void **state)
{
  fixture_t *f = *state;
  wait_arg_t a = {.ch = f->channel, .delay_ms = 500};
  pthread_t th;
  assert_int_equal (pthread_create (&th, NULL, wait_client, &a), 0);
  assert_true (eventually (&handlers_started, 1));
  rpc_server_shutdown (f->server, 30000);
  pthread_join (th, NULL);
  assert_int_equal (a.code, GRPC_STATUS_OK);
  assert_true (a.completed);
  assert_int_equal (atomic_load (&cancels_seen), 0);
  assert_int_equal (rpc_server_inflight (f->server), 0);

  /* After shutdown no new call is accepted. */
  Echo__V1__EchoReply *reply = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (unary_echo (f->channel, (const uint8_t *) "x", 1, 2000, &reply, &st), -1);
  assert_true (st.code == GRPC_STATUS_UNAVAILABLE || st.code == GRPC_STATUS_DEADLINE_EXCEEDED);
  rpc_status_release (&st);
}

static void
test_shutdown_cancels_calls_that_outlive_the_grace_period (void **state)
{
  fixture_t *f = *state;
  wait_arg_t a = {.ch = f->channel, .delay_ms = 60000};
  pthread_t th;
  assert_int_equal (pthread_create (&th, NULL, wait_client, &a), 0);
  assert_true (eventually (&handlers_started, 1));
  rpc_server_shutdown (f->server, 200);
  pthread_join (th, NULL);
  assert_int_not_equal (a.code, GRPC_STATUS_OK);
  assert_false (a.completed);
  assert_int_equal (atomic_load (&cancels_seen), 1);
  assert_int_equal (rpc_server_inflight (f->server), 0);
}

static void
test_tls_round_trip_and_plaintext_client_refused (void **state)
{
  (void) state;
  rpc_opts_t server_opts = {.tls_cert_file = "tests/unit/common/rpc/localhost.crt",
                            .tls_key_file = "tests/unit/common/rpc/localhost.key"};
  int port = 0;
  rpc_server_t *s = start_echo_server (&server_opts, &port);
  char target[64];
  snprintf (target, sizeof target, "127.0.0.1:%d", port);

  err_t err = ERR_INIT;
  rpc_opts_t client_opts
      = {.tls = true, .tls_ca_file = "tests/unit/common/rpc/localhost.crt", .tls_server_name = "localhost"};
  rpc_channel_t *tls = NULL;
  assert_int_equal (rpc_channel_new (target, &client_opts, &tls, &err), 0);
  Echo__V1__EchoReply *reply = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  assert_int_equal (unary_echo (tls, (const uint8_t *) "secret", 6, 10000, &reply, &st), 0);
  assert_memory_equal (reply->payload.data, "secret", 6);
  protobuf_c_message_free_unpacked (&reply->base, NULL);
  rpc_status_release (&st);
  rpc_channel_destroy (tls);

  rpc_channel_t *plain = NULL;
  assert_int_equal (rpc_channel_new (target, NULL, &plain, &err), 0);
  assert_int_equal (unary_echo (plain, (const uint8_t *) "x", 1, 5000, &reply, &st), -1);
  assert_int_equal (st.code, GRPC_STATUS_UNAVAILABLE);
  rpc_status_release (&st);
  rpc_channel_destroy (plain);

  /* A missing key file is a clear error, not a crash. */
  rpc_opts_t bad
      = {.tls_cert_file = "tests/unit/common/rpc/localhost.crt", .tls_key_file = "tests/unit/common/rpc/missing.key"};
  rpc_server_t *s2 = NULL;
  assert_int_equal (rpc_server_new (&bad, &s2, &err), 0);
  assert_int_equal (rpc_server_start (s2, "127.0.0.1:0", NULL, &err), -1);
  assert_non_null (strstr (err_msg (&err), "missing.key"));
  err_release (&err);
  rpc_server_destroy (s2);
  rpc_server_destroy (s);
}

int
main (void)
{
  rpc_init ();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown (test_unary_echoes_payload_metadata_and_deadline, setup, teardown),
      cmocka_unit_test_setup_teardown (test_handler_errors_map_to_grpc_status, setup, teardown),
      cmocka_unit_test_setup_teardown (test_unregistered_method_is_unimplemented, setup, teardown),
      cmocka_unit_test_setup_teardown (test_server_streaming_delivers_every_message_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown (test_sends_started_without_waiting_arrive_in_order_and_give_their_buffers_back,
                                       setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_client_that_cancels_fails_a_started_send_and_its_buffers_come_back,
                                       setup, teardown),
      cmocka_unit_test_setup_teardown (test_client_streaming_counts_every_message, setup, teardown),
      cmocka_unit_test_setup_teardown (test_bidi_streaming_echoes_each_message_before_the_next, setup, teardown),
      cmocka_unit_test_setup_teardown (test_a_split_call_sends_on_one_thread_while_another_receives, setup, teardown),
      cmocka_unit_test_setup_teardown (test_cancel_ends_a_receiver_blocked_while_the_sender_waits, setup, teardown),
      cmocka_unit_test_setup_teardown (test_eight_mib_messages_round_trip_and_oversize_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown (test_oversize_message_from_a_peer_is_refused_by_the_server, setup, teardown),
      cmocka_unit_test_setup_teardown (test_deadline_cancels_the_handler, setup, teardown),
      cmocka_unit_test_setup_teardown (test_client_cancellation_reaches_the_handler, setup, teardown),
      cmocka_unit_test_setup_teardown (test_client_that_stops_reading_makes_server_sends_fail, setup, teardown),
      cmocka_unit_test_setup_teardown (test_hundred_concurrent_calls_are_all_in_the_server_at_once, setup, teardown),
      cmocka_unit_test (test_admission_refuses_before_the_handler_runs),
      cmocka_unit_test (test_open_calls_beyond_their_cap_are_refused_without_a_thread),
      cmocka_unit_test (test_a_call_whose_request_never_comes_is_cancelled),
      cmocka_unit_test_setup_teardown (test_graceful_shutdown_lets_a_call_in_flight_finish, setup, teardown),
      cmocka_unit_test_setup_teardown (test_shutdown_cancels_calls_that_outlive_the_grace_period, setup, teardown),
      cmocka_unit_test (test_tls_round_trip_and_plaintext_client_refused),
  };
  int failed = cmocka_run_group_tests (tests, NULL, NULL);
  rpc_shutdown ();
  return failed;
}
