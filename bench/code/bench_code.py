"""bench/code: code contexts against fresh interpreters, one run, one
gateway and shim. Prints a Markdown table (median and p99, and ratios
against the baseline measured in the same run):

- RunCode("1+1") round trip vs Exec python3 -c 'print(1+1)' (target <= 0.1x)
- RunCode("import pandas, matplotlib") in a warm context vs the same python3 -c
- a 1-megapixel PNG result: bytes/s through gRPC and through REST
- CreateContext vs python3 -c 'import ipykernel'

Run: /usr/bin/python3 -m bench.code.bench_code [N] (after `bazel build //...`).
"""

from __future__ import annotations

import statistics
import sys
import time

from tests.lib import code
from tests.lib.client import pb, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.shim import running_shim

PNG_1MP = ("import matplotlib.pyplot as plt, numpy as np\n"
           "fig = plt.figure(figsize=(10, 10), dpi=100)\n"
           "plt.imshow(np.random.default_rng(1).random((1000, 1000, 3))); plt.axis('off'); plt.show()")


def timed(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def stats(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def row(name, xs, base=None, unit="ms"):
    med, p99 = stats(xs)
    ratio = f"{med / stats(base)[0]:.3f}x" if base else ""
    print(f"| {name} | {med * 1000:.1f} {unit} | {p99 * 1000:.1f} {unit} | {ratio} |")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    secret = "bench-" + "x" * 32
    with running_gateway(secret=secret) as gw, running_shim(gw) as shim, sandbox_client(gw) as c:
        sid = c.launch().sandbox_id
        cid = code.create(c, sid).context_id
        code.run(c, sid, "1", context_id=cid)
        exec_ = timed(lambda: c.exec(sid, ["python3", "-c", "print(1+1)"]), n)
        run = timed(lambda: code.run(c, sid, "1+1", context_id=cid), n)
        code.run(c, sid, "import pandas, matplotlib", context_id=cid)
        imp_exec = timed(lambda: c.exec(sid, ["python3", "-c", "import pandas, matplotlib"]), max(3, n // 4))
        imp_run = timed(lambda: code.run(c, sid, "import pandas, matplotlib", context_id=cid), n)
        ik = timed(lambda: c.exec(sid, ["python3", "-c", "import ipykernel"]), max(3, n // 4))
        created = []

        def make():
            created.append(code.create(c, sid).context_id)
            code.delete(c, sid, created[-1])
        cc = timed(make, max(3, n // 4))
        size = len(code.run(c, sid, PNG_1MP, context_id=cid).results[0].png)
        png_grpc = timed(lambda: code.run(c, sid, PNG_1MP, context_id=cid), max(3, n // 4))
        png_rest = timed(lambda: shim.request("POST", f"/sandboxes/{sid}/code",
                                              {"code": PNG_1MP, "context_id": cid}, timeout=120), max(3, n // 4))
        print("| measure | median | p99 | vs baseline |")
        print("| --- | --- | --- | --- |")
        row("Exec python3 -c 'print(1+1)' (baseline)", exec_)
        row("RunCode(\"1+1\"), warm context", run, exec_)
        row("Exec python3 -c 'import pandas, matplotlib' (baseline)", imp_exec)
        row("RunCode(\"import pandas, matplotlib\"), warm context", imp_run, imp_exec)
        row("Exec python3 -c 'import ipykernel' (baseline)", ik)
        row("CreateContext (kernel ready) + DeleteContext", cc, ik)
        for name, xs in (("gRPC", png_grpc), ("REST (JSON, base64)", png_rest)):
            med, p99 = stats(xs)
            print(f"| 1-megapixel PNG ({size} bytes) via {name} | {size / med / 1e6:.1f} MB/s "
                  f"({med * 1000:.0f} ms) | {size / p99 / 1e6:.1f} MB/s | |")
        c.delete(sid)


if __name__ == "__main__":
    main()
