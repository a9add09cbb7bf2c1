/* api/files: the handlers of the file methods — ReadFile, WriteFile,
 * ListDir, Stat, Remove, Rename, MakeDir, Watch (see internal.h). They turn
 * messages into file operations of the runtime (runtime.h, "The file
 * API"), which run inside the sandbox, and their answers back into
 * messages; contents pass through in bounded pieces with flow control both
 * ways. No path is interpreted here beyond "not empty, no NUL byte"; names
 * that are not valid UTF-8 travel as the proto says (a `string` made
 * valid, its `*_bytes` twin exact). ListDir is in files_list.c. No
 * state. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "gateway/api/internal.h"

void
api_cleanup_file_fn (sbx_file_t **f)
{
  sbx_file_close (*f);
}

bool
api_call_gone (void *ctx)
{
  return rpc_call_cancelled ((rpc_call_t *) ctx);
}
#define call_gone api_call_gone

int
api_file_start (const api_ctx_t *ctx, const sbx_file_req_t *req, rpc_call_t *call, sbx_file_t **out, err_t *err)
{
  sbx_file_req_t r = *req;
  if (api_image_user (ctx, req->id, &r.as_user, &r.uid, &r.gid, err) < 0)
    return -1;
  return sbx_file_start (ctx->rt, &r, api_call_gone, call, out, err);
}

/* Receives one request message like api_recv_request, and refuses one
 * whose strings hold a NUL byte: protobuf-c ends a string at its first
 * NUL, which would make "a\0b" mean "a". Such a message re-encodes
 * shorter than it came. */
int
api_recv_checked (rpc_call_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err)
{
  grpc_byte_buffer *bb = NULL;
  int rc = rpc_call_recv_raw (call, &bb, err);
  if (rc == 0)
    return err_make (err, EINVAL, "%s: no request message", rpc_call_method (call));
  if (rc < 0)
    return -1;
  size_t len = grpc_byte_buffer_length (bb);
  rc = rpc_unpack (bb, desc, rpc_call_max_message (call), out, err);
  grpc_byte_buffer_destroy (bb);
  if (rc < 0)
    return -1;
  if (protobuf_c_message_get_packed_size (*out) != len)
    return err_make (err, EINVAL, "%s: a string of the request holds a NUL byte", rpc_call_method (call));
  return 0;
}

Sandbox__V1__FileType
api_file_type_to_proto (uint32_t t)
{
  switch (t)
    {
    case SBX_FTYPE_FILE: return SANDBOX__V1__FILE_TYPE__FILE_TYPE_FILE;
    case SBX_FTYPE_DIR: return SANDBOX__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
    case SBX_FTYPE_SYMLINK: return SANDBOX__V1__FILE_TYPE__FILE_TYPE_SYMLINK;
    default: return SANDBOX__V1__FILE_TYPE__FILE_TYPE_OTHER;
    }
}

void
api_names_free (api_names_t *n)
{
  for (size_t i = 0; i < sizeof n->owned / sizeof n->owned[0]; i++)
    {
      free (n->owned[i]);
      n->owned[i] = NULL;
    }
}

int
api_file_info_to_proto (const sbx_file_wire_t *in, const char *path, const char *target, Sandbox__V1__FileInfo *out,
                        api_names_t *names, err_t *err)
{
  sandbox__v1__file_info__init (out);
  const char *slash = strrchr (path, '/');
  const char *name = slash != NULL && slash[1] != '\0' ? slash + 1 : path;
  const char *p = api_utf8_text (path, &out->path_bytes, &names->owned[0]);
  const char *nm = api_utf8_text (name, &out->name_bytes, &names->owned[1]);
  const char *t = target != NULL ? api_utf8_text (target, &out->symlink_target_bytes, &names->owned[2]) : "";
  if (p == NULL || nm == NULL || t == NULL)
    return err_make (err, ENOMEM, "out of memory");
  out->path = (char *) p;
  out->name = (char *) nm;
  out->symlink_target = (char *) t;
  out->type = api_file_type_to_proto (in->type);
  out->size = in->size;
  out->mode = in->mode;
  out->uid = in->uid;
  out->gid = in->gid;
  out->mtime_ms = in->mtime_ms;
  return 0;
}

const char *
api_request_path (const char *text, ProtobufCBinaryData bytes, char *buf, err_t *err)
{
  if (bytes.len == 0)
    return text;
  if (bytes.len >= SBX_FILE_PATH_MAX)
    {
      err_make (err, ENAMETOOLONG, "a path is longer than %d bytes", SBX_FILE_PATH_MAX - 1);
      return NULL;
    }
  if (memchr (bytes.data, '\0', bytes.len) != NULL)
    {
      err_make (err, EINVAL, "a path holds a NUL byte");
      return NULL;
    }
  memcpy (buf, bytes.data, bytes.len);
  buf[bytes.len] = '\0';
  return buf;
}

/* Replies with a FileInfo from an INFO answer. */
static int
reply_file_info (rpc_call_t *call, const sbx_file_msg_t *msg, err_t *err)
{
  cleanup_names api_names_t names = {0};
  Sandbox__V1__FileInfo info;
  if (api_file_info_to_proto (&msg->info, msg->path, msg->target, &info, &names, err) < 0)
    return -1;
  return rpc_call_reply (call, &info.base, err);
}

/* Runs an operation whose answer is one INFO, and replies with it. */
static int
reply_info_of (rpc_call_t *call, const api_ctx_t *ctx, const sbx_file_req_t *req, err_t *err)
{
  cleanup_file sbx_file_t *f = NULL;
  sbx_file_msg_t msg;
  if (api_file_start (ctx, req, call, &f, err) < 0)
    return -1;
  int rc = sbx_file_next (f, &msg, err);
  if (rc < 0)
    return -1;
  if (rc == 0 || msg.kind != SBX_FRAME_INFO)
    return err_make (err, EIO, "%s: no description came back", rpc_call_method (call));
  return reply_file_info (call, &msg, err);
}

int
api_stat (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__stat_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__StatRequest *r = (Sandbox__V1__StatRequest *) m;
  char buf[SBX_FILE_PATH_MAX];
  sbx_file_req_t req = {.id = r->sandbox_id, .op = SBX_FILE_STAT};
  if ((req.path = api_request_path (r->path, r->path_bytes, buf, err)) == NULL)
    return -1;
  return reply_info_of (call, ctx, &req, err);
}

int
api_make_dir (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__make_dir_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__MakeDirRequest *r = (Sandbox__V1__MakeDirRequest *) m;
  char buf[SBX_FILE_PATH_MAX];
  sbx_file_req_t req
      = {.id = r->sandbox_id, .op = SBX_FILE_MKDIR, .mode = r->mode, .flags = r->parents ? SBX_FILE_F_PARENTS : 0};
  if ((req.path = api_request_path (r->path, r->path_bytes, buf, err)) == NULL)
    return -1;
  return reply_info_of (call, ctx, &req, err);
}

int
api_rename (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__rename_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__RenameRequest *r = (Sandbox__V1__RenameRequest *) m;
  char from[SBX_FILE_PATH_MAX], to[SBX_FILE_PATH_MAX];
  sbx_file_req_t req = {.id = r->sandbox_id, .op = SBX_FILE_RENAME, .flags = r->overwrite ? SBX_FILE_F_OVERWRITE : 0};
  if ((req.path = api_request_path (r->from, r->from_bytes, from, err)) == NULL
      || (req.path2 = api_request_path (r->to, r->to_bytes, to, err)) == NULL)
    return -1;
  return reply_info_of (call, ctx, &req, err);
}

int
api_remove (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__remove_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__RemoveRequest *r = (Sandbox__V1__RemoveRequest *) m;
  char buf[SBX_FILE_PATH_MAX];
  sbx_file_req_t req = {.id = r->sandbox_id, .op = SBX_FILE_REMOVE, .flags = r->recursive ? SBX_FILE_F_RECURSIVE : 0};
  if ((req.path = api_request_path (r->path, r->path_bytes, buf, err)) == NULL)
    return -1;
  cleanup_file sbx_file_t *f = NULL;
  sbx_file_msg_t msg;
  if (api_file_start (ctx, &req, call, &f, err) < 0)
    return -1;
  int rc = sbx_file_next (f, &msg, err);
  if (rc < 0)
    return -1;
  if (rc > 0)
    return err_make (err, EIO, "Remove: an unexpected answer");
  Sandbox__V1__RemoveResponse resp = SANDBOX__V1__REMOVE_RESPONSE__INIT;
  return rpc_call_reply (call, &resp.base, err);
}

int
api_read_file (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__read_file_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ReadFileRequest *r = (Sandbox__V1__ReadFileRequest *) m;
  char buf[SBX_FILE_PATH_MAX];
  sbx_file_req_t req = {.id = r->sandbox_id, .op = SBX_FILE_READ, .offset = r->offset, .length = r->length};
  if ((req.path = api_request_path (r->path, r->path_bytes, buf, err)) == NULL)
    return -1;
  cleanup_file sbx_file_t *f = NULL;
  sbx_file_msg_t msg;
  if (api_file_start (ctx, &req, call, &f, err) < 0)
    return -1;
  int rc = sbx_file_next (f, &msg, err);
  if (rc < 0)
    return -1;
  if (rc == 0 || msg.kind != SBX_FRAME_INFO)
    return err_make (err, EIO, "ReadFile: no description came back");
  cleanup_free char *path = strdup (msg.path);
  if (path == NULL)
    return err_make (err, ENOMEM, "ReadFile: out of memory");
  cleanup_names api_names_t names = {0};
  Sandbox__V1__FileInfo info;
  if (api_file_info_to_proto (&msg.info, path, NULL, &info, &names, err) < 0)
    return -1;
  /* The first chunk carries the description with the first bytes. */
  Sandbox__V1__FileChunk first = SANDBOX__V1__FILE_CHUNK__INIT;
  first.info = &info;
  rc = sbx_file_next (f, &msg, err);
  if (rc < 0)
    return -1;
  if (rc > 0 && msg.kind != SBX_FRAME_DATA)
    return err_make (err, EIO, "ReadFile: an unexpected answer");
  if (rc > 0)
    first.data = (ProtobufCBinaryData){msg.len, (uint8_t *) msg.data};
  if (rpc_call_send (call, &first.base, err) < 0)
    return -1;
  while (rc > 0)
    {
      if ((rc = sbx_file_next (f, &msg, err)) < 0)
        return -1;
      if (rc > 0 && msg.kind != SBX_FRAME_DATA)
        return err_make (err, EIO, "ReadFile: an unexpected answer");
      /* Sent from the runtime's own buffer. */
      if (rc > 0 && api_send_bytes_field (call, API_FIELD_FILE_CHUNK_DATA, msg.data, msg.len, true, err) < 0)
        return -1;
    }
  return 0;
}

/* The contents of a WriteFile call, message by message, into the
 * operation. 0 once all of it went through. */
static int
write_contents (rpc_call_t *call, sbx_file_t *f, err_t *err)
{
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_call_recv (call, &sandbox__v1__write_file_request__descriptor, &m, err);
      if (rc < 0)
        return -1;
      if (rc == 0)
        return sbx_file_send_end (f, err);
      /* The next message arrives while this one goes to the sandbox. */
      rpc_call_recv_ahead (call);
      Sandbox__V1__WriteFileRequest *w = (Sandbox__V1__WriteFileRequest *) m;
      if (w->payload_case != SANDBOX__V1__WRITE_FILE_REQUEST__PAYLOAD_DATA)
        rc = err_make (err, EINVAL, "WriteFile: only the first message may carry a header");
      else if (w->data.len > 0)
        rc = sbx_file_send (f, &(struct iovec){w->data.data, w->data.len}, 1, err);
      protobuf_c_message_free_unpacked (m, NULL);
      if (rc < 0)
        return -1;
    }
}

int
api_write_file (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__write_file_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__WriteFileRequest *w = (Sandbox__V1__WriteFileRequest *) m;
  if (w->payload_case != SANDBOX__V1__WRITE_FILE_REQUEST__PAYLOAD_HEADER || w->header == NULL)
    return err_make (err, EINVAL, "the first WriteFile message must carry the header");
  const Sandbox__V1__WriteFileHeader *h = w->header;
  char buf[SBX_FILE_PATH_MAX];
  sbx_file_req_t req = {.id = h->sandbox_id,
                        .op = SBX_FILE_WRITE,
                        .path = api_request_path (h->path, h->path_bytes, buf, err),
                        .mode = h->mode,
                        .flags = (h->make_parents ? SBX_FILE_F_PARENTS : 0) | (h->append ? SBX_FILE_F_APPEND : 0)};
  if (req.path == NULL)
    return -1;
  cleanup_file sbx_file_t *f = NULL;
  sbx_file_msg_t msg;
  if (api_file_start (ctx, &req, call, &f, err) < 0)
    return -1;
  rpc_call_recv_ahead (call);
  if (write_contents (call, f, err) < 0)
    return -1;
  int rc = sbx_file_next (f, &msg, err);
  if (rc < 0)
    return -1;
  if (rc == 0 || msg.kind != SBX_FRAME_INFO)
    return err_make (err, EIO, "WriteFile: no description came back");
  msg.target = NULL;
  return reply_file_info (call, &msg, err);
}

Sandbox__V1__FileEvent__Kind
api_event_kind_to_proto (uint32_t k)
{
  switch (k)
    {
    case SBX_EVENT_WATCHING: return SANDBOX__V1__FILE_EVENT__KIND__KIND_WATCHING;
    case SBX_EVENT_CREATED: return SANDBOX__V1__FILE_EVENT__KIND__KIND_CREATED;
    case SBX_EVENT_MODIFIED: return SANDBOX__V1__FILE_EVENT__KIND__KIND_MODIFIED;
    case SBX_EVENT_REMOVED: return SANDBOX__V1__FILE_EVENT__KIND__KIND_REMOVED;
    case SBX_EVENT_RENAMED: return SANDBOX__V1__FILE_EVENT__KIND__KIND_RENAMED;
    case SBX_EVENT_OVERFLOW: return SANDBOX__V1__FILE_EVENT__KIND__KIND_OVERFLOW;
    default: return SANDBOX__V1__FILE_EVENT__KIND__KIND_UNSPECIFIED;
    }
}

int
api_watch (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_checked (call, &sandbox__v1__watch_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__WatchRequest *r = (Sandbox__V1__WatchRequest *) m;
  char buf[SBX_FILE_PATH_MAX];
  sbx_file_req_t req = {.id = r->sandbox_id, .op = SBX_FILE_WATCH, .flags = r->recursive ? SBX_FILE_F_RECURSIVE : 0};
  if ((req.path = api_request_path (r->path, r->path_bytes, buf, err)) == NULL)
    return -1;
  cleanup_file sbx_file_t *f = NULL;
  sbx_file_msg_t msg;
  if (api_file_start (ctx, &req, call, &f, err) < 0)
    return -1;
  /* Until the client cancels (ECANCELED), or the watch fails. */
  for (;;)
    {
      int rc = sbx_file_next (f, &msg, err);
      if (rc <= 0)
        return rc < 0 ? -1 : 0;
      if (msg.kind != SBX_FRAME_EVENT)
        return err_make (err, EIO, "Watch: an unexpected answer");
      cleanup_names api_names_t names = {0};
      Sandbox__V1__FileEvent ev = SANDBOX__V1__FILE_EVENT__INIT;
      ev.path = (char *) api_utf8_text (msg.path, &ev.path_bytes, &names.owned[0]);
      ev.kind = api_event_kind_to_proto (msg.event.kind);
      ev.is_dir = msg.event.is_dir != 0;
      ev.old_path = msg.target != NULL ? (char *) api_utf8_text (msg.target, &ev.old_path_bytes, &names.owned[1])
                                       : (char *) "";
      if (ev.path == NULL || ev.old_path == NULL)
        return err_make (err, ENOMEM, "Watch: out of memory");
      if (rpc_call_send (call, &ev.base, err) < 0)
        return -1;
    }
}
