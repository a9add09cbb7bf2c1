"""Server reflection, v1 and v1alpha: listing, descriptors, errors, and a
client that learns the Sandbox API from reflection alone."""

import grpc
import pytest
from google.protobuf import descriptor_pb2

from tests.lib.grpc_clients import (DynamicService, ReflectionClient, file_proto,
                                    pool_from_file_descriptor_protos, streaming_flags)

VERSIONS = ["v1", "v1alpha"]
SANDBOX_FILE = "sandbox/v1/sandbox.proto"
SANDBOX_METHODS = ["Launch", "Restore", "Exec", "Run", "ListProcesses", "SignalProcess", "ExportSnapshot",
                   "PersistSnapshot",
                   "Connect", "Delete", "Get", "List", "Status", "ReadFile", "WriteFile", "ListDir", "Stat",
                   "Remove", "Rename", "MakeDir", "Watch", "Forward", "ListPorts",
                   "PullImage", "ListImages", "RemoveImage"]
"""The methods every release has served, in proto order; later ones follow them."""
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]  # 5


@pytest.fixture(params=VERSIONS)
def reflection(request, gateway, std_protos) -> ReflectionClient:
    return ReflectionClient(gateway.channel(), std_protos, request.param)


def _normalized(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """A copy without the parts protoc fills in differently per output mode
    (source info, json_name)."""
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)
    out.ClearField("source_code_info")

    def strip(msgs):
        for m in msgs:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)

    strip(out.message_type)
    return out


def _by_name(blobs):
    files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in blobs]
    return {f.name: f for f in files}


def test_list_services_includes_sandbox_health_and_both_reflection_services(reflection):
    services = reflection.list_services()
    for expected in ["sandbox.v1.Sandbox", "grpc.health.v1.Health",
                     "grpc.reflection.v1.ServerReflection",
                     "grpc.reflection.v1alpha.ServerReflection"]:
        assert expected in services
    assert len(services) == len(set(services)), f"duplicate service names: {services}"


def test_file_containing_sandbox_service_is_exactly_sandbox_proto(reflection, sandbox_api):
    sandbox_pb2, _ = sandbox_api
    files = _by_name(reflection.file_descriptors(file_containing_symbol="sandbox.v1.Sandbox"))
    assert SANDBOX_FILE in files, f"got files {sorted(files)}"
    got = files[SANDBOX_FILE]
    assert got.package == "sandbox.v1"
    assert _normalized(got) == _normalized(file_proto(sandbox_pb2.DESCRIPTOR))
    # Every dependency the file names is returned too.
    assert set(got.dependency) <= set(files)


def test_file_by_filename_returns_sandbox_proto(reflection):
    files = _by_name(reflection.file_descriptors(file_by_filename=SANDBOX_FILE))
    assert SANDBOX_FILE in files
    assert [s.name for s in files[SANDBOX_FILE].service] == ["Sandbox"]


@pytest.mark.parametrize("symbol", ["sandbox.v1.LaunchRequest", "sandbox.v1.Sandbox.Launch",
                                    "sandbox.v1.Compression"])
def test_file_containing_message_method_or_enum_symbol_returns_sandbox_proto(reflection, symbol):
    # What `grpcurl describe <message>` and method invocation ask for.
    files = _by_name(reflection.file_descriptors(file_containing_symbol=symbol))
    assert SANDBOX_FILE in files


@pytest.mark.parametrize("symbol,filename", [
    ("grpc.health.v1.Health", "grpc/health/v1/health.proto"),
    ("grpc.reflection.v1.ServerReflection", "grpc/reflection/v1/reflection.proto"),
    ("grpc.reflection.v1alpha.ServerReflection", "grpc/reflection/v1alpha/reflection.proto"),
])
def test_file_containing_standard_service_returns_its_proto(reflection, symbol, filename):
    files = _by_name(reflection.file_descriptors(file_containing_symbol=symbol))
    assert filename in files


@pytest.mark.parametrize("fields", [
    {"file_containing_symbol": "no.such.Symbol"},
    {"file_containing_symbol": "sandbox.v1.Sandbox.NoSuchMethod"},
    {"file_by_filename": "no/such/file.proto"},
])
def test_unknown_symbol_or_file_returns_not_found_error(reflection, fields):
    resp = reflection.one(**fields)
    assert resp.WhichOneof("message_response") == "error_response", resp
    assert resp.error_response.error_code == NOT_FOUND


def test_several_requests_on_one_stream_are_answered_in_order(reflection):
    requests = [
        reflection.request(list_services=""),
        reflection.request(file_containing_symbol="no.such.Symbol"),
        reflection.request(file_by_filename=SANDBOX_FILE),
        reflection.request(file_containing_symbol="grpc.health.v1.Health"),
        reflection.request(list_services=""),
        reflection.request(file_by_filename="no/such/file.proto"),
    ]
    responses = reflection.exchange(requests)
    kinds = [r.WhichOneof("message_response") for r in responses]
    assert kinds == ["list_services_response", "error_response", "file_descriptor_response",
                     "file_descriptor_response", "list_services_response", "error_response"]
    files = _by_name(responses[2].file_descriptor_response.file_descriptor_proto)
    assert SANDBOX_FILE in files
    files = _by_name(responses[3].file_descriptor_response.file_descriptor_proto)
    assert "grpc/health/v1/health.proto" in files
    for req, resp in zip(requests, responses):
        if resp.HasField("original_request"):
            assert resp.original_request == req


def test_long_stream_of_requests_is_answered_completely(reflection):
    requests = [reflection.request(file_containing_symbol="sandbox.v1.Sandbox")
                for _ in range(100)]
    responses = reflection.exchange(requests, timeout=30.0)
    assert len(responses) == 100
    assert all(r.WhichOneof("message_response") == "file_descriptor_response"
               for r in responses)


def test_client_without_proto_copy_calls_sandbox_via_reflection(reflection, gateway, sandbox_api):
    """Learns sandbox.v1.Sandbox from reflection only, then calls it."""
    blobs = reflection.file_descriptors(file_containing_symbol="sandbox.v1.Sandbox")
    pool = pool_from_file_descriptor_protos(blobs)
    service = DynamicService(gateway.channel(), pool, "sandbox.v1.Sandbox")

    sandbox_pb2, _ = sandbox_api
    compiled = sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"]
    reflected = [(m.name, streaming_flags(m)) for m in service.descriptor.methods]
    assert reflected == [(m.name, streaming_flags(m)) for m in compiled.methods]
    assert [name for name, _ in reflected][:len(SANDBOX_METHODS)] == SANDBOX_METHODS
    flags = dict(reflected)
    for name in ["Restore", "WriteFile"]:
        assert flags[name] == (True, False), name
    assert flags["Run"] == (True, True)
    assert flags["Forward"] == (True, True)
    for name in ["Exec", "ExportSnapshot", "PersistSnapshot", "ReadFile", "Watch"]:
        assert flags[name] == (False, True), name
    for name in ["Launch", "ListProcesses", "SignalProcess", "Connect", "Delete", "Get", "List", "Status", "ListDir",
                 "Stat", "Remove", "Rename", "MakeDir", "ListPorts"]:
        assert flags[name] == (False, False), name

    # A request built from the reflected descriptor is wire-compatible with
    # the generated code.
    LaunchRequest = service.request_class("Launch")
    launch = LaunchRequest(sandbox_id="reflected-1", allow_egress=True)
    decoded = sandbox_pb2.LaunchRequest.FromString(launch.SerializeToString())
    assert (decoded.sandbox_id, decoded.allow_egress) == ("reflected-1", True)

    # Launch with an id that no runtime would accept: it must get past auth
    # without creating anything.
    try:
        service.callable("Launch")(LaunchRequest(sandbox_id="!not a valid id"),
                                   metadata=gateway.auth_metadata(), timeout=10.0)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    assert code not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK)

    ListRequest = service.request_class("List")
    try:
        resp = service.callable("List")(ListRequest(), metadata=gateway.auth_metadata(),
                                        timeout=10.0)
        code = grpc.StatusCode.OK
        assert resp.DESCRIPTOR.full_name == "sandbox.v1.ListResponse"
    except grpc.RpcError as e:
        code = e.code()
    assert code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.OK)

    # And without the token the same dynamic call is refused.
    with pytest.raises(grpc.RpcError) as err:
        service.callable("List")(ListRequest(), timeout=10.0)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
