"""gRPC clients for the tests, built without generated stubs where the
`grpc` package name makes stubs impossible.

- `sandbox_modules()`: the generated sandbox.v1 Python stubs (from
  SANDBOX_PY_STUBS).
- `StdProtos`: message classes for grpc.health.v1 and grpc.reflection
  (v1, v1alpha), built at run time from the FileDescriptorSet in
  SANDBOX_STD_DESCRIPTORS.
- `HealthClient`, `ReflectionClient`: thin generic-call clients.
- `pool_from_file_descriptor_protos()` and `DynamicService`: a client that
  knows nothing but what server reflection told it.
- `rpc_code()`, `rpc_error()`: the outcome of one call, for tests that
  expect it to fail.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Iterable, Optional

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.lib.procs import py_stubs_dir, require_file, std_descriptors_path

# Default deadline of every RPC a test makes.
RPC_TIMEOUT_S = 10.0

_BUILD_HINT = "build it with `bazel build //proto/...`"


def message_class(descriptor):
    """The message class for a descriptor, across protobuf versions."""
    get = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    if get is not None:
        return get(descriptor)
    return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


def sandbox_modules():
    """(sandbox_pb2, sandbox_pb2_grpc) from the generated Python stubs."""
    stubs = py_stubs_dir()
    require_file(stubs / "sandbox" / "v1" / "sandbox_pb2.py", _BUILD_HINT + " or set SANDBOX_PY_STUBS")
    if str(stubs) not in sys.path:
        sys.path.insert(0, str(stubs))
    from sandbox.v1 import sandbox_pb2, sandbox_pb2_grpc  # noqa: E402
    return sandbox_pb2, sandbox_pb2_grpc


def pool_from_file_descriptor_protos(serialized: Iterable[bytes]) -> descriptor_pool.DescriptorPool:
    """A fresh pool holding the given serialized FileDescriptorProtos, added
    in dependency order whatever order they come in. Raises ValueError when a
    dependency is missing."""
    files = {}
    for blob in serialized:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(blob)
        files.setdefault(fdp.name, fdp)
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    while len(added) < len(files):
        progress = False
        for name, fdp in files.items():
            if name in added or any(d not in added for d in fdp.dependency):
                continue
            pool.AddSerializedFile(fdp.SerializeToString())
            added.add(name)
            progress = True
        if not progress:
            missing = sorted({d for n, f in files.items() if n not in added
                              for d in f.dependency if d not in files})
            raise ValueError(f"unresolvable dependencies: missing {missing}, "
                             f"have {sorted(files)}")
    return pool


class StdProtos:
    """Message classes of the standard services the gateway serves."""

    def __init__(self, path=None):
        path = require_file(path or std_descriptors_path(),
                            _BUILD_HINT + " or set SANDBOX_STD_DESCRIPTORS")
        fds = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
        self.pool = pool_from_file_descriptor_protos(f.SerializeToString() for f in fds.file)

        def cls(name):
            return message_class(self.pool.FindMessageTypeByName(name))

        self.HealthCheckRequest = cls("grpc.health.v1.HealthCheckRequest")
        self.HealthCheckResponse = cls("grpc.health.v1.HealthCheckResponse")
        status = self.pool.FindEnumTypeByName("grpc.health.v1.HealthCheckResponse.ServingStatus")
        self.ServingStatus = SimpleNamespace(**{v.name: v.number for v in status.values})
        self.serving_status_name = {v.number: v.name for v in status.values}
        self.reflection = {}
        for version in ("v1", "v1alpha"):
            pkg = f"grpc.reflection.{version}"
            self.reflection[version] = SimpleNamespace(
                version=version,
                service=f"{pkg}.ServerReflection",
                Request=cls(f"{pkg}.ServerReflectionRequest"),
                Response=cls(f"{pkg}.ServerReflectionResponse"),
            )


class HealthClient:
    SERVICE = "grpc.health.v1.Health"

    def __init__(self, channel: grpc.Channel, std: StdProtos):
        self.std = std
        self._check = channel.unary_unary(
            f"/{self.SERVICE}/Check",
            request_serializer=std.HealthCheckRequest.SerializeToString,
            response_deserializer=std.HealthCheckResponse.FromString)
        self._watch = channel.unary_stream(
            f"/{self.SERVICE}/Watch",
            request_serializer=std.HealthCheckRequest.SerializeToString,
            response_deserializer=std.HealthCheckResponse.FromString)

    def check(self, service: str = "", timeout: float = RPC_TIMEOUT_S, **kw):
        return self._check(self.std.HealthCheckRequest(service=service), timeout=timeout, **kw)

    def watch(self, service: str = "", timeout: float = RPC_TIMEOUT_S, **kw):
        """The call object: iterate it for responses, cancel() to end it."""
        return self._watch(self.std.HealthCheckRequest(service=service), timeout=timeout, **kw)


class ReflectionClient:
    def __init__(self, channel: grpc.Channel, std: StdProtos, version: str):
        self.types = std.reflection[version]
        self._info = channel.stream_stream(
            f"/{self.types.service}/ServerReflectionInfo",
            request_serializer=self.types.Request.SerializeToString,
            response_deserializer=self.types.Response.FromString)

    def request(self, **fields):
        return self.types.Request(**fields)

    def exchange(self, requests: list, timeout: float = RPC_TIMEOUT_S) -> list:
        """Sends all requests on one stream, half-closes, returns every
        response in arrival order."""
        return list(self._info(iter(requests), timeout=timeout))

    def one(self, timeout: float = RPC_TIMEOUT_S, **fields):
        responses = self.exchange([self.request(**fields)], timeout)
        if len(responses) != 1:
            raise AssertionError(f"expected 1 response, got {len(responses)}: {responses}")
        return responses[0]

    def list_services(self) -> list[str]:
        resp = self.one(list_services="")
        kind = resp.WhichOneof("message_response")
        if kind != "list_services_response":
            raise AssertionError(f"list_services answered with {kind}: {resp}")
        return [s.name for s in resp.list_services_response.service]

    def file_descriptors(self, **fields) -> list[bytes]:
        """The FileDescriptorProtos of a file_by_filename or
        file_containing_symbol request."""
        resp = self.one(**fields)
        kind = resp.WhichOneof("message_response")
        if kind != "file_descriptor_response":
            raise AssertionError(f"{fields} answered with {kind}: {resp}")
        return list(resp.file_descriptor_response.file_descriptor_proto)


def call_error(fn, *args, **kwargs) -> Optional[grpc.RpcError]:
    """Runs one call (unary, or draining a response stream); returns the
    grpc.RpcError it ended with, or None when it succeeded."""
    try:
        result = fn(*args, **kwargs)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            for _ in result:
                pass
    except grpc.RpcError as e:
        return e
    return None


def rpc_code(fn, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    """The final status code and details of one call (OK when it succeeded)."""
    e = call_error(fn, *args, **kwargs)
    return (grpc.StatusCode.OK, "") if e is None else (e.code(), e.details() or "")


def rpc_error(fn, *args, **kwargs) -> grpc.RpcError:
    """The error of one call that must fail."""
    e = call_error(fn, *args, **kwargs)
    if e is None:
        raise AssertionError(f"{getattr(fn, '__name__', fn)} succeeded; an error was expected")
    return e


class DynamicService:
    """Calls the methods of a service known only through a descriptor pool."""

    def __init__(self, channel: grpc.Channel, pool: descriptor_pool.DescriptorPool,
                 service_name: str):
        self.descriptor = pool.FindServiceByName(service_name)
        self._channel = channel

    def method(self, name: str):
        return self.descriptor.methods_by_name[name]

    def request_class(self, method: str):
        return message_class(self.method(method).input_type)

    def response_class(self, method: str):
        return message_class(self.method(method).output_type)

    def callable(self, method: str):
        m = self.method(method)
        path = f"/{self.descriptor.full_name}/{m.name}"
        req = message_class(m.input_type)
        resp = message_class(m.output_type)
        client_streaming, server_streaming = streaming_flags(m)
        factory = {
            (False, False): self._channel.unary_unary,
            (False, True): self._channel.unary_stream,
            (True, False): self._channel.stream_unary,
            (True, True): self._channel.stream_stream,
        }[(client_streaming, server_streaming)]
        return factory(path, request_serializer=req.SerializeToString,
                       response_deserializer=resp.FromString)


def streaming_flags(method_descriptor) -> tuple[bool, bool]:
    """(client_streaming, server_streaming) of a method descriptor, read from
    its proto form (works on every protobuf version)."""
    p = descriptor_pb2.MethodDescriptorProto()
    method_descriptor.CopyToProto(p)
    return p.client_streaming, p.server_streaming


def file_proto(file_descriptor) -> descriptor_pb2.FileDescriptorProto:
    p = descriptor_pb2.FileDescriptorProto()
    file_descriptor.CopyToProto(p)
    return p
