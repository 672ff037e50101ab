#!/usr/bin/env bash
# How prof_new.log / prof_old.log / pytest.log were made (H100 80GB HBM3, 2026-12-06): the
# tree at 7a89eed ("new": one-pass stages of hi only) against its parent's cuda_src/ssd.cu
# ("old", saved as .rec/ssd_before.cu), in the order new, old, new, in one process each.
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 90 tests/test_ssd.py \
    -k "allow_tf32 or float32_backward_walk or float32_forward_in_one_kernel or float32_head_sums or tensor_core_backward_matches" > "$O/pytest.log" 2>&1
cp cuda_src/ssd.cu /tmp/new.cu
for v in new old new; do
    [ $v = old ] && cp .rec/ssd_before.cu cuda_src/ssd.cu || cp /tmp/new.cu cuda_src/ssd.cu
    python3 benchmarks/profile_ssd.py --dtype float32+tf32 --serial --reps 7 > "$O/prof_$v.log" 2>&1
done
cp /tmp/new.cu cuda_src/ssd.cu
