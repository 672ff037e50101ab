#!/bin/bash
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
W="import time; t=time.time(); from ssmkit._gpu import ssd; n=ssd.warmup(PAIRS); print('warmup', n, round(time.time()-t,1), 's')"
timeout 150 python3 -c "${W/PAIRS/}"
timeout 200 python3 -m pytest -q -x -m gpu tests/test_ssd.py tests/test_ssd_chunked.py -p no:cacheprovider > $OUT/pytest_ssd.log 2>&1; echo "pytest rc $?"; tail -2 $OUT/pytest_ssd.log
(cd .rec/a && PYTHONPATH=/tmp/np:$PWD timeout 120 python3 -c "${W/PAIRS/[('bfloat16','bfloat16'),('float32','float32')]}")
for r in 1; do
timeout 60 python3 benchmarks/host_profile.py --only ssd --top 30 > $OUT/host_ssd_new$r.log 2>&1; echo "new rc $?"
grep -A8 "^| call" $OUT/host_ssd_new$r.log
(cd .rec/a && PYTHONPATH=/tmp/np:$PWD timeout 60 python3 benchmarks/host_profile.py --only ssd --top 30 > $OUT/host_ssd_old$r.log 2>&1; echo "old rc $?")
grep -A8 "^| call" $OUT/host_ssd_old$r.log
done
