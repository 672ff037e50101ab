#!/usr/bin/env bash
# A copy of this checkout's working tree (no .git, no .whl) at DEST with PATCH applied, the
# tree b of a two-tree A/B (ab_selective_scan_trees.sh, ab_ssd_trees.sh):
#
#   benchmarks/patched_tree.sh DEST PATCH
#
# DEST: an absolute path (replaced); PATCH: a path relative to the repository root (the copy
# holds it too).
set -u
dest=${1:?usage: benchmarks/patched_tree.sh DEST PATCH}
patch=${2:?usage: benchmarks/patched_tree.sh DEST PATCH}
cd "$(dirname "$0")/.."
rm -rf "$dest"; mkdir -p "$dest"
tar --exclude=./.whl --exclude=./.git -cf - . | tar -xf - -C "$dest"
cd "$dest" && git apply "$patch"
