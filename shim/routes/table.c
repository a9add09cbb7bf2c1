/* routes/table: the REST contract's route table — method, path template,
 * body handling, auth, handler. server.c matches requests against it
 * (router.h). */
#include "shim/routes/routes.h"

const shim_route_t shim_routes[] = {
    {"GET", "/health", SHIM_BODY_NONE, false, route_health, NULL, NULL, false},
    {"POST", "/sandboxes", SHIM_BODY_JSON, true, route_launch, NULL, NULL, false},
    {"GET", "/sandboxes", SHIM_BODY_NONE, true, route_list, NULL, NULL, false},
    {"DELETE", "/sandboxes/{id}", SHIM_BODY_NONE, true, route_delete, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/exec", SHIM_BODY_JSON, true, route_exec, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/restore", SHIM_BODY_STREAM, true, route_restore, route_restore_upload,
     route_restore_cleanup, false},
    {"GET", "/sandboxes/{id}/tar", SHIM_BODY_NONE, true, route_tar, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/snapshot", SHIM_BODY_NONE, true, route_snapshot, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/connect", SHIM_BODY_NONE, true, route_connect, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/processes/{pid}/terminal", SHIM_BODY_NONE, true, route_terminal, NULL,
     route_terminal_cleanup, true},
    {"POST", "/sandboxes/{id}/processes", SHIM_BODY_JSON, true, route_process_start, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/processes", SHIM_BODY_NONE, true, route_process_list, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/processes/{pid}", SHIM_BODY_NONE, true, route_process_get, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/processes/{pid}/output", SHIM_BODY_NONE, true, route_process_output, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/processes/{pid}/stdin", SHIM_BODY_RAW, true, route_process_stdin, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/processes/{pid}/signal", SHIM_BODY_JSON, true, route_process_signal, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/processes/{pid}/resize", SHIM_BODY_JSON, true, route_process_resize, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/files", SHIM_BODY_NONE, true, route_file_get, NULL, NULL, false},
    {"PUT", "/sandboxes/{id}/files", SHIM_BODY_STREAM, true, route_file_put, route_file_put_upload,
     route_file_put_cleanup, false},
    {"DELETE", "/sandboxes/{id}/files", SHIM_BODY_NONE, true, route_file_delete, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/files/stat", SHIM_BODY_NONE, true, route_file_stat, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/files/list", SHIM_BODY_NONE, true, route_file_list, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/files/rename", SHIM_BODY_JSON, true, route_file_rename, NULL, NULL, false},
    {"POST", "/sandboxes/{id}/files/mkdir", SHIM_BODY_JSON, true, route_file_mkdir, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/files/watch", SHIM_BODY_NONE, true, route_file_watch, NULL, NULL, false},
    {"GET", "/metrics", SHIM_BODY_NONE, true, route_metrics, NULL, NULL, false},
    {"GET", "/sandboxes/{id}/ports", SHIM_BODY_NONE, true, route_ports_list, NULL, NULL, false},
    /* Before the proxy: a server's own POST …/links is shadowed by it. */
    {"POST", "/sandboxes/{id}/ports/{port}/links", SHIM_BODY_JSON, true, route_port_link, NULL, NULL, false},
    {"*", "/sandboxes/{id}/ports/{port}", SHIM_BODY_NONE, true, route_port_root, NULL, NULL, false},
    {"*", "/sandboxes/{id}/ports/{port}/{*}", SHIM_BODY_STREAM, true, proxy_handle, proxy_upload, proxy_cleanup,
     false},
    {"*", "/p/{*}", SHIM_BODY_STREAM, false, proxy_handle, proxy_upload, proxy_cleanup, false},
};
const size_t shim_n_routes = sizeof shim_routes / sizeof shim_routes[0];
