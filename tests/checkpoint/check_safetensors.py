#!/usr/bin/env python3
"""Independent check of a safetensors file written by mantissa.

Usage: check_safetensors.py FILE EXPECTED.json

EXPECTED.json: {"metadata": {...}, "tensors": [[name, shape, [values...]], ...]} in data order.
The file is read with the safetensors library when it is installed, else with the format's
definition (8-byte little-endian header length, JSON header, raw little-endian data) using only
the standard library. Exit status 0 when every tensor and the metadata match exactly.
"""
import json
import struct
import sys


def require(condition, message):
    # Not assert: python3 -O (or PYTHONOPTIMIZE) would drop the checks and pass every file.
    if not condition:
        sys.exit(f"check_safetensors: {message}")


def read_with_library(path):
    from safetensors import safe_open  # noqa: raises ImportError when not installed
    tensors = {}
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
        for name in f.keys():
            array = f.get_tensor(name)
            tensors[name] = (list(array.shape), [float(x) for x in array.reshape(-1)])
    return metadata, tensors, None


def read_by_definition(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    require(n % 8 == 0, f"header length {n} is not a multiple of 8")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors, order, end = {}, [], 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        require(info["dtype"] == "F32", f"{name}: dtype {info['dtype']}")
        begin, stop = info["data_offsets"]
        require(begin == end, f"{name}: data starts at {begin}, previous tensor ended at {end}")
        count = 1
        for d in info["shape"]:
            count *= d
        require(stop - begin == 4 * count, f"{name}: {stop - begin} bytes for {count} floats")
        tensors[name] = (info["shape"], list(struct.unpack(f"<{count}f", body[begin:stop])))
        order.append(name)
        end = stop
    require(end == len(body), f"{len(body) - end} trailing data bytes")
    return metadata, tensors, order


def main():
    path, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    try:
        metadata, tensors, order = read_with_library(path)
        reader = "safetensors library"
    except ImportError:
        metadata, tensors, order = read_by_definition(path)
        reader = "reader by definition (safetensors library not installed)"
    require(metadata == expected["metadata"], f"metadata {metadata} != {expected['metadata']}")
    names = [t[0] for t in expected["tensors"]]
    require(sorted(tensors) == sorted(names), f"tensors {sorted(tensors)} != {sorted(names)}")
    if order is not None:
        require(order == names, f"data order {order} != {names}")
    for name, shape, values in expected["tensors"]:
        got_shape, got_values = tensors[name]
        require(list(got_shape) == shape, f"{name}: shape {got_shape} != {shape}")
        # Both sides as float32 bit patterns: an exact comparison.
        want = struct.pack(f"<{len(values)}f", *values)
        got = struct.pack(f"<{len(got_values)}f", *got_values)
        require(got == want, f"{name}: values differ")
    print(f"check_safetensors: {len(names)} tensors match ({reader})")


if __name__ == "__main__":
    main()
