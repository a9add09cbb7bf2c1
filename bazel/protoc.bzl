"""Code generation from .proto files with Debian's protoc and protoc-c.

All rules run the system compilers (protobuf-compiler, protobuf-c-compiler,
protobuf-compiler-grpc) and write into the calling package's output tree, so
a file `a/b/c.proto` imported as "a/b/c.proto" generates `a/b/c.pb-c.h`,
included as "a/b/c.pb-c.h".
"""

def _stem(path):
    return path[:-len(".proto")]

def protoc_c(name, srcs, import_paths, protos):
    """Generates protobuf-c sources.

    Args:
      name: the genrule's name.
      srcs: the .proto labels.
      import_paths: protoc -I roots, relative to the execution root.
      protos: the import paths of the files to compile (one per src).
    """
    outs = []
    for p in protos:
        outs += [_stem(p) + ".pb-c.c", _stem(p) + ".pb-c.h"]
    native.genrule(
        name = name,
        srcs = srcs,
        outs = outs,
        cmd = "protoc-c --c_out=$(GENDIR)/%s %s %s" % (
            native.package_name(),
            " ".join(["-I" + i for i in import_paths]),
            " ".join(protos),
        ),
    )

def protoc_descriptor_set(name, srcs, import_paths, protos, out):
    """Writes a FileDescriptorSet with every import included."""
    native.genrule(
        name = name,
        srcs = srcs,
        outs = [out],
        cmd = "protoc --include_imports --descriptor_set_out=$@ %s %s" % (
            " ".join(["-I" + i for i in import_paths]),
            " ".join(protos),
        ),
    )

def protoc_python_grpc(name, srcs, import_paths, protos, out_dir):
    """Generates Python messages and gRPC stubs under `out_dir`."""
    outs = []
    for p in protos:
        outs += [out_dir + "/" + _stem(p) + "_pb2.py", out_dir + "/" + _stem(p) + "_pb2_grpc.py"]
    native.genrule(
        name = name,
        srcs = srcs,
        outs = outs,
        cmd = ("protoc --python_out=$(GENDIR)/%s/%s --grpc_python_out=$(GENDIR)/%s/%s " +
               "--plugin=protoc-gen-grpc_python=$$(command -v grpc_python_plugin) %s %s") % (
            native.package_name(),
            out_dir,
            native.package_name(),
            out_dir,
            " ".join(["-I" + i for i in import_paths]),
            " ".join(protos),
        ),
    )
