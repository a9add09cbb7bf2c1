/* reflection: gRPC server reflection, grpc.reflection.v1 and v1alpha.
 *
 * Answers from a FileDescriptorSet embedded in the binary at build time
 * (every .proto the gateway serves, imports included), so that grpcurl and
 * other reflection clients can list and describe the services with no
 * .proto at hand. Supports list_services, file_by_filename,
 * file_containing_symbol (answered with the file and its transitive
 * dependencies), file_containing_extension and
 * all_extension_numbers_of_type (no extensions are defined).
 *
 * The two protocol versions are identical on the wire, so one handler
 * serves both. The index is built once at registration and is read-only
 * afterwards, so handlers share it without locks.
 */
#ifndef SBX_GATEWAY_REFLECTION_H
#define SBX_GATEWAY_REFLECTION_H

#include <stddef.h>
#include <stdint.h>

#include "common/rpc/rpc.h"

/* Parses the serialized FileDescriptorSet `set` (borrowed during the call)
 * and registers ServerReflectionInfo for v1 and v1alpha on `server`. */
int reflection_register (rpc_server_t *server, const uint8_t *set, size_t len, err_t *err);

/* Frees the index (after the server has shut down). */
void reflection_release (void);

#endif
