#!/usr/bin/env python3
"""Writes tests/io/data/reference.safetensors with the official `safetensors`
Python package (its Rust serializer), so that kestrel's reader is checked
against a file it did not write itself.

    python3 -m venv /tmp/st && /tmp/st/bin/pip install safetensors numpy
    /tmp/st/bin/python tools/gen_safetensors_reference.py [-o OUT]

Tensors (every value is exactly representable in its type; the test
tests/io/test_safetensors.cpp recomputes them from the same formulas):
    embed.weight  F32  (5, 3)  value = 0.25 * (3*r + c) - 1
    proj.weight   F16  (2, 4)  value = (4*r + c) - 3.5
    norm.weight   BF16 (4,)    value = 1 + 0.5 * i
    position_ids  I64  (1, 6)  value = i (not a kernel type)
    scale         F32  ()      3.25
    empty         F32  (0, 2)
metadata: {"format": "pt", "producer": "kestrel gen_safetensors_reference.py"}

The writer sorts tensors by dtype alignment then name and pads the header
with spaces to a multiple of 8 bytes; the reader must accept both.
"""
import argparse
import os

import numpy as np
import safetensors
from safetensors import TensorSpec, serialize_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 values that are exact in bfloat16."""
    bits = x.astype(np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), "value not exact in bfloat16"
    return (bits >> 16).astype(np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", default=os.path.join(ROOT, "tests", "io", "data", "reference.safetensors"))
    args = ap.parse_args()

    r, c = np.meshgrid(np.arange(5), np.arange(3), indexing="ij")
    embed = (0.25 * (3 * r + c) - 1).astype("<f4")
    r, c = np.meshgrid(np.arange(2), np.arange(4), indexing="ij")
    proj = ((4 * r + c) - 3.5).astype("<f2")
    norm = bf16_bits(1 + 0.5 * np.arange(4, dtype=np.float32)).astype("<u2")
    pos = np.arange(6, dtype="<i8").reshape(1, 6)
    scale = np.array(3.25, dtype="<f4")
    empty = np.zeros((0, 2), dtype="<f4")

    arrays = {"embed.weight": (embed, "float32"), "proj.weight": (proj, "float16"),
              "norm.weight": (norm, "bfloat16"), "position_ids": (pos, "int64"),
              "scale": (scale, "float32"), "empty": (empty, "float32")}
    specs = {k: TensorSpec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes) for k, (a, dtype) in arrays.items()}
    metadata = {"format": "pt", "producer": "kestrel gen_safetensors_reference.py"}
    os.makedirs(os.path.dirname(args.o), exist_ok=True)
    serialize_file(specs, args.o, metadata=metadata)

    # Round trip through the package's own reader (numpy has no bfloat16: skip that one).
    with safetensors.safe_open(args.o, framework="numpy") as f:
        for k, (a, _) in arrays.items():
            if k == "norm.weight":
                continue
            assert np.array_equal(f.get_tensor(k), a), k
    print(f"wrote {args.o} ({os.path.getsize(args.o)} bytes) with safetensors {safetensors.__version__}")


if __name__ == "__main__":
    main()
