#!/usr/bin/env python3
"""Pack files into a one-layer OCI image archive, without a registry or a daemon.

    pack.py --ref NAME:TAG --out IMAGE.tar --entrypoint '["/bin/x"]' [--cmd '["a"]']
            [--user UID:GID] [--env K=V]... [--workdir DIR]
            [--file SRC:DEST[:MODE]]... [--dir DEST[:MODE]]... [--libs-for DEST]...

The archive is an OCI image layout (oci-layout, index.json, blobs/) that
`ctr -n k8s.io images import` reads; the index annotation
io.containerd.image.name carries the reference. `--libs-for DEST` adds the
shared libraries (and the program interpreter) that the ELF file packed at
DEST needs, as `ldd` resolves them on this machine, at the same paths.

Deterministic: the same inputs give the same bytes (sorted entries, mtime 0,
uid/gid 0, no compression, no timestamps in the config).

`--print-config` prints the image config JSON instead of writing an archive
(the tests compare it with the Dockerfile's final stage).
"""

import argparse
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def shared_libs(path):
    """Absolute paths of the libraries and interpreter `ldd` lists for path."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True)
    if out.returncode != 0:
        if "not a dynamic executable" in out.stdout + out.stderr:
            return []
        sys.exit(f"pack.py: ldd {path} failed: {out.stderr.strip()}")
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].split("(")[0].strip()
            if target == "not found" or not target:
                sys.exit(f"pack.py: {path}: a library is missing: {line}")
            libs.append(target)
        elif line.startswith("/"):
            libs.append(line.split("(")[0].strip())  # the interpreter
    return libs


def parse_mode(text, default):
    return int(text, 8) if text else default


class Tree:
    """The image's files: path -> (kind, mode, data)."""

    def __init__(self):
        self.entries = {}

    def add_dir(self, dest, mode=0o755):
        dest = dest.strip("/")
        parts = dest.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in self.entries:
                self.entries[p] = ("dir", 0o755 if i < len(parts) else mode, None)

    def add_file(self, src, dest, mode=None):
        dest = dest.strip("/")
        parent = os.path.dirname(dest)
        if parent:
            self.add_dir(parent)
        with open(src, "rb") as f:
            data = f.read()
        if mode is None:
            mode = stat.S_IMODE(os.stat(src).st_mode)
        self.entries[dest] = ("file", mode, data)

    def layer(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for path in sorted(self.entries):
                kind, mode, data = self.entries[path]
                ti = tarfile.TarInfo(path)
                ti.mode = mode
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                ti.mtime = 0
                if kind == "dir":
                    ti.type = tarfile.DIRTYPE
                    tf.addfile(ti)
                else:
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        return buf.getvalue()


def image_config(args, diff_id):
    cfg = {"Entrypoint": json.loads(args.entrypoint)}
    if args.cmd:
        cfg["Cmd"] = json.loads(args.cmd)
    if args.user:
        cfg["User"] = args.user
    cfg["Env"] = args.env or ["PATH=/usr/local/bin:/usr/bin:/bin"]
    if args.workdir:
        cfg["WorkingDir"] = args.workdir
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--out")
    ap.add_argument("--entrypoint", required=True, help="JSON array")
    ap.add_argument("--cmd", help="JSON array")
    ap.add_argument("--user")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir")
    ap.add_argument("--file", action="append", default=[], help="SRC:DEST[:MODE]")
    ap.add_argument("--dir", action="append", default=[], help="DEST[:MODE]")
    ap.add_argument("--libs-for", action="append", default=[], help="DEST of a packed ELF file")
    ap.add_argument("--print-config", action="store_true")
    args = ap.parse_args()

    tree = Tree()
    sources = {}
    for spec in args.dir:
        dest, _, mode = spec.partition(":")
        tree.add_dir(dest, parse_mode(mode, 0o755))
    for spec in args.file:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            sys.exit(f"pack.py: --file {spec}: want SRC:DEST[:MODE]")
        src, dest = parts[0], parts[1]
        mode = parse_mode(parts[2], None) if len(parts) == 3 else None
        if not os.path.isfile(src):
            sys.exit(f"pack.py: --file {spec}: {src} is not a file")
        tree.add_file(src, dest, mode)
        sources[dest.strip("/")] = src
    for dest in args.libs_for:
        src = sources.get(dest.strip("/"))
        if src is None:
            sys.exit(f"pack.py: --libs-for {dest}: no --file packed at {dest}")
        for lib in shared_libs(src):
            # Content of the resolved file, at the path the loader asks for.
            tree.add_file(os.path.realpath(lib), lib, 0o755)

    layer = tree.layer()
    config = json.dumps(image_config(args, sha(layer)), sort_keys=True).encode()
    if args.print_config:
        sys.stdout.write(config.decode() + "\n")
        return
    if not args.out:
        sys.exit("pack.py: --out is required (or --print-config)")
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": sha(config), "size": len(config)},
            "layers": [{"mediaType": LAYER, "digest": sha(layer), "size": len(layer)}],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": sha(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {"io.containerd.image.name": args.ref},
                }
            ],
        },
        sort_keys=True,
    ).encode()
    blobs = [
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
        ("index.json", index),
    ] + [("blobs/sha256/" + sha(b)[7:], b) for b in (config, manifest, layer)]
    tmp = args.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as t:
        for name, data in blobs:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = 0
            ti.mode = 0o644
            t.addfile(ti, io.BytesIO(data))
    os.replace(tmp, args.out)
    print(f"{args.ref} {sha(manifest)} {len(layer)} bytes -> {args.out}")


if __name__ == "__main__":
    main()
