import sys, math
from hetplan.calibration import modern
from hetplan.estimate.estimator import estimate
sets = sys.argv[1:] or ["moe_h100"]
for name in sets:
    cases, skipped = modern.load_sets([name])[name]
    errs=[]
    for c in cases:
        e = estimate(c.plan, model=c.model, virtual_stages=c.virtual_stages)
        pred = c.evaluate()
        err = pred/c.measured-1
        if name.startswith("dgxc") and not (c.model.is_moe or c.info['cp']>1): continue
        errs.append(abs(err))
        i=c.info
        mem = max(s.memory.total for s in e.stages)/2**30
        st=e.stages[0]
        print(f"{err*100:+6.1f}% {c.quantity[:4]} meas {c.measured:8.2f} pred {pred:8.2f} | {i['model'][:18]:18s} {i['gpu'][:6]} n{i['n']} tp{i['tp']}pp{i['pp']}dp{i['dp']}cp{i['cp']}ep{i['ep']}vp{i['vp']} mbs{i['mbs']} gbs{i['gbs']} s{i['seq']} {i['recompute']} {i['dtype']} | it {e.iteration_time_s:.2f} pipe {e.pipeline_time_s:.2f} bub {e.bubble_time_s:.2f} dpx {e.dp_exposed_time_s:.2f} opt {e.optimizer_time_s:.2f} f {st.forward_s*1e3:.0f}ms b {st.backward_s*1e3:.0f}ms tp {st.tp_comm_s*1e3:.0f}ms mem {mem:.0f}G fit {e.fits} {'CAL' if c.is_calibration else ''}")
    print(name, "n", len(errs), "MAPE", sum(errs)/max(len(errs),1))
    for s in skipped: print("  skip", s.key, s.reason)
