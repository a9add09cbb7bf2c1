"""OCI image rules (Bazel 4, no rules_oci/rules_docker: nothing is downloaded).

Two actions, so that a rebuild with only our code changed repacks only the
app layer:

- `base_layer`: runs deploy/base/build_base.sh, which builds the Debian
  rootfs with debootstrap and packs it with umoci into a cache directory
  OUTSIDE Bazel (~/.cache/sandbox-gateway/base-<key>, key = hash of the
  package list and the script). Its output is a small text file naming that
  directory. Bazel re-runs the action only when its inputs change; the
  script itself returns at once when the entry exists, so even a re-run (or
  `bazel clean --expunge`) costs nothing once the base is built.
- `oci_image`: copies the cached base layout (blobs are a few hundred MB:
  seconds), checks every shared library the programs need against the base
  rootfs, inserts the app layer (the programs and the entrypoint) with
  `umoci insert` and writes the image config (entrypoint, ports, user,
  labels) with `umoci config`. Output: an OCI image layout directory, tag
  `latest`.

Both actions need root, the network (Debian's archive, base only) and tools
outside the sandbox (debootstrap, umoci, chroot, unshare), so they run
locally, unsandboxed and are never put in the disk cache (hundreds of MB).
The targets are tagged "manual": `bazel build //...` stays offline and
quick; build them by name.
"""

_LOCAL = {
    "local": "1",
    "no-sandbox": "1",
    "no-cache": "1",
    "no-remote": "1",
}

def _base_layer_impl(ctx):
    out = ctx.actions.declare_file(ctx.attr.name + ".txt")
    ctx.actions.run_shell(
        outputs = [out],
        inputs = [ctx.file.script, ctx.file.packages],
        command = 'entry=$("$1" | tail -n 1) && test -f "$entry/ok" && printf "%s\\n" "$entry" > "$2"',
        arguments = [ctx.file.script.path, out.path],
        execution_requirements = _LOCAL,
        use_default_shell_env = True,
        mnemonic = "DebianBaseLayer",
        progress_message = "Building the Debian base layer %s (debootstrap: minutes unless cached)" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]))]

base_layer = rule(
    implementation = _base_layer_impl,
    attrs = {
        "script": attr.label(allow_single_file = True, mandatory = True),
        "packages": attr.label(allow_single_file = True, mandatory = True),
    },
    doc = "The cached Debian base layer; outputs <name>.txt, the cache entry's path.",
)

def _oci_image_impl(ctx):
    out = ctx.actions.declare_directory(ctx.attr.name)
    programs = [
        ctx.executable.gateway,
        ctx.executable.helper,
        ctx.executable.unpack,
        ctx.executable.shim,
    ]
    args = ctx.actions.args()
    args.add("--out", out.path)
    args.add("--base", ctx.file.base.path)
    args.add("--base-script", ctx.file.base_script.path)
    args.add("--entrypoint", ctx.file.entrypoint.path)
    args.add("--check-libs", ctx.file.check_libs.path)
    args.add("--status", ctx.info_file.path)
    args.add("--tag", ctx.attr.tag)
    args.add("--source-url", ctx.var.get("IMAGE_SOURCE", ctx.attr.source_url))
    args.add("--version", ctx.var.get("IMAGE_VERSION", ""))
    args.add_all(programs)
    ctx.actions.run(
        executable = ctx.executable._builder,
        arguments = [args],
        inputs = depset(
            programs + [
                ctx.file.base,
                ctx.file.base_script,
                ctx.file.packages,
                ctx.file.entrypoint,
                ctx.file.check_libs,
                ctx.info_file,
            ],
        ),
        outputs = [out],
        execution_requirements = _LOCAL,
        use_default_shell_env = True,
        mnemonic = "OciImage",
        progress_message = "Packing the OCI image %s (app layer on the cached base)" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]))]

oci_image = rule(
    implementation = _oci_image_impl,
    attrs = {
        "base": attr.label(allow_single_file = True, mandatory = True),
        "base_script": attr.label(allow_single_file = True, mandatory = True),
        "packages": attr.label(allow_single_file = True, mandatory = True),
        "entrypoint": attr.label(allow_single_file = True, mandatory = True),
        "check_libs": attr.label(allow_single_file = True, mandatory = True),
        "gateway": attr.label(executable = True, cfg = "target", mandatory = True),
        "helper": attr.label(executable = True, cfg = "target", mandatory = True),
        "unpack": attr.label(executable = True, cfg = "target", mandatory = True),
        "shim": attr.label(executable = True, cfg = "target", mandatory = True),
        "tag": attr.string(default = "latest"),
        "source_url": attr.string(default = ""),
        "_builder": attr.label(
            default = "//deploy:build_image",
            executable = True,
            cfg = "exec",
        ),
    },
    doc = "An OCI image layout directory: the cached base layer plus the app layer.",
)
