"""Compiler options shared by the project's own C code."""

# Warnings are errors for our code. Generated code uses GENERATED_COPTS.
COPTS = [
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wshadow",
    "-Wformat=2",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

GENERATED_COPTS = [
    "-std=gnu11",
    "-Wno-unused-parameter",
]
