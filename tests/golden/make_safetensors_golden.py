#!/usr/bin/env python3
"""Golden files for Ember's safetensors reader/writer, made with the reference `safetensors`
package, and a check that files written by Ember load there.

  pip install safetensors numpy
  python3 tests/golden/make_safetensors_golden.py            # rewrites tests/golden/safetensors/
  python3 tests/golden/make_safetensors_golden.py --verify DIR

Writing mode saves a few small files (every dtype Ember has, special float values, metadata,
non-ASCII names, a zero-size tensor, a scalar) plus expected.json, which records each tensor's
dtype, shape, raw little-endian bytes (hex) and values; the C++ test compares against it bit for
bit and needs no Python.

--verify DIR reads DIR/manifest.json, written in the same format by
  EMBER_SAFETENSORS_EXPORT_DIR=DIR ./test_safetensors --gtest_filter='*ExportForPython*'
and loads every file it lists with the reference package, checking dtypes, shapes, bytes,
metadata and, where the manifest names a golden file, byte-for-byte identity with it.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import safetensors
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_DIR = os.path.join(HERE, "safetensors")

# Names older releases of the package use for dtypes, mapped to the format's codes.
DTYPE_CODES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
               "int32": "I32", "int64": "I64", "bool": "BOOL"}


def bf16_bits(values):
    """float32 -> bfloat16 bit patterns, rounding to nearest even (NaN stays a quiet NaN)."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_values(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).astype(np.uint32).view(np.float32)


def json_value(x):
    """A tensor element as JSON: non-finite floats become strings."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def describe(code, shape, raw, values):
    return {"dtype": code, "shape": list(shape), "hex": raw.hex(),
            "values": [json_value(v) for v in np.asarray(values).reshape(-1)]}


def save_raw(path, specs, metadata):
    """Saves {name: (code, shape, raw bytes)} through the package's low-level serializer, which
    takes any dtype (numpy has no bfloat16)."""
    buffers = {name: np.frombuffer(raw, dtype=np.uint8).copy() for name, (_, _, raw) in specs.items()}
    if hasattr(safetensors, "TensorSpec"):
        tensors = {name: safetensors.TensorSpec(dtype={"BF16": "bfloat16"}[code], shape=list(shape),
                                                data_ptr=buffers[name].ctypes.data,
                                                data_len=buffers[name].nbytes)
                   for name, (code, shape, _) in specs.items()}
    else:
        tensors = {name: {"dtype": {"BF16": "bfloat16"}[code], "shape": list(shape), "data": raw}
                   for name, (code, shape, raw) in specs.items()}
    safetensors.serialize_file(tensors, path, metadata=metadata)


def numpy_entry(arr):
    code = DTYPE_CODES[arr.dtype.name]
    return describe(code, arr.shape, np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes(), arr)


def make_golden():
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    files = {}
    inf, nan = float("inf"), float("nan")

    # f32: special values, smallest subnormal, largest finite. One metadata key keeps the header
    # deterministic (the reference writes metadata in hash order), so Ember must match it byte for byte.
    f32 = {
        "weight": np.array([[0.0, -0.0, 1.5, -2.25, 1e-45, 3.4028234663852886e38],
                            [inf, -inf, nan, 0.1, -1e-38, 123456.789]], dtype=np.float32),
        "bias": np.array([1.0, -1.0, 0.5], dtype=np.float32),
    }
    save_file(f32, os.path.join(GOLDEN_DIR, "f32.safetensors"), metadata={"format": "pt"})
    files["f32.safetensors"] = {"byte_identical": True, "metadata": {"format": "pt"},
                                "tensors": {k: numpy_entry(v) for k, v in f32.items()}}

    # f16: subnormals, the largest finite value, rounding of 1/3, and a 0-d tensor.
    f16 = {
        "h": np.array([[0.0, -0.0], [65504.0, 5.960464477539063e-08], [inf, -inf], [nan, 1.0 / 3.0]],
                      dtype=np.float16),
        "scalar": np.array(2.5, dtype=np.float16),
    }
    save_file(f16, os.path.join(GOLDEN_DIR, "f16.safetensors"))
    files["f16.safetensors"] = {"byte_identical": True, "metadata": {},
                                "tensors": {k: numpy_entry(v) for k, v in f16.items()}}

    # bf16: raw bit patterns (numpy has none), written through the package's serializer.
    bits = bf16_bits([[1.0, -0.0], [3.14159265, inf], [nan, 9.183549615799121e-41]])
    bits = np.concatenate([bits.reshape(-1), np.array([0x0001, 0xFF80], dtype=np.uint16)]).reshape(4, 2)
    raw = bits.astype("<u2").tobytes()
    save_raw(os.path.join(GOLDEN_DIR, "bf16.safetensors"), {"b": ("BF16", bits.shape, raw)},
             metadata={"note": "bf16 from raw bits"})
    files["bf16.safetensors"] = {"byte_identical": True, "metadata": {"note": "bf16 from raw bits"},
                                 "tensors": {"b": describe("BF16", bits.shape, raw, bf16_values(bits))}}

    # Integers at their limits, bools, doubles, a zero-size tensor, and names that need JSON
    # escaping or are not ASCII: the writer's escaping must match the reference's too.
    mixed = {
        "ids": np.array([0, -1, 2**63 - 1, -(2**63), 42], dtype=np.int64),
        "counts": np.array([[2**31 - 1, -(2**31)], [7, -7]], dtype=np.int32),
        "mask": np.array([True, False, True], dtype=np.bool_),
        "doubles": np.array([math.pi, 1e-300, -0.0], dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "encoder.ünïcødé \"quoted\"\ttab": np.array([7.0], dtype=np.float32),
    }
    save_file(mixed, os.path.join(GOLDEN_DIR, "mixed.safetensors"), metadata={"format": "np"})
    files["mixed.safetensors"] = {"byte_identical": True, "metadata": {"format": "np"},
                                  "tensors": {k: numpy_entry(v) for k, v in mixed.items()}}

    # Several metadata keys: the header order is the package's hash order, so no byte check.
    meta = {"format": "pt", "author": "ember tests", "unicode": "ü ✓ \"q\""}
    md = {"x": np.array([1.0, 2.0], dtype=np.float32)}
    save_file(md, os.path.join(GOLDEN_DIR, "metadata.safetensors"), metadata=meta)
    files["metadata.safetensors"] = {"byte_identical": False, "metadata": meta,
                                     "tensors": {k: numpy_entry(v) for k, v in md.items()}}

    with open(os.path.join(GOLDEN_DIR, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "safetensors " + safetensors.__version__, "files": files}, f,
                  indent=1, ensure_ascii=False, sort_keys=True)
        f.write("\n")
    print("wrote", len(files), "files to", GOLDEN_DIR)


def verify(directory):
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    failures = 0

    def fail(msg):
        nonlocal failures
        failures += 1
        print("FAIL:", msg)

    for fname, want in manifest["files"].items():
        failures_before = failures
        path = os.path.join(directory, fname)
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        if (8 + n) % 8:
            fail(f"{fname}: data buffer starts at {8 + n}, not 8-byte aligned")
        got = {name: info for name, info in safetensors.deserialize(data)}
        if set(got) != set(want["tensors"]):
            fail(f"{fname}: tensors {sorted(got)} != {sorted(want['tensors'])}")
        for name, w in want["tensors"].items():
            if name not in got:
                continue
            g = got[name]
            code = DTYPE_CODES.get(g["dtype"], g["dtype"])
            if code != w["dtype"] or list(g["shape"]) != w["shape"]:
                fail(f"{fname}: tensor {name!r}: got {code} {g['shape']}, want {w['dtype']} {w['shape']}")
            got_hex = bytes(g["data"]).hex()
            if got_hex != w["hex"]:
                at = next((i for i, (a, b) in enumerate(zip(got_hex, w["hex"])) if a != b), min(len(got_hex), len(w["hex"])))
                fail(f"{fname}: tensor {name!r}: bytes differ from byte {at // 2} "
                     f"(got {got_hex[at:at + 16]}..., want {w['hex'][at:at + 16]}...)")
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
        if meta != want["metadata"]:
            fail(f"{fname}: metadata {meta} != {want['metadata']}")
        # The high-level numpy loader too, for the dtypes numpy has.
        if all(w["dtype"] != "BF16" for w in want["tensors"].values()):
            arrays = load_file(path)
            for name, w in want["tensors"].items():
                flat = [json_value(v) for v in arrays[name].reshape(-1)]
                bad = [i for i, (a, b) in enumerate(zip(flat, w["values"])) if a != b]
                if len(flat) != len(w["values"]) or bad:
                    i = bad[0] if bad else min(len(flat), len(w["values"]))
                    fail(f"{fname}: tensor {name!r}: numpy value {i} is {flat[i:i + 1]}, want {w['values'][i:i + 1]}")
        same_as = want.get("same_bytes_as")
        if same_as:
            with open(os.path.join(GOLDEN_DIR, same_as), "rb") as f:
                if f.read() != data:
                    fail(f"{fname}: bytes differ from the reference-written {same_as}")
        print("ok  " if failures == failures_before else "FAILED", fname)
    if failures:
        print(failures, "failure(s)")
        sys.exit(1)
    print("all", len(manifest["files"]), "files written by Ember load in safetensors", safetensors.__version__)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verify", metavar="DIR", help="check files Ember wrote into DIR")
    args = parser.parse_args()
    if args.verify:
        verify(args.verify)
    else:
        make_golden()
