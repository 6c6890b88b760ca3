#!/usr/bin/env bash
# The measurements behind a "time to an answer" report on one GPU, each into OUT as JSON, then their tables:
#   1. batch-1 steps of both 1B-class pairs (target step against the copy bandwidth, the draft's c) and the
#      Llama pair end to end at synthetic acceptance 0.8 against Leviathan's formula (gpu_cudagraphs.py);
#   2. the 9-point depth sweep, engines reused against a process per job, after a warm-up sweep (sweep_time.py;
#      needs the CLI's Hydra layer);
#   3. the steps at contexts of 1 to 2,048 keys, attention split and not (attention_context.py);
#   4. the kernels: the targets' and drafts' GEMV chains against the copy bandwidth (gemv_bandwidth.py), and a
#      profiled k = 0 and k = 4 run of the Llama pair, where its device idles (step_trace.py; traces in OUT/traces);
#   5. the launch choices, each against engine=cuda within one process: the argmax and greedy verification in three
#      launches instead of one, and the targets' one-row GEMVs in stream order (kernel_cuts.py, both pairs);
#   6. a reused engine against engines built at k, in one process (reuse_cost.py, k = 1 and 4 from K = 8).
#
#   bash benchmarks/time_to_answer.sh OUT [SECTIONS]     SECTIONS: comma-separated of steps,sweep,context,kernels,cuts,
#                                                        reuse (all)
#
# Run from the repository root on a machine with a CUDA GPU; on an H100 (2026-12-07) steps took 4.4 minutes, sweep
# 5.5 (a fresh machine), kernels 0.7, cuts 0.8, reuse 1.6 (before it measured the engines alone and captured every
# depth: expect more): split the sections over calls where a call's time is capped.
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: bash benchmarks/time_to_answer.sh OUT [steps,sweep,context,kernels,cuts,reuse]" >&2
  exit 2
fi
OUT=$1
SECTIONS=${2:-steps,sweep,context,kernels,cuts,reuse}
for section in ${SECTIONS//,/ }; do
  case $section in steps|sweep|context|kernels|cuts|reuse) ;; *)
    echo "time_to_answer.sh: unknown section '$section'; valid: steps, sweep, context, kernels, cuts, reuse" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
LLAMA=llama-3.2-1b+llama-100m
if [[ ,$SECTIONS, == *,steps,* ]]; then
  python benchmarks/gpu_cudagraphs.py --pairs $LLAMA --sections step,e2e --rates 0.8 --repeats 4 \
    --out "$OUT/cudagraphs_llama_step_e2e.json"
  python benchmarks/gpu_cudagraphs.py --pairs lfm2-1.2b+lfm2-350m --sections step --out "$OUT/cudagraphs_lfm2_step.json"
  python benchmarks/cudagraphs_report.py summary "$OUT/cudagraphs_llama_step_e2e.json" "$OUT/cudagraphs_lfm2_step.json"
  python benchmarks/cudagraphs_report.py speedups "$OUT/cudagraphs_llama_step_e2e.json" --tolerance 0.10 --spread
  python benchmarks/cudagraphs_report.py speedups "$OUT/cudagraphs_llama_step_e2e.json" --tolerance 0.10 --realized
fi
if [[ ,$SECTIONS, == *,sweep,* ]]; then
  python benchmarks/sweep_time.py --out "$OUT/sweep_time.json" --warm-up --modes reused,isolated --rounds 1
fi
if [[ ,$SECTIONS, == *,context,* ]]; then
  python benchmarks/diagnostics/attention_context.py --pair $LLAMA --configs 64x4/1,64x4/16 \
    --contexts 1,64,128,256,512,1024,2048 --rounds 2 --out "$OUT/attention_context.json"
fi
if [[ ,$SECTIONS, == *,kernels,* ]]; then
  python benchmarks/diagnostics/gemv_bandwidth.py --out "$OUT/gemv_bandwidth.json"
  python benchmarks/diagnostics/step_trace.py record --pair $LLAMA --ks 0,4 --new-tokens 48 --out "$OUT/traces"
  python benchmarks/diagnostics/step_trace.py summarize "$OUT"/traces/trace_k*.json.gz --out "$OUT/step_trace_summary.json"
fi
if [[ ,$SECTIONS, == *,cuts,* ]]; then
  python benchmarks/diagnostics/kernel_cuts.py --pairs $LLAMA,lfm2-1.2b+lfm2-350m \
    --configs defaults,argmax_two_launches,gemv_early_draft --rounds 3 --out "$OUT/kernel_cuts.json"
  python benchmarks/diagnostics/kernel_cuts.py --table "$OUT/kernel_cuts.json"
fi
if [[ ,$SECTIONS, == *,reuse,* ]]; then
  python benchmarks/diagnostics/reuse_cost.py --ks 1,4 --max-k 8 --rounds 4 --out "$OUT/reuse_cost.json"
  python benchmarks/diagnostics/reuse_cost.py --table "$OUT/reuse_cost.json"
fi
