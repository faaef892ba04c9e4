#!/usr/bin/python3
"""Golden trajectories for Ember's optimizers, LR schedulers and gradient clipping
(tests/optim/test_optim_golden.cpp), made with PyTorch and Hugging Face transformers.

Produced with Debian's /usr/bin/python3 (3.11.2), torch 1.13.0a0 (Debian python3-torch 1.13.1+dfsg-4) and
transformers 4.45.2 (pip). See tests/golden/README.md.

  /usr/bin/python3 tests/golden/make_optim_golden.py     # rewrites tests/golden/optim/optim_golden.json

Everything goes into one JSON file; every number is written with Python's shortest round-trip
repr, so float64 values and float32 values (widened exactly to float64) are stored exactly.

"optimizers": torch.optim.SGD / Adam / AdamW run for 10 steps, in float64 and in float32, on two
parameters ([4, 3] and [5]). The gradient at each step comes from a noisy quadratic evaluated at
the current parameters,
    grad = curvature * (param - target) + 0.1 * noise_step
with fixed curvature, target and per-step noise; the gradients actually used are recorded per step,
so the C++ test feeds exactly the same ones and needs not reproduce the function. Each case
records the initial values, the gradient and the parameters after every step, and the final
optimizer state (momentum_buffer, or exp_avg and exp_avg_sq). One case uses two parameter groups
with different lr and weight decay, one an AdamW whose lr follows get_scheduler("linear").

"schedulers": transformers.get_scheduler(name, optimizer, num_warmup_steps=4,
num_training_steps=20) for linear, cosine, polynomial (defaults, and power 2 with lr_end 1e-3)
and constant_with_warmup: the lr right after construction and after each of 24 scheduler steps
(4 steps past the end of the schedule), from a base lr of 0.1.

"clip_grad_norm": torch.nn.utils.clip_grad_norm_ on three fixed gradients, norm 2 and inf,
max_norm that clips and one that does not, float32 and float64: the returned total norm and the
gradients afterwards.
"""
import json
import math
import os

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "optim", "optim_golden.json")

STEPS = 10
SHAPES = [[4, 3], [5]]
DTYPES = {"float64": torch.float64, "float32": torch.float32}

# name, torch optimizer, options (Ember's option names), extra (groups / schedule)
OPTIMIZER_CASES = [
    ("sgd_plain", "SGD", dict(lr=0.1)),
    ("sgd_momentum_dampening", "SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov", "SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", "Adam", dict(lr=0.01)),
    ("adam_l2", "Adam", dict(lr=0.01, weight_decay=0.1)),
    ("adam_betas_eps", "Adam", dict(lr=0.02, beta1=0.8, beta2=0.99, eps=1e-3, weight_decay=0.05)),
    ("adamw", "AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("adamw_two_groups", "AdamW", dict(lr=0.01, weight_decay=0.1),
     dict(group_overrides=[{}, {"lr": 0.05, "weight_decay": 0.0}])),
    ("adamw_linear_schedule", "AdamW", dict(lr=0.02, weight_decay=0.01),
     dict(schedule=dict(name="linear", warmup=3, total=10))),
]


def torch_options(kind, o):
    o = dict(o)
    if kind in ("Adam", "AdamW"):
        b1, b2 = o.pop("beta1", 0.9), o.pop("beta2", 0.999)
        o["betas"] = (b1, b2)
    return o


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def problem(dtype):
    """Initial parameters, curvature, targets and per-step noise: fixed, shared by every case."""
    gen = torch.Generator().manual_seed(2024)
    init = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    curvature = [torch.rand(s, generator=gen, dtype=torch.float64) * 2.0 + 0.1 for s in SHAPES]
    target = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    noise = [[torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES] for _ in range(STEPS)]
    cast = lambda ts: [t.to(dtype) for t in ts]
    return cast(init), cast(curvature), cast(target), [cast(n) for n in noise]


def run_optimizer(name, kind, options, extra, dtype_name):
    dtype = DTYPES[dtype_name]
    init, curvature, target, noise = problem(dtype)
    params = [p.clone().requires_grad_() for p in init]
    topt = torch_options(kind, options)
    cls = getattr(torch.optim, kind)
    overrides = extra.get("group_overrides")
    if overrides:
        groups = [dict(params=[p], **ov) for p, ov in zip(params, overrides)]
        opt = cls(groups, **topt)
    else:
        opt = cls(params, **topt)
    sched = None
    if "schedule" in extra:
        s = extra["schedule"]
        sched = transformers.get_scheduler(s["name"], opt, num_warmup_steps=s["warmup"],
                                           num_training_steps=s["total"])
    grads, after, lrs = [], [], []
    for step in range(STEPS):
        with torch.no_grad():
            for i, p in enumerate(params):
                p.grad = curvature[i] * (p - target[i]) + 0.1 * noise[step][i]
        grads.append([flat(p.grad) for p in params])
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        if sched is not None:
            sched.step()
        after.append([flat(p) for p in params])
    state = {}
    for p in params:
        for key, value in opt.state[p].items():
            if torch.is_tensor(value) and value.dim() > 0:
                state.setdefault(key, []).append(flat(value))
    case = dict(name=name, optimizer=kind, dtype=dtype_name, options=options, shapes=SHAPES,
                initial=[flat(p) for p in init], grads=grads, params=after, lr_used=lrs, final_state=state)
    if overrides:
        case["group_overrides"] = overrides
    if sched is not None:
        case["schedule"] = extra["schedule"]
    return case


SCHEDULER_CASES = [
    ("linear", {}),
    ("cosine", {}),
    ("polynomial", {}),
    ("polynomial", {"power": 2.0, "lr_end": 1e-3}),
    ("constant_with_warmup", {}),
    ("constant", {}),
]
BASE_LR, WARMUP, TOTAL, SCHED_STEPS = 0.1, 4, 20, 24


def run_scheduler(name, kwargs):
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=BASE_LR)
    sched = transformers.get_scheduler(name, opt, num_warmup_steps=WARMUP, num_training_steps=TOTAL,
                                       scheduler_specific_kwargs=dict(kwargs) or None)
    lrs = [sched.get_last_lr()[0]]
    for _ in range(SCHED_STEPS):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    # transformers' defaults, written out so the C++ test passes the same values.
    power, lr_end = kwargs.get("power", 1.0), kwargs.get("lr_end", 1e-7)
    return dict(name=name, base_lr=BASE_LR, warmup=WARMUP, total=TOTAL, power=power, lr_end=lr_end,
                lrs=[float(x) for x in lrs])


def run_clip(dtype_name, max_norm, norm_type):
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(99)
    shapes = [[3, 4], [5], [2, 2]]
    params = [torch.zeros(s, dtype=dtype, requires_grad=True) for s in shapes]
    grads = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]
    grads[1] = grads[1] * 3.0  # the largest element, for the inf norm, sits in the second tensor
    for p, g in zip(params, grads):
        p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, norm_type=norm_type)
    return dict(dtype=dtype_name, max_norm=max_norm, norm_type="inf" if math.isinf(norm_type) else norm_type,
                shapes=shapes, grads=[flat(g) for g in grads], total_norm=float(total),
                clipped=[flat(p.grad) for p in params])


def dump_one_case_per_line(golden):
    """JSON with each case on a line of its own: compact, and diffs show which case changed."""
    parts = []
    for key, value in golden.items():
        if isinstance(value, list):
            body = ",\n  ".join(json.dumps(case, separators=(",", ":")) for case in value)
            parts.append(f"{json.dumps(key)}: [\n  {body}\n ]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value)}")
    text = "{\n " + ",\n ".join(parts) + "\n}\n"
    assert json.loads(text) == golden
    return text


def main():
    golden = {
        "generated_by": {"script": "tests/golden/make_optim_golden.py", "torch": torch.__version__,
                         "transformers": transformers.__version__},
        "optimizers": [run_optimizer(name, kind, options, rest[0] if rest else {}, dt)
                       for name, kind, options, *rest in OPTIMIZER_CASES for dt in DTYPES],
        "schedulers": [run_scheduler(name, kw) for name, kw in SCHEDULER_CASES],
        "clip_grad_norm": [run_clip(dt, mn, nt) for dt in DTYPES for nt in (2.0, math.inf)
                           for mn in (1.0, 100.0)],
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(dump_one_case_per_line(golden))
    print(f"wrote {OUT} ({os.path.getsize(OUT) / 1024:.0f} KiB): {len(golden['optimizers'])} optimizer runs, "
          f"{len(golden['schedulers'])} schedules, {len(golden['clip_grad_norm'])} clipping cases")


if __name__ == "__main__":
    main()
