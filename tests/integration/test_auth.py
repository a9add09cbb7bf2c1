"""Bearer-token authorization of every sandbox.v1.Sandbox method."""

import grpc
import pytest

from tests.lib.gateway import start_gateway
from tests.lib.grpc_clients import HealthClient, ReflectionClient, rpc_code

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
NOT_CONFIGURED = "gateway secret not configured"

# Requests that cannot create anything even once the runtime exists: ids
# that fail validation, or sandboxes that do not exist.
BAD_ID = "!not a valid id"
MISSING_ID = "no-such-sandbox-for-auth-tests"


def _requests(pb2):
    return {
        "Launch": lambda: pb2.LaunchRequest(sandbox_id=BAD_ID),
        "Restore": lambda: iter([
            pb2.RestoreRequest(header=pb2.RestoreHeader(sandbox_id=BAD_ID)),
            pb2.RestoreRequest(tar_chunk=b"\0" * 512),
        ]),
        "Exec": lambda: pb2.ExecRequest(sandbox_id=MISSING_ID, argv=["true"]),
        "Run": lambda: iter([pb2.ProcessInput(start=pb2.ProcessStart(sandbox_id=MISSING_ID, argv=["true"]))]),
        "ListProcesses": lambda: pb2.ListProcessesRequest(sandbox_id=MISSING_ID),
        "SignalProcess": lambda: pb2.SignalProcessRequest(sandbox_id=MISSING_ID, process_id="p", signal=15),
        "ExportSnapshot": lambda: pb2.ExportSnapshotRequest(sandbox_id=MISSING_ID),
        "PersistSnapshot": lambda: pb2.PersistSnapshotRequest(sandbox_id=MISSING_ID),
        "Connect": lambda: pb2.ConnectRequest(sandbox_id=BAD_ID),
        "Delete": lambda: pb2.DeleteRequest(sandbox_id=MISSING_ID),
        "Get": lambda: pb2.GetRequest(sandbox_id=MISSING_ID),
        "List": lambda: pb2.ListRequest(),
        "Status": lambda: pb2.StatusRequest(),
        "ReadFile": lambda: pb2.ReadFileRequest(sandbox_id=MISSING_ID, path="/etc/hostname"),
        "WriteFile": lambda: iter([
            pb2.WriteFileRequest(header=pb2.WriteFileHeader(sandbox_id=MISSING_ID, path="/tmp/x")),
            pb2.WriteFileRequest(data=b"x"),
        ]),
        "ListDir": lambda: pb2.ListDirRequest(sandbox_id=MISSING_ID, path="/"),
        "Stat": lambda: pb2.StatRequest(sandbox_id=MISSING_ID, path="/"),
        "Remove": lambda: pb2.RemoveRequest(sandbox_id=MISSING_ID, path="/tmp/x"),
        "Rename": lambda: pb2.RenameRequest(sandbox_id=MISSING_ID, to="/tmp/y", **{"from": "/tmp/x"}),
        "MakeDir": lambda: pb2.MakeDirRequest(sandbox_id=MISSING_ID, path="/tmp/d"),
        "Watch": lambda: pb2.WatchRequest(sandbox_id=MISSING_ID, path="/tmp"),
        "Forward": lambda: iter([pb2.ForwardFrame(sandbox_id=MISSING_ID, port=8000)]),
        "ListPorts": lambda: pb2.ListPortsRequest(sandbox_id=MISSING_ID),
        "PullImage": lambda: pb2.PullImageRequest(image=BAD_ID),
        "ListImages": lambda: pb2.ListImagesRequest(),
        "RemoveImage": lambda: pb2.RemoveImageRequest(image=BAD_ID),
        "CreateContext": lambda: pb2.CreateContextRequest(sandbox_id=MISSING_ID),
        "ListContexts": lambda: pb2.ListContextsRequest(sandbox_id=MISSING_ID),
        "RestartContext": lambda: pb2.RestartContextRequest(sandbox_id=MISSING_ID, context_id="c"),
        "DeleteContext": lambda: pb2.DeleteContextRequest(sandbox_id=MISSING_ID, context_id="c"),
        "RunCode": lambda: pb2.RunCodeRequest(sandbox_id=MISSING_ID, code="1"),
        "Extend": lambda: pb2.ExtendRequest(sandbox_id=MISSING_ID, idle_ttl_seconds=60),
        "CreateTemplate": lambda: pb2.CreateTemplateRequest(sandbox_id=MISSING_ID, name="t"),
        "ListTemplates": lambda: pb2.ListTemplatesRequest(),
        "DeleteTemplate": lambda: pb2.DeleteTemplateRequest(name="missing"),
    }


METHODS = ["Launch", "Restore", "Exec", "Run", "ListProcesses", "SignalProcess", "ExportSnapshot", "PersistSnapshot",
           "Connect", "Delete", "Get", "List", "Status", "ReadFile", "WriteFile", "ListDir", "Stat", "Remove",
           "Rename", "MakeDir", "Watch", "Forward", "ListPorts", "PullImage", "ListImages", "RemoveImage",
           "CreateContext", "ListContexts", "RestartContext", "DeleteContext", "RunCode", "Extend",
           "CreateTemplate", "ListTemplates", "DeleteTemplate"]


def call(gw, sandbox_api, method, metadata=None):
    """(status code, details) of one call of `method`."""
    pb2, pb2_grpc = sandbox_api
    stub = pb2_grpc.SandboxStub(gw.channel())
    request = _requests(pb2)[method]()
    kwargs = {"timeout": 10.0}
    if metadata is not None:
        kwargs["metadata"] = metadata
    return rpc_code(getattr(stub, method), request, **kwargs)


def test_method_table_covers_every_rpc_of_the_service(sandbox_api):
    pb2, _ = sandbox_api
    assert [m.name for m in pb2.DESCRIPTOR.services_by_name["Sandbox"].methods] == METHODS


@pytest.mark.parametrize("method", METHODS)
def test_missing_token_is_unauthenticated(gateway, sandbox_api, method):
    code, _ = call(gateway, sandbox_api, method)
    assert code == UNAUTHENTICATED


@pytest.mark.parametrize("method", METHODS)
def test_wrong_token_is_unauthenticated(gateway, sandbox_api, method):
    code, _ = call(gateway, sandbox_api, method, gateway.auth_metadata("0" * 64))
    assert code == UNAUTHENTICATED


@pytest.mark.parametrize("value_of", [
    pytest.param(lambda s: s, id="secret-without-scheme"),
    pytest.param(lambda s: f"Basic {s}", id="basic-scheme"),
    pytest.param(lambda s: "Bearer", id="scheme-only"),
    pytest.param(lambda s: "Bearer ", id="empty-token"),
    pytest.param(lambda s: f"Bearer {s[:-1]}", id="secret-prefix"),
    pytest.param(lambda s: f"Bearer {s}x", id="secret-plus-suffix"),
    pytest.param(lambda s: f"Bearer {s[:-1]}{'0' if s[-1] != '0' else '1'}", id="last-char-differs"),
    pytest.param(lambda s: f"Bearer {s.upper()}", id="different-case"),
    pytest.param(lambda s: f"Bearer {s} {s}", id="secret-twice"),
])
@pytest.mark.parametrize("method", ["List", "Exec"])
def test_malformed_or_near_miss_authorization_is_unauthenticated(gateway, sandbox_api, method,
                                                                 value_of):
    code, _ = call(gateway, sandbox_api, method, [("authorization", value_of(gateway.secret))])
    assert code == UNAUTHENTICATED


@pytest.mark.parametrize("method", METHODS)
def test_correct_token_passes_authorization(gateway, sandbox_api, method):
    code, details = call(gateway, sandbox_api, method, gateway.auth_metadata())
    assert code not in (UNAUTHENTICATED, UNAVAILABLE), details
    if method == "List":
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED), details


def test_correct_token_among_other_metadata_passes_authorization(gateway, sandbox_api):
    metadata = [("x-request-id", "abc"), *gateway.auth_metadata(), ("x-other", "1")]
    code, details = call(gateway, sandbox_api, "List", metadata)
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED), details


def test_secret_never_appears_in_gateway_logs(gateways, sandbox_api, gateway_secret):
    gw = gateways.gateway(secret=gateway_secret, env={"SANDBOX_LOG_LEVEL": "debug"})
    wrong = "f" * 64
    for method in METHODS:
        call(gw, sandbox_api, method, gw.auth_metadata())
        call(gw, sandbox_api, method, gw.auth_metadata(wrong))
    gw.stop()
    text = gw.logs.text() + gw.stdout.text()
    assert gateway_secret not in text
    assert wrong not in text


@pytest.fixture(scope="module", params=["unset", "empty"])
def unconfigured_gateway(request):
    env = {"CLOUD_RUN_SANDBOX_GATEWAY_SECRET": None if request.param == "unset" else ""}
    gw = start_gateway(env)
    try:
        yield gw
    finally:
        rc = gw.stop()
        assert rc == 0, gw.describe()


@pytest.mark.parametrize("token", [None, "", "some-token"], ids=["no-token", "empty-token", "token"])
@pytest.mark.parametrize("method", METHODS)
def test_unconfigured_secret_makes_every_method_unavailable(unconfigured_gateway, sandbox_api,
                                                            method, token):
    metadata = None if token is None else unconfigured_gateway.auth_metadata(token)
    code, details = call(unconfigured_gateway, sandbox_api, method, metadata)
    assert code == UNAVAILABLE
    assert NOT_CONFIGURED in details


def test_unconfigured_secret_leaves_health_and_reflection_working(unconfigured_gateway,
                                                                  std_protos):
    ch = unconfigured_gateway.channel()
    health = HealthClient(ch, std_protos)
    assert health.check("").status == std_protos.ServingStatus.SERVING
    for version in ("v1", "v1alpha"):
        assert "sandbox.v1.Sandbox" in ReflectionClient(ch, std_protos, version).list_services()

