pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null; export PYTHONPATH=/tmp/np:$PWD
export PYTHONUNBUFFERED=1
python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 300 tests/test_ssd.py -k "walk_form or fused_forward" > $OUT/pytest_walk_form.log 2>&1
echo "pytest exit $?" >> $OUT/pytest_walk_form.log
cd benchmarks
for d in "" "SSD_MMA_WALK_FWD_BLOCKS=3" "SSD_EXP_NO_LO=1" "SSD_EXP_NO_BLOB=1" "SSD_EXP_NO_LO=1 SSD_EXP_NO_BLOB=1" "SSD_MMA_WALK_FWD_BLOCKS=3 SSD_EXP_NO_LO=1 SSD_EXP_NO_BLOB=1"; do
  echo "## defines: '$d'" >> $OUT/variants.txt
  SSMKIT_CUDA_DEFINES="$d" python3 ssd_walk_forward.py >> $OUT/variants.txt 2>&1
done
cd ..; tail -3 $OUT/pytest_walk_form.log; grep -v "^|---\|^| form" $OUT/variants.txt
