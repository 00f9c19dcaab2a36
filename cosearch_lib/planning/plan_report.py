"""The job plan as text: the tables ``cosearch plan`` prints, and the summary table README.md and
docs/PLAN.md show (``planning.job_plan`` computes the plan)."""

from __future__ import annotations

import math

from cosearch_lib.planning.job_plan import JobPlan


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _hours(hours: float) -> str:
    """Hours with the precision they need: 1,257; 9.4; 0.08."""
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.1f}" if hours >= 1 else f"{hours:.2f}"


def format_plan(plan: JobPlan) -> str:
    """The plan as the text tables ``cosearch plan`` prints."""
    where = f"{plan.nodes} node(s) x {plan.gpus_per_node} GPU(s) ({plan.device})" if plan.gpus_per_node else \
        f"{plan.nodes} node(s) x {plan.ranks // plan.nodes} CPU rank(s) ({plan.device})"
    out = [f"plan: profile {plan.profile!r} on {where}: {plan.ranks} data-parallel rank(s)", ""]
    out.append("GPU memory per rank (GiB)" if plan.gpus_per_node else "memory per rank (GiB, host)")
    for part, gib in plan.rank_memory.items():
        out.append(f"  {part:<40} {gib:8.1f}")
    for share, gib in plan.rank_capacity.items():
        out.append(f"  {'room for the ' + share:<40} {gib:8.1f}")
    out += ["", "host memory per node (GiB)"]
    for part, gib in plan.node_memory.items():
        out.append(f"  training node: {part:<25} {gib:8.1f}")
    for part, gib in plan.retriever_memory.items():
        out.append(f"  retrieval node: {part:<24} {gib:8.1f}")
    out.append(f"  {'each node has (slurm.mem)':<40} {plan.node_capacity_gib:8.1f}")
    out += ["", "disk (GiB)"]
    for part, gib in plan.disk.items():
        out.append(f"  {part:<40} {gib:8.1f}")
    stages = list(next(iter(plan.stages.values())))
    out += ["", f"seconds per step by stage (wall, on {plan.ranks} rank(s))",
            f"  {'method':<14}" + "".join(f"{s:>14}" for s in stages) + f"{'step':>12}{'steps/job':>11}{'GPU-h (run)' if plan.gpus_per_node else 'CPU-h (run)':>13}"]
    for m, st in plan.stages.items():
        out.append(f"  {m:<14}" + "".join(f"{st[s]:14,.0f}" for s in stages)
                   + f"{_duration(plan.step_s[m]):>12}{plan.steps_per_job[m]:>11}{_hours(plan.gpu_hours[m]):>13}")
    out.append(f"  {plan.steps} steps per method; a job: {_duration(plan.time_limit_s)} (slurm.time), start {plan.startup_s:.0f} s, "
               f"checkpoint {plan.checkpoint_s:.0f} s, stop warning {plan.signal_lead_s:.0f} s "
               + ("(derived: the longest stage and its checkpoint, +10% + 60 s)" if plan.lead_derived else "(slurm.signal_lead_s)"))
    for grid, hours in plan.cell_gpu_hours.items():
        out.append(f"  one {grid} grid cell: {_hours(hours)} {'GPU' if plan.gpus_per_node else 'CPU'}-hours")
    out.append(f"  evaluation (every test question of each method, greedy): {_duration(plan.evaluation_s)} on these ranks")
    out += ["", "throughputs from:"] + [f"  {src}" for src in plan.inputs]
    out += [f"note: {n}" for n in plan.notes]
    if plan.refusals:
        out += ["", f"CANNOT FIT OR FINISH ({len(plan.refusals)}):"] + [f"  - {r}" for r in plan.refusals]
    else:
        out += ["", "fits and finishes: every rank fits, a job holds a step, the warning covers it, the run finishes within its requeues"]
    return "\n".join(out)


def plan_summary_table(plans: list[JobPlan]) -> str:
    """One markdown row per (plan, method): wall minutes per step, steps per job, GPU-hours per run,
    and the plan's verdict; what README.md shows beside the paper's hardware."""
    rows = ["| GPUs | method | minutes per step | steps per 24 h job | GPU-hours (run) | verdict |", "|---|---|---|---|---|---|"]
    for plan in plans:
        for m in plan.step_s:
            refused = [r.what for r in plan.refusals if r.what.startswith(m) or f" {m} " in f" {r.what} "
                       or len(plan.step_s) == 1]
            verdict = "; ".join(refused) if refused else "fits and finishes"
            rows.append(f"| {plan.nodes} x {plan.gpus_per_node} | {m} | {plan.step_s[m] / 60:,.1f} | {plan.steps_per_job[m]} | "
                        f"{plan.gpu_hours[m]:,.0f} | {verdict} |")
    return "\n".join(rows)
