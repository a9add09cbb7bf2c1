"""embed_file: turns a binary file into a C array and its length."""

def embed_file(name, src, symbol, out):
    """Writes `out` (a .c file) defining `symbol` and `symbol`_len from `src`."""
    native.genrule(
        name = name,
        srcs = [src],
        outs = [out],
        cmd = ("{ echo '/* Generated from $(location %s); do not edit. */';" +
               " echo '#include <stddef.h>';" +
               " echo 'const unsigned char %s[] = {';" +
               " od -An -v -tx1 $< | sed -e 's/ \\([0-9a-f][0-9a-f]\\)/0x\\1,/g';" +
               " echo '};';" +
               " echo 'const size_t %s_len = sizeof %s;'; } > $@") % (src, symbol, symbol, symbol),
    )
