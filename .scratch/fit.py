from hetplan.calibration import modern
import sys
sys.path.insert(0,'tests/calibration')
from test_modern import NOT_FITTING_YET
res, cases = modern.run_modern()
bad = {c.key.split(":", 2)[0] + ":" + c.info["model"] + f":n{c.info['n']}" for c in cases if not c.fits}
print("now fit (remove):", sorted(NOT_FITTING_YET - bad))
print("new not fitting:", sorted(bad - NOT_FITTING_YET))
for s in modern.SET_NAMES:
    r=res[s]; print(f"{s:18s} n={r['n']:3d} mape={r['mape']*100:5.1f} max={r['max_abs_error']*100:5.1f} tau={r['kendall_tau']:.2f} held={r['held_out']['mape']*100:5.1f} ne={r['not_expressible']['n']}", "dense_cp1=%.3f"%r['dense_cp1']['mape'] if 'dense_cp1' in r else "", "mem=%s"%({k:round(v,3) for k,v in r['memory'].items()} if 'memory' in r else ''))
