import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import numpy as np
import test_ssd as T
from helpers import rel_err
import ssmkit
from ssmkit import reference as ref
cases = [(dict(batch=1, L=31, H=1, P=1, G=1, N=2, D_form=None, with_z=False, with_bias=True,
               with_init=False, seq_cuts=[2]), dict(chunk_size=2, dt_softplus=True), 0)]
for kw, opts, seed in cases:
    rng = np.random.default_rng(seed)
    inputs = T.make_inputs(rng, **kw)
    try:
        T.check_against_reference("gpu", "float32", inputs, opts, rng)
        print(sys.argv[1], "PASS")
    except AssertionError as e:
        print(sys.argv[1], "FAIL", " ".join(str(e).splitlines()[0:2]))
