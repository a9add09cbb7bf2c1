/* rpc/external: hands a socket this layer accepted to a gRPC core listener
 * made with the address "external:<name>" — the one way gRPC core 1.51
 * takes an accepted connection under any credentials (TLS included;
 * grpc_server_add_channel_from_fd takes insecure ones only). The core
 * fills a channel argument named like the address with its connection
 * handler; its interface, a class with one method besides its destructor,
 * is declared here as libgrpc exports it (grpc_core::TcpServerFdHandler,
 * the same one gRPC's C++ ExternalConnectionAcceptor calls). The handler
 * takes the descriptor, names the connection by its peer address and runs
 * the handshake of the listener's credentials. No state. */
#include <grpc/grpc.h>

namespace grpc_core
{
class TcpServerFdHandler
{
public:
  virtual ~TcpServerFdHandler () = default;
  virtual void Handle (int listener_fd, int fd, grpc_byte_buffer *pending_read) = 0;
};
} // namespace grpc_core

extern "C" void
rpc_external_handle (void *handler, int listener_fd, int fd)
{
  static_cast<grpc_core::TcpServerFdHandler *> (handler)->Handle (listener_fd, fd, nullptr);
}
