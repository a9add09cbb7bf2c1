"""The Python client library of the integration, security and reliability
tests (no tests here). Import it as `tests.lib.<module>`: pytest.ini puts the
repository root on sys.path.

- `procs`: running a binary under test (`ManagedProcess`, its logs), stopping
  it with checks, polling (`wait_until`), memory (`vm_rss_kib`, `RssSampler`).
- `gateway`: starting sandbox-gateway (`start_gateway`, `running_gateway`,
  `gateway_client`), groups of gateways and shims a test starts
  (`ProcessGroup`), and the host's view of a gateway's sandboxes (mounts,
  cgroups, processes).
- `grpc_clients`: the generated sandbox.v1 stubs, health and reflection
  clients, `rpc_code` / `rpc_error`.
- `client`: `SandboxClient`, the client of sandbox.v1.Sandbox (launch, exec,
  delete, get/list, export, restore, persist, connect).
- `snapshots`: tar streams: chunking, decompressing, reading.
- `shim`: starting sandbox-shim (`start_shim`), its REST contract as an
  agent backend uses it (`ShimClient`), and raw HTTP helpers.
- `peers`: what sandboxes and the gateway talk to: TCP servers, a network
  namespace, the fake GCS server.
- `security`: helpers of the escape tests (`py`, `sh`, `assert_works`).
"""
