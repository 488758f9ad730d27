#!/usr/bin/env python3
"""Writes a copy of a GGUF model with only its first N layers (real weights,
real architecture, metadata as is except the block count). The GPU machine
takes at most 64 MiB per call, so the real-model comparisons of
scripts/gpu_test.sh run on such cuts of the models we ship.

usage: truncate_gguf.py IN.gguf OUT.gguf N_LAYERS
"""
import re
import sys

import gguf


def main():
    src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        if name == f"{arch}.block_count":
            w.add_uint32(name, n)
        elif vtype == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data])
            else:
                w.add_array(name, [f.parts[i][0].item() for i in f.data])
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode("utf-8", "surrogateescape"))
        else:
            w.add_key_value(name, f.parts[-1][0].item(), vtype)
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) >= n:
            continue
        w.add_tensor(t.name, t.data, raw_shape=list(t.data.shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
