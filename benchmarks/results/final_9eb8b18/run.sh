pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null; export PYTHONPATH=/tmp/np:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/nvidia_smi.txt 2>&1
SSMKIT_COMMIT=9eb8b18 timeout 200 python3 benchmarks/bench_selective_scan.py --out $OUT > $OUT/bench.log 2>&1
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > $OUT/pytest.log 2>&1; echo "exit $?" >> $OUT/pytest.log
tail -n 2 $OUT/pytest.log; tail -n 12 $OUT/bench.log
