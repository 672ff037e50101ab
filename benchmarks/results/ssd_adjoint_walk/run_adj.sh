#!/bin/bash
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
timeout 200 python3 -m pytest -q -m gpu tests/test_ssd.py tests/test_ssd_chunked.py -p no:cacheprovider > $OUT/pytest_ssd.log 2>&1; echo "pytest rc $?"; tail -2 $OUT/pytest_ssd.log
for d in float32 bfloat16; do
  for t in new old; do
    if [ $t = old ]; then dir=.rec/a; else dir=$PWD; fi
    (cd $dir && PYTHONPATH=/tmp/np:$dir timeout 100 python3 benchmarks/profile_ssd.py --dtype $d --reps 7 > $OUT/profile_${d}_$t.log 2>&1)
    echo "$d $t: $(grep adjoint_passing $OUT/profile_${d}_$t.log)"
  done
done
for r in 1 2 3; do for t in new old; do for d in float32 bfloat16; do
  if [ $t = old ]; then dir=.rec/a; else dir=$PWD; fi
  (cd $dir && PYTHONPATH=/tmp/np:$dir timeout 100 python3 $OLDPWD/benchmarks/ab_ssd_trees.py $t $d 2>&1 | grep ABROW | tee -a $OUT/ab.log | cut -c1-250)
done; done; done
