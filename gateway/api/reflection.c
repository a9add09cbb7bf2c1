/* reflection: server reflection over the embedded descriptor set (see
 * reflection.h). State: one read-only index built at registration. */
#include "gateway/api/reflection.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "descriptor.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"

typedef struct refl_file_s
{
  const char *name;
  ProtobufCBinaryData bytes; /* the serialized FileDescriptorProto */
  size_t n_deps;
  char **deps;
} refl_file_t;

typedef struct refl_symbol_s
{
  char *name; /* fully qualified, no leading dot */
  size_t file;
  bool is_message;
} refl_symbol_t;

static Google__Protobuf__FileDescriptorSet *refl_set;
static refl_file_t *refl_files;
static size_t refl_n_files;
static refl_symbol_t *refl_symbols;
static size_t refl_n_symbols, refl_cap_symbols;
static char **refl_services;
static size_t refl_n_services;

static int
add_symbol (const char *scope, const char *name, size_t file, bool is_message, char **out, err_t *err)
{
  if (refl_n_symbols == refl_cap_symbols)
    {
      size_t cap = refl_cap_symbols ? refl_cap_symbols * 2 : 64;
      refl_symbol_t *s = realloc (refl_symbols, cap * sizeof *s);
      if (s == NULL)
        return err_make (err, ENOMEM, "reflection index: out of memory");
      refl_symbols = s;
      refl_cap_symbols = cap;
    }
  char *full = NULL;
  if (asprintf (&full, "%s%s%s", scope, scope[0] ? "." : "", name) < 0)
    return err_make (err, ENOMEM, "reflection index: out of memory");
  refl_symbols[refl_n_symbols++] = (refl_symbol_t){.name = full, .file = file, .is_message = is_message};
  if (out != NULL)
    *out = full;
  return 0;
}

static int
index_enum (const char *scope, const Google__Protobuf__EnumDescriptorProto *e, size_t file, err_t *err)
{
  char *full = NULL;
  if (add_symbol (scope, e->name, file, false, &full, err) < 0)
    return -1;
  /* Enum values live in the enum's enclosing scope, as in protoc. */
  for (size_t i = 0; i < e->n_value; i++)
    if (add_symbol (scope, e->value[i]->name, file, false, NULL, err) < 0)
      return -1;
  return 0;
}

static int
index_message (const char *scope, const Google__Protobuf__DescriptorProto *m, size_t file, err_t *err)
{
  char *full = NULL;
  if (add_symbol (scope, m->name, file, true, &full, err) < 0)
    return -1;
  for (size_t i = 0; i < m->n_nested_type; i++)
    if (index_message (full, m->nested_type[i], file, err) < 0)
      return -1;
  for (size_t i = 0; i < m->n_enum_type; i++)
    if (index_enum (full, m->enum_type[i], file, err) < 0)
      return -1;
  for (size_t i = 0; i < m->n_field; i++)
    if (add_symbol (full, m->field[i]->name, file, false, NULL, err) < 0)
      return -1;
  return 0;
}

static int
index_file (const Google__Protobuf__FileDescriptorProto *f, size_t idx, err_t *err)
{
  const char *pkg = f->package != NULL ? f->package : "";
  for (size_t i = 0; i < f->n_message_type; i++)
    if (index_message (pkg, f->message_type[i], idx, err) < 0)
      return -1;
  for (size_t i = 0; i < f->n_enum_type; i++)
    if (index_enum (pkg, f->enum_type[i], idx, err) < 0)
      return -1;
  for (size_t i = 0; i < f->n_service; i++)
    {
      char *svc = NULL;
      if (add_symbol (pkg, f->service[i]->name, idx, false, &svc, err) < 0)
        return -1;
      char **s = realloc (refl_services, (refl_n_services + 1) * sizeof *s);
      if (s == NULL)
        return err_make (err, ENOMEM, "reflection index: out of memory");
      refl_services = s;
      refl_services[refl_n_services++] = svc;
      for (size_t j = 0; j < f->service[i]->n_method; j++)
        if (add_symbol (svc, f->service[i]->method[j]->name, idx, false, NULL, err) < 0)
          return -1;
    }
  return 0;
}

static const refl_symbol_t *
find_symbol (const char *name)
{
  if (name[0] == '.')
    name++;
  for (size_t i = 0; i < refl_n_symbols; i++)
    if (strcmp (refl_symbols[i].name, name) == 0)
      return &refl_symbols[i];
  return NULL;
}

static long
find_file (const char *name)
{
  for (size_t i = 0; i < refl_n_files; i++)
    if (strcmp (refl_files[i].name, name) == 0)
      return (long) i;
  return -1;
}

/* Adds file `idx` and, first, its transitive dependencies to `out`
 * (indices, each once). */
static void
collect_file (size_t idx, bool *seen, size_t *out, size_t *n)
{
  if (seen[idx])
    return;
  seen[idx] = true;
  out[(*n)++] = idx;
  for (size_t i = 0; i < refl_files[idx].n_deps; i++)
    {
      long d = find_file (refl_files[idx].deps[i]);
      if (d >= 0)
        collect_file ((size_t) d, seen, out, n);
    }
}

typedef Grpc__Reflection__V1__ServerReflectionRequest refl_req_t;
typedef Grpc__Reflection__V1__ServerReflectionResponse refl_resp_t;

static int
send_error (rpc_call_t *call, refl_resp_t *resp, grpc_status_code code, const char *msg, err_t *err)
{
  Grpc__Reflection__V1__ErrorResponse e = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
  e.error_code = (int32_t) code;
  e.error_message = (char *) msg;
  resp->message_response_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
  resp->error_response = &e;
  return rpc_call_send (call, &resp->base, err);
}

static int
send_files (rpc_call_t *call, refl_resp_t *resp, size_t idx, err_t *err)
{
  cleanup_free bool *seen = calloc (refl_n_files, sizeof *seen);
  cleanup_free size_t *order = calloc (refl_n_files, sizeof *order);
  cleanup_free ProtobufCBinaryData *blobs = calloc (refl_n_files, sizeof *blobs);
  if (seen == NULL || order == NULL || blobs == NULL)
    return err_make (err, ENOMEM, "reflection: out of memory");
  size_t n = 0;
  collect_file (idx, seen, order, &n);
  for (size_t i = 0; i < n; i++)
    blobs[i] = refl_files[order[i]].bytes;
  Grpc__Reflection__V1__FileDescriptorResponse fd = GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
  fd.n_file_descriptor_proto = n;
  fd.file_descriptor_proto = blobs;
  resp->message_response_case
      = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
  resp->file_descriptor_response = &fd;
  return rpc_call_send (call, &resp->base, err);
}

static int
answer (rpc_call_t *call, refl_req_t *req, err_t *err)
{
  refl_resp_t resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
  resp.valid_host = req->host;
  resp.original_request = req;
  switch (req->message_request_case)
    {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
      {
        cleanup_free Grpc__Reflection__V1__ServiceResponse *svcs = calloc (refl_n_services + 1, sizeof *svcs);
        cleanup_free Grpc__Reflection__V1__ServiceResponse **ptrs = calloc (refl_n_services + 1, sizeof *ptrs);
        if (svcs == NULL || ptrs == NULL)
          return err_make (err, ENOMEM, "reflection: out of memory");
        for (size_t i = 0; i < refl_n_services; i++)
          {
            grpc__reflection__v1__service_response__init (&svcs[i]);
            svcs[i].name = refl_services[i];
            ptrs[i] = &svcs[i];
          }
        Grpc__Reflection__V1__ListServiceResponse list = GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
        list.n_service = refl_n_services;
        list.service = ptrs;
        resp.message_response_case
            = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        resp.list_services_response = &list;
        return rpc_call_send (call, &resp.base, err);
      }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
      {
        long f = find_file (req->file_by_filename);
        if (f < 0)
          return send_error (call, &resp, GRPC_STATUS_NOT_FOUND, "file not found", err);
        return send_files (call, &resp, (size_t) f, err);
      }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
      {
        const refl_symbol_t *s = find_symbol (req->file_containing_symbol);
        if (s == NULL)
          return send_error (call, &resp, GRPC_STATUS_NOT_FOUND, "symbol not found", err);
        return send_files (call, &resp, s->file, err);
      }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
      return send_error (call, &resp, GRPC_STATUS_NOT_FOUND, "extension not found", err);
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
      {
        const refl_symbol_t *s = find_symbol (req->all_extension_numbers_of_type);
        if (s == NULL || !s->is_message)
          return send_error (call, &resp, GRPC_STATUS_NOT_FOUND, "type not found", err);
        Grpc__Reflection__V1__ExtensionNumberResponse ext = GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
        ext.base_type_name = s->name;
        resp.message_response_case
            = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
        resp.all_extension_numbers_response = &ext;
        return rpc_call_send (call, &resp.base, err);
      }
    default:
      return send_error (call, &resp, GRPC_STATUS_INVALID_ARGUMENT, "empty or unknown reflection request", err);
    }
}

static int
reflection_info (rpc_call_t *call, void *user, err_t *err)
{
  for (;;)
    {
      ProtobufCMessage *m = NULL;
      int rc = rpc_call_recv (call, &grpc__reflection__v1__server_reflection_request__descriptor, &m, err);
      if (rc <= 0)
        return rc;
      rc = answer (call, (refl_req_t *) m, err);
      protobuf_c_message_free_unpacked (m, NULL);
      if (rc < 0)
        return -1;
    }
}

int
reflection_register (rpc_server_t *server, const uint8_t *set, size_t len, err_t *err)
{
  refl_set = google__protobuf__file_descriptor_set__unpack (NULL, len, set);
  if (refl_set == NULL)
    return err_make (err, EINVAL, "reflection: the embedded descriptor set does not decode");
  refl_n_files = refl_set->n_file;
  refl_files = calloc (refl_n_files ? refl_n_files : 1, sizeof *refl_files);
  if (refl_files == NULL)
    return err_make (err, ENOMEM, "reflection index: out of memory");
  for (size_t i = 0; i < refl_n_files; i++)
    {
      const Google__Protobuf__FileDescriptorProto *f = refl_set->file[i];
      refl_file_t *rf = &refl_files[i];
      rf->name = f->name;
      rf->deps = f->dependency;
      rf->n_deps = f->n_dependency;
      size_t sz = google__protobuf__file_descriptor_proto__get_packed_size (f);
      rf->bytes.data = malloc (sz ? sz : 1);
      if (rf->bytes.data == NULL)
        return err_make (err, ENOMEM, "reflection index: out of memory");
      rf->bytes.len = google__protobuf__file_descriptor_proto__pack (f, rf->bytes.data);
      if (index_file (f, i, err) < 0)
        return -1;
    }
  if (rpc_server_add_method (server, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", reflection_info,
                             NULL, err)
          < 0
      || rpc_server_add_method (server, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                reflection_info, NULL, err)
             < 0)
    return -1;
  return 0;
}

void
reflection_release (void)
{
  for (size_t i = 0; i < refl_n_files; i++)
    free (refl_files[i].bytes.data);
  free (refl_files);
  for (size_t i = 0; i < refl_n_symbols; i++)
    free (refl_symbols[i].name);
  free (refl_symbols);
  free (refl_services);
  if (refl_set != NULL)
    google__protobuf__file_descriptor_set__free_unpacked (refl_set, NULL);
  refl_set = NULL;
  refl_files = NULL;
  refl_symbols = NULL;
  refl_services = NULL;
  refl_n_files = refl_n_symbols = refl_cap_symbols = refl_n_services = 0;
}
