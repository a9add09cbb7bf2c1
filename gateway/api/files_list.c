/* api/files_list: the ListDir handler, one page per call (see the proto).
 * The entries come from the walk inside the sandbox one at a time
 * (runtime/files.c, helper/files_list.c) and are encoded as they come into
 * one buffer of at most API_LIST_PAGE_MAX_BYTES, which goes to gRPC as it
 * is: no decoded copy of the listing is ever held, and what a sandbox
 * chooses (how many entries, how long their names and link targets) costs
 * the gateway at most one page per call. The walk of a later page skips
 * the entries of the earlier ones inside the sandbox, and the walk is
 * stopped as soon as the page is full. The buffer is a mapping of its own,
 * unmapped once gRPC has sent it: the memory goes back to the system
 * whatever the allocator keeps. No state beyond the call. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/cleanup.h"
#include "gateway/api/internal.h"

/* Most bytes of encoded entries in one ListDir answer (a page). A request
 * that does not page fails with RESOURCE_EXHAUSTED when its listing is
 * larger. */
#define API_LIST_PAGE_MAX_BYTES (4 * 1024 * 1024)
/* Most bytes of encoded entries held by all listings at once, being filled
 * or waiting for gRPC to send them (a client that does not read keeps its
 * page): past it a page ends early (a paged listing continues with the
 * next call) or the call fails RESOURCE_EXHAUSTED (retry later). */
#define API_LIST_TOTAL_MAX_BYTES (64 * 1024 * 1024)
/* Room after the entries for the next page's token (field 2). */
#define LIST_TOKEN_ROOM 32
/* The mapping's first bytes hold its own length (for the unmapping) and
 * the bytes it holds of the total. */
#define LIST_MAP_HEAD 64

/* Bytes of entries all listings hold now (API_LIST_TOTAL_MAX_BYTES). */
static _Atomic size_t list_bytes_held;

typedef struct page_s
{
  uint8_t *map; /* NULL once handed to gRPC */
  uint8_t *data;
  size_t len;      /* bytes encoded */
  size_t n;        /* entries */
  bool over_total; /* it ended at API_LIST_TOTAL_MAX_BYTES */
} page_t;

static void
unmap_page (void *map)
{
  size_t len, held;
  memcpy (&len, map, sizeof len);
  memcpy (&held, (uint8_t *) map + sizeof len, sizeof held);
  atomic_fetch_sub (&list_bytes_held, held);
  munmap (map, len);
}

static void
page_close (page_t *pg)
{
  if (pg->map != NULL)
    unmap_page (pg->map);
  pg->map = NULL;
}
#define cleanup_page __attribute__ ((cleanup (page_close)))

static int
page_open (page_t *pg, err_t *err)
{
  size_t len = LIST_MAP_HEAD + API_LIST_PAGE_MAX_BYTES + LIST_TOKEN_ROOM;
  void *map = mmap (NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return err_make (err, ENOMEM, "ListDir: out of memory");
  memcpy (map, &len, sizeof len); /* held: 0 (a new mapping is zeroed) */
  *pg = (page_t){.map = map, .data = (uint8_t *) map + LIST_MAP_HEAD};
  return 0;
}

/* Encodes one entry into the page: 1, or 0 when it would pass the page's
 * bytes (nothing written), -1 with *err. */
static int
page_add (page_t *pg, const sbx_file_msg_t *msg, err_t *err)
{
  cleanup_names api_names_t names = {0};
  Sandbox__V1__FileInfo info;
  if (api_file_info_to_proto (&msg->info, msg->path, msg->target, &info, &names, err) < 0)
    return -1;
  size_t len = protobuf_c_message_get_packed_size (&info.base);
  uint8_t head[API_FIELD_HEADER_MAX];
  size_t hn = api_field_header (head, API_FIELD_LIST_DIR_ENTRIES, len);
  if (pg->len + hn + len > API_LIST_PAGE_MAX_BYTES)
    return 0;
  if (atomic_fetch_add (&list_bytes_held, hn + len) + hn + len > API_LIST_TOTAL_MAX_BYTES)
    {
      atomic_fetch_sub (&list_bytes_held, hn + len);
      pg->over_total = true;
      return 0;
    }
  size_t held;
  memcpy (&held, pg->map + sizeof (size_t), sizeof held);
  held += hn + len;
  memcpy (pg->map + sizeof (size_t), &held, sizeof held);
  memcpy (pg->data + pg->len, head, hn);
  protobuf_c_message_pack (&info.base, pg->data + pg->len + hn);
  pg->len += hn + len;
  pg->n++;
  return 1;
}

/* Appends ListDirResponse.next_page_token. */
static void
page_token (page_t *pg, uint64_t next)
{
  char tok[24];
  int k = snprintf (tok, sizeof tok, "%" PRIu64, next);
  pg->len += api_field_header (pg->data + pg->len, API_FIELD_LIST_DIR_NEXT_PAGE_TOKEN, (size_t) k);
  memcpy (pg->data + pg->len, tok, (size_t) k);
  pg->len += (size_t) k;
}

/* The entries before a page: 0 for none, else what its token says. */
static int
parse_token (const char *tok, uint64_t *offset, err_t *err)
{
  *offset = 0;
  if (tok == NULL || tok[0] == '\0')
    return 0;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull (tok, &end, 10);
  if (tok[0] < '1' || tok[0] > '9' || *end != '\0' || errno != 0 || v > UINT32_MAX * 16ULL)
    return err_make (err, EINVAL, "ListDir: `%.32s` is not a page token this gateway gave", tok);
  *offset = v;
  return 0;
}

/* Reads the walk's answers into the page until it is full (*more: entries
 * follow) or the walk ends. */
static int
fill_page (sbx_file_t *f, const Sandbox__V1__ListDirRequest *r, bool paged, page_t *pg, bool *more, err_t *err)
{
  sbx_file_msg_t msg;
  int rc;
  *more = false;
  while ((rc = sbx_file_next (f, &msg, err)) > 0)
    {
      if (msg.kind != SBX_FRAME_INFO)
        return err_make (err, EIO, "ListDir: an unexpected answer");
      if (r->page_size > 0 && pg->n == r->page_size)
        {
          *more = true;
          return 0;
        }
      if ((rc = page_add (pg, &msg, err)) < 0)
        return -1;
      if (rc == 0 && pg->over_total && (!paged || pg->n == 0))
        return err_make (err, EAGAIN,
                         "ListDir: listings in flight hold the gateway's listing memory (%d bytes); retry later",
                         API_LIST_TOTAL_MAX_BYTES);
      if (rc == 0 && (!paged || pg->n == 0))
        return err_make (err, EMSGSIZE,
                         "ListDir: the listing is larger than one page (%d bytes); page through it with "
                         "page_size and page_token, or list with a smaller depth",
                         API_LIST_PAGE_MAX_BYTES);
      if (rc == 0)
        {
          *more = true;
          return 0;
        }
    }
  return rc < 0 ? -1 : 0;
}

int
api_list_dir (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__list_dir_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ListDirRequest *r = (Sandbox__V1__ListDirRequest *) m;
  char buf[SBX_FILE_PATH_MAX];
  sbx_file_req_t req = {.id = r->sandbox_id, .op = SBX_FILE_LIST, .depth = r->depth};
  if ((req.path = api_request_path (r->path, r->path_bytes, buf, err)) == NULL
      || parse_token (r->page_token, &req.offset, err) < 0)
    return -1;
  bool paged = r->page_size > 0 || req.offset > 0;
  cleanup_page page_t pg = {0};
  if (page_open (&pg, err) < 0)
    return -1;
  bool more;
  {
    cleanup_file sbx_file_t *f = NULL;
    if (api_file_start (ctx, &req, call, &f, err) < 0 || fill_page (f, r, paged, &pg, &more, err) < 0)
      return -1;
  } /* the walk is stopped before the page is sent */
  if (more)
    page_token (&pg, req.offset + pg.n);
  grpc_slice slice = grpc_slice_new_with_user_data (pg.data, pg.len, unmap_page, pg.map);
  pg.map = NULL; /* gRPC's now, also when the send fails */
  return rpc_call_send_raw (call, &slice, 1, err);
}
