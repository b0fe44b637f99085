#!/usr/bin/env python3
"""Copy a HuggingFace Llama checkpoint keeping only its first N layers.

Used to carry real weights (and so real K/V statistics) to a machine where
the whole checkpoint does not fit the transfer limit. Reads and writes the
safetensors format directly (8-byte header length, JSON header, raw data).
usage: slice_checkpoint.py SRC_DIR DST_DIR N_LAYERS
"""
import json, os, re, shutil, struct, sys

src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst, exist_ok=True)
with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
cfg["num_hidden_layers"] = keep
with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
for extra in ("tokenizer.json", "tokenizer_config.json", "tokenizer.bin"):
    if os.path.exists(os.path.join(src, extra)):
        shutil.copy(os.path.join(src, extra), dst)
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    base = 8 + n
    out_header, blobs, off = {}, [], 0
    for name, t in header.items():
        if name == "__metadata__":
            out_header[name] = t
            continue
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= keep:
            continue
        b, e = t["data_offsets"]
        f.seek(base + b)
        blob = f.read(e - b)
        out_header[name] = dict(t, data_offsets=[off, off + len(blob)])
        blobs.append(blob)
        off += len(blob)
hb = json.dumps(out_header).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hb)))
    f.write(hb)
    for blob in blobs:
        f.write(blob)
